//! The HTTP/JSON control API (axum): routes, authentication of each request, and the
//! ordering of the data plane and the store for every change.
//!
//! A tenant's admission document is the tenants-file schema (buffet-config's
//! `tenants`), as JSON: a tenants-file entry is an admission body, validated by the same
//! code. Errors are `{"error": "..."}` with a 4xx naming the problem; [`ApiError`] maps
//! every failure to its status in one place ([`From<PlaneError>`](ApiError)).
//!
//! The router is built from one table ([`routes`]); `docs/openapi.json` documents it
//! ([`OPENAPI`], served at `GET /v1/openapi.json`) and a test keeps the two equal.
//!
//! Changes are serialised (one at a time) and ordered so that the store is the truth
//! after a crash: the data plane applies the change first (an admission builds the
//! tenant's state, an update its new state off the data path and swaps its rules
//! between bursts), then one redb
//! transaction commits it, then the request is acknowledged. A crash before the commit
//! leaves the previous, acknowledged state in the store, and a restart re-admits exactly
//! that; a failed commit undoes the data-plane change before answering 500.
//!
//! Blocking work (data-plane calls, store commits) runs on tokio's blocking pool, never
//! on the data plane's thread. This module does not start the daemon (see [`crate::daemon`]).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, State};
use axum::http::{header, Method, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use buffet_config::tenants::{self, Format};
use buffet_config::TenantConfig;
use buffet_dispatch::Match;
use buffet_memory::MemoryError;
use buffet_sdk::TenantId;
use buffet_worker::{PipelineError, Report, WorkerEvent};
use futures_util::Stream;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use crate::auth::{self, Auth, Denied, Principal};
use crate::daemon::ReloadError;
use crate::metrics::Metrics;
use crate::plane::{Plane, PlaneError};
use crate::store::{Batch, Store, StoreError};
use crate::xdp::XdpChangeError;

/// A request that failed: its status and the message of `{"error": ...}`.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What is wrong.
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    fn bad_request(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, m)
    }

    fn unprocessable(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, m)
    }

    fn conflict(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, m)
    }

    fn not_found(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, m)
    }

    fn internal(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(json!({ "error": self.message }))).into_response();
        if self.status == StatusCode::REQUEST_TIMEOUT {
            // The request's body may still be unread (a client that announced one and
            // never sent it): the connection is not worth keeping for another request.
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
        }
        r
    }
}

impl From<Denied> for ApiError {
    fn from(d: Denied) -> ApiError {
        match d {
            Denied::Unauthenticated => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or unknown bearer token (Authorization: Bearer TOKEN)",
            ),
            Denied::Forbidden => ApiError::new(StatusCode::FORBIDDEN, "this token may not do that"),
        }
    }
}

impl From<PlaneError> for ApiError {
    fn from(e: PlaneError) -> ApiError {
        let message = e.to_string();
        let status = match &e {
            PlaneError::Policy { .. } | PlaneError::Chain(_) => StatusCode::UNPROCESSABLE_ENTITY,
            PlaneError::Xdp(x) => match x {
                XdpChangeError::Rules { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                XdpChangeError::Worker(buffet_xdp::WorkerTableError::NotLive(_)) => {
                    StatusCode::NOT_FOUND
                }
                XdpChangeError::Worker(_) | XdpChangeError::Capacity(_) => StatusCode::CONFLICT,
                XdpChangeError::Map(_) => StatusCode::INTERNAL_SERVER_ERROR,
            },
            PlaneError::Pipeline(p) => match p {
                // The host failed the Memory Manager (a protection key not tagged or
                // loaded, guard pages not sealed) or the NF registered a region its own
                // state does not fit: the server's fault, not a conflict the client can
                // resolve.
                PipelineError::Memory {
                    source:
                        MemoryError::Tag(_)
                        | MemoryError::Seal(_)
                        | MemoryError::Enter(_)
                        | MemoryError::StateTooLarge { .. }
                        | MemoryError::StateOverAligned { .. },
                    ..
                } => StatusCode::INTERNAL_SERVER_ERROR,
                PipelineError::Duplicate(_)
                | PipelineError::TooMany(_)
                | PipelineError::Memory { .. }
                | PipelineError::LastWorker(_)
                | PipelineError::NotQuarantined(_)
                | PipelineError::StateHeldByStuckWorker(_)
                | PipelineError::QuarantineBackoff { .. } => StatusCode::CONFLICT,
                PipelineError::Unknown(_) | PipelineError::NotLive(_) => StatusCode::NOT_FOUND,
                PipelineError::Policy { .. }
                | PipelineError::Dispatch { .. }
                | PipelineError::Config(_) => StatusCode::UNPROCESSABLE_ENTITY,
                PipelineError::Stopped => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
        };
        ApiError::new(status, message)
    }
}

impl From<ReloadError> for ApiError {
    fn from(e: ReloadError) -> ApiError {
        let status = match &e {
            ReloadError::Fixed { .. } => StatusCode::CONFLICT,
            ReloadError::Config(_) | ReloadError::Token(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ReloadError::Stopping => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, format!("reload refused, nothing changed: {e}"))
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        ApiError::internal(e.to_string())
    }
}

/// An admitted tenant as the API knows it.
#[derive(Clone, Debug)]
struct Admitted {
    /// The admission document (stored as is).
    doc: Value,
    /// The document, validated.
    cfg: TenantConfig,
}

/// A stored tenant that could not be re-admitted at start: kept in the store as it was
/// (its document and tokens), not in the data plane. The API lists and shows it as
/// `not_restored` with its reason; `DELETE` removes it, `PUT /v1/tenants/{id}` with a
/// document that fits admits it.
#[derive(Clone, Debug)]
struct NotRestored {
    /// The stored document (`{"id": ID}` when it is not JSON).
    doc: Value,
    /// Why it could not be re-admitted.
    reason: String,
}

/// Everything the handlers share.
pub struct AppState {
    plane: Arc<dyn Plane>,
    store: Arc<Store>,
    auth: Auth,
    metrics: Arc<Metrics>,
    tenants: RwLock<BTreeMap<u32, Admitted>>,
    /// Stored tenants not running since the start (never also in `tenants`).
    not_restored: RwLock<BTreeMap<u32, NotRestored>>,
    /// One change at a time: the data plane and the store see changes in one order.
    writes: tokio::sync::Mutex<()>,
    events: broadcast::Sender<WorkerEvent>,
    shutdown: watch::Receiver<bool>,
    /// Both changed by a config reload.
    default_max_nb: AtomicU64,
    max_workers: AtomicU16,
    /// Set by the Agent when overloaded with no worker left to launch: admissions get 503.
    refusing: Arc<Mutex<Option<String>>>,
    ready: AtomicBool,
    /// `POST /v1/reload` (set once the daemon is up).
    reloader: OnceLock<Reloader>,
    /// The interfaces whose frames come through XDP ([`Parts::xdp_ifaces`]).
    xdp_ifaces: Vec<String>,
}

#[cfg(test)]
impl AppState {
    /// Sets (`Some`) or lifts the Agent's refusal, as the Agent does.
    pub(crate) fn set_refusing(&self, reason: Option<&str>) {
        *self.refusing.lock().unwrap_or_else(PoisonError::into_inner) = reason.map(str::to_owned);
    }

    /// The Agent's refusal now.
    pub(crate) fn refusing_now(&self) -> Option<String> {
        self.refusing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// What `POST /v1/reload` calls: reads the config again and applies its mutable parts
/// (the daemon's SIGHUP path, [`crate::Daemon::reload_config`]).
pub type Reloader = Arc<dyn Fn() -> Result<Vec<&'static str>, ReloadError> + Send + Sync>;

/// What [`AppState::new`] needs.
pub struct Parts {
    /// The data plane.
    pub plane: Arc<dyn Plane>,
    /// The store.
    pub store: Arc<Store>,
    /// Tokens.
    pub auth: Auth,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Scheduler events, fanned out to `/v1/events` subscribers.
    pub events: broadcast::Sender<WorkerEvent>,
    /// Turns true when the daemon shuts down (ends event streams).
    pub shutdown: watch::Receiver<bool>,
    /// MAX_NB of an admission that gives none.
    pub default_max_nb: u64,
    /// Most live workers.
    pub max_workers: u16,
    /// The Agent's refusal flag.
    pub refusing: Arc<Mutex<Option<String>>>,
    /// The interfaces whose frames an XDP program or an AF_XDP socket receives
    /// ([`crate::DaemonConfig::xdp_ifaces`]): a tenant matching on `vlan` is warned
    /// about when it is admitted or changed, and at start.
    pub xdp_ifaces: Vec<String>,
}

/// Why a stored tenant could not be re-admitted at start (it is kept in the store, not
/// running): `tenant 9 ("acme"): isolation: asks for mpk, ...`, the tenant named once.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{}: {cause}", self.head())]
pub struct RestoreError {
    /// The tenant.
    pub id: u32,
    /// Its name, when its document has one.
    pub name: Option<String>,
    /// Why, without the tenant's id.
    pub cause: String,
}

impl RestoreError {
    /// The tenant as a line names it: `tenant 9 ("acme")`, or `tenant 9`.
    pub fn head(&self) -> String {
        tenant_head(self.id, self.name.as_deref())
    }
}

/// What [`AppState::restore`] did with the stored tenants.
#[derive(Debug, Default)]
pub struct Restored {
    /// How many were re-admitted.
    pub admitted: usize,
    /// The ones that could not be, kept in the store (and listed by the API) as they are.
    pub kept: Vec<RestoreError>,
}

/// `message` without the tenant it names first, for a restore's line, which names the
/// tenant itself: the source `request: ` (the document is validated as a request's would
/// be), then exactly `head` (`tenant 9 ("acme")`, as the tenants-file code labels a
/// tenant) or `tenant 9`, and the `: ` after it. Only that exact text is taken off: a
/// name with `): ` or quotes in it cannot cut the cause short.
fn without_tenant(message: &str, id: u32, head: &str) -> String {
    let m = message.strip_prefix("request: ").unwrap_or(message);
    [head.to_owned(), format!("tenant {id}")]
        .iter()
        .find_map(|h| m.strip_prefix(h.as_str())?.strip_prefix(": "))
        .unwrap_or(m)
        .to_owned()
}

/// The warning, one line, for the tenants of `tenants` whose rules match on `vlan`
/// when frames reach the data plane through XDP on `ifaces` (none: `None`), as `buffet
/// run` warns for `--port af-xdp` and `--dispatch xdp`: where the NIC or its driver takes
/// the 802.1Q tag out of a received frame (VLAN offload), the tag is not in the bytes an
/// XDP program or an AF_XDP socket sees, so such a rule matches no such frame; an
/// `af_packet` port puts the tag back.
fn stripped_vlan_warning<'a>(
    tenants: impl IntoIterator<Item = &'a TenantConfig>,
    ifaces: &[String],
) -> Option<String> {
    if ifaces.is_empty() {
        return None;
    }
    let problem = buffet_config::tenants::stripped_vlan_problem(tenants)?;
    let ethtool: Vec<String> = ifaces
        .iter()
        .map(|i| format!("ethtool -K {i} rxvlan off"))
        .collect();
    Some(format!(
        "buffetd: warning: {problem}. Turn the offload off ({}) or receive on a port of kind \
         \"af_packet\" (dispatch.mode = \"software\"), which puts the tag back",
        ethtool.join(", "),
    ))
}

/// Tenant `id` named as the tenants-file code labels it in its errors, `tenant 9
/// ("acme")`, or `tenant 9` without a name.
fn tenant_head(id: u32, name: Option<&str>) -> String {
    match name {
        Some(n) => format!("tenant {id} ({n:?})"),
        None => format!("tenant {id}"),
    }
}

/// The name a restore's line gives a stored tenant: its document's, unless that name
/// is one the tenants-file code leaves out of its labels too (stored before names were
/// bounded: too long, or with control characters), then the tenant is named by id.
fn label_name(doc: &Value) -> Option<String> {
    doc.get("name")
        .and_then(Value::as_str)
        .filter(|n| n.len() <= tenants::MAX_NAME_BYTES && !n.chars().any(char::is_control))
        .map(str::to_owned)
}

impl AppState {
    /// The state, with no tenant yet.
    pub fn new(p: Parts) -> AppState {
        AppState {
            plane: p.plane,
            store: p.store,
            auth: p.auth,
            metrics: p.metrics,
            tenants: RwLock::new(BTreeMap::new()),
            not_restored: RwLock::new(BTreeMap::new()),
            writes: tokio::sync::Mutex::new(()),
            events: p.events,
            shutdown: p.shutdown,
            default_max_nb: AtomicU64::new(p.default_max_nb),
            max_workers: AtomicU16::new(p.max_workers),
            refusing: p.refusing,
            ready: AtomicBool::new(false),
            reloader: OnceLock::new(),
            xdp_ifaces: p.xdp_ifaces,
        }
    }

    /// The warning for the running tenants that match on `vlan` when frames come
    /// through XDP ([`stripped_vlan_warning`]), or `None`: what the start says once the
    /// stored tenants are re-admitted.
    pub fn vlan_warning(&self) -> Option<String> {
        let tenants = self.tenants();
        stripped_vlan_warning(tenants.values().map(|a| &a.cfg), &self.xdp_ifaces)
    }

    /// Says on stderr that some of `changed` (tenants just admitted or changed) match on
    /// `vlan` where frames come through XDP. The API has no place for a warning in an
    /// answer; the operator reads the daemon's log.
    fn warn_vlan<'a>(&self, changed: impl IntoIterator<Item = &'a TenantConfig>) {
        if let Some(w) = stripped_vlan_warning(changed, &self.xdp_ifaces) {
            eprintln!("{w}");
        }
    }

    /// Sets what `POST /v1/reload` calls (once; later calls are ignored).
    pub fn set_reloader(&self, reloader: Reloader) {
        let _ = self.reloader.set(reloader);
    }

    /// Re-admits the stored tenants (blocking; before serving). Each is checked as an
    /// admission is — its isolation level against the server's, its policy and chain
    /// against the NFs, its room in the data plane — since the config may have changed
    /// since it was admitted: a tenant that asked for `mpk` is never run at another
    /// level. One that fails no longer runs but stays in the store as it is (document
    /// and tokens) and is listed as `not_restored`; the others run.
    pub fn restore(&self, stored: Vec<(u32, Vec<u8>)>) -> Restored {
        let mut out = Restored::default();
        for (id, bytes) in stored {
            let doc: Value = match serde_json::from_slice(&bytes) {
                Ok(doc) => doc,
                Err(e) => {
                    let e = RestoreError {
                        id,
                        name: None,
                        cause: format!("not a JSON document: {e}"),
                    };
                    out.kept.push(self.keep(json!({ "id": id }), e));
                    continue;
                }
            };
            let name = label_name(&doc);
            match self.readmit(id, name.as_deref(), &doc) {
                Ok(cfg) => {
                    self.tenants_mut().insert(id, Admitted { doc, cfg });
                    out.admitted += 1;
                }
                Err(cause) => out
                    .kept
                    .push(self.keep(doc, RestoreError { id, name, cause })),
            }
        }
        out
    }

    /// The checks and the admission of stored tenant `id`'s document (`name` as
    /// [`label_name`] gives it); on error nothing changed and the error is why, without
    /// the tenant (a restore's line names it itself). A refusal that keeps its parts
    /// apart gives its cause as is; one that is only text loses exactly the tenant it
    /// names first ([`without_tenant`]).
    fn readmit(&self, id: u32, name: Option<&str>, doc: &Value) -> Result<TenantConfig, String> {
        let head = tenant_head(id, name);
        let text = |e: &dyn std::fmt::Display| without_tenant(&e.to_string(), id, &head);
        let cfg = parse_tenants(self.plane.registered_names(), vec![doc.clone()])
            .map_err(|e| match e {
                tenants::TenantsError::Field { field, message, .. } => {
                    format!("{field}: {message}")
                }
                other => text(&other),
            })?
            .pop()
            .ok_or_else(|| "empty document".to_owned())?;
        if let Some(cause) = self.level_problem(&cfg) {
            return Err(cause);
        }
        self.plane.check_policy(&cfg).map_err(|e| match e {
            PlaneError::Policy { error, .. } => error.to_string(),
            other => text(&other),
        })?;
        self.plane.admit(&cfg).map_err(|e| text(&e))?;
        Ok(cfg)
    }

    /// Admits `a` into the data plane and stores its document under `id`; a store that
    /// fails takes the admission back, so nothing changed.
    fn admit_and_store(&self, id: u32, a: &Admitted) -> Result<(), ApiError> {
        self.plane.admit(&a.cfg)?;
        let bytes = serde_json::to_vec(&a.doc).map_err(|e| ApiError::internal(e.to_string()))?;
        if let Err(e) = self.store.apply(&Batch {
            put: vec![(id, bytes)],
            delete: vec![],
        }) {
            let _ = self.plane.remove(a.cfg.id);
            return Err(e.into());
        }
        Ok(())
    }

    /// Keeps stored tenant `e.id` (its document `doc`) as not restored, for `e.cause`.
    fn keep(&self, doc: Value, e: RestoreError) -> RestoreError {
        self.not_restored_mut().insert(
            e.id,
            NotRestored {
                doc,
                reason: e.cause.clone(),
            },
        );
        e
    }

    /// The limits a config reload may change: MAX_NB of an admission that gives none,
    /// and the most live workers `POST /v1/workers` allows.
    pub fn set_limits(&self, default_max_nb: u64, max_workers: u16) {
        self.default_max_nb.store(default_max_nb, Ordering::Relaxed);
        self.max_workers.store(max_workers, Ordering::Relaxed);
    }

    /// The tokens (a config reload replaces the admin token).
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    fn default_max_nb(&self) -> u64 {
        self.default_max_nb.load(Ordering::Relaxed)
    }

    /// Marks the API ready (`/readyz` answers 200) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    fn tenants_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u32, Admitted>> {
        self.tenants.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn tenants(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u32, Admitted>> {
        self.tenants.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn not_restored_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u32, NotRestored>> {
        self.not_restored
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn not_restored(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u32, NotRestored>> {
        self.not_restored
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Stored tenant `id`, kept not running since the start, if it is one.
    fn not_restored_one(&self, id: u32) -> Option<NotRestored> {
        self.not_restored().get(&id).cloned()
    }

    /// Who sent a request: the daemon itself ([`Internal`]) is the admin; anyone else is
    /// whom its bearer token names.
    fn principal(&self, parts: &axum::http::request::Parts) -> Result<Principal, ApiError> {
        if parts.extensions.get::<Internal>().is_some() {
            return Ok(Principal::Admin);
        }
        let h = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        Ok(self.auth.identify(h)?)
    }

    /// A new tenant `t` (not yet admitted) against the current set minus `leaving`:
    /// duplicate id, isolation level, overlapping rules, policy.
    fn check_new(
        &self,
        t: &TenantConfig,
        others: &BTreeMap<u32, TenantConfig>,
    ) -> Result<(), ApiError> {
        if others.contains_key(&t.id.0) {
            return Err(ApiError::conflict(format!(
                "tenant {} is already admitted",
                t.id
            )));
        }
        self.check_level(t)?;
        check_overlaps(t, others)?;
        self.plane.check_policy(t)?;
        Ok(())
    }

    /// 503 while the Agent refuses new tenants (overloaded, no worker to launch): every
    /// request that would add a tenant, alone or in a tenant set, is counted and refused.
    fn check_admitting(&self) -> Result<(), ApiError> {
        self.refusal().inspect_err(|_| {
            self.metrics
                .refused_admissions
                .fetch_add(1, Ordering::Relaxed);
        })
    }

    /// The Agent's refusal as the 503 it answers, not counted: what a dry run says.
    fn refusal(&self) -> Result<(), ApiError> {
        let reason = self
            .refusing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match reason {
            Some(reason) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not admitting new tenants: {reason}"),
            )),
            None => Ok(()),
        }
    }

    /// Lifts the Agent's refusal: a tenant was removed or a worker launched, so there is
    /// room again (the next overload report sets it anew if there is not).
    fn stop_refusing(&self) {
        *self.refusing.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn check_level(&self, t: &TenantConfig) -> Result<(), ApiError> {
        match self.level_problem(t) {
            Some(p) => Err(ApiError::unprocessable(format!("tenant {}: {p}", t.id))),
            None => Ok(()),
        }
    }

    /// What is wrong with `t`'s isolation level here, without the tenant.
    fn level_problem(&self, t: &TenantConfig) -> Option<String> {
        let here = self.plane.level();
        match t.isolation {
            Some(l) if l != here => Some(format!(
                "isolation: asks for {}, this server runs every tenant at {}",
                l.name(),
                here.name()
            )),
            _ => None,
        }
    }

    /// The change of tenant `new.id` to `new`, against the other tenants `others`: the
    /// isolation level, overlapping rules, the policy. Name, rules, MAX_NB, weight and
    /// policy can all change in place.
    fn check_update(
        &self,
        new: &TenantConfig,
        others: &BTreeMap<u32, TenantConfig>,
    ) -> Result<(), ApiError> {
        self.check_level(new)?;
        check_overlaps(new, others)?;
        self.plane.check_policy(new)?;
        Ok(())
    }
}

/// True when some packet could match both rules.
fn overlap(a: &Match, b: &Match) -> bool {
    if a.validate().is_err() || b.validate().is_err() {
        return false;
    }
    a.overlaps(b)
}

/// Refuses a tenant one of whose rules overlaps another tenant's rule at the same
/// priority: which tenant a packet belongs to would depend on admission order.
fn check_overlaps(t: &TenantConfig, others: &BTreeMap<u32, TenantConfig>) -> Result<(), ApiError> {
    for (i, (pa, ma)) in t.rules.iter().enumerate() {
        for (oid, o) in others.iter().filter(|(id, _)| **id != t.id.0) {
            for (j, (pb, mb)) in o.rules.iter().enumerate() {
                if pa == pb && overlap(ma, mb) {
                    return Err(ApiError::conflict(format!(
                        "tenant {}: rules[{i}] overlaps tenant {oid}'s rules[{j}] at the same \
                         priority {pa}: give one of them another priority",
                        t.id
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Validates tenant documents with the tenants-file code; a stage may name the NFs the
/// embedding program registered (`registered`, [`Plane::registered_names`]).
fn parse_docs(registered: &[String], docs: Vec<Value>) -> Result<Vec<TenantConfig>, ApiError> {
    parse_tenants(registered, docs).map_err(|e| ApiError::unprocessable(e.to_string()))
}

/// [`parse_docs`] with the tenants-file code's own error (its field and message apart).
fn parse_tenants(
    registered: &[String],
    docs: Vec<Value>,
) -> Result<Vec<TenantConfig>, tenants::TenantsError> {
    let text = json!({ "tenant": docs }).to_string();
    buffet_config::registry::with_registered_names(registered, || {
        tenants::parse(Format::Json, Path::new("request"), &text)
    })
}

/// When a request must be answered: set by [`run_to_completion`] as the request enters,
/// read by [`JsonBody`] so that waiting for a body ends then too.
#[derive(Clone, Copy)]
struct Deadline(tokio::time::Instant);

/// Marks a request the daemon makes to its own routes in this process (the cluster
/// Agent's admissions, updates and removals): it is served as the admin's without a
/// token, so a reload that replaces the admin token does not lock the daemon out of its
/// own API. A request from the network never carries it (hyper builds those with no
/// extensions), and no code outside this crate can make one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Internal;

/// Who sent the request ([`AppState::principal`]), from the request head alone.
struct Caller(Principal);

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        Ok(Caller(state.principal(parts)?))
    }
}

/// The admin, checked from the request head alone. As an extractor placed before the
/// body's, it refuses a request before its body is read: a client without the token
/// cannot hold a connection by announcing a body it never sends (its request is
/// answered 401 and, the body unread, the connection closed).
struct Admin;

impl FromRequestParts<Arc<AppState>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        state.principal(parts)?.admin()?;
        Ok(Admin)
    }
}

/// A request body: JSON, a size the limit allows, read by the request's [`Deadline`]. A
/// body not complete by then is a 408 and the read stops, so the request lets go of the
/// connection (the 408 closes it) instead of waiting for bytes that may never come.
struct JsonBody(Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let deadline = req.extensions().get::<Deadline>().copied();
        let read = Bytes::from_request(req, state);
        let body = match deadline {
            Some(Deadline(at)) => tokio::time::timeout_at(at, read).await.map_err(|_| {
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request body did not arrive in time (api.request_timeout_ms)",
                )
            })?,
            None => read.await,
        };
        let body = body.map_err(|r: BytesRejection| {
            let status = r.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(status, "request body too large")
            } else {
                ApiError::new(status, format!("cannot read the request body: {r}"))
            }
        })?;
        serde_json::from_slice(&body)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))
    }
}

/// A tenant's document as `GET /v1/tenants` and `GET /v1/tenants/{id}` show one kept
/// not running, sent back (to `PUT /v1/tenants/{id}` or in a tenant set): its
/// `"state": "not_restored"` and `reason` say how the server holds it, they are no part
/// of the document, and are taken off. Any other `state` stays, and the schema refuses
/// it as an unknown field.
fn without_row_fields(mut doc: Value) -> Value {
    if let Some(o) = doc.as_object_mut() {
        if o.get("state").and_then(Value::as_str) == Some("not_restored") {
            o.remove("state");
            o.remove("reason");
        }
    }
    doc
}

/// A tenant document with the server's default MAX_NB filled in.
fn with_default_max_nb(mut v: Value, default: u64) -> Result<Value, ApiError> {
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("a tenant is a JSON object"))?;
    obj.entry("max_nb").or_insert(json!(default));
    Ok(v)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("task failed: {e}")))?
}

/// The OpenAPI document of this API (`docs/openapi.json`), served at
/// `GET /v1/openapi.json`; a test checks that it documents exactly [`routes`].
pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");

type Handler = axum::routing::MethodRouter<Arc<AppState>>;

/// Every route: method, path, handler. The router is built from this table and nothing
/// else, so [`routes`] is the whole API.
fn table() -> Vec<(Method, &'static str, Handler)> {
    vec![
        (Method::GET, "/healthz", get(healthz)),
        (Method::GET, "/readyz", get(readyz)),
        (Method::GET, "/metrics", get(metrics)),
        (Method::GET, "/v1/openapi.json", get(openapi)),
        (Method::GET, "/v1/tenants", get(list_tenants)),
        (Method::POST, "/v1/tenants", post(admit)),
        (Method::PUT, "/v1/tenants", put(apply)),
        (Method::GET, "/v1/tenants/{id}", get(get_tenant)),
        (Method::PUT, "/v1/tenants/{id}", put(update)),
        (Method::DELETE, "/v1/tenants/{id}", delete(remove)),
        (Method::GET, "/v1/tenants/{id}/stats", get(tenant_stats)),
        (Method::POST, "/v1/tenants/{id}/tokens", post(create_token)),
        (
            Method::POST,
            "/v1/tenants/{id}/release",
            post(release_tenant),
        ),
        (Method::GET, "/v1/stats", get(stats)),
        (Method::GET, "/v1/workers", get(list_workers)),
        (Method::POST, "/v1/workers", post(launch_worker)),
        (Method::DELETE, "/v1/workers/{id}", delete(terminate_worker)),
        (Method::GET, "/v1/events", get(events)),
        (Method::POST, "/v1/reload", post(reload)),
    ]
}

/// Every `(method, path)` the API serves (paths in axum's and OpenAPI's `{param}` form).
pub fn routes() -> Vec<(Method, &'static str)> {
    table().into_iter().map(|(m, p, _)| (m, p)).collect()
}

/// A path parameter; a path that does not parse is a 400 in JSON, like every other
/// error (axum's own rejection is plain text).
struct UrlPath<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for UrlPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(UrlPath(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// A query string; one that does not parse is a 400 in JSON.
struct Query<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// The router, with the body limit and the request timeout.
pub fn router(state: Arc<AppState>, max_body: usize, timeout: Duration) -> Router {
    table()
        .into_iter()
        .fold(Router::new(), |r, (_, path, handler)| {
            r.route(path, handler)
        })
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|method: Method| async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "{method} is not served on this route (GET /v1/openapi.json lists the API)"
                ),
            )
        })
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn(move |req, next| {
            run_to_completion(req, next, timeout)
        }))
        .with_state(state)
}

/// Runs a request's handler on a task of its own and answers 408 when it takes longer
/// than `timeout`. The handler is not cancelled then: a change it started (admitting,
/// updating, removing a tenant: data plane, store and the API's own view, under the
/// writes lock) finishes, so the three never disagree; the 408 says so. Dropping the
/// handler's future instead would stop it between a change that was made and the record
/// of it. The request carries its [`Deadline`]: a handler still reading its body then
/// stops reading ([`JsonBody`]), so no task outlives the 408 waiting on the client.
async fn run_to_completion(
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
    timeout: Duration,
) -> Response {
    req.extensions_mut()
        .insert(Deadline(tokio::time::Instant::now() + timeout));
    let task = tokio::spawn(next.run(req));
    match tokio::time::timeout(timeout, task).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => {
            ApiError::internal(format!("the request's handler failed: {e}")).into_response()
        }
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "no answer within {} ms; a change the request started still completes: \
                 read the resource to see its outcome",
                timeout.as_millis()
            ),
        )
        .into_response(),
    }
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<Arc<AppState>>) -> Response {
    if s.ready.load(Ordering::Acquire) {
        "ready\n".into_response()
    } else {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn report(s: &Arc<AppState>) -> Result<Report, ApiError> {
    let plane = s.plane.clone();
    blocking(move || Ok(plane.report()?)).await
}

async fn metrics(State(s): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let r = report(&s).await?;
    let text = s
        .metrics
        .encode(r)
        .map_err(|e| ApiError::internal(format!("encoding metrics: {e}")))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

fn view(id: u32, a: &Admitted) -> Value {
    let mut v = a.doc.clone();
    if let Some(o) = v.as_object_mut() {
        o.insert("id".into(), json!(id));
        o.entry("name").or_insert(json!(a.cfg.name));
    }
    v
}

/// A stored tenant not running: its document, with `"state": "not_restored"` and the
/// reason beside it (a running tenant's row has no `state`).
fn not_restored_view(id: u32, n: &NotRestored) -> Value {
    let mut v = n.doc.clone();
    if let Some(o) = v.as_object_mut() {
        o.insert("id".into(), json!(id));
        o.insert("state".into(), json!("not_restored"));
        o.insert("reason".into(), json!(n.reason));
    }
    v
}

/// What answers a request that needs stored tenant `id` running, or its id free, when
/// it is kept not running: `status`, why, and the way out.
fn not_running(id: u32, n: &NotRestored, status: StatusCode) -> ApiError {
    ApiError::new(
        status,
        format!(
            "tenant {id} is stored but not running (not restored at start: {}): \
             replace it (PUT /v1/tenants/{id}) or remove it (DELETE /v1/tenants/{id})",
            n.reason
        ),
    )
}

async fn list_tenants(State(s): State<Arc<AppState>>, _: Admin) -> Result<Json<Value>, ApiError> {
    let mut rows: BTreeMap<u32, Value> = s
        .tenants()
        .iter()
        .map(|(id, a)| (*id, view(*id, a)))
        .collect();
    for (id, n) in s.not_restored().iter() {
        rows.insert(*id, not_restored_view(*id, n));
    }
    let list: Vec<Value> = rows.into_values().collect();
    Ok(Json(json!({ "tenant": list })))
}

async fn get_tenant(
    State(s): State<Arc<AppState>>,
    UrlPath(id): UrlPath<u32>,
    Caller(who): Caller,
) -> Result<Json<Value>, ApiError> {
    who.may_read(TenantId(id))?;
    if let Some(a) = s.tenants().get(&id) {
        return Ok(Json(view(id, a)));
    }
    s.not_restored()
        .get(&id)
        .map(|n| Json(not_restored_view(id, n)))
        .ok_or_else(|| ApiError::not_found(format!("tenant {id} is not admitted")))
}

async fn tenant_stats(
    State(s): State<Arc<AppState>>,
    UrlPath(id): UrlPath<u32>,
    Caller(who): Caller,
) -> Result<Json<Value>, ApiError> {
    who.may_read(TenantId(id))?;
    if let Some(n) = s.not_restored_one(id) {
        return Err(not_running(id, &n, StatusCode::NOT_FOUND));
    }
    let r = report(&s).await?;
    let t = r
        .tenants
        .iter()
        .find(|t| t.id.0 == id)
        .ok_or_else(|| ApiError::not_found(format!("tenant {id} is not admitted")))?;
    let mut v = serde_json::to_value(t).map_err(|e| ApiError::internal(e.to_string()))?;
    // With chains: the per-stage counters, one object per stage in chain order.
    let stages = buffet_config::chain::stage_rows(&t.nf);
    if let (Some(o), false) = (v.as_object_mut(), stages.is_empty()) {
        o.insert("chain".into(), json!(stages));
    }
    Ok(Json(v))
}

async fn stats(State(s): State<Arc<AppState>>, _: Admin) -> Result<Json<Value>, ApiError> {
    let r = report(&s).await?;
    serde_json::to_value(&r)
        .map(Json)
        .map_err(|e| ApiError::internal(e.to_string()))
}

async fn admit(
    State(s): State<Arc<AppState>>,
    _: Admin,
    JsonBody(doc): JsonBody,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let started = Instant::now();
    let doc = with_default_max_nb(doc, s.default_max_nb())?;
    let cfg = parse_docs(s.plane.registered_names(), vec![doc.clone()])?
        .pop()
        .ok_or_else(|| ApiError::bad_request("no tenant"))?;
    s.check_admitting()?;
    let _one = s.writes.lock().await;
    let id = cfg.id.0;
    if let Some(n) = s.not_restored_one(id) {
        return Err(not_running(id, &n, StatusCode::CONFLICT));
    }
    let others: BTreeMap<u32, TenantConfig> = s
        .tenants()
        .iter()
        .map(|(k, a)| (*k, a.cfg.clone()))
        .collect();
    s.check_new(&cfg, &others)?;
    let st = s.clone();
    let admitted = Admitted { doc, cfg };
    let a = admitted.clone();
    blocking(move || st.admit_and_store(id, &a)).await?;
    let v = view(id, &admitted);
    s.warn_vlan([&admitted.cfg]);
    s.tenants_mut().insert(id, admitted);
    s.metrics
        .admission_latency
        .observe(started.elapsed().as_secs_f64());
    Ok((StatusCode::CREATED, Json(v)))
}

async fn update(
    State(s): State<Arc<AppState>>,
    UrlPath(id): UrlPath<u32>,
    _: Admin,
    JsonBody(doc): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let mut doc = without_row_fields(doc);
    if let Some(o) = doc.as_object_mut() {
        match o.get("id") {
            None => {
                o.insert("id".into(), json!(id));
            }
            Some(v) if v.as_u64() == Some(u64::from(id)) => {}
            Some(v) => {
                return Err(ApiError::unprocessable(format!(
                    "id: the body's id {v} is not the path's {id}"
                )))
            }
        }
    }
    let doc = with_default_max_nb(doc, s.default_max_nb())?;
    let cfg = parse_docs(s.plane.registered_names(), vec![doc.clone()])?
        .pop()
        .ok_or_else(|| ApiError::bad_request("no tenant"))?;
    let _one = s.writes.lock().await;
    let old = s.tenants().get(&id).cloned();
    let Some(old) = old else {
        if s.not_restored_one(id).is_some() {
            return readmit(&s, Admitted { doc, cfg }).await.map(Json);
        }
        return Err(ApiError::not_found(format!("tenant {id} is not admitted")));
    };
    let others: BTreeMap<u32, TenantConfig> = s
        .tenants()
        .iter()
        .map(|(k, a)| (*k, a.cfg.clone()))
        .collect();
    s.check_update(&cfg, &others)?;
    let new = Admitted { doc, cfg };
    let (st, n) = (s.clone(), new.clone());
    blocking(move || {
        st.plane.update(&old.cfg, &n.cfg)?;
        let bytes = serde_json::to_vec(&n.doc).map_err(|e| ApiError::internal(e.to_string()))?;
        if let Err(e) = st.store.apply(&Batch {
            put: vec![(id, bytes)],
            delete: vec![],
        }) {
            let _ = st.plane.update(&n.cfg, &old.cfg);
            return Err(e.into());
        }
        Ok(())
    })
    .await?;
    let v = view(id, &new);
    s.warn_vlan([&new.cfg]);
    s.tenants_mut().insert(id, new);
    Ok(Json(v))
}

/// `PUT /v1/tenants/{id}` of a stored tenant not running (with the writes lock held):
/// its new document is admitted as a new tenant is (the Agent's refusal included) and
/// replaces the stored one; its tokens stay.
async fn readmit(s: &Arc<AppState>, new: Admitted) -> Result<Value, ApiError> {
    let id = new.cfg.id.0;
    s.check_admitting()?;
    let others: BTreeMap<u32, TenantConfig> = s
        .tenants()
        .iter()
        .map(|(k, a)| (*k, a.cfg.clone()))
        .collect();
    s.check_new(&new.cfg, &others)?;
    let (st, n) = (s.clone(), new.clone());
    blocking(move || st.admit_and_store(id, &n)).await?;
    let v = view(id, &new);
    s.warn_vlan([&new.cfg]);
    s.not_restored_mut().remove(&id);
    s.tenants_mut().insert(id, new);
    Ok(v)
}

async fn remove(
    State(s): State<Arc<AppState>>,
    UrlPath(id): UrlPath<u32>,
    _: Admin,
) -> Result<StatusCode, ApiError> {
    let _one = s.writes.lock().await;
    let old = s.tenants().get(&id).cloned();
    let Some(old) = old else {
        if s.not_restored_one(id).is_none() {
            return Err(ApiError::not_found(format!("tenant {id} is not admitted")));
        }
        // Not in the data plane: only the store (its document and tokens) has it. Its
        // removal frees no room there, so the Agent's refusal stays.
        let store = s.store.clone();
        blocking(move || {
            Ok(store.apply(&Batch {
                put: vec![],
                delete: vec![id],
            })?)
        })
        .await?;
        s.not_restored_mut().remove(&id);
        s.auth.forget_tenant(TenantId(id));
        return Ok(StatusCode::NO_CONTENT);
    };
    let st = s.clone();
    blocking(move || {
        st.plane.remove(TenantId(id))?;
        if let Err(e) = st.store.apply(&Batch {
            put: vec![],
            delete: vec![id],
        }) {
            // Put it back: the store still has it, a restart would re-admit it.
            let _ = st.plane.admit(&old.cfg);
            return Err(e.into());
        }
        Ok(())
    })
    .await?;
    s.tenants_mut().remove(&id);
    s.auth.forget_tenant(TenantId(id));
    s.stop_refusing();
    Ok(StatusCode::NO_CONTENT)
}

/// `?dry_run=true`: validate only.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApplyQuery {
    #[serde(default)]
    dry_run: bool,
}

/// One step of a batch, undone in reverse on failure.
enum Step {
    Removed(TenantConfig),
    /// From the first to the second.
    Updated(TenantConfig, TenantConfig),
    Added(TenantId),
}

async fn apply(
    State(s): State<Arc<AppState>>,
    Query(q): Query<ApplyQuery>,
    _: Admin,
    JsonBody(doc): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let list = doc
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("tenant"))
        .and_then(Value::as_array)
        .ok_or_else(|| {
            ApiError::bad_request(
                "a tenant set is {\"tenant\": [ ... ]} (the tenants file as JSON)",
            )
        })?
        .clone();
    let docs = list
        .into_iter()
        .map(|d| with_default_max_nb(without_row_fields(d), s.default_max_nb()))
        .collect::<Result<Vec<_>, _>>()?;
    // An empty set is valid here (remove every tenant); the file parser wants entries.
    let cfgs = if docs.is_empty() {
        Vec::new()
    } else {
        parse_docs(s.plane.registered_names(), docs.clone())?
    };
    let _one = s.writes.lock().await;
    let current = s.tenants().clone();
    // Stored tenants not running: admitted anew when the set has them, else removed
    // from the store.
    let kept: Vec<u32> = s.not_restored().keys().copied().collect();
    let wanted: BTreeMap<u32, Admitted> = docs
        .into_iter()
        .zip(cfgs)
        .map(|(doc, cfg)| (cfg.id.0, Admitted { doc, cfg }))
        .collect();
    // A set that adds tenants is refused as an admission is, removals in it or not, and
    // first, as an admission is: a 503 before any 409 or 422 of the tenants in it. A dry
    // run says so but counts no refused admission: it admits nothing.
    if wanted.keys().any(|id| !current.contains_key(id)) {
        if q.dry_run {
            s.refusal()?;
        } else {
            s.check_admitting()?;
        }
    }
    let final_set: BTreeMap<u32, TenantConfig> =
        wanted.iter().map(|(k, a)| (*k, a.cfg.clone())).collect();
    let (mut added, mut updated, mut removed, mut unchanged) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, a) in &wanted {
        match current.get(id) {
            None => {
                let mut others = final_set.clone();
                others.remove(id);
                s.check_new(&a.cfg, &others)?;
                added.push(*id);
            }
            Some(old) if old.cfg == a.cfg => unchanged.push(*id),
            Some(_) => {
                s.check_update(&a.cfg, &final_set)?;
                updated.push(*id);
            }
        }
    }
    for id in current.keys().chain(&kept) {
        if !wanted.contains_key(id) {
            removed.push(*id);
        }
    }
    removed.sort_unstable();
    let summary = json!({
        "added": added, "updated": updated, "removed": removed, "unchanged": unchanged,
        "dry_run": q.dry_run,
    });
    if q.dry_run {
        return Ok(Json(summary));
    }
    // Only a running tenant's removal frees room (a slot, its region, its workers'
    // load) and lifts the Agent's refusal, as `DELETE` does; one kept not running since
    // the start held none.
    let frees = removed.iter().any(|id| current.contains_key(id));
    let mut changed: Vec<u32> = added.iter().chain(&updated).copied().collect();
    changed.sort_unstable();
    let st = s.clone();
    let w = wanted.clone();
    blocking(move || {
        let mut done: Vec<Step> = Vec::new();
        let undo = |done: Vec<Step>| {
            for step in done.into_iter().rev() {
                let _ = match step {
                    Step::Removed(cfg) => st.plane.admit(&cfg),
                    Step::Updated(old, new) => st.plane.update(&new, &old),
                    Step::Added(id) => st.plane.remove(id),
                };
            }
        };
        let mut run = || -> Result<Batch, ApiError> {
            let mut batch = Batch::default();
            for id in &removed {
                if let Some(old) = current.get(id) {
                    st.plane.remove(TenantId(*id))?;
                    done.push(Step::Removed(old.cfg.clone()));
                }
                batch.delete.push(*id);
            }
            for id in &updated {
                st.plane.update(&current[id].cfg, &w[id].cfg)?;
                done.push(Step::Updated(current[id].cfg.clone(), w[id].cfg.clone()));
                batch
                    .put
                    .push((*id, serde_json::to_vec(&w[id].doc).unwrap_or_default()));
            }
            for id in &added {
                st.plane.admit(&w[id].cfg)?;
                done.push(Step::Added(TenantId(*id)));
                batch
                    .put
                    .push((*id, serde_json::to_vec(&w[id].doc).unwrap_or_default()));
            }
            Ok(batch)
        };
        let batch = match run() {
            Ok(b) => b,
            Err(e) => {
                undo(done);
                return Err(e);
            }
        };
        if let Err(e) = st.store.apply(&batch) {
            undo(done);
            return Err(e.into());
        }
        for id in &batch.delete {
            st.auth.forget_tenant(TenantId(*id));
        }
        Ok(())
    })
    .await?;
    s.warn_vlan(
        changed
            .iter()
            .filter_map(|id| wanted.get(id))
            .map(|a| &a.cfg),
    );
    *s.tenants_mut() = wanted;
    s.not_restored_mut().clear();
    if frees {
        s.stop_refusing();
    }
    Ok(Json(summary))
}

async fn create_token(
    State(s): State<Arc<AppState>>,
    UrlPath(id): UrlPath<u32>,
    _: Admin,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let _one = s.writes.lock().await;
    if !s.tenants().contains_key(&id) && s.not_restored_one(id).is_none() {
        return Err(ApiError::not_found(format!("tenant {id} is not admitted")));
    }
    let token = auth::generate();
    let h = auth::hash(&token);
    let store = s.store.clone();
    blocking(move || Ok(store.put_token(&h, id)?)).await?;
    s.auth.add_tenant_token(h, TenantId(id));
    Ok((
        StatusCode::CREATED,
        Json(json!({ "tenant": id, "token": token })),
    ))
}

async fn list_workers(State(s): State<Arc<AppState>>, _: Admin) -> Result<Json<Value>, ApiError> {
    let r = report(&s).await?;
    serde_json::to_value(&r.workers)
        .map(|w| Json(json!({ "workers": w })))
        .map_err(|e| ApiError::internal(e.to_string()))
}

async fn launch_worker(
    State(s): State<Arc<AppState>>,
    _: Admin,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let _one = s.writes.lock().await;
    let r = report(&s).await?;
    let live = r.workers.iter().filter(|w| w.live).count();
    let max = s.max_workers.load(Ordering::Relaxed);
    if live >= usize::from(max) {
        return Err(ApiError::conflict(format!(
            "{live} workers are live: dataplane.max_workers is {max}"
        )));
    }
    let plane = s.plane.clone();
    let id = blocking(move || Ok(plane.launch_worker()?)).await?;
    s.stop_refusing();
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

/// Lifts a tenant's quarantine (the operator's decision; refused while its backoff runs).
async fn release_tenant(
    State(s): State<Arc<AppState>>,
    UrlPath(id): UrlPath<u32>,
    _: Admin,
) -> Result<StatusCode, ApiError> {
    let _one = s.writes.lock().await;
    let plane = s.plane.clone();
    blocking(move || Ok(plane.release(id)?)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn terminate_worker(
    State(s): State<Arc<AppState>>,
    UrlPath(id): UrlPath<u16>,
    _: Admin,
) -> Result<StatusCode, ApiError> {
    let _one = s.writes.lock().await;
    let plane = s.plane.clone();
    blocking(move || Ok(plane.terminate_worker(id)?)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Reads the config again and applies its mutable parts, all or nothing (as SIGHUP
/// does): 200 with the fields that changed, or a 4xx naming why nothing did (409: the
/// first field that needs a restart; 422: the config cannot be read or is invalid).
async fn reload(State(s): State<Arc<AppState>>, _: Admin) -> Result<Json<Value>, ApiError> {
    let reloader = s
        .reloader
        .get()
        .cloned()
        .ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not ready"))?;
    let _one = s.writes.lock().await;
    let changed = blocking(move || {
        reloader().map_err(|e| {
            eprintln!("buffetd: API: reload refused, nothing changed: {e}");
            ApiError::from(e)
        })
    })
    .await?;
    eprintln!(
        "buffetd: API: config reloaded: {}",
        if changed.is_empty() {
            "nothing changed".to_owned()
        } else {
            changed.join(", ")
        }
    );
    Ok(Json(json!({ "changed": changed })))
}

fn event_name(e: &WorkerEvent) -> &'static str {
    match e {
        WorkerEvent::Migration { .. } => "migration",
        WorkerEvent::Overload { .. } => "overload",
        WorkerEvent::Fault { .. } => "quarantine",
        WorkerEvent::WorkerLaunched { .. } => "worker_launched",
        WorkerEvent::WorkerTerminated { .. } => "worker_terminated",
        WorkerEvent::WorkerDied { .. } => "worker_died",
        WorkerEvent::WorkerStuck { .. } => "worker_stuck",
        WorkerEvent::PortDown { .. } => "port_down",
        WorkerEvent::Released { .. } => "released",
    }
}

async fn events(
    State(s): State<Arc<AppState>>,
    _: Admin,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let rx = s.events.subscribe();
    let stop = s.shutdown.clone();
    let stream = futures_util::stream::unfold((rx, stop), |(mut rx, mut stop)| async move {
        if *stop.borrow() {
            return None;
        }
        let ev = tokio::select! {
            r = rx.recv() => match r {
                Ok(e) => SseEvent::default()
                    .event(event_name(&e))
                    .json_data(&e)
                    .unwrap_or_default(),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    SseEvent::default().event("lagged").data(n.to_string())
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            },
            _ = stop.changed() => return None,
        };
        Some((Ok(ev), (rx, stop)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use tower::ServiceExt;

    /// The Memory Manager's failures split by whose they are: the host's or the NF's
    /// (500) against a conflict the client can resolve (409).
    #[test]
    fn memory_failures_of_the_host_are_500_and_conflicts_409() {
        let status = |source: MemoryError| {
            ApiError::from(PlaneError::Pipeline(PipelineError::Memory {
                tenant: TenantId(7),
                source,
            }))
            .status
        };
        assert_eq!(
            status(MemoryError::Enter(buffet_memory::EnterError::NoKey)),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            status(MemoryError::StateTooLarge {
                state_bytes: 64,
                region_bytes: 8
            }),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            status(MemoryError::StaleReplacement {
                tenant: TenantId(7)
            }),
            StatusCode::CONFLICT
        );
    }

    /// A restore names the tenant itself: the cause drops exactly the tenant the refusal
    /// names first (and the `request` source), and nothing else, whatever the name holds.
    #[test]
    fn a_restores_cause_names_its_tenant_nowhere() {
        let acme = r#"tenant 9 ("acme")"#;
        assert_eq!(
            without_tenant("tenant 9: policy.flow_capacity: bad", 9, acme),
            "policy.flow_capacity: bad"
        );
        assert_eq!(
            without_tenant(
                r#"request: tenant 9 ("acme"): rules[0].dst_ip: invalid"#,
                9,
                acme
            ),
            "rules[0].dst_ip: invalid"
        );
        assert_eq!(
            without_tenant("request: tenant 9: name: too long", 9, "tenant 9"),
            "name: too long"
        );
        assert_eq!(
            without_tenant("too many tenants: all 2 slots are in use", 9, acme),
            "too many tenants: all 2 slots are in use"
        );
        assert_eq!(
            without_tenant("tenant 90: x", 9, "tenant 9"),
            "tenant 90: x"
        );
        // A name that looks like the end of a label, or holds quotes.
        let odd = tenant_head(9, Some(r#"a): b "c""#));
        assert_eq!(odd, r#"tenant 9 ("a): b \"c\"")"#);
        assert_eq!(
            without_tenant(
                r#"request: tenant 9 ("a): b \"c\""): chain[0].nf: not offered"#,
                9,
                &odd
            ),
            "chain[0].nf: not offered"
        );
        let e = RestoreError {
            id: 9,
            name: Some("acme".into()),
            cause: "isolation: asks for mpk".into(),
        };
        assert_eq!(
            e.to_string(),
            r#"tenant 9 ("acme"): isolation: asks for mpk"#
        );
    }

    /// Tenants matching on `vlan` are warned about where frames come through XDP, named
    /// with what to do on each such interface; without XDP, or without a `vlan` rule,
    /// nothing is said.
    #[test]
    fn a_vlan_rule_where_frames_come_through_xdp_is_warned_about() {
        let docs = vec![
            json!({ "id": 4, "rules": [ { "vlan": 12 } ] }),
            json!({ "id": 5, "rules": [ { "dst_ip": "10.5.0.0/16" } ] }),
            json!({ "id": 7, "rules": [ { "dst_ip": "10.7.0.0/16" },
                                        { "vlan": 7, "dst_port": 80, "protocol": "tcp" } ] }),
        ];
        let ts = parse_tenants(&[], docs).unwrap();
        let eth = vec!["eth1".to_owned()];
        assert_eq!(stripped_vlan_warning(&ts, &[]), None);
        assert_eq!(stripped_vlan_warning(&ts[1..2], &eth), None);
        let w = stripped_vlan_warning(&ts, &eth).unwrap();
        assert!(
            w.starts_with("buffetd: warning: tenants 4, 7 match on vlan, but an XDP program"),
            "{w}"
        );
        assert!(w.contains("(ethtool -K eth1 rxvlan off)"), "{w}");
        assert!(w.contains("kind \"af_packet\""), "{w}");
        assert_eq!(w.lines().count(), 1, "{w}");
        let two = vec!["eth1".to_owned(), "eth2".to_owned()];
        let w = stripped_vlan_warning(&ts[..1], &two).unwrap();
        assert!(
            w.starts_with("buffetd: warning: tenant 4 matches on vlan"),
            "{w}"
        );
        assert!(
            w.contains("(ethtool -K eth1 rxvlan off, ethtool -K eth2 rxvlan off)"),
            "{w}"
        );
    }

    /// A handler that outlives the request timeout is answered 408, in JSON, and still
    /// runs to its end: the change it was making is not cut in half.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_timed_out_request_is_answered_408_and_its_handler_finishes() {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let app = Router::new()
            .route(
                "/slow",
                post(move || async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    d.store(true, Ordering::SeqCst);
                    StatusCode::NO_CONTENT
                }),
            )
            .route("/fast", get(|| async { "ok" }))
            .layer(axum::middleware::from_fn(move |req, next| {
                run_to_completion(req, next, Duration::from_millis(20))
            }));
        let req = |method: &str, path: &str| {
            axum::http::Request::builder()
                .method(method)
                .uri(path)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let r = app.clone().oneshot(req("POST", "/slow")).await.unwrap();
        assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);
        let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("no answer within 20 ms"),
            "{v}"
        );
        assert!(
            !done.load(Ordering::SeqCst),
            "answered before the handler ended"
        );
        let t0 = Instant::now();
        while !done.load(Ordering::SeqCst) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the handler was cancelled"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let r = app.oneshot(req("GET", "/fast")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
}
