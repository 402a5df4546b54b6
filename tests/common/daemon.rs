//! `buffetd` as the process tests start it (tests/client.rs, tests/daemon.rs,
//! tests/daemon_start.rs, tests/live.rs, tests/live_dpdk.rs): its config's head, a free
//! API port, the start — here or inside a network namespace — that returns once the API
//! answers, and the `buffet` client run against it.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback TCP port nothing listens on (at the time of asking).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A config's first lines: `data_dir`, the API on 127.0.0.1:`port` and the NF `nf`; the
/// caller appends `[dataplane]` and the ports.
pub fn config_head(data_dir: &Path, port: u16, nf: &str) -> String {
    format!(
        "data_dir = \"{d}\"\n[api]\nlisten = \"127.0.0.1:{port}\"\n[nf]\nname = \"{nf}\"\n",
        d = data_dir.display()
    )
}

/// Writes `text` to `<dir>/buffet.toml`; its path.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let cfg = dir.join("buffet.toml");
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// A running buffetd, killed on drop if it still runs: a test that fails midway must not
/// leave its daemon running (holding the test's output pipe open, so whatever reads it
/// never sees the end).
pub struct Daemon {
    pub child: Child,
    /// Its API port on 127.0.0.1.
    pub port: u16,
    /// `http://127.0.0.1:PORT`.
    pub api: String,
    token: String,
    /// The network namespace it runs in, if not this process's.
    ns: Option<String>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Daemon {
    /// Starts buffetd on the config file `cfg` (API on 127.0.0.1:`port`) with the admin
    /// token `token`, its stderr to `stderr`; returns once `GET /readyz` answers.
    pub fn start(cfg: &Path, port: u16, token: &str, stderr: Stdio) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_buffetd"))
            .arg("--config")
            .arg(cfg)
            .env("BUFFETD_ADMIN_TOKEN", token)
            .stderr(stderr)
            .spawn()
            .unwrap();
        let d = Daemon::new(child, port, token, None);
        let t0 = Instant::now();
        while ureq::get(&format!("{}/readyz", d.api)).call().is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "buffetd did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// Starts buffetd on `cfg` inside network namespace `ns` (`ip netns exec`, which
    /// executes buffetd in its own process: the child is the daemon), its stderr piped;
    /// returns once the client run in `ns` lists the workers. Fails with buffetd's stderr
    /// and the config if it ends first.
    pub fn start_in(ns: &str, cfg: &Path, port: u16, token: &str) -> Daemon {
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                env!("CARGO_BIN_EXE_buffetd"),
                "--config",
            ])
            .arg(cfg)
            .env("BUFFETD_ADMIN_TOKEN", token)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut d = Daemon::new(child, port, token, Some(ns));
        let config = || std::fs::read_to_string(cfg).unwrap_or_default();
        let t0 = Instant::now();
        while !d.client(&["workers", "ls"]).0 {
            if let Some(status) = d.child.try_wait().unwrap() {
                let mut err = String::new();
                let _ = d.child.stderr.take().unwrap().read_to_string(&mut err);
                panic!("buffetd ended ({status}): {err}\nits config:\n{}", config());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "buffetd did not start; its config:\n{}",
                config()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    fn new(child: Child, port: u16, token: &str, ns: Option<&str>) -> Daemon {
        Daemon {
            child,
            port,
            api: format!("http://127.0.0.1:{port}"),
            token: token.to_owned(),
            ns: ns.map(str::to_owned),
        }
    }

    /// `buffet ARGS --json` against the daemon with its admin token (in its namespace):
    /// success, stdout as JSON (or Null), and stderr.
    pub fn client<S: AsRef<OsStr>>(&self, args: &[S]) -> (bool, serde_json::Value, String) {
        let buffet = env!("CARGO_BIN_EXE_buffet");
        let mut c = match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, buffet]);
                c
            }
            None => Command::new(buffet),
        };
        let out = c
            .args(args)
            .arg("--json")
            .env("BUFFET_API", &self.api)
            .env("BUFFET_TOKEN", &self.token)
            .output()
            .unwrap();
        (
            out.status.success(),
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Sends it `SIG` (`kill -SIG`).
    pub fn signal(&self, sig: &str) {
        super::netns::signal(&self.child, sig);
    }
}
