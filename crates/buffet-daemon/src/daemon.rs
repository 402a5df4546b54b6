//! The daemon's life: start (admin token, store, data plane, re-admission of every
//! stored tenant, then the API), the event pump and the Agent, and an orderly stop
//! (stop intake, drain the data plane, return its final report).
//!
//! The API runs on a tokio runtime of its own thread; the data plane on its own thread
//! (see [`crate::plane`]); the event pump on a third, reading the data plane's event
//! channel. Signals are the binary's business ([`crate::main`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use buffet_worker::{Report, WorkerEvent};
use tokio::sync::{broadcast, watch};

use crate::api::{self, AppState, Parts, RestoreError};
use crate::auth::{self, Auth, TokenError};
use crate::config::DaemonConfig;
use crate::metrics::Metrics;
use crate::plane::{self, Plane, StartError};
use crate::store::{Store, StoreError};

/// Why the daemon could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The admin token.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The data plane.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A stored tenant could not be re-admitted.
    #[error(transparent)]
    Restore(#[from] RestoreError),
    /// The API address.
    #[error("api.listen {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The runtime or a thread.
    #[error("{0}")]
    Runtime(String),
}

/// A running daemon.
pub struct Daemon {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<Report, DaemonError>>>,
}

impl Daemon {
    /// Starts everything `cfg` says and returns once the API accepts requests (every
    /// stored tenant re-admitted). `config_path` only names the config in errors.
    pub fn start(cfg: DaemonConfig, config_path: &Path) -> Result<Daemon, DaemonError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let path = config_path.to_owned();
        let thread = std::thread::Builder::new()
            .name("buffetd-api".into())
            .spawn(move || run(cfg, path, ready_tx, stop_rx))
            .map_err(|e| DaemonError::Runtime(format!("cannot start the API thread: {e}")))?;
        match ready_rx.recv() {
            Ok(addr) => Ok(Daemon {
                addr,
                stop: Some(stop_tx),
                thread: Some(thread),
            }),
            Err(_) => Err(match thread.join() {
                Ok(Err(e)) => e,
                Ok(Ok(_)) => DaemonError::Runtime("the daemon stopped while starting".into()),
                Err(_) => DaemonError::Runtime("the daemon panicked while starting".into()),
            }),
        }
    }

    /// The API's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops intake (the API), drains the data plane and returns its final report.
    pub fn stop(mut self) -> Result<Report, DaemonError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<Report, DaemonError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(DaemonError::Runtime("the daemon panicked".into()))),
            None => Err(DaemonError::Runtime("already stopped".into())),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.shutdown();
        }
    }
}

fn run(
    cfg: DaemonConfig,
    config_path: PathBuf,
    ready: std::sync::mpsc::Sender<SocketAddr>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<Report, DaemonError> {
    let (token, origin) = auth::admin_token(cfg.api.admin_token_file.as_deref(), &cfg.data_dir)?;
    eprintln!("buffetd: admin token from {origin}");
    let store = Arc::new(Store::open(&cfg.data_dir)?);
    let contents = store.load()?;
    let started = plane::start(&cfg, &config_path)?;
    let plane = started.plane.clone();
    let dataplane = started.thread;
    let finish = |plane: &Arc<dyn Plane>, dataplane: JoinHandle<Report>| {
        plane.stop();
        dataplane
            .join()
            .map_err(|_| DaemonError::Runtime("the data plane panicked".into()))
    };
    let metrics = Arc::new(Metrics::default());
    let (events_tx, _) = broadcast::channel(4096);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let refusing = Arc::new(Mutex::new(None));
    let auth = Auth::new(
        &token,
        contents
            .tokens
            .iter()
            .map(|(h, id)| (*h, buffet_sdk::TenantId(*id))),
    );
    let cluster = cfg.cluster.clone().map(|c| {
        crate::cluster::Hook::new(c, &token, plane.clone(), refusing.clone(), &cfg.dataplane)
    });
    drop(token);
    let state = Arc::new(AppState::new(Parts {
        plane: plane.clone(),
        store,
        auth,
        metrics: metrics.clone(),
        events: events_tx.clone(),
        shutdown: shutdown_rx,
        default_max_nb: cfg.dataplane.default_tenant_max_nb,
        max_workers: cfg.dataplane.max_workers,
        refusing: refusing.clone(),
    }));
    match state.restore(contents.tenants) {
        Ok(n) if n > 0 => eprintln!("buffetd: re-admitted {n} stored tenants"),
        Ok(_) => {}
        Err(e) => {
            let _ = finish(&plane, dataplane);
            return Err(e.into());
        }
    }
    let pump_stop = Arc::new(AtomicBool::new(false));
    let pump = {
        let agent = Agent {
            plane: plane.clone(),
            metrics,
            events: events_tx,
            refusing,
            launch: cfg.agent.launch_on_overload,
            max_workers: cfg.dataplane.max_workers,
            last_action: None,
        };
        let stop = pump_stop.clone();
        std::thread::Builder::new()
            .name("buffetd-events".into())
            .spawn(move || agent.run(&stop))
            .map_err(|e| DaemonError::Runtime(format!("cannot start the event thread: {e}")))?
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("buffetd-tokio")
        .enable_all()
        .build()
        .map_err(|e| DaemonError::Runtime(format!("tokio runtime: {e}")))?;
    let app = api::router(
        state.clone(),
        cfg.api.max_body_bytes,
        Duration::from_millis(cfg.api.request_timeout_ms),
    );
    let served = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(cfg.api.listen)
            .await
            .map_err(|source| DaemonError::Listen {
                addr: cfg.api.listen,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| DaemonError::Listen {
                addr: cfg.api.listen,
                source,
            })?;
        state.set_ready(true);
        eprintln!("buffetd: API on http://{addr}");
        let _ = ready.send(addr);
        let agent = cluster.map(|h| h.spawn(app.clone(), addr, shutdown_tx.subscribe()));
        let st = state.clone();
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop.await;
                st.set_ready(false);
                let _ = shutdown_tx.send(true);
            })
            .await
            .map_err(|e| DaemonError::Runtime(format!("API server: {e}")));
        if let Some(a) = agent {
            // The cluster Agent revokes its lease on the way out.
            let _ = tokio::time::timeout(Duration::from_secs(3), a).await;
        }
        served
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let report = finish(&plane, dataplane)?;
    pump_stop.store(true, Ordering::Release);
    let _ = pump.join();
    served?;
    Ok(report)
}

/// The Agent: reads the data plane's events, counts them, fans them out to
/// `/v1/events`, and answers overload reports: launch a worker while fewer than
/// `max_workers` are live; otherwise flag the server so that new admissions get 503
/// (cleared when a worker is launched or a tenant removed through the API).
struct Agent {
    plane: Arc<dyn Plane>,
    metrics: Arc<Metrics>,
    events: broadcast::Sender<WorkerEvent>,
    refusing: Arc<Mutex<Option<String>>>,
    launch: bool,
    max_workers: u16,
    /// Overload reports arrive once per check: act at most once a second.
    last_action: Option<Instant>,
}

impl Agent {
    fn run(mut self, stop: &AtomicBool) {
        let rx = self.plane.events();
        while !stop.load(Ordering::Acquire) {
            let Ok(e) = rx.recv_timeout(Duration::from_millis(100)) else {
                continue;
            };
            match &e {
                WorkerEvent::Migration { .. } => {
                    self.metrics.migrations.inc();
                }
                WorkerEvent::Overload { worker, slot, .. } => {
                    self.metrics.overload_reports.inc();
                    self.on_overload(*worker, *slot);
                }
                WorkerEvent::Fault { .. } => {
                    self.metrics.quarantines.inc();
                }
                _ => {}
            }
            let _ = self.events.send(e);
        }
    }

    fn on_overload(&mut self, worker: u16, slot: u64) {
        if self
            .last_action
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.last_action = Some(Instant::now());
        let live = match self.plane.report() {
            Ok(r) => r.workers.iter().filter(|w| w.live).count(),
            Err(_) => return,
        };
        if self.launch && live < usize::from(self.max_workers) {
            match self.plane.launch_worker() {
                Ok(id) => {
                    self.metrics.agent_launches.inc();
                    eprintln!("buffetd: agent: worker {worker} overloaded in slot {slot}: launched worker {id}");
                    return;
                }
                Err(e) => eprintln!("buffetd: agent: cannot launch a worker: {e}"),
            }
        }
        let reason = format!(
            "worker {worker} is overloaded (slot {slot}) and no worker can be launched \
             ({live} live, dataplane.max_workers {})",
            self.max_workers
        );
        let mut flag = self.refusing.lock().unwrap_or_else(PoisonError::into_inner);
        if flag.is_none() {
            eprintln!("buffetd: agent: refusing new tenants: {reason}");
        }
        *flag = Some(reason);
    }
}
