//! The daemon's persistent state in one redb file (`<data_dir>/buffetd.redb`): every
//! admitted tenant as its admission document (the tenants-file schema, as JSON) and the
//! SHA-256 of every tenant-scoped token.
//!
//! Why redb: it is maintained, pure Rust, and crash-safe by default — every write
//! transaction is durable once `commit` returns (copy-on-write B-trees with a checksummed
//! commit slot; a crash mid-commit leaves the previous commit), with no separate sync
//! call to forget (fjall needs an explicit persist, sled calls itself beta).
//!
//! Every method is one transaction: it is wholly there after a crash or wholly absent.
//! This module knows nothing of the data plane; [`crate::api`] orders the two (see
//! docs/daemon.md, "Persistence").

use std::path::{Path, PathBuf};

use redb::{Database, ReadableTable, TableDefinition};

/// Tenant id → admission document (JSON).
const TENANTS: TableDefinition<'_, u32, &[u8]> = TableDefinition::new("tenants");
/// SHA-256 of a tenant-scoped token → the tenant it reads.
const TOKENS: TableDefinition<'_, &[u8], u32> = TableDefinition::new("tokens");

/// A store operation that failed; nothing of it was committed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb's error (boxed: it is large and errors are rare).
    #[error("store: {0}")]
    Redb(Box<redb::Error>),
    /// Another process (another buffetd) has the store open: redb locks its file.
    #[error(
        "data_dir {}: another buffetd is using it (its store, buffetd.redb, is locked): \
         stop that buffetd, or give this one its own data_dir",
        dir.display()
    )]
    InUse {
        /// The data directory.
        dir: PathBuf,
    },
}

fn e(x: impl Into<redb::Error>) -> StoreError {
    StoreError::Redb(Box::new(x.into()))
}

/// What the store holds, read at start.
#[derive(Debug, Default)]
pub struct Contents {
    /// `(tenant id, admission document)`, by id.
    pub tenants: Vec<(u32, Vec<u8>)>,
    /// `(token hash, tenant id)`.
    pub tokens: Vec<([u8; 32], u32)>,
}

/// A change of the tenant set made in one transaction.
#[derive(Debug, Default)]
pub struct Batch {
    /// Tenants to write (added or updated).
    pub put: Vec<(u32, Vec<u8>)>,
    /// Tenants to delete, with their tokens.
    pub delete: Vec<u32>,
}

/// The open store.
pub struct Store {
    db: Database,
}

impl Store {
    /// Opens (or creates) `<dir>/buffetd.redb`, creating `dir` if needed.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|io| e(redb::StorageError::Io(io)))?;
        let db = Database::create(dir.join("buffetd.redb")).map_err(|x| match x {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::InUse {
                dir: dir.to_owned(),
            },
            x => e(x),
        })?;
        let tx = db.begin_write().map_err(e)?;
        tx.open_table(TENANTS).map_err(e)?;
        tx.open_table(TOKENS).map_err(e)?;
        tx.commit().map_err(e)?;
        Ok(Store { db })
    }

    /// Everything stored.
    pub fn load(&self) -> Result<Contents, StoreError> {
        let tx = self.db.begin_read().map_err(e)?;
        let mut c = Contents::default();
        for row in tx.open_table(TENANTS).map_err(e)?.iter().map_err(e)? {
            let (k, v) = row.map_err(e)?;
            c.tenants.push((k.value(), v.value().to_vec()));
        }
        for row in tx.open_table(TOKENS).map_err(e)?.iter().map_err(e)? {
            let (k, v) = row.map_err(e)?;
            if let Ok(hash) = <[u8; 32]>::try_from(k.value()) {
                c.tokens.push((hash, v.value()));
            }
        }
        Ok(c)
    }

    /// Applies `batch` in one durable transaction (deleted tenants lose their tokens).
    pub fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(e)?;
        {
            let mut tenants = tx.open_table(TENANTS).map_err(e)?;
            let mut tokens = tx.open_table(TOKENS).map_err(e)?;
            for (id, doc) in &batch.put {
                tenants.insert(id, doc.as_slice()).map_err(e)?;
            }
            for id in &batch.delete {
                tenants.remove(id).map_err(e)?;
                tokens.retain(|_, t| t != *id).map_err(e)?;
            }
        }
        tx.commit().map_err(e)
    }

    /// Stores a tenant-scoped token's hash.
    pub fn put_token(&self, hash: &[u8; 32], tenant: u32) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(e)?;
        tx.open_table(TOKENS)
            .map_err(e)?
            .insert(hash.as_slice(), tenant)
            .map_err(e)?;
        tx.commit().map_err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_survives_reopening_and_deletes_take_their_tokens() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            s.apply(&Batch {
                put: vec![(7, b"{\"id\":7}".to_vec()), (8, b"{\"id\":8}".to_vec())],
                delete: vec![],
            })
            .unwrap();
            s.put_token(&[1; 32], 7).unwrap();
            s.put_token(&[2; 32], 8).unwrap();
            s.apply(&Batch {
                put: vec![],
                delete: vec![7],
            })
            .unwrap();
        }
        let c = Store::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(c.tenants, vec![(8, b"{\"id\":8}".to_vec())]);
        assert_eq!(c.tokens, vec![([2; 32], 8)]);
    }

    #[test]
    fn a_store_already_open_is_named_as_another_buffetd_using_the_data_dir() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Store::open(dir.path()).unwrap();
        let e = Store::open(dir.path()).err().unwrap().to_string();
        assert_eq!(
            e,
            format!(
                "data_dir {}: another buffetd is using it (its store, buffetd.redb, is \
                 locked): stop that buffetd, or give this one its own data_dir",
                dir.path().display()
            )
        );
    }
}
