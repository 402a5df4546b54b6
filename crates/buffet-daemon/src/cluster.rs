//! Agent mode: this buffetd is one server of a cluster placed by buffet-orchestrator,
//! through etcd (`[cluster]` in buffet.toml; without it the daemon is a single server
//! and never touches etcd).
//!
//! The Agent
//! * registers `/buffet/servers/<server_id>` under a lease it keeps alive, and rewrites
//!   it every `report_interval_ms` with the server's load (packets per slot per worker,
//!   live/max workers, tenants and their rates, the overload flag the local Agent raises
//!   when it can launch no more workers), never over a registration it did not write
//!   (another buffetd's, or one without an instance id: see `claim` and `publish`);
//! * watches `/buffet/placements/<server_id>/` and makes the server's tenant set equal
//!   to it: a placed tenant is admitted, an unplaced one removed, through this daemon's
//!   own API router (the very handlers, validation and store of `POST` and
//!   `DELETE /v1/tenants`, called as the daemon itself, without a token), and the
//!   outcome of each admission (`live`, or `failed` with buffetd's status and reason)
//!   goes to `/buffet/status/<tenant>`, in a transaction that writes it only while that
//!   placement is current;
//! * applies a placement whose document changed (an update through the Orchestrator's
//!   `PUT /v1/tenants/{id}`) through buffetd's own `PUT /v1/tenants/{id}` (one swap between
//!   bursts; a refused update changes nothing), and answers it the same way, marked as an
//!   update so that the Orchestrator puts the previous document back on a refusal;
//! * clears the local overload flag (which buffetd's Agent raises on the scheduler's
//!   overload reports when it can launch no worker) once no live worker has carried its
//!   MAX_NB for two timeslots, so that the flag it publishes describes the server now.
//!
//! **Fencing.** In cluster mode the Agent owns the server's tenant set, and it serves
//! tenants only while it holds its lease. When the lease counts as lost (no keep-alive
//! acknowledged for 3/4 of `lease_ttl_s`, counted from when the last acknowledged one
//! was sent; see `buffet_orchestrator::lease`), it removes every tenant before the lease
//! can have expired in etcd, so before the Orchestrator can place them elsewhere; then it
//! registers again with a new lease and admits what is placed on it then. The same holds
//! at start: tenants restored from the store keep serving only if the first
//! registration succeeds and they are still placed here; otherwise they are removed. On
//! SIGTERM the Agent revokes its lease, so its tenants are re-placed at once.
//!
//! This module does not place anything (the Orchestrator does) and does not change how
//! a tenant is admitted (the API does).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use buffet_orchestrator::lease::{self, LeaseState};
use buffet_orchestrator::schema::{self, ServerLoad, State, Status, WorkerLoad};
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::config::DataplaneConfig;
use crate::plane::Plane;

/// `[cluster]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd client URLs.
    pub etcd: Vec<String>,
    /// This server's id in the cluster (`[A-Za-z0-9._-]`, at most 64 bytes).
    pub server_id: String,
    /// TTL of the server's lease, seconds: a dead server's tenants are re-placed after it.
    #[serde(default = "default_ttl")]
    pub lease_ttl_s: u64,
    /// How often the load is published, ms.
    #[serde(default = "default_report")]
    pub report_interval_ms: u64,
}

fn default_ttl() -> u64 {
    10
}

fn default_report() -> u64 {
    1000
}

impl ClusterConfig {
    /// The first problem: `(field, message)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.etcd.is_empty() {
            return Err(("etcd", "give at least one etcd URL".into()));
        }
        if let Some(u) = self
            .etcd
            .iter()
            .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
        {
            return Err(("etcd", format!("{u:?} is not an http:// URL")));
        }
        if !schema::valid_server_id(&self.server_id) {
            return Err((
                "server_id",
                format!(
                    "{:?}: 1 to 64 of [A-Za-z0-9._-], not . or .. (it is a path segment of etcd \
                     keys)",
                    self.server_id
                ),
            ));
        }
        if !(1..=3600).contains(&self.lease_ttl_s) {
            return Err((
                "lease_ttl_s",
                format!("must be 1..=3600, got {}", self.lease_ttl_s),
            ));
        }
        if self.report_interval_ms < 50 || self.report_interval_ms > self.lease_ttl_s * 1000 {
            return Err((
                "report_interval_ms",
                format!(
                    "must be 50..=lease_ttl_s*1000, got {}",
                    self.report_interval_ms
                ),
            ));
        }
        Ok(())
    }
}

/// What the daemon hands the Agent at start.
pub struct Hook {
    cfg: ClusterConfig,
    instance: String,
    plane: Arc<dyn Plane>,
    refusing: Arc<Mutex<Option<String>>>,
    dataplane: DataplaneConfig,
}

impl Hook {
    /// Captures what the Agent needs. It calls the daemon's routes as the daemon itself,
    /// not with the admin token, which a reload may replace.
    pub fn new(
        cfg: ClusterConfig,
        instance: String,
        plane: Arc<dyn Plane>,
        refusing: Arc<Mutex<Option<String>>>,
        dataplane: &DataplaneConfig,
    ) -> Hook {
        Hook {
            cfg,
            instance,
            plane,
            refusing,
            dataplane: dataplane.clone(),
        }
    }

    /// Starts the Agent on the current runtime; it ends (revoking its lease) once
    /// `shutdown` turns true.
    pub fn spawn(
        self,
        api: Router,
        addr: SocketAddr,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.agent(api, addr, shutdown).run())
    }

    /// The Agent, not started: it calls `api` as this daemon's own API (at `addr`).
    fn agent(self, api: Router, addr: SocketAddr, shutdown: watch::Receiver<bool>) -> Agent {
        Agent {
            cfg: self.cfg,
            instance: self.instance,
            run: random_id(),
            last_error: None,
            plane: self.plane,
            refusing: self.refusing,
            dataplane: self.dataplane,
            api,
            addr,
            shutdown,
            local: BTreeMap::new(),
            failed: HashMap::new(),
            unwritten: BTreeMap::new(),
            last: None,
            calm_since: None,
            seq: 0,
        }
    }
}

/// A tenant this Agent admitted: the placement revision it answers (0 = restored from
/// the store at start, not yet matched to a placement) and the placement document it
/// serves (`None` when restored from the store).
struct Local {
    rev: i64,
    doc: Option<Value>,
}

/// Why a session ended.
enum End {
    Stop,
    Lost,
    /// Another buffetd wrote this server's key over this session's registration.
    Displaced,
    /// Another buffetd with this one's instance id wrote this server's key over this
    /// session's registration: the two share one identity. Why, for the log.
    Twin(String),
}

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
enum AgentError {
    #[error(transparent)]
    Connect(#[from] lease::ConnectError),
    #[error("etcd: {}", lease::describe(.0))]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd: no answer within {0:?}")]
    Timeout(Duration),
    #[error(
        "server id {id:?} is registered by another buffetd (instance {other}, API {api}): \
         each server needs its own cluster.server_id; registering when that one is gone"
    )]
    Taken {
        id: String,
        other: String,
        api: String,
    },
    #[error(
        "server id {id:?} is registered without an instance id (by an older buffetd, API \
         {api}), which may be another server: registering when that registration is gone \
         ({hint})"
    )]
    Unidentified {
        id: String,
        api: String,
        /// What makes it go: its buffetd stopping or its lease expiring, or, for a key
        /// written with no lease, deleting it.
        hint: String,
    },
    #[error("server id {0:?} was registered over this registration by another buffetd")]
    Displaced(String),
    #[error(
        "server id {id:?} was registered over this registration by another buffetd with \
         this one's instance id (API {api}): two buffetds share one identity, a data_dir \
         copied with its cluster-instance file. This one serves nothing and registers \
         again only once that registration is gone; give one of them a data_dir of its \
         own (or move its cluster-instance aside) and restart it"
    )]
    Twin { id: String, api: String },
    #[error("the server's key changed while registering: retrying")]
    Raced,
}

/// This server's instance id: a random id (32 hex digits) kept in
/// `data_dir/cluster-instance`, made at the first start in cluster mode. A file that
/// cannot be read or does not hold an id is an error naming it, never a new identity
/// (the cluster would take this server for another one).
pub fn instance_id(data_dir: &std::path::Path) -> std::io::Result<String> {
    let path = data_dir.join("cluster-instance");
    let named = |kind, why: String| std::io::Error::new(kind, format!("{}: {why}", path.display()));
    match std::fs::read_to_string(&path) {
        Ok(s) if s.trim().is_empty() => {}
        Ok(s) if is_instance_id(s.trim()) => return Ok(s.trim().to_owned()),
        Ok(_) => {
            return Err(named(
                std::io::ErrorKind::InvalidData,
                "not an instance id (32 hex digits); move the file aside to give this server \
                 a new identity"
                    .into(),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e.kind(), e.to_string())),
    }
    let id = random_id();
    // All or nothing: a crash part-way leaves no file (a new id at the next start), never
    // a truncated id another start would take as this server's.
    buffet_config::auth::write_whole(&path, |f| {
        use std::io::Write;
        writeln!(f, "{id}")
    })
    .map_err(|e| named(e.kind(), e.to_string()))?;
    Ok(id)
}

/// A random id of 32 lowercase hex digits (an instance id, a run id).
fn random_id() -> String {
    buffet_config::auth::generate()
        .trim_start_matches("bt_")
        .chars()
        .take(32)
        .collect()
}

/// Whether `s` has the form [`instance_id`] makes: 32 lowercase hex digits.
fn is_instance_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

const ETCD_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs `work` unless the lease counts as lost first (then `None`, and `work` is dropped:
/// the caller fences, which undoes whatever half of it ran).
async fn or_lost<T>(
    held: &mut watch::Receiver<LeaseState>,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        _ = lease::lost(held) => None,
        r = work => Some(r),
    }
}

async fn timed<T>(
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, AgentError> {
    tokio::time::timeout(ETCD_TIMEOUT, f)
        .await
        .map_err(|_| AgentError::Timeout(ETCD_TIMEOUT))?
        .map_err(AgentError::from)
}

/// Packet counters at one moment: when, per worker, per tenant.
type Sample = (Instant, HashMap<u16, u64>, HashMap<u32, u64>);

struct Agent {
    cfg: ClusterConfig,
    /// This buffetd's instance id ([`instance_id`]).
    instance: String,
    /// This process's run id (`ServerLoad::run`).
    run: String,
    /// The last registration error logged, so a retry every half second does not log
    /// the same line again.
    last_error: Option<String>,
    plane: Arc<dyn Plane>,
    refusing: Arc<Mutex<Option<String>>>,
    dataplane: DataplaneConfig,
    api: Router,
    addr: SocketAddr,
    shutdown: watch::Receiver<bool>,
    local: BTreeMap<u32, Local>,
    /// Placements that failed here, by the revision that failed (not retried).
    failed: HashMap<u32, i64>,
    /// Statuses etcd did not take (an error, or no answer in time), by tenant: written
    /// again at every load report and reconciliation until etcd takes them or their
    /// placement changes. The admission they answer is not tried again (it is in
    /// `local` or `failed`), so without this a lost status would leave the tenant
    /// `pending` in the cluster for good.
    unwritten: BTreeMap<u32, Status>,
    /// The previous load sample: when, per worker and per tenant packets.
    last: Option<Sample>,
    /// Since when no live worker has been measured at its MAX_NB.
    calm_since: Option<Instant>,
    seq: u64,
}

impl Agent {
    fn log(&self, msg: impl std::fmt::Display) {
        eprintln!("buffetd: cluster agent {}: {msg}", self.cfg.server_id);
    }

    /// Adds every tenant the server serves that the Agent does not know of (restored
    /// from buffetd's store, or admitted through buffetd's own API) to its tenant set,
    /// as not placed here yet: the next reconciliation removes it, or applies its
    /// placement's document to it, and fencing removes it.
    async fn adopt_served(&mut self) {
        let (s, list) = self.call(Method::GET, "/v1/tenants", None).await;
        if !s.is_success() {
            self.log(format!("cannot list the server's tenants: {s} {list}"));
            return;
        }
        for t in list["tenant"].as_array().into_iter().flatten() {
            if let Some(id) = t["id"].as_u64().and_then(|i| u32::try_from(i).ok()) {
                self.local.entry(id).or_insert(Local { rev: 0, doc: None });
            }
        }
    }

    async fn run(mut self) {
        self.adopt_served().await;
        loop {
            if *self.shutdown.borrow() {
                return;
            }
            match self.session().await {
                Ok(End::Stop) => return,
                Ok(End::Lost) => {
                    self.last_error = None;
                    self.log("lease lost: fencing");
                }
                Ok(End::Displaced) => {
                    self.last_error = None;
                    let e = AgentError::Displaced(self.cfg.server_id.clone());
                    self.log(format!("{e}: fencing"));
                }
                Ok(End::Twin(why)) => {
                    // Registering again over the other one would have it do the same:
                    // the two would take turns for good.
                    self.log(why);
                    if !self.wait_registration_gone().await {
                        return;
                    }
                }
                Err(e) => {
                    let e = e.to_string();
                    if self.last_error.as_ref() != Some(&e) {
                        self.log(format!("not registered: {e}"));
                        self.last_error = Some(e);
                    }
                }
            }
            self.fence().await;
            let mut stop = self.shutdown.clone();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = lease::raised(&mut stop) => return,
            }
        }
    }

    /// After another buffetd with this one's instance id wrote over this registration:
    /// serves nothing (fences until that works), and waits until the server's key is
    /// gone (that buffetd stopped, or its lease expired) before registering again, never
    /// over it. `false` when shut down meanwhile.
    async fn wait_registration_gone(&mut self) -> bool {
        let key = schema::server_key(&self.cfg.server_id);
        loop {
            self.fence().await;
            let mut stop = self.shutdown.clone();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = lease::raised(&mut stop) => return false,
            }
            if !self.local.is_empty() {
                continue;
            }
            let Ok(mut client) = lease::connect(&self.cfg.etcd, ETCD_TIMEOUT).await else {
                continue;
            };
            if let Ok(g) = timed(client.get(key.as_bytes(), None)).await {
                if g.kvs().is_empty() {
                    self.log("the other registration is gone: registering again");
                    return true;
                }
            }
        }
    }

    /// Removes every tenant (the server serves nothing without its lease).
    async fn fence(&mut self) {
        self.adopt_served().await;
        if self.local.is_empty() {
            return;
        }
        let n = self.local.len();
        let (s, v) = self
            .call(Method::PUT, "/v1/tenants", Some(json!({ "tenant": [] })))
            .await;
        if s.is_success() {
            self.local.clear();
            self.log(format!(
                "fenced: removed {n} tenants until registered again"
            ));
        } else {
            self.log(format!("cannot remove tenants while fenced: {s} {v}"));
        }
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(self.cfg.lease_ttl_s)
    }

    async fn session(&mut self) -> Result<End, AgentError> {
        let mut client = lease::connect(&self.cfg.etcd, ETCD_TIMEOUT).await?;
        self.claim(&mut client).await?;
        // The fencing clock starts here, not once registered: etcd counts the lease's TTL
        // from the grant, and registering may take a while.
        let asked = Instant::now();
        let lease_id = timed(client.lease_grant(self.cfg.lease_ttl_s as i64, None))
            .await?
            .id();
        if let Err(e) = self.register(&mut client, lease_id).await {
            let _ = timed(client.lease_revoke(lease_id)).await;
            return Err(e);
        }
        self.last_error = None;
        let (mut held, keeper) = lease::hold(client.clone(), lease_id, self.ttl(), asked);
        let end = self.serve(&mut client, lease_id, &mut held).await;
        keeper.abort();
        if matches!(end, Ok(End::Stop)) {
            let _ = timed(client.lease_revoke(lease_id)).await;
            self.log("stopped: lease revoked");
        }
        if matches!(end, Ok(End::Displaced | End::Twin(_))) {
            // Nothing is attached to it any more. Revoked aside: the caller fences at
            // once, not after a slow etcd's answer.
            let mut client = client.clone();
            tokio::spawn(async move {
                let _ = timed(client.lease_revoke(lease_id)).await;
            });
        }
        end
    }

    async fn serve(
        &mut self,
        client: &mut Client,
        lease_id: i64,
        held: &mut watch::Receiver<LeaseState>,
    ) -> Result<End, AgentError> {
        self.log(format!("registered (lease {lease_id:x})"));
        let prefix = schema::placements_of(&self.cfg.server_id);
        let rev = self.reconcile(client).await?;
        let mut w = timed(
            client.watch(
                prefix.as_bytes(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(rev + 1),
                ),
            ),
        )
        .await?;
        let mut tick = tokio::time::interval(Duration::from_millis(self.cfg.report_interval_ms));
        let mut stop = self.shutdown.clone();
        loop {
            // The lease's verdict comes first, and every etcd call below races it: on a
            // partition an etcd call hangs until its timeout, and the fencing deadline
            // must not wait for it.
            tokio::select! {
                biased;
                _ = lease::lost(held) => return Ok(End::Lost),
                _ = lease::raised(&mut stop) => return Ok(End::Stop),
                m = w.message() => match m {
                    Ok(Some(r)) if !r.canceled() => {
                        if !r.events().is_empty()
                            && or_lost(held, self.reconcile(client)).await.is_none()
                        {
                            return Ok(End::Lost);
                        }
                    }
                    _ => loop {
                        // The watch broke (an etcd restart): reconcile and watch again
                        // while the lease holds.
                        if *held.borrow() == LeaseState::Lost {
                            return Ok(End::Lost);
                        }
                        if *stop.borrow() {
                            return Ok(End::Stop);
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        let Some(reconciled) = or_lost(held, self.reconcile(client)).await else {
                            return Ok(End::Lost);
                        };
                        let Ok(rev) = reconciled else { continue };
                        let watched = or_lost(
                            held,
                            timed(client.watch(
                                prefix.as_bytes(),
                                Some(WatchOptions::new().with_prefix().with_start_revision(rev + 1)),
                            )),
                        )
                        .await;
                        match watched {
                            None => return Ok(End::Lost),
                            Some(Ok(nw)) => {
                                w = nw;
                                break;
                            }
                            Some(Err(_)) => {}
                        }
                    },
                },
                _ = tick.tick() => {
                    match or_lost(held, self.publish(client, lease_id)).await {
                        None => return Ok(End::Lost),
                        Some(Err(AgentError::Displaced(_))) => return Ok(End::Displaced),
                        Some(Err(e @ AgentError::Twin { .. })) => {
                            return Ok(End::Twin(e.to_string()))
                        }
                        Some(Err(e)) => self.log(format!("load report: {e}")),
                        Some(Ok(())) => {}
                    }
                    if !self.unwritten.is_empty()
                        && or_lost(held, self.write_unwritten(client)).await.is_none()
                    {
                        return Ok(End::Lost);
                    }
                }
            }
        }
    }

    /// Makes the tenant set equal to the placements; returns the revision read.
    async fn reconcile(&mut self, client: &mut Client) -> Result<i64, AgentError> {
        self.adopt_served().await;
        let prefix = schema::placements_of(&self.cfg.server_id);
        let g = timed(schema::get_all(
            client,
            prefix.as_bytes(),
            Some(GetOptions::new().with_prefix()),
        ))
        .await?;
        let rev = g.header().map_or(0, |h| h.revision());
        let wanted: BTreeMap<u32, (Value, i64)> = g
            .kvs()
            .iter()
            .filter_map(|kv| {
                let id = schema::tenant_of(kv.key(), schema::PLACEMENTS)?;
                let doc = serde_json::from_slice(kv.value()).ok()?;
                Some((id, (doc, kv.mod_revision())))
            })
            .collect();
        let gone: Vec<u32> = self
            .local
            .keys()
            .filter(|id| !wanted.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            let (s, v) = self
                .call(Method::DELETE, &format!("/v1/tenants/{id}"), None)
                .await;
            if s.is_success() || s == StatusCode::NOT_FOUND {
                self.local.remove(&id);
            } else {
                self.log(format!("cannot remove tenant {id}: {s} {v}"));
            }
        }
        self.failed.retain(|id, _| wanted.contains_key(id));
        self.unwritten.retain(|id, _| wanted.contains_key(id));
        for (id, (doc, prev)) in wanted {
            if let Some(l) = self.local.get(&id) {
                if l.rev == prev {
                    continue;
                }
                if l.doc.as_ref() == Some(&doc) {
                    // Placed here again with the document it serves.
                    if let Some(l) = self.local.get_mut(&id) {
                        l.rev = prev;
                    }
                    self.status(client, id, prev, State::Live, None, false)
                        .await;
                    continue;
                }
                // The placement's document changed (an update through the Orchestrator),
                // or the tenant was restored from the store: apply the placed document
                // through buffetd's own update path (one swap between bursts; a refused
                // update changes nothing).
                let (s, v) = self
                    .call(Method::PUT, &format!("/v1/tenants/{id}"), Some(doc.clone()))
                    .await;
                let l = self.local.entry(id).or_insert(Local { rev: 0, doc: None });
                l.rev = prev;
                if s.is_success() {
                    l.doc = Some(doc);
                    self.status(client, id, prev, State::Live, None, true).await;
                } else {
                    let reason = Self::reason(&v);
                    self.log(format!("update of tenant {id} refused: {s} {reason}"));
                    self.status(
                        client,
                        id,
                        prev,
                        State::Failed,
                        Some((s.as_u16(), reason)),
                        true,
                    )
                    .await;
                }
                continue;
            }
            if self.failed.get(&id) == Some(&prev) {
                continue;
            }
            let (s, v) = self
                .call(Method::POST, "/v1/tenants", Some(doc.clone()))
                .await;
            if s.is_success() {
                self.local.insert(
                    id,
                    Local {
                        rev: prev,
                        doc: Some(doc),
                    },
                );
                self.status(client, id, prev, State::Live, None, false)
                    .await;
            } else {
                let reason = Self::reason(&v);
                self.log(format!("tenant {id} refused: {s} {reason}"));
                self.failed.insert(id, prev);
                self.status(
                    client,
                    id,
                    prev,
                    State::Failed,
                    Some((s.as_u16(), reason)),
                    false,
                )
                .await;
            }
        }
        // Statuses lost earlier (their admissions are not tried again above). An error
        // here leaves them for the next report.
        let _ = self.write_unwritten(client).await;
        Ok(rev)
    }

    /// The `error` of buffetd's answer, else the whole answer.
    fn reason(v: &Value) -> String {
        v["error"]
            .as_str()
            .map_or_else(|| v.to_string(), str::to_owned)
    }

    /// Writes a tenant's status while its placement (revision `prev`) is current; one
    /// etcd did not take is kept in `unwritten` and written again later.
    async fn status(
        &mut self,
        client: &mut Client,
        id: u32,
        prev: i64,
        state: State,
        failure: Option<(u16, String)>,
        update: bool,
    ) {
        let st = Status {
            server: self.cfg.server_id.clone(),
            state,
            placement_rev: prev,
            code: failure.as_ref().map(|f| f.0),
            reason: failure.map(|f| f.1),
            update,
        };
        match Self::put_status(client, &self.cfg.server_id, id, &st).await {
            Ok(()) => {
                self.unwritten.remove(&id);
            }
            Err(e) => {
                self.log(format!("status of tenant {id}: {e}; written again later"));
                self.unwritten.insert(id, st);
            }
        }
    }

    /// Puts `st` as tenant `id`'s status if the placement it answers is still current
    /// (a transaction compares its revision). `Ok` also when it is not: a placement
    /// changed since needs no answer to the old one.
    async fn put_status(
        client: &mut Client,
        server: &str,
        id: u32,
        st: &Status,
    ) -> Result<(), AgentError> {
        let txn = etcd_client::Txn::new()
            .when(vec![Compare::mod_revision(
                schema::placement_key(server, id),
                CompareOp::Equal,
                st.placement_rev,
            )])
            .and_then(vec![TxnOp::put(
                schema::status_key(id),
                serde_json::to_vec(st).unwrap_or_default(),
                None,
            )]);
        timed(client.txn(txn)).await.map(|_| ())
    }

    /// Writes the statuses etcd did not take before; stops at the first error (etcd
    /// still fails: the rest wait too).
    async fn write_unwritten(&mut self, client: &mut Client) -> Result<(), AgentError> {
        while let Some((&id, st)) = self.unwritten.first_key_value() {
            Self::put_status(client, &self.cfg.server_id, id, st).await?;
            self.unwritten.remove(&id);
        }
        Ok(())
    }

    /// Refuses to register while a registration this buffetd did not write holds this
    /// server id: only one with this buffetd's own instance id (its previous life) is
    /// taken over. One without an instance id (an older buffetd, or a value that is not
    /// a registration) cannot be told from another server's, so it is never taken over.
    async fn claim(&self, client: &mut Client) -> Result<(), AgentError> {
        let key = schema::server_key(&self.cfg.server_id);
        let g = timed(client.get(key.as_bytes(), None)).await?;
        let Some(kv) = g.kvs().first() else {
            return Ok(());
        };
        let v: Value = serde_json::from_slice(kv.value()).unwrap_or(Value::Null);
        let api = v["api"].as_str().unwrap_or("unknown").to_owned();
        let id = self.cfg.server_id.clone();
        match v["instance"].as_str() {
            Some(me) if me == self.instance => Ok(()),
            Some(other) => Err(AgentError::Taken {
                id,
                other: other.to_owned(),
                api,
            }),
            None => Err(AgentError::Unidentified {
                hint: if kv.lease() == 0 {
                    format!("it has no lease and stays until deleted: etcdctl del {key}")
                } else {
                    "stop that buffetd, or wait for its lease to expire".to_owned()
                },
                id,
                api,
            }),
        }
    }

    /// The first report of a session: written only if no other buffetd registered the
    /// id since [`claim`](Self::claim) looked (a transaction on the key's revision).
    async fn register(&mut self, client: &mut Client, lease_id: i64) -> Result<(), AgentError> {
        let key = schema::server_key(&self.cfg.server_id);
        let g = timed(client.get(key.as_bytes(), None)).await?;
        let seen = g.kvs().first().map_or(0, |kv| kv.mod_revision());
        let load = self.load().await;
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(
                key.as_bytes(),
                CompareOp::Equal,
                seen,
            )])
            .and_then(vec![TxnOp::put(
                key.as_bytes(),
                serde_json::to_vec(&load).unwrap_or_default(),
                Some(PutOptions::new().with_lease(lease_id)),
            )]);
        if timed(client.txn(txn)).await?.succeeded() {
            return Ok(());
        }
        // Someone wrote the key meanwhile: say who, or retry.
        self.claim(client).await?;
        Err(AgentError::Raced)
    }

    /// Writes the server's key (under the lease) with its current load, only over this
    /// session's own registration (or where none is): a key another buffetd wrote since
    /// (an older one registers without looking) is not written back, and the session
    /// ends ([`AgentError::Displaced`]) so that two servers never serve one id.
    async fn publish(&mut self, client: &mut Client, lease_id: i64) -> Result<(), AgentError> {
        let load = self.load().await;
        let key = schema::server_key(&self.cfg.server_id);
        let put = || {
            vec![TxnOp::put(
                key.as_bytes(),
                serde_json::to_vec(&load).unwrap_or_default(),
                Some(PutOptions::new().with_lease(lease_id)),
            )]
        };
        for cmp in [
            Compare::lease(key.as_bytes(), CompareOp::Equal, lease_id),
            // Deleted by hand while the lease holds: registered again.
            Compare::version(key.as_bytes(), CompareOp::Equal, 0),
        ] {
            if timed(client.txn(Txn::new().when(vec![cmp]).and_then(put())))
                .await?
                .succeeded()
            {
                return Ok(());
            }
        }
        // Written over by whom: a buffetd with this one's instance id but another run
        // shares its identity (this one's previous life is not running).
        let g = timed(client.get(key.as_bytes(), None)).await?;
        let twin = g
            .kvs()
            .first()
            .and_then(|kv| serde_json::from_slice::<ServerLoad>(kv.value()).ok())
            .filter(|l| {
                l.instance.as_deref() == Some(self.instance.as_str())
                    && l.run.as_ref().is_some_and(|r| *r != self.run)
            });
        match twin {
            Some(l) => Err(AgentError::Twin {
                id: self.cfg.server_id.clone(),
                api: l.api.unwrap_or_else(|| "unknown".into()),
            }),
            None => Err(AgentError::Displaced(self.cfg.server_id.clone())),
        }
    }

    async fn load(&mut self) -> ServerLoad {
        let d = &self.dataplane;
        let slot_ns = 1u64 << d.shift.min(63);
        let mut l = ServerLoad {
            server: self.cfg.server_id.clone(),
            instance: Some(self.instance.clone()),
            run: Some(self.run.clone()),
            api: Some(format!("http://{}", self.addr)),
            slot_ns,
            worker_max_nb: d.worker_max_nb,
            max_workers: d.max_workers,
            tenant_slots: d.tenant_slots,
            overloaded: self.overload_flag(),
            seq: self.seq,
            offered: Some(self.plane.offered().to_vec()),
            ..ServerLoad::default()
        };
        self.seq += 1;
        let plane = self.plane.clone();
        let Ok(Ok(r)) = tokio::task::spawn_blocking(move || plane.report()).await else {
            return l;
        };
        let now = Instant::now();
        let workers: HashMap<u16, u64> = r.workers.iter().map(|w| (w.id, w.packets)).collect();
        let tenants: HashMap<u32, u64> = r.tenants.iter().map(|t| (t.id.0, t.packets)).collect();
        let (dt, pw, pt) = match &self.last {
            Some((t, pw, pt)) => (now.duration_since(*t).as_secs_f64(), Some(pw), Some(pt)),
            None => (0.0, None, None),
        };
        let rate = |now: u64, before: Option<u64>| match before {
            Some(b) if dt > 0.0 => now.saturating_sub(b) as f64 / dt,
            _ => 0.0,
        };
        l.live_workers = r.workers.iter().filter(|w| w.live).count() as u16;
        l.workers = r
            .workers
            .iter()
            .map(|w| WorkerLoad {
                id: w.id,
                live: w.live,
                pkts_per_slot: rate(w.packets, pw.and_then(|p| p.get(&w.id).copied()))
                    * slot_ns as f64
                    / 1e9,
            })
            .collect();
        l.tenant_pps = r
            .tenants
            .iter()
            .map(|t| {
                (
                    t.id.0,
                    rate(t.packets, pt.and_then(|p| p.get(&t.id.0).copied())),
                )
            })
            .collect();
        l.pps = l.tenant_pps.values().sum();
        l.tenants = r.tenants.len() as u32;
        let measured = self.last.is_some();
        self.last = Some((now, workers, tenants));
        if measured {
            self.settle_overload(&l, now);
            l.overloaded = self.overload_flag();
        }
        l
    }

    fn overload_flag(&self) -> Option<String> {
        self.refusing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Clears the local overload flag once no live worker has carried its MAX_NB for two
    /// timeslots, as measured between reports. buffetd's own Agent raises the flag on the
    /// scheduler's overload reports and clears it only when a worker is launched or a
    /// running tenant is removed through the API (not one kept not running since the
    /// start, which held no room); but after the Orchestrator moved tenants away,
    /// the scheduler's report for the slot before the removal can raise it again, and in
    /// a cluster the flag is what the Orchestrator acts on.
    fn settle_overload(&mut self, l: &ServerLoad, now: Instant) {
        let max_nb = l.worker_max_nb as f64;
        let busy = l.worker_max_nb > 0
            && l.workers
                .iter()
                .any(|w| w.live && w.pkts_per_slot >= max_nb);
        if busy {
            self.calm_since = None;
            return;
        }
        let since = *self.calm_since.get_or_insert(now);
        if now.duration_since(since) < Duration::from_nanos(l.slot_ns.saturating_mul(2)) {
            return;
        }
        let mut flag = self.refusing.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(reason) = flag.take() {
            self.log(format!(
                "overload over (every live worker under its MAX_NB for two timeslots): \
                 admitting again; it was: {reason}"
            ));
        }
    }

    /// A request to this daemon's own API router, as the admin: marked as the daemon's
    /// own ([`crate::api::Internal`]), not by the admin token, which a reload may replace.
    async fn call(&self, method: Method, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .extension(crate::api::Internal)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.map(|b| b.to_string()).unwrap_or_default()));
        let Ok(req) = req else {
            return (StatusCode::INTERNAL_SERVER_ERROR, Value::Null);
        };
        let Ok(resp) = self.api.clone().oneshot(req).await;
        let status = resp.status();
        // In-process, and the list of every tenant grows with the tenants: no cap (a
        // 1 MiB cap once left a large server's tenant set unread, so never fenced).
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap_or_default();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::routing::get;
    use axum::Json;
    use buffet_orchestrator::local_etcd::{LocalEtcd, LocalEtcdError};

    /// etcd goes away between an admission and its status (here: while buffetd's API
    /// admits the tenant). Once etcd is back the status is written, though the admission
    /// is not tried again: the Orchestrator sees the tenant live instead of `pending` for
    /// good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_status_etcd_did_not_take_is_written_once_etcd_is_back() {
        let test = "a_status_etcd_did_not_take_is_written_once_etcd_is_back";
        let Some(etcd) = buffet_testkit::gate::started_or_skip(
            test,
            LocalEtcd::start(),
            LocalEtcdError::is_missing,
        ) else {
            return;
        };
        let etcd = Arc::new(Mutex::new(etcd));
        let url = etcd.lock().unwrap().url();
        let dir = tempfile::tempdir().unwrap();
        // A real data plane (the firewall NF, no port) for the Agent's load reports.
        let path = dir.path().join("buffet.toml");
        let cfg = crate::config::DaemonConfig::parse(
            &path,
            &format!(
                "data_dir = \"{}\"\n[nf]\nname = \"firewall\"\n[dataplane]\narena_mib = 64\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let started = crate::plane::start(&cfg, &path).unwrap();
        // buffetd's API as the Agent uses it: the admission succeeds, and etcd stops while
        // it is answered (the first time).
        let admitted = Arc::new(AtomicUsize::new(0));
        let api = {
            let (listed, admitted, etcd) = (admitted.clone(), admitted.clone(), etcd.clone());
            Router::new().route(
                "/v1/tenants",
                get(move || async move {
                    let served: Vec<Value> = (listed.load(Ordering::SeqCst) > 0)
                        .then(|| json!({ "id": 5 }))
                        .into_iter()
                        .collect();
                    Json(json!({ "tenant": served }))
                })
                .post(move || async move {
                    if admitted.fetch_add(1, Ordering::SeqCst) == 0 {
                        etcd.lock().unwrap().kill();
                    }
                    (StatusCode::CREATED, Json(json!({ "id": 5 })))
                }),
            )
        };
        let mut client = lease::connect(std::slice::from_ref(&url), ETCD_TIMEOUT)
            .await
            .unwrap();
        let doc = json!({
            "id": 5, "name": "t5",
            "rules": [ { "dst_ip": "10.0.4.0/24" } ],
            "policy": { "default": "allow" },
        });
        let placed = client
            .put(schema::placement_key("s1", 5), doc.to_string(), None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let (_stop, stop_rx) = watch::channel(false);
        let cluster = ClusterConfig {
            etcd: vec![url],
            server_id: "s1".into(),
            lease_ttl_s: 6,
            report_interval_ms: 300,
        };
        let hook = Hook::new(
            cluster,
            "0".repeat(32),
            started.plane.clone(),
            Arc::new(Mutex::new(None)),
            &cfg.dataplane,
        );
        let mut agent = hook.agent(api, "127.0.0.1:1".parse().unwrap(), stop_rx);
        // The placements were read before etcd stopped; the status write fails.
        agent.reconcile(&mut client).await.unwrap();
        assert_eq!(admitted.load(Ordering::SeqCst), 1);
        let e = etcd.clone();
        tokio::task::spawn_blocking(move || e.lock().unwrap().resume())
            .await
            .unwrap()
            .unwrap();
        // The next reconciliations (a watch event, a broken watch) and load reports.
        let t0 = std::time::Instant::now();
        let st = loop {
            let _ = agent.reconcile(&mut client).await;
            let stored = timed(client.get(schema::status_key(5), None)).await;
            if let Some(kv) = stored.as_ref().ok().and_then(|g| g.kvs().first()) {
                break serde_json::from_slice::<Status>(kv.value()).unwrap();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no status for tenant 5 after etcd came back"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(
            (st.state, st.placement_rev),
            (State::Live, placed),
            "{st:?}"
        );
        assert_eq!(admitted.load(Ordering::SeqCst), 1, "admitted once only");
        started.plane.stop();
        let _ = started.thread.join();
    }

    #[test]
    fn the_instance_id_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let id = instance_id(&data).unwrap();
        assert_eq!(id.len(), 32, "{id}");
        assert_eq!(instance_id(&data).unwrap(), id, "read back, not made again");
        let path = data.join("cluster-instance");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{id}\n"));
        // No temporary file left beside it.
        assert!(!data.join("cluster-instance.new").exists());
        // An empty file (never written by this code, but possible by hand): a new id.
        std::fs::write(&path, "").unwrap();
        let other = instance_id(&data).unwrap();
        assert_ne!(other, id);
        assert_eq!(instance_id(&data).unwrap(), other);
    }

    #[test]
    fn an_unreadable_instance_file_is_an_error_not_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: reading it fails (EISDIR).
        std::fs::create_dir_all(dir.path().join("cluster-instance")).unwrap();
        let e = instance_id(dir.path()).unwrap_err();
        assert_ne!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        assert!(
            dir.path().join("cluster-instance").is_dir(),
            "left as it was"
        );
        // A file that is not text: an error naming it, and the file is not replaced.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster-instance");
        std::fs::write(&path, [0xff, 0xfe, b'\n']).unwrap();
        let e = instance_id(dir.path()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), [0xff, 0xfe, b'\n']);
        // Text that is not an id (an id cut short by a crash, a hand edit): the same.
        for bad in ["3f2a\n", "ZZ2aee8a1c5fcb6d18b1b0f3a8b1c9e6d2\n"] {
            std::fs::write(&path, bad).unwrap();
            let e = instance_id(dir.path()).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{bad}: {e}");
            assert!(e.to_string().contains("move the file aside"), "{e}");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), bad);
        }
    }
}
