//! The daemon's life: start (the API's address, the store, the admin token, the data
//! plane, re-admission of every stored tenant that still fits the config — one that no
//! longer does is kept in the store, not run, and said on stderr — then the API serves;
//! a start that fails leaves data_dir as it found it), the event pump and the Agent, and
//! an orderly stop (stop intake, drain the data plane, return its final report).
//!
//! The API runs on a tokio runtime of its own thread; the data plane on its own thread
//! (see [`crate::plane`]); the event pump on a third, reading the data plane's event
//! channel. Signals are the binary's business ([`crate::main`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use buffet_config::chain::RegisteredStages;
use buffet_worker::{Report, WorkerEvent};
use tokio::sync::{broadcast, watch};

use crate::api::{self, AppState, Parts};
use crate::auth::{self, Auth, TokenError};
use crate::config::{ConfigError, DaemonConfig};
use crate::metrics::Metrics;
use crate::plane::{self, Plane, StartError};
use crate::serve::{self, ConnSetup};
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

/// Why a config reload was refused; when it is, nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// A field that only a restart can change differs from the running config.
    #[error("{field} cannot change without a restart")]
    Fixed {
        /// The field, e.g. `nf.name` or `dataplane.workers`.
        field: String,
    },
    /// The admin token could not be read.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The daemon is stopping.
    #[error("the daemon is stopping")]
    Stopping,
    /// The config could not be read again, or is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Where a reload reads the config from: by default the file the daemon started with;
/// the binary's source also applies its command-line overrides.
pub type ConfigSource = Arc<dyn Fn() -> Result<DaemonConfig, ConfigError> + Send + Sync>;

/// Builds and starts the data plane from the config (and the config's path, for errors).
pub type PlaneStarter =
    Box<dyn FnOnce(&DaemonConfig, &Path) -> Result<plane::Started, StartError> + Send>;

/// What a config reload can reach in a running daemon.
struct Live {
    state: Arc<AppState>,
    agent: Arc<AgentPolicy>,
    setup: watch::Sender<ConnSetup>,
    config: Mutex<DaemonConfig>,
    /// The admin token's hash: a reload that reads the same file tells a rotated token
    /// from the same one read again.
    admin_token: Mutex<[u8; 32]>,
    source: Mutex<ConfigSource>,
}

/// The Agent's settings, changed by a reload.
struct AgentPolicy {
    launch: AtomicBool,
    max_workers: AtomicU16,
}

/// A running daemon.
pub struct Daemon {
    addr: SocketAddr,
    live: Arc<Live>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<Report, DaemonError>>>,
}

impl Daemon {
    /// Starts everything `cfg` says and returns once the API accepts requests (every
    /// stored tenant re-admitted). `config_path` names the config in errors and is what
    /// a reload reads again (see [`set_config_source`](Self::set_config_source)).
    pub fn start(cfg: DaemonConfig, config_path: &Path) -> Result<Daemon, DaemonError> {
        Self::start_with(cfg, config_path, Box::new(plane::start))
    }

    /// [`start`](Self::start) for a program that embeds the daemon with NFs of its own
    /// registered by name (the registry `buffet`'s command uses, e.g.
    /// `buffet::cli::Registry`): `nf.offered` and tenants' chains in the API may name them
    /// as stages ([`plane::start_registered`]). Read `cfg` with
    /// [`DaemonConfig::load_registered`] and the same names.
    pub fn start_registered<R>(
        cfg: DaemonConfig,
        config_path: &Path,
        registered: R,
    ) -> Result<Daemon, DaemonError>
    where
        R: RegisteredStages + Send + 'static,
    {
        Self::start_with(
            cfg,
            config_path,
            Box::new(move |cfg, path| plane::start_registered(cfg, path, &registered)),
        )
    }

    /// [`start`](Self::start) with the data plane `starter` builds from the config
    /// instead of the one the config names: an embedder's own NF
    /// ([`plane::start_nf`]).
    pub fn start_with(
        cfg: DaemonConfig,
        config_path: &Path,
        starter: PlaneStarter,
    ) -> Result<Daemon, DaemonError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let path = config_path.to_owned();
        let thread = std::thread::Builder::new()
            .name("buffetd-api".into())
            .spawn(move || run(cfg, path, starter, ready_tx, stop_rx))
            .map_err(|e| DaemonError::Runtime(format!("cannot start the API thread: {e}")))?;
        match ready_rx.recv() {
            Ok((addr, live)) => Ok(Daemon {
                addr,
                live,
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

    /// The API's routes with their layers (body limit, request timeout), as served now:
    /// for callers in this process that send requests without a socket (the API's fuzz
    /// target). Auth and validation are the routes' own, as over HTTP.
    pub fn router(&self) -> axum::Router {
        self.live.setup.borrow().router.clone()
    }

    /// Applies what of `new` can change while running, all or nothing, and returns the
    /// fields it changed. Reloadable: `api.admin_token_file` (and the token it holds,
    /// read again), `api.max_body_bytes`, `api.request_timeout_ms`,
    /// `api.header_read_timeout_ms` (these three for connections accepted from now on),
    /// `dataplane.max_workers`, `dataplane.default_tenant_max_nb` and `[agent]`. Any
    /// other field that differs from the running config refuses the whole reload,
    /// naming the first such field.
    pub fn reload(&self, new: DaemonConfig) -> Result<Vec<&'static str>, ReloadError> {
        self.live.reload(new)
    }

    /// Reads the config again from its source (see [`set_config_source`](Self::set_config_source))
    /// and [`reload`](Self::reload)s it: what SIGHUP and `POST /v1/reload` both do.
    pub fn reload_config(&self) -> Result<Vec<&'static str>, ReloadError> {
        self.live.reload_config()
    }

    /// Replaces where [`reload_config`](Self::reload_config) reads the config (by
    /// default: the file the daemon was started with, without overrides).
    pub fn set_config_source(&self, source: ConfigSource) {
        *self
            .live
            .source
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = source;
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

impl Live {
    /// See [`Daemon::reload_config`]. One reload at a time: the source's lock is held
    /// from reading the config to applying it, so two reloads never apply out of order.
    fn reload_config(&self) -> Result<Vec<&'static str>, ReloadError> {
        let source = self.source.lock().unwrap_or_else(PoisonError::into_inner);
        let new = source()?;
        self.reload(new)
    }

    /// See [`Daemon::reload`].
    fn reload(&self, new: DaemonConfig) -> Result<Vec<&'static str>, ReloadError> {
        let live = self;
        let mut cur = live.config.lock().unwrap_or_else(PoisonError::into_inner);
        fixed_change(&cur, &new).map_or(Ok(()), |field| Err(ReloadError::Fixed { field }))?;
        let token = if new.api.admin_token_file != cur.api.admin_token_file
            || new.api.admin_token_file.is_some()
        {
            Some(auth::admin_token(new.api.admin_token_file.as_deref(), &new.data_dir)?.0)
        } else {
            None
        };
        let (a, b) = (&cur.api, &new.api);
        let (d, e) = (&cur.dataplane, &new.dataplane);
        let mut held = live
            .admin_token
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let new_hash = token.as_deref().map(auth::hash);
        let rotated = new_hash.is_some_and(|h| h != *held);
        let moved = a.admin_token_file != b.admin_token_file;
        let changed: Vec<&'static str> = [
            ("api.admin_token_file", moved),
            ("api.admin_token_file (token)", rotated && !moved),
            ("api.max_body_bytes", a.max_body_bytes != b.max_body_bytes),
            (
                "api.request_timeout_ms",
                a.request_timeout_ms != b.request_timeout_ms,
            ),
            (
                "api.header_read_timeout_ms",
                a.header_read_timeout_ms != b.header_read_timeout_ms,
            ),
            ("dataplane.max_workers", d.max_workers != e.max_workers),
            (
                "dataplane.default_tenant_max_nb",
                d.default_tenant_max_nb != e.default_tenant_max_nb,
            ),
            (
                "agent.launch_on_overload",
                cur.agent.launch_on_overload != new.agent.launch_on_overload,
            ),
        ]
        .into_iter()
        .filter_map(|(f, c)| c.then_some(f))
        .collect();
        // First the one step that can fail (the server loop has gone: stopping).
        if live.setup.send(conn_setup(&live.state, &new)).is_err() {
            return Err(ReloadError::Stopping);
        }
        if let Some(t) = token {
            live.state.auth().set_admin(&t);
        }
        if let Some(h) = new_hash {
            *held = h;
        }
        live.state
            .set_limits(e.default_tenant_max_nb, e.max_workers);
        live.agent
            .launch
            .store(new.agent.launch_on_overload, Ordering::Release);
        live.agent
            .max_workers
            .store(e.max_workers, Ordering::Release);
        *cur = new;
        Ok(changed)
    }
}

/// The first field of `new` that differs from `cur` and cannot change while running.
fn fixed_change(cur: &DaemonConfig, new: &DaemonConfig) -> Option<String> {
    let mut probe = new.clone();
    probe
        .api
        .admin_token_file
        .clone_from(&cur.api.admin_token_file);
    probe.api.max_body_bytes = cur.api.max_body_bytes;
    probe.api.request_timeout_ms = cur.api.request_timeout_ms;
    probe.api.header_read_timeout_ms = cur.api.header_read_timeout_ms;
    probe.dataplane.max_workers = cur.dataplane.max_workers;
    probe.dataplane.default_tenant_max_nb = cur.dataplane.default_tenant_max_nb;
    probe.agent = cur.agent.clone();
    let (p, c) = (&probe, cur);
    let fields: [(&str, bool); 16] = [
        ("data_dir", p.data_dir != c.data_dir),
        ("api.listen", p.api.listen != c.api.listen),
        (
            "api.max_connections",
            p.api.max_connections != c.api.max_connections,
        ),
        ("nf", p.nf != c.nf),
        (
            "dataplane.workers",
            p.dataplane.workers != c.dataplane.workers,
        ),
        (
            "dataplane.worker_max_nb",
            p.dataplane.worker_max_nb != c.dataplane.worker_max_nb,
        ),
        ("dataplane.shift", p.dataplane.shift != c.dataplane.shift),
        (
            "dataplane.threshold",
            p.dataplane.threshold != c.dataplane.threshold,
        ),
        (
            "dataplane.planner",
            p.dataplane.planner != c.dataplane.planner,
        ),
        (
            "dataplane.tenant_slots",
            p.dataplane.tenant_slots != c.dataplane.tenant_slots,
        ),
        (
            "dataplane.arena_mib",
            p.dataplane.arena_mib != c.dataplane.arena_mib,
        ),
        ("dataplane.pin", p.dataplane.pin != c.dataplane.pin),
        (
            "dataplane.idle_wait_us",
            p.dataplane.idle_wait_us != c.dataplane.idle_wait_us,
        ),
        ("port", p.ports != c.ports),
        ("dispatch", p.dispatch != c.dispatch),
        ("dataplane", p.dataplane != c.dataplane),
    ];
    if let Some((f, _)) = fields.iter().find(|(_, differs)| *differs) {
        return Some((*f).to_owned());
    }
    // Any table not named above (compared by its printed form).
    (format!("{p:?}") != format!("{c:?}"))
        .then(|| "a table other than [api], [dataplane] and [agent]".to_owned())
}

/// A new connection's router and head deadline, from `cfg`.
fn conn_setup(state: &Arc<AppState>, cfg: &DaemonConfig) -> ConnSetup {
    ConnSetup {
        router: api::router(
            state.clone(),
            cfg.api.max_body_bytes,
            Duration::from_millis(cfg.api.request_timeout_ms),
        ),
        header_read_timeout: Duration::from_millis(cfg.api.header_read_timeout_ms),
        linger_bytes: cfg.api.max_body_bytes as u64,
    }
}

fn run(
    cfg: DaemonConfig,
    config_path: PathBuf,
    starter: PlaneStarter,
    ready: std::sync::mpsc::Sender<(SocketAddr, Arc<Live>)>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<Report, DaemonError> {
    // What can fail without changing anything on disk comes first: the API's address
    // (in use by another process; reserved, not yet listening), then the store's lock
    // (another buffetd on this data_dir). Whatever this start creates in data_dir
    // afterwards is removed again if it fails before the API serves.
    let reserved = Reserved::bind(cfg.api.listen)?;
    let mut created = Created::new(&cfg.data_dir);
    let store = created.file("buffetd.redb", || Store::open(&cfg.data_dir))?;
    let store = Arc::new(store);
    created.hold(store.clone());
    let (token, origin) = created.file("admin.token", || {
        auth::admin_token(cfg.api.admin_token_file.as_deref(), &cfg.data_dir)
    })?;
    let contents = store.load()?;
    // The cluster instance id only touches data_dir: kept before the data plane starts,
    // so failing here stops nothing that runs.
    let instance = match &cfg.cluster {
        Some(_) => Some(
            created
                .file("cluster-instance", || {
                    crate::cluster::instance_id(&cfg.data_dir)
                })
                .map_err(|e| {
                    DaemonError::Runtime(format!("cannot keep the cluster instance id: {e}"))
                })?,
        ),
        None => None,
    };
    let started = starter(&cfg, &config_path)?;
    let plane = started.plane.clone();
    let dataplane = started.thread;
    let finish =
        |plane: &Arc<dyn Plane>, dataplane: JoinHandle<Report>| -> Result<Report, DaemonError> {
            plane.stop();
            let mut report = dataplane
                .join()
                .map_err(|_| DaemonError::Runtime("the data plane panicked".into()))?;
            plane.complete_report(&mut report);
            Ok(report)
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
    let cluster = match (cfg.cluster.clone(), instance) {
        (Some(c), Some(instance)) => Some(crate::cluster::Hook::new(
            c,
            instance,
            plane.clone(),
            refusing.clone(),
            &cfg.dataplane,
        )),
        _ => None,
    };
    let admin_hash = auth::hash(&token);
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
        xdp_ifaces: cfg.xdp_ifaces(),
    }));
    // A stored tenant the config no longer admits is kept in the store, not run: the
    // others are not held hostage to it, and the API can remove or replace it.
    let restored = state.restore(contents.tenants);
    if restored.admitted > 0 {
        eprintln!("buffetd: re-admitted {} stored tenants", restored.admitted);
    }
    let store_path = cfg.data_dir.join("buffetd.redb");
    for e in &restored.kept {
        eprintln!(
            "buffetd: store {}: {} not restored, kept in the store and not running: {} \
             (DELETE /v1/tenants/{id} removes it, PUT /v1/tenants/{id} replaces it)",
            store_path.display(),
            e.head(),
            e.cause,
            id = e.id,
        );
    }
    // A restored tenant matching on `vlan` where frames come through XDP, said as its
    // admission said it.
    if let Some(w) = state.vlan_warning() {
        eprintln!("{w}");
    }
    let pump_stop = Arc::new(AtomicBool::new(false));
    let policy = Arc::new(AgentPolicy {
        launch: AtomicBool::new(cfg.agent.launch_on_overload),
        max_workers: AtomicU16::new(cfg.dataplane.max_workers),
    });
    let pump = {
        let agent = Agent {
            plane: plane.clone(),
            metrics,
            events: events_tx,
            refusing,
            policy: policy.clone(),
            last_action: None,
        };
        let stop = pump_stop.clone();
        match std::thread::Builder::new()
            .name("buffetd-events".into())
            .spawn(move || agent.run(&stop))
        {
            Ok(pump) => pump,
            Err(e) => {
                // The data plane runs: stopped before the error returns.
                let _ = finish(&plane, dataplane);
                return Err(DaemonError::Runtime(format!(
                    "cannot start the event thread: {e}"
                )));
            }
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("buffetd-tokio")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            pump_stop.store(true, Ordering::Release);
            let _ = finish(&plane, dataplane);
            let _ = pump.join();
            return Err(DaemonError::Runtime(format!("tokio runtime: {e}")));
        }
    };
    let (setup, setup_rx) = watch::channel(conn_setup(&state, &cfg));
    let max_connections = cfg.api.max_connections;
    let listen = cfg.api.listen;
    let file = config_path;
    let live = Arc::new(Live {
        state: state.clone(),
        agent: policy,
        setup,
        config: Mutex::new(cfg),
        admin_token: Mutex::new(admin_hash),
        source: {
            // The embedder's registered NF names: `nf.offered` may name them on reload too.
            let names = plane.registered_names().to_vec();
            Mutex::new(Arc::new(move || {
                DaemonConfig::load_registered(&file, &names)
            }))
        },
    });
    // `POST /v1/reload`: the same path as SIGHUP. Weak: the state must not keep alive
    // what holds it.
    let weak: Weak<Live> = Arc::downgrade(&live);
    state.set_reloader(Arc::new(move || match weak.upgrade() {
        Some(l) => l.reload_config(),
        None => Err(ReloadError::Stopping),
    }));
    let served = rt.block_on(async {
        // Only now does the kernel accept connections: one made earlier in the start was
        // refused, not left waiting in the backlog of a daemon that might still fail.
        let listener = reserved.listen().and_then(|l| {
            tokio::net::TcpListener::from_std(l).map_err(|source| DaemonError::Listen {
                addr: listen,
                source,
            })
        })?;
        let addr = listener
            .local_addr()
            .map_err(|source| DaemonError::Listen {
                addr: listen,
                source,
            })?;
        state.set_ready(true);
        // Said once started: a failed start removes a token it generated.
        eprintln!("buffetd: admin token: {origin}");
        eprintln!("buffetd: API on http://{addr}");
        // Started: what this start wrote into data_dir is the daemon's data now.
        created.keep();
        let _ = ready.send((addr, live));
        // The cluster Agent admits placed tenants through the API's own routes, as set up
        // at start (a reload's new request limits apply to clients, not to it).
        let agent = cluster.map(|h| {
            let router = setup_rx.borrow().router.clone();
            h.spawn(router, addr, shutdown_tx.subscribe())
        });
        let st = state.clone();
        serve::serve(listener, setup_rx, max_connections, async move {
            let _ = stop.await;
            st.set_ready(false);
            let _ = shutdown_tx.send(true);
        })
        .await;
        if let Some(a) = agent {
            // The cluster Agent revokes its lease on the way out.
            let _ = tokio::time::timeout(Duration::from_secs(3), a).await;
        }
        Ok::<(), DaemonError>(())
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    let report = finish(&plane, dataplane)?;
    pump_stop.store(true, Ordering::Release);
    let _ = pump.join();
    served?;
    Ok(report)
}

/// The API's address, bound but not listening: a busy address is found before anything
/// else is done, yet a client connecting during the start is refused (ECONNREFUSED)
/// instead of waiting in the backlog of a daemon that is not serving yet, and a TCP
/// readiness probe does not pass before the API serves.
struct Reserved {
    socket: socket2::Socket,
    addr: SocketAddr,
}

impl Reserved {
    /// Binds `addr` with `SO_REUSEADDR`, as std's and tokio's listeners do (a restart
    /// binds while the last run's connections are in TIME_WAIT).
    fn bind(addr: SocketAddr) -> Result<Reserved, DaemonError> {
        use socket2::{Domain, Protocol, Socket, Type};
        let err = |source| DaemonError::Listen { addr, source };
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(err)?;
        socket.set_reuse_address(true).map_err(err)?;
        socket.bind(&addr.into()).map_err(err)?;
        Ok(Reserved { socket, addr })
    }

    /// Starts listening (non-blocking, for tokio). Another process that bound the same
    /// address meanwhile and listens first makes this fail with "address in use".
    fn listen(self) -> Result<std::net::TcpListener, DaemonError> {
        let addr = self.addr;
        let err = |source| DaemonError::Listen { addr, source };
        self.socket.listen(1024).map_err(err)?;
        self.socket.set_nonblocking(true).map_err(err)?;
        Ok(self.socket.into())
    }
}

/// The files a start creates in the data directory (and the directory itself), removed
/// again when the start fails before the API serves: a failed start leaves the disk as
/// it found it. A file that was there before is never removed, nor one whose creating
/// step failed (another buffetd may have made it meanwhile). The files are removed while
/// the store is still open ([`hold`](Self::hold)): no other buffetd can take the
/// data_dir as its own until they are gone.
struct Created {
    dir: PathBuf,
    /// The directories of `dir`'s path that did not exist, deepest first: removed
    /// too, each if empty.
    new_dirs: Vec<PathBuf>,
    /// Files this start created.
    files: Vec<PathBuf>,
    /// The open store, whose lock keeps other buffetds out of the data_dir: released
    /// only after the files are removed (a field drops after `drop` has run).
    store: Option<Arc<Store>>,
    keep: bool,
}

impl Created {
    fn new(dir: &Path) -> Created {
        Created {
            dir: dir.to_owned(),
            new_dirs: dir
                .ancestors()
                .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
                .map(Path::to_owned)
                .collect(),
            files: Vec::new(),
            store: None,
            keep: false,
        }
    }

    /// Keeps `store` open until the files this start created are removed.
    fn hold(&mut self, store: Arc<Store>) {
        self.store = Some(store);
    }

    /// Runs `make`, which may create `<dir>/<name>`; if it succeeds and the file was not
    /// there before, the file is this start's.
    fn file<T, E>(&mut self, name: &str, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let path = self.dir.join(name);
        let before = path.exists();
        let out = make()?;
        if !before && path.exists() {
            self.files.push(path);
        }
        Ok(out)
    }

    /// The start succeeded: keep everything.
    fn keep(&mut self) {
        self.keep = true;
        self.store = None;
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for f in self.files.iter().rev() {
            let _ = std::fs::remove_file(f);
        }
        for d in &self.new_dirs {
            // Only if empty: anything else in it is not this start's.
            if std::fs::remove_dir(d).is_err() {
                break;
            }
        }
    }
}

/// The Agent: reads the data plane's events, counts them, fans them out to
/// `/v1/events`, and answers overload reports: launch a worker while fewer than
/// `max_workers` are live; otherwise flag the server so that new admissions get 503
/// (cleared when a worker is launched, by the Agent or through the API, or a running
/// tenant removed through the API, by `DELETE` or in a tenant set).
struct Agent {
    plane: Arc<dyn Plane>,
    metrics: Arc<Metrics>,
    events: broadcast::Sender<WorkerEvent>,
    refusing: Arc<Mutex<Option<String>>>,
    policy: Arc<AgentPolicy>,
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
            // The data plane's own reaction first (the XDP program's Worker Table).
            self.plane.on_event(&e);
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
        let max_workers = self.policy.max_workers.load(Ordering::Acquire);
        if self.policy.launch.load(Ordering::Acquire) && live < usize::from(max_workers) {
            match self.plane.launch_worker() {
                Ok(id) => {
                    self.metrics.agent_launches.inc();
                    eprintln!("buffetd: agent: worker {worker} overloaded in slot {slot}: launched worker {id}");
                    // A worker more: admitting again, as after `POST /v1/workers`.
                    *self.refusing.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    return;
                }
                Err(e) => eprintln!("buffetd: agent: cannot launch a worker: {e}"),
            }
        }
        let reason = format!(
            "worker {worker} is overloaded (slot {slot}) and no worker can be launched \
             ({live} live, dataplane.max_workers {max_workers})"
        );
        let mut flag = self.refusing.lock().unwrap_or_else(PoisonError::into_inner);
        if flag.is_none() {
            eprintln!("buffetd: agent: refusing new tenants: {reason}");
        }
        *flag = Some(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Batch, StoreError};
    use serde_json::{json, Value};

    /// A config on a loopback port with its admin token in `<dir>/admin.token`.
    fn test_config(dir: &Path, token: &str) -> DaemonConfig {
        std::fs::write(dir.join("admin.token"), format!("{token}\n")).unwrap();
        let text = format!(
            "data_dir = \"{d}/data\"\n[api]\nlisten = \"127.0.0.1:0\"\n\
             admin_token_file = \"{d}/admin.token\"\n[nf]\nname = \"firewall\"\n\
             [dataplane]\nworkers = 1\ntenant_slots = 16\narena_mib = 64\n\
             [[port]]\nkind = \"generator\"\ntenants = 2\nrate_pps = 1000\n",
            d = dir.display()
        );
        DaemonConfig::parse(Path::new("test.toml"), &text).unwrap()
    }

    /// The cluster Agent calls the daemon's routes in-process as the daemon itself: a
    /// reload that replaces the admin token (the old one then gets 401) leaves it the
    /// admin.
    #[test]
    fn the_daemons_own_requests_stay_admin_when_the_admin_token_is_rotated() {
        use axum::body::Body;
        use axum::http::{header, Method, Request, StatusCode};
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let old = "the-admin-token-at-start-0123456789";
        let cfg = test_config(dir.path(), old);
        let d = Daemon::start(cfg.clone(), Path::new("test.toml")).unwrap();
        std::fs::write(
            dir.path().join("admin.token"),
            "the-admin-token-after-reload-98765\n",
        )
        .unwrap();
        d.reload(cfg).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let send = |req: Request<Body>| {
            let router = d.router();
            rt.block_on(async move { router.oneshot(req).await.unwrap().status() })
        };
        let with_old_token = Request::get("/v1/tenants")
            .header(header::AUTHORIZATION, format!("Bearer {old}"))
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(with_old_token), StatusCode::UNAUTHORIZED);
        // As the Agent's `call` builds them.
        let own = |method: Method, uri: &str, body: &str| {
            Request::builder()
                .method(method)
                .uri(uri)
                .extension(api::Internal)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_owned()))
                .unwrap()
        };
        let doc = r#"{"id": 7, "rules": [{"dst_ip": "10.0.0.0/24"}]}"#;
        assert_eq!(
            send(own(Method::POST, "/v1/tenants", doc)),
            StatusCode::CREATED
        );
        assert_eq!(send(own(Method::GET, "/v1/tenants", "")), StatusCode::OK);
        assert_eq!(
            send(own(Method::DELETE, "/v1/tenants/7", "")),
            StatusCode::NO_CONTENT
        );
        d.stop().unwrap();
    }

    /// The daemon's own API, called in-process as the cluster Agent calls it (the
    /// admin, no token).
    struct Own {
        rt: tokio::runtime::Runtime,
    }

    impl Own {
        fn new() -> Own {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            Own { rt }
        }

        /// `method uri` with `body`: the status and the answer's text.
        fn text(&self, d: &Daemon, method: &str, uri: &str, body: Option<&Value>) -> (u16, String) {
            use axum::body::Body;
            use axum::http::{header, Request};
            use tower::ServiceExt;
            let req = Request::builder()
                .method(method)
                .uri(uri)
                .extension(api::Internal)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.map(Value::to_string).unwrap_or_default()))
                .unwrap();
            let router = d.router();
            self.rt.block_on(async move {
                let r = router.oneshot(req).await.unwrap();
                let status = r.status().as_u16();
                let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
                    .await
                    .unwrap();
                (status, String::from_utf8_lossy(&bytes).into_owned())
            })
        }

        /// `method uri` with `body`: the status and the answer as JSON (Null if none).
        fn call(&self, d: &Daemon, method: &str, uri: &str, body: Option<&Value>) -> (u16, Value) {
            let (s, text) = self.text(d, method, uri, body);
            (s, serde_json::from_str(&text).unwrap_or(Value::Null))
        }

        /// `buffet_refused_admissions_total` in `/metrics`.
        fn refused_admissions(&self, d: &Daemon) -> u64 {
            let (s, text) = self.text(d, "GET", "/metrics", None);
            assert_eq!(s, 200, "{text}");
            text.lines()
                .find_map(|l| l.strip_prefix("buffet_refused_admissions_total "))
                .unwrap_or_else(|| panic!("no refused admissions counter: {text}"))
                .trim()
                .parse()
                .unwrap()
        }
    }

    /// A tenant owning `prefix`.
    fn tenant(id: u32, prefix: &str) -> Value {
        json!({ "id": id, "rules": [ { "dst_ip": prefix } ] })
    }

    const TOKEN: &str = "the-admin-token-of-the-api-tests-0123";

    /// A daemon whose store had tenants 1..=`stored` (tenant `i` on `10.0.i.0/24`),
    /// restarted with `slots` Tenant Table slots: tenants 1..=`slots` run, the others
    /// are kept not running.
    fn with_not_restored(dir: &Path, own: &Own, stored: u32, slots: u32) -> Daemon {
        let cfg = test_config(dir, TOKEN);
        let d = Daemon::start(cfg.clone(), Path::new("test.toml")).unwrap();
        for id in 1..=stored {
            let t = tenant(id, &format!("10.0.{id}.0/24"));
            let (s, v) = own.call(&d, "POST", "/v1/tenants", Some(&t));
            assert_eq!(s, 201, "{v}");
        }
        d.stop().unwrap();
        let mut cfg = cfg;
        cfg.dataplane.tenant_slots = slots;
        let d = Daemon::start(cfg, Path::new("test.toml")).unwrap();
        let (s, v) = own.call(&d, "GET", "/v1/tenants", None);
        assert_eq!(s, 200, "{v}");
        let kept: Vec<u64> = v["tenant"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["state"] == "not_restored")
            .map(|t| t["id"].as_u64().unwrap())
            .collect();
        assert_eq!(
            kept,
            (u64::from(slots) + 1..=u64::from(stored)).collect::<Vec<_>>()
        );
        d
    }

    /// While the Agent refuses new tenants, a tenant set that adds one is refused with
    /// 503 before anything else is checked in it, as an admission is (the overlap of its
    /// new tenant with a running one would be a 409), and only a set that is applied
    /// counts a refused admission: a dry run says the same and counts nothing.
    #[test]
    fn a_tenant_set_is_refused_first_like_an_admission_and_a_dry_run_counts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let own = Own::new();
        let d = Daemon::start(test_config(dir.path(), TOKEN), Path::new("test.toml")).unwrap();
        let (s, v) = own.call(&d, "POST", "/v1/tenants", Some(&tenant(1, "10.0.0.0/24")));
        assert_eq!(s, 201, "{v}");
        let overlapping = tenant(2, "10.0.0.0/25");
        let set = |t: &Value| json!({ "tenant": [ tenant(1, "10.0.0.0/24"), t ] });
        let refused = |s: u16, v: &Value| {
            s == 503
                && v["error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("not admitting new tenants: "))
        };
        d.live.state.set_refusing(Some("worker 0 is overloaded"));
        let dry = "/v1/tenants?dry_run=true";
        let (s, v) = own.call(&d, "PUT", dry, Some(&set(&overlapping)));
        assert!(refused(s, &v), "{s} {v}");
        let (s, v) = own.call(&d, "PUT", dry, Some(&set(&tenant(3, "10.0.3.0/24"))));
        assert!(refused(s, &v), "{s} {v}");
        assert_eq!(own.refused_admissions(&d), 0);
        // Applied: refused first and counted, as an admission of the same tenant is.
        let (s, v) = own.call(&d, "PUT", "/v1/tenants", Some(&set(&overlapping)));
        assert!(refused(s, &v), "{s} {v}");
        assert_eq!(own.refused_admissions(&d), 1);
        let (s, v) = own.call(&d, "POST", "/v1/tenants", Some(&overlapping));
        assert!(refused(s, &v), "{s} {v}");
        assert_eq!(own.refused_admissions(&d), 2);
        // A set that adds no tenant is not refused.
        let only = json!({ "tenant": [ tenant(1, "10.0.0.0/24") ] });
        let (s, v) = own.call(&d, "PUT", dry, Some(&only));
        assert_eq!(s, 200, "{v}");
        // Not refusing: the overlap is what is wrong with the set.
        d.live.state.set_refusing(None);
        let (s, v) = own.call(&d, "PUT", dry, Some(&set(&overlapping)));
        assert_eq!(s, 409, "{v}");
        assert_eq!(own.refused_admissions(&d), 2);
        d.stop().unwrap();
    }

    /// Removing a stored tenant kept not running frees nothing in the data plane (it held
    /// no slot, no region, no worker's load), so it leaves the Agent's refusal as it is,
    /// by `DELETE` and in a tenant set alike; removing a running tenant lifts it.
    #[test]
    fn removing_a_tenant_kept_not_running_keeps_the_agents_refusal() {
        let dir = tempfile::tempdir().unwrap();
        let own = Own::new();
        let d = with_not_restored(dir.path(), &own, 4, 2);
        let state = d.live.state.clone();
        state.set_refusing(Some("worker 0 is overloaded"));
        let (s, v) = own.call(&d, "DELETE", "/v1/tenants/4", None);
        assert_eq!(s, 204, "{v}");
        assert!(state.refusing_now().is_some(), "lifted by a DELETE");
        let running = |ids: &[u32]| {
            let list: Vec<Value> = ids
                .iter()
                .map(|id| tenant(*id, &format!("10.0.{id}.0/24")))
                .collect();
            json!({ "tenant": list })
        };
        let (s, v) = own.call(&d, "PUT", "/v1/tenants", Some(&running(&[1, 2])));
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["removed"], json!([3]), "{v}");
        assert!(state.refusing_now().is_some(), "lifted by a tenant set");
        let (s, v) = own.call(&d, "PUT", "/v1/tenants", Some(&running(&[1])));
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["removed"], json!([2]), "{v}");
        assert!(state.refusing_now().is_none(), "a running tenant's removal");
        d.stop().unwrap();
    }

    /// A stored tenant kept not running, read with `GET` and sent back as it was read
    /// (with its `state` and `reason`), is admitted once it fits, by
    /// `PUT /v1/tenants/{id}` and in a tenant set alike; with a `state` of another value
    /// they are still unknown fields.
    #[test]
    fn a_not_restored_tenant_sent_back_as_read_is_admitted_once_it_fits() {
        let dir = tempfile::tempdir().unwrap();
        let own = Own::new();
        let d = with_not_restored(dir.path(), &own, 3, 2);
        let (s, doc) = own.call(&d, "GET", "/v1/tenants/3", None);
        assert_eq!(s, 200, "{doc}");
        assert_eq!(doc["state"], "not_restored", "{doc}");
        // Still no room: refused for that, not for the fields of its listing.
        let (s, v) = own.call(&d, "PUT", "/v1/tenants/3", Some(&doc));
        assert_eq!(s, 409, "{v}");
        assert!(
            v["error"].as_str().unwrap().contains("too many tenants"),
            "{v}"
        );
        let mut live = doc.clone();
        live["state"] = json!("live");
        let (s, v) = own.call(&d, "PUT", "/v1/tenants/3", Some(&live));
        assert_eq!(s, 422, "{v}");
        assert!(
            v["error"].as_str().unwrap().contains("unknown field"),
            "{v}"
        );
        let (s, v) = own.call(&d, "DELETE", "/v1/tenants/2", None);
        assert_eq!(s, 204, "{v}");
        let (s, v) = own.call(&d, "PUT", "/v1/tenants/3", Some(&doc));
        assert_eq!(s, 200, "{v}");
        assert!(v.get("state").is_none() && v.get("reason").is_none(), "{v}");
        let (s, v) = own.call(&d, "GET", "/v1/tenants/3", None);
        assert_eq!((s, v.get("state")), (200, None), "{v}");
        let cfg = d.live.config.lock().unwrap().clone();
        d.stop().unwrap();

        // A tenant set read with `GET /v1/tenants` and sent back.
        let mut cfg = cfg;
        cfg.dataplane.tenant_slots = 1;
        let d = Daemon::start(cfg, Path::new("test.toml")).unwrap();
        let (s, v) = own.call(&d, "DELETE", "/v1/tenants/1", None);
        assert_eq!(s, 204, "{v}");
        let (s, list) = own.call(&d, "GET", "/v1/tenants", None);
        assert_eq!(s, 200, "{list}");
        assert_eq!(list["tenant"][0]["state"], "not_restored", "{list}");
        let (s, v) = own.call(&d, "PUT", "/v1/tenants", Some(&list));
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["added"], json!([3]), "{v}");
        let (s, v) = own.call(&d, "GET", "/v1/tenants", None);
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["tenant"][0]["id"], 3, "{v}");
        assert!(v["tenant"][0].get("state").is_none(), "{v}");
        d.stop().unwrap();
    }

    /// The reason a stored tenant is not running is the refusal's cause alone, whatever
    /// the tenant's name holds: a name with `): ` in it does not cut it short.
    #[test]
    fn a_not_restored_tenants_reason_is_whole_whatever_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let own = Own::new();
        let cfg = test_config(dir.path(), TOKEN);
        // Stored before a check it now fails (a prefix the schema refuses).
        let doc = json!({ "id": 9, "name": "edge): west \"2\"",
                          "rules": [ { "dst_ip": "10.0.0.300/24" } ] });
        {
            let store = Store::open(&cfg.data_dir).unwrap();
            let put = vec![(9, serde_json::to_vec(&doc).unwrap())];
            store
                .apply(&Batch {
                    put,
                    delete: vec![],
                })
                .unwrap();
        }
        let d = Daemon::start(cfg, Path::new("test.toml")).unwrap();
        let (s, v) = own.call(&d, "GET", "/v1/tenants/9", None);
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["state"], "not_restored", "{v}");
        let reason = v["reason"].as_str().unwrap();
        assert!(reason.starts_with("rules[0].dst_ip: "), "{reason}");
        assert!(
            !reason.contains("edge") && !reason.contains("tenant"),
            "{reason}"
        );
        assert_eq!(v["name"], doc["name"], "{v}");
        d.stop().unwrap();
    }

    #[test]
    fn a_reload_reports_a_token_rotated_in_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = test_config(dir.path(), "the-admin-token-at-start-0123456789");
        let d = Daemon::start(cfg.clone(), Path::new("test.toml")).unwrap();
        assert!(d.reload(cfg.clone()).unwrap().is_empty());
        std::fs::write(
            dir.path().join("admin.token"),
            "the-admin-token-after-reload-98765\n",
        )
        .unwrap();
        assert_eq!(
            d.reload(cfg.clone()).unwrap(),
            ["api.admin_token_file (token)"]
        );
        // Read again, the same token: nothing changed.
        assert!(d.reload(cfg).unwrap().is_empty());
        d.stop().unwrap();
    }

    #[test]
    fn a_reserved_address_refuses_connections_until_it_listens() {
        let reserved = Reserved::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = reserved.socket.local_addr().unwrap().as_socket().unwrap();
        let e = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        let listener = reserved.listen().unwrap();
        std::net::TcpStream::connect(addr).unwrap();
        drop(listener);
    }

    #[test]
    fn a_reserved_address_another_process_listens_on_first_is_in_use_at_listen() {
        let reserved = Reserved::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = reserved.socket.local_addr().unwrap().as_socket().unwrap();
        // SO_REUSEADDR lets another listener bind an address only bound, not listened on.
        let other = std::net::TcpListener::bind(addr).unwrap();
        let e = reserved.listen().unwrap_err().to_string();
        assert_eq!(
            e,
            // The address as configured.
            "api.listen 127.0.0.1:0: Address already in use (os error 98)"
        );
        drop(other);
    }

    #[test]
    fn a_failed_start_removes_its_files_before_it_unlocks_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut created = Created::new(&data);
        let store = Arc::new(created.file("buffetd.redb", || Store::open(&data)).unwrap());
        created.hold(store.clone());
        created
            .file("admin.token", || {
                std::fs::write(data.join("admin.token"), "t\n")
            })
            .unwrap();
        // The daemon's state, which owns the store, goes first on a failed start.
        drop(store);
        // Another buffetd opening the data_dir now is still kept out: it cannot take the
        // files as its own and then lose them to this start's clean-up.
        assert!(matches!(Store::open(&data), Err(StoreError::InUse { .. })));
        drop(created);
        assert!(!data.exists(), "{:?}", std::fs::read_dir(&data).ok());
        // And the lock went with it.
        Store::open(&data).unwrap();
    }
}
