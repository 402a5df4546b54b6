//! A single-member etcd server on loopback, as a child process: for the cluster tests,
//! the benchmark and trying a cluster on one machine. It uses the `etcd` binary of the
//! system (Debian's etcd-server), free ports and a temporary data directory, and is
//! killed on drop. It can be stopped and started again on the same ports and data (an
//! etcd restart). Not for production: no TLS, no peers, no auth.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why the local etcd could not run.
#[derive(Debug, thiserror::Error)]
pub enum LocalEtcdError {
    /// No `etcd` binary.
    #[error("no etcd binary ({path}): install Debian's etcd-server")]
    Missing {
        /// Where it was looked for.
        path: String,
    },
    /// It could not be started, or did not answer.
    #[error("etcd: {0}")]
    Start(String),
}

impl LocalEtcdError {
    /// Whether etcd is not installed (a test skips), rather than failed to start.
    pub fn is_missing(&self) -> bool {
        matches!(self, LocalEtcdError::Missing { .. })
    }
}

/// A running (or stopped) local etcd.
pub struct LocalEtcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    binary: PathBuf,
}

/// A free port, never one this process handed out before: tests start several etcds at
/// once, and a port the kernel gives out again could otherwise be another etcd's.
fn free_port() -> std::io::Result<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
}

/// The etcd binary: `$ETCD_BIN`, else `etcd` on `PATH`.
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ETCD_BIN") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("etcd"))
            .find(|p| p.is_file())
    })
}

impl LocalEtcd {
    /// Starts etcd and waits until it answers on its client port.
    pub fn start() -> Result<LocalEtcd, LocalEtcdError> {
        let binary = etcd_binary().ok_or_else(|| LocalEtcdError::Missing {
            path: "$ETCD_BIN or etcd on PATH".into(),
        })?;
        let dir = tempfile::tempdir().map_err(|e| LocalEtcdError::Start(e.to_string()))?;
        let client_port = free_port().map_err(|e| LocalEtcdError::Start(e.to_string()))?;
        let peer_port = free_port().map_err(|e| LocalEtcdError::Start(e.to_string()))?;
        let mut e = LocalEtcd {
            child: None,
            dir,
            client_port,
            peer_port,
            binary,
        };
        e.resume()?;
        Ok(e)
    }

    /// The client URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills etcd (SIGKILL), keeping its data.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data, and waits until it answers.
    pub fn resume(&mut self) -> Result<(), LocalEtcdError> {
        self.kill();
        let log = std::fs::File::create(self.dir.path().join("etcd.log"))
            .map_err(|e| LocalEtcdError::Start(e.to_string()))?;
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg("buffet-test")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(self.url())
            .arg("--advertise-client-urls")
            .arg(self.url())
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("buffet-test={peer}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| LocalEtcdError::Start(format!("{}: {e}", self.binary.display())))?;
        self.child = Some(child);
        let t0 = Instant::now();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.client_port));
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    let log = std::fs::read_to_string(self.dir.path().join("etcd.log"))
                        .unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(5).collect();
                    return Err(LocalEtcdError::Start(format!(
                        "exited with {status}: {}",
                        tail.join(" | ")
                    )));
                }
            }
            // Ready once this etcd says so, not when something answers on the port: a
            // listener there may be another process's, and this etcd may still be about
            // to fail to bind and exit (seen: a test then found the port refused).
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
                && std::fs::read_to_string(self.dir.path().join("etcd.log"))
                    .is_ok_and(|log| log.contains("ready to serve client requests"))
            {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(LocalEtcdError::Start("did not listen within 20 s".into()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.kill();
    }
}
