//! Bearer tokens, shared by buffetd and buffet-orchestrator: one admin token (every
//! request) and tenant-scoped tokens (reads of their own tenant only; buffetd issues them).
//!
//! Tokens are kept only as SHA-256 hashes (in memory and in the store); a presented
//! token is hashed and the hashes are compared in constant time (`subtle`). Tenant
//! tokens are found by their hash, so lookup time depends only on the hash, never on
//! how much of a stored token a guess matches. No token is ever logged; the only place
//! one appears in clear is the response that creates it. This module does not decide
//! which route needs which principal: each server's API does (buffetd's `api` module,
//! buffet-orchestrator's `api` module).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use buffet_sdk::TenantId;
use ring::rand::SecureRandom;
use subtle::ConstantTimeEq;

/// Environment variable holding buffetd's admin token when its config names no file.
pub const ADMIN_TOKEN_ENV: &str = "BUFFETD_ADMIN_TOKEN";

/// The shortest admin token accepted, in characters.
pub const MIN_TOKEN_LEN: usize = 16;

/// Who a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Principal {
    /// The admin token: may do everything.
    Admin,
    /// A tenant-scoped token: may read this tenant only.
    Tenant(TenantId),
}

/// Why the admin token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file cannot be read.
    #[error("{setting}: {}: {source}", path.display())]
    Read {
        /// The setting that names the file (`api.admin_token_file`, `--admin-token-file`).
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The token is too short to be a secret.
    #[error("{origin}: the admin token must be at least 16 characters")]
    TooShort {
        /// Where it came from.
        origin: String,
    },
    /// No token was given where one is required.
    #[error("no admin token: {hint}")]
    Missing {
        /// Where to give one.
        hint: String,
    },
    /// A generated token could not be written.
    #[error("{}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// SHA-256 of a token.
pub fn hash(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A fresh random token (`bt_` and 64 hex digits).
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system random generator works");
    let mut s = String::with_capacity(67);
    s.push_str("bt_");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// A token from a file (its first line, trimmed; `setting` names the file's setting in
/// errors) or else from environment variable `env`: `Ok(None)` when neither is given.
/// Returns the token and where it came from (for the log; never the token itself).
pub fn token_from(
    file: Option<&Path>,
    setting: &'static str,
    env: &str,
) -> Result<Option<(String, String)>, TokenError> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            setting,
            path: path.to_owned(),
            source,
        })?;
        let t = text.lines().next().unwrap_or("").trim().to_owned();
        return checked(t, format!("{setting} {}", path.display())).map(Some);
    }
    if let Ok(t) = std::env::var(env) {
        return checked(t.trim().to_owned(), env.to_owned()).map(Some);
    }
    Ok(None)
}

fn checked(t: String, origin: String) -> Result<(String, String), TokenError> {
    if t.len() < MIN_TOKEN_LEN {
        Err(TokenError::TooShort { origin })
    } else {
        Ok((t, origin))
    }
}

/// buffetd's admin token: the config's file, else `BUFFETD_ADMIN_TOKEN`, else one generated
/// into `<data_dir>/admin.token` (mode 0600) on first start and read from there later.
/// Returns the token and where it came from (for the log; never the token itself).
pub fn admin_token(file: Option<&Path>, data_dir: &Path) -> Result<(String, String), TokenError> {
    if let Some(found) = token_from(file, "api.admin_token_file", ADMIN_TOKEN_ENV)? {
        return Ok(found);
    }
    let path = data_dir.join("admin.token");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let t = text.lines().next().unwrap_or("").trim().to_owned();
        return checked(t, format!("{}", path.display()));
    }
    let t = generate();
    write_whole(&path, |f| {
        use std::io::Write;
        writeln!(f, "{t}")
    })
    .map_err(|source| TokenError::Write {
        path: path.clone(),
        source,
    })?;
    Ok((t, format!("generated into {}", path.display())))
}

/// Writes the file `path` (mode 0600, its directory created if needed) with what `fill`
/// writes, all or nothing: into `<path>.new` first, synced, then renamed over `path` and
/// the directory synced. A write that fails (or a crash) part-way leaves no `path`, never
/// a partial one that a later start would read as a too-short token or a truncated
/// identity. The rename replaces a `path` made meanwhile: buffetd generates its token
/// and its cluster instance id while it holds the store's lock.
pub fn write_whole(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    // One left by a crash part-way: not ours to read, only to replace.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = fill(&mut f)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

/// The tokens a server accepts.
pub struct Auth {
    /// The admin token's hash (replaced by a config reload).
    admin: RwLock<[u8; 32]>,
    tenants: RwLock<HashMap<[u8; 32], TenantId>>,
}

/// Why a request is not allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No token, or one nobody issued: 401.
    Unauthenticated,
    /// A valid token that may not do this: 403.
    Forbidden,
}

impl Auth {
    /// Accepts `admin` and the tenant tokens whose hashes are given.
    pub fn new(admin: &str, tenant_hashes: impl IntoIterator<Item = ([u8; 32], TenantId)>) -> Auth {
        Auth {
            admin: RwLock::new(hash(admin)),
            tenants: RwLock::new(tenant_hashes.into_iter().collect()),
        }
    }

    /// Who presents `authorization` (an `Authorization` header value).
    pub fn identify(&self, authorization: Option<&str>) -> Result<Principal, Denied> {
        // The scheme is case-blind (RFC 9110 §11.1): `bearer` and `BEARER` are `Bearer`.
        let token = authorization
            .and_then(|h| h.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("Bearer"))
            .map(|(_, t)| t.trim())
            .filter(|t| !t.is_empty())
            .ok_or(Denied::Unauthenticated)?;
        let h = hash(token);
        let admin = *self
            .admin
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if bool::from(admin.ct_eq(&h)) {
            return Ok(Principal::Admin);
        }
        let map = self
            .tenants
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match map.get_key_value(&h) {
            Some((stored, &id)) if bool::from(stored.ct_eq(&h)) => Ok(Principal::Tenant(id)),
            _ => Err(Denied::Unauthenticated),
        }
    }

    /// Replaces the admin token (a config reload): the old one stops working.
    pub fn set_admin(&self, admin: &str) {
        *self
            .admin
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = hash(admin);
    }

    /// Accepts a new tenant token (by hash).
    pub fn add_tenant_token(&self, hash: [u8; 32], id: TenantId) {
        self.tenants
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(hash, id);
    }

    /// Forgets every token of a removed tenant.
    pub fn forget_tenant(&self, id: TenantId) {
        self.tenants
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|_, t| *t != id);
    }
}

impl Principal {
    /// Allowed to read tenant `id`?
    pub fn may_read(self, id: TenantId) -> Result<(), Denied> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Tenant(t) if t == id => Ok(()),
            Principal::Tenant(_) => Err(Denied::Forbidden),
        }
    }

    /// Allowed to change things?
    pub fn admin(self) -> Result<(), Denied> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Tenant(_) => Err(Denied::Forbidden),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_identify_their_principal() {
        let t7 = generate();
        let auth = Auth::new("admin-token-0123456789", [(hash(&t7), TenantId(7))]);
        assert_eq!(
            auth.identify(Some("Bearer admin-token-0123456789")),
            Ok(Principal::Admin)
        );
        assert_eq!(
            auth.identify(Some(&format!("Bearer {t7}"))),
            Ok(Principal::Tenant(TenantId(7)))
        );
        assert_eq!(auth.identify(None), Err(Denied::Unauthenticated));
        // The scheme is case-blind; another scheme or no token is not a bearer token.
        for h in [
            "bearer admin-token-0123456789",
            "BEARER admin-token-0123456789",
        ] {
            assert_eq!(auth.identify(Some(h)), Ok(Principal::Admin), "{h}");
        }
        for h in [
            "Basic admin-token-0123456789",
            "Bearer",
            "Bearer  ",
            "admin-token-0123456789",
        ] {
            assert_eq!(auth.identify(Some(h)), Err(Denied::Unauthenticated), "{h}");
        }
        assert_eq!(
            auth.identify(Some("Bearer admin-token-0123456788")),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(
            auth.identify(Some("Basic admin-token-0123456789")),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(
            Principal::Tenant(TenantId(7)).may_read(TenantId(8)),
            Err(Denied::Forbidden)
        );
        auth.forget_tenant(TenantId(7));
        assert_eq!(
            auth.identify(Some(&format!("Bearer {t7}"))),
            Err(Denied::Unauthenticated)
        );
    }

    #[test]
    fn a_token_file_whose_write_fails_is_not_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data/admin.token");
        let e = write_whole(&path, |f| {
            use std::io::Write;
            f.write_all(b"bt_0123")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "disk full");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("data"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // The next start generates a whole token instead of refusing a partial one.
        let (t, origin) = admin_token(None, &dir.path().join("data")).unwrap();
        assert!(origin.starts_with("generated into"), "{origin}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{t}\n"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_generated_admin_token_is_kept_and_reread() {
        let dir = tempfile::tempdir().unwrap();
        let (a, origin) = admin_token(None, dir.path()).unwrap();
        assert!(origin.starts_with("generated into"));
        let (b, _) = admin_token(None, dir.path()).unwrap();
        assert_eq!(a, b);
    }
}
