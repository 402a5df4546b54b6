//! What the embedded-daemon tests share: the admin token and the config.

use std::path::Path;

/// buffetd's admin token in these tests.
pub const ADMIN: &str = "admin-token-for-my-nf-0123456789";

/// A buffetd config under `dir` (its admin token written there): the API on a free
/// loopback port, monitor as the default stage, firewall and the author's `my-nf`
/// offered, one worker, a generator of two tenants; then `extra` (a `[cluster]` table).
pub fn config_text(dir: &Path, extra: &str) -> String {
    std::fs::write(dir.join("admin.token"), format!("{ADMIN}\n")).unwrap();
    format!(
        r#"
data_dir = "{d}/data"
[api]
listen = "127.0.0.1:0"
admin_token_file = "{d}/admin.token"
[nf]
name = "monitor"
offered = ["firewall", "my-nf"]
[dataplane]
workers = 1
tenant_slots = 8
arena_mib = 256
[[port]]
kind = "generator"
tenants = 2
rate_pps = 20000
{extra}"#,
        d = dir.display()
    )
}
