//! The Buffet Orchestrator: places tenants on many buffetd servers, through etcd.
//!
//! Every server runs buffetd with a `[cluster]` table: its Agent registers under a lease,
//! publishes its load, and admits the tenants placed on it. The Orchestrator (two or more
//! may run; etcd's election picks the one that writes) admits a tenant on the server
//! with the most headroom that fits, answers once the tenant is live there (or failed,
//! with the reason), re-places a dead server's tenants on the others, and moves tenants
//! off a server that reports overload. A single server needs none of this.
//!
//! * [`schema`] — the etcd key layout and values (shared with buffetd's Agent);
//! * [`placement`] — the placement policy, sans I/O;
//! * [`lease`] — connecting to etcd, holding a lease and knowing when it is lost;
//! * [`orchestrator`] — election, the leader's view, placement writes;
//! * [`api`] — the HTTP/JSON API;
//! * [`serve`] — the HTTP/1.1 server loop (head deadline, connection limit, lingering
//!   close), buffetd's too;
//! * [`local_etcd`] — an etcd child process on loopback for tests and trials.
//!
//! The API takes bearer tokens (`buffet_config::auth`, the code buffetd uses): the admin
//! token for everything, an optional reader token for reads only.
//!
//! Not here: moving a live tenant's state between servers (a moved tenant starts afresh),
//! TLS to etcd or on the API. See docs/cluster.md.
#![forbid(unsafe_code)]

pub mod api;
pub mod lease;
pub mod local_etcd;
pub mod orchestrator;
pub mod placement;
pub mod schema;
pub mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use buffet_config::auth::{self, TokenError};
use clap::Parser;

pub use orchestrator::{Config, Orchestrator, StartError, Token};

/// Environment variable holding the admin token when `--admin-token-file` is not given.
pub const ADMIN_TOKEN_ENV: &str = "BUFFET_ORCHESTRATOR_ADMIN_TOKEN";
/// Environment variable holding the reader token when `--reader-token-file` is not given.
pub const READER_TOKEN_ENV: &str = "BUFFET_ORCHESTRATOR_READER_TOKEN";

/// `buffet-orchestrator` command line.
#[derive(Parser, Debug)]
#[command(
    name = "buffet-orchestrator",
    version,
    about = "Buffet's Orchestrator: places tenants on buffetd servers through etcd"
)]
pub struct Args {
    /// etcd client URLs, comma-separated.
    #[arg(long, value_name = "URL[,URL]", value_delimiter = ',', required = true)]
    pub etcd: Vec<String>,
    /// The API's address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7900")]
    pub listen: SocketAddr,
    /// The URL followers name as the leader's (default `http://<listen>`).
    #[arg(long, value_name = "URL")]
    pub advertise: Option<String>,
    /// Election lease TTL, seconds (1 to 3600): a dead leader is replaced within it.
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
    pub lease_ttl: u64,
    /// Seconds an admission may take to become live before 504 (over 0, at most 3600).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = seconds)]
    pub admit_timeout: f64,
    /// Seconds a client may take to send a request head before its connection is closed
    /// (over 0, at most 3600); also how long an idle connection stays open.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = seconds)]
    pub header_read_timeout: f64,
    /// Seconds a client may take to send a request body once its head is read, else 408
    /// (over 0, at most 3600).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = seconds)]
    pub body_timeout: f64,
    /// Most API connections open at once (1 to 1048576); further clients wait.
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_connections: u64,
    /// Expected rate of a tenant admitted without `expected_pps`, packets per second.
    #[arg(long, value_name = "PPS", default_value_t = 10.0, value_parser = expected_pps)]
    pub default_expected_pps: f64,
    /// File whose first line is the admin token (every request); else
    /// `BUFFET_ORCHESTRATOR_ADMIN_TOKEN`. One of the two is required.
    #[arg(long, value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,
    /// File whose first line is a reader token (GET requests only); else
    /// `BUFFET_ORCHESTRATOR_READER_TOKEN`; else none.
    #[arg(long, value_name = "PATH")]
    pub reader_token_file: Option<PathBuf>,
}

/// The `buffet-orchestrator` binary: runs until SIGTERM or SIGINT, then resigns.
pub fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The message alone: every error here already ends with its cause
            // (`path: why`), so walking the cause chain would print each cause twice.
            eprintln!("buffet-orchestrator: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let (admin, origin) = auth::token_from(
        args.admin_token_file.as_deref(),
        "--admin-token-file",
        ADMIN_TOKEN_ENV,
    )?
    .ok_or_else(|| TokenError::Missing {
        hint: format!("give --admin-token-file PATH or set {ADMIN_TOKEN_ENV}"),
    })?;
    eprintln!("buffet-orchestrator: admin token from {origin}");
    let reader = auth::token_from(
        args.reader_token_file.as_deref(),
        "--reader-token-file",
        READER_TOKEN_ENV,
    )?;
    let mut cfg = Config::new(args.etcd, args.listen, Token::new(admin));
    if let Some((r, origin)) = reader {
        eprintln!("buffet-orchestrator: reader token from {origin}");
        cfg.reader_token = Some(Token::new(r));
    }
    cfg.advertise = args.advertise;
    cfg.lease_ttl = Duration::from_secs(args.lease_ttl);
    // In range by `seconds`, the flags' parser.
    cfg.admit_timeout = Duration::from_secs_f64(args.admit_timeout);
    cfg.header_read_timeout = Duration::from_secs_f64(args.header_read_timeout);
    cfg.body_timeout = Duration::from_secs_f64(args.body_timeout);
    cfg.max_connections = args.max_connections as usize;
    cfg.default_expected_pps = args.default_expected_pps;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let o = Orchestrator::start(cfg).await?;
        eprintln!("buffet-orchestrator: API on http://{}", o.addr());
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!("buffet-orchestrator: stopping: resigning");
        o.stop().await;
        Ok(())
    })
}

/// The longest lease TTL and timeout, seconds: an hour.
const MAX_SECONDS: u64 = 3600;

/// `--admit-timeout`, `--header-read-timeout`, `--body-timeout`: seconds, over 0 and at
/// most [`MAX_SECONDS`].
fn seconds(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= MAX_SECONDS as f64 => Ok(s),
        _ => Err(format!(
            "a number of seconds over 0 and at most {MAX_SECONDS}"
        )),
    }
}

/// `--default-expected-pps`: packets per second, a finite number >= 0.
fn expected_pps(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p),
        _ => Err("a number of packets per second >= 0".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Args, String> {
        let mut argv = vec!["buffet-orchestrator", "--etcd", "http://127.0.0.1:2379"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).map_err(|e| e.to_string())
    }

    #[test]
    fn out_of_range_durations_and_rates_are_refused_naming_the_flag() {
        for (flag, value) in [
            ("--admit-timeout", "1e30"),
            ("--admit-timeout", "NaN"),
            ("--admit-timeout", "0"),
            ("--header-read-timeout", "0"),
            ("--body-timeout", "1e30"),
            ("--max-connections", "0"),
            ("--lease-ttl", "99999999999"),
            ("--lease-ttl", "0"),
            ("--default-expected-pps", "-1"),
            ("--default-expected-pps", "inf"),
        ] {
            let arg = format!("{flag}={value}");
            let e = parse(&[&arg]).expect_err(&arg);
            assert!(e.contains(flag), "{arg}: {e}");
        }
        let a = parse(&["--admit-timeout", "3600", "--lease-ttl", "3600"]).unwrap();
        assert_eq!((a.admit_timeout, a.lease_ttl), (3600.0, 3600));
    }
}
