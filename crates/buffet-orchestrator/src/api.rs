//! The Orchestrator's HTTP/JSON API (axum). Writes go to the leader; a follower answers
//! them 503 naming the leader (`{"error": ..., "leader": URL}`). Reads come from etcd,
//! on any Orchestrator.
//!
//! | method and path | what |
//! |---|---|
//! | `POST /v1/tenants` | admit: buffetd's admission document plus optional `expected_pps`; answers once the tenant is live (201) or failed (the server's status and reason), 504 after `--admit-timeout` |
//! | `PUT /v1/tenants/{id}` | update a placed tenant's document (policy, rules, MAX_NB...; optional `expected_pps`): its server applies it through buffetd's update path (a chain naming an NF that server does not offer moves it to one that does); answers once applied (200) or refused (the server's status and reason; the previous document stays); one at a time per tenant (waits while its previous change is applied, then 409) |
//! | `GET /v1/tenants`, `GET /v1/tenants/{id}` | tenants with their server and state (`live`, `failed`, `pending`, `unplaced`) |
//! | `DELETE /v1/tenants/{id}` | remove from the cluster (204) |
//! | `GET /v1/servers` | registered servers with their last load report, headroom, the NFs they offer to chains and whether they are `draining` |
//! | `POST /v1/servers/{id}/drain` | drain a server: no tenant is placed on it, its tenants move to servers that fit them (202, with `tenants_left`; one that fits nowhere stays, served, until room appears); kept in etcd until ended |
//! | `DELETE /v1/servers/{id}/drain` | end a drain (204): the server is chosen for tenants again |
//! | `GET /v1/leader` | the leader's URL, and whether this one leads |
//! | `GET /healthz` | liveness (the only route without a token) |
//!
//! Every route but `/healthz` needs `Authorization: Bearer <token>`: the admin token for
//! anything, the reader token (if configured) for `GET` only. No token or an unknown one
//! is 401; the reader token on a write is 403. Tokens are compared as SHA-256 hashes in
//! constant time (`buffet_config::auth`, buffetd's code) and never logged.
//!
//! [`ApiError`] maps every failure to its status in one place.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use buffet_config::auth::Principal;
use etcd_client::GetOptions;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::orchestrator::{AdmitError, Shared};
use crate::placement::PlaceError;
use crate::schema::{self, ServerLoad, State as Outcome, Status, TenantRecord};

/// A failed request: status, message, and the leader when this one is not.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What is wrong.
    pub message: String,
    /// The leader's URL, on 503 from a follower.
    pub leader: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            leader: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.message });
        if let Some(l) = self.leader {
            body["leader"] = json!(l);
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<AdmitError> for ApiError {
    fn from(e: AdmitError) -> ApiError {
        let status = match &e {
            AdmitError::NotLeader | AdmitError::Refusing(_) | AdmitError::Waiting(..) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            AdmitError::Duplicate(_)
            | AdmitError::Exists(..)
            | AdmitError::Unplaced(..)
            | AdmitError::Changed(_)
            | AdmitError::Busy(..) => StatusCode::CONFLICT,
            AdmitError::Unknown(_) | AdmitError::UnknownServer(_) => StatusCode::NOT_FOUND,
            AdmitError::Place(PlaceError::TooLarge { .. } | PlaceError::NotOffered { .. }) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            AdmitError::Place(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdmitError::Etcd(_) => StatusCode::BAD_GATEWAY,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<etcd_client::Error> for ApiError {
    fn from(e: etcd_client::Error) -> ApiError {
        ApiError::new(StatusCode::BAD_GATEWAY, format!("etcd: {e}"))
    }
}

/// The largest request body the API reads (larger ones get 413).
pub(crate) const MAX_BODY: u64 = 1 << 20;

/// The router.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/v1/leader", get(leader))
        .route("/v1/servers", get(servers))
        .route(
            "/v1/servers/{id}/drain",
            axum::routing::post(drain).delete(undrain),
        )
        .route("/v1/tenants", get(list).post(admit))
        .route("/v1/tenants/{id}", get(one).put(update).delete(remove))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY as usize))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn_with_state(shared.clone(), authorize))
        .with_state(shared)
}

/// Every error is `{"error": ...}`: axum's own rejections (a path id that is not a
/// number, a body over the limit, a method a route does not have) answer in plain text
/// or with an empty body; this rewrites them, keeping their status and their words.
async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_owned();
    let message = if text.is_empty() {
        match status {
            StatusCode::METHOD_NOT_ALLOWED => {
                let allowed = parts
                    .headers
                    .get(header::ALLOW)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                format!("method not allowed here (allowed: {allowed})")
            }
            s => s.canonical_reason().unwrap_or("error").to_owned(),
        }
    } else {
        text
    };
    let mut out = (status, Json(json!({ "error": message }))).into_response();
    for name in [header::ALLOW, header::WWW_AUTHENTICATE] {
        if let Some(v) = parts.headers.get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}

/// Lets a request through when its bearer token allows it (see the module doc).
async fn authorize(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if s.admin.identify(presented) == Ok(Principal::Admin) {
        return next.run(req).await;
    }
    let reader = s
        .reader
        .as_ref()
        .is_some_and(|r| r.identify(presented) == Ok(Principal::Admin));
    if reader {
        if req.method() == Method::GET {
            return next.run(req).await;
        }
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "the reader token may only read (GET); this needs the admin token",
        )
        .into_response();
    }
    let mut r = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "a valid token is required: Authorization: Bearer <token>",
    )
    .into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    r
}

async fn not_leader(s: &Shared) -> ApiError {
    let leader = s.leader_url().await;
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: match &leader {
            Some(l) => format!("this orchestrator is not the leader: send writes to {l}"),
            None => "this orchestrator is not the leader and no leader is elected now".into(),
        },
        leader,
    }
}

async fn leader(State(s): State<Arc<Shared>>) -> Json<Value> {
    Json(json!({ "leader": s.leader_url().await, "me": s.me, "is_leader": s.is_leader() }))
}

async fn servers(State(s): State<Arc<Shared>>) -> Result<Json<Value>, ApiError> {
    let g = schema::get_all(
        &s.client,
        schema::SERVERS,
        Some(GetOptions::new().with_prefix()),
    )
    .await?;
    let rev = g.header().map_or(0, |h| h.revision());
    let d = schema::keys_at(&s.client, schema::DRAINS, rev).await?;
    let drained: std::collections::BTreeSet<&str> = d
        .kvs()
        .iter()
        .filter_map(|kv| schema::drained_of(kv.key()))
        .collect();
    let list: Vec<Value> = g
        .kvs()
        .iter()
        .filter_map(|kv| serde_json::from_slice::<ServerLoad>(kv.value()).ok())
        .map(|l| {
            let mut v = serde_json::to_value(&l).unwrap_or_default();
            v["capacity_pps"] = json!(l.capacity_pps());
            v["draining"] = json!(drained.contains(l.server.as_str()));
            v
        })
        .collect();
    Ok(Json(json!({ "servers": list })))
}

/// A 400 unless `id` has the form of a server id.
fn server_id(id: &str) -> Result<(), ApiError> {
    if schema::valid_server_id(id) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        format!("{id:?} is not a server id (1 to 64 of [A-Za-z0-9._-], not . or ..)"),
    ))
}

/// Drains a server: no tenant is placed on it any more, and its tenants move to servers
/// that fit them (those that fit nowhere stay, served, and move once room appears).
/// Answers 202 with how many tenants are still placed on it; `GET /v1/servers` shows
/// `draining`, `GET /v1/tenants` where each tenant is.
async fn drain(
    State(s): State<Arc<Shared>>,
    UrlPath(id): UrlPath<String>,
) -> Result<Response, ApiError> {
    server_id(&id)?;
    match s.set_drain(&id, true).await {
        Ok(left) => Ok((
            StatusCode::ACCEPTED,
            Json(json!({ "server": id, "draining": true, "tenants_left": left })),
        )
            .into_response()),
        Err(AdmitError::NotLeader) => Err(not_leader(&s).await),
        Err(e) => Err(e.into()),
    }
}

/// Ends a server's drain (204): it is chosen for tenants again. Its moved tenants stay
/// where they went.
async fn undrain(
    State(s): State<Arc<Shared>>,
    UrlPath(id): UrlPath<String>,
) -> Result<StatusCode, ApiError> {
    server_id(&id)?;
    match s.set_drain(&id, false).await {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(AdmitError::NotLeader) => Err(not_leader(&s).await),
        Err(e) => Err(e.into()),
    }
}

/// Every tenant record joined with its status.
async fn tenants(s: &Shared) -> Result<BTreeMap<u32, Value>, ApiError> {
    let t = schema::get_all(
        &s.client,
        schema::TENANTS,
        Some(GetOptions::new().with_prefix()),
    )
    .await?;
    let rev = t.header().map_or(0, |h| h.revision());
    let st = schema::get_all(
        &s.client,
        schema::STATUS,
        Some(GetOptions::new().with_prefix().with_revision(rev)),
    )
    .await?;
    let statuses: BTreeMap<u32, Status> = st
        .kvs()
        .iter()
        .filter_map(|kv| {
            Some((
                schema::tenant_of(kv.key(), schema::STATUS)?,
                serde_json::from_slice(kv.value()).ok()?,
            ))
        })
        .collect();
    // The placements' revisions, at the same revision: a status answers one placement,
    // and an update written since is not what the server runs yet.
    let pl = schema::keys_at(&s.client, schema::PLACEMENTS, rev).await?;
    let placed: BTreeMap<(String, u32), i64> = pl
        .kvs()
        .iter()
        .filter_map(|kv| {
            let rest = std::str::from_utf8(kv.key())
                .ok()?
                .strip_prefix(schema::PLACEMENTS)?;
            let (server, id) = rest.rsplit_once('/')?;
            Some(((server.to_owned(), id.parse().ok()?), kv.mod_revision()))
        })
        .collect();
    Ok(t.kvs()
        .iter()
        .filter_map(|kv| {
            let id = schema::tenant_of(kv.key(), schema::TENANTS)?;
            let r: TenantRecord = serde_json::from_slice(kv.value()).ok()?;
            let placement = r
                .server
                .as_ref()
                .and_then(|srv| placed.get(&(srv.clone(), id)).copied());
            Some((id, view(id, &r, statuses.get(&id), placement)))
        })
        .collect())
}

/// Tenant `id`'s line: its record, and its state as its status tells, when the status
/// answers the tenant's current placement (revision `placement`): a status of an
/// earlier placement (an update written since) leaves it `pending`.
fn view(id: u32, r: &TenantRecord, st: Option<&Status>, placement: Option<i64>) -> Value {
    let (state, reason) = match (&r.server, st) {
        (None, _) => ("unplaced", r.reason.clone()),
        (Some(srv), Some(st))
            if &st.server == srv && placement.is_none_or(|p| st.placement_rev == p) =>
        {
            match st.state {
                Outcome::Live => ("live", None),
                Outcome::Failed => ("failed", st.reason.clone()),
            }
        }
        (Some(_), _) => ("pending", None),
    };
    json!({
        "id": id,
        "name": r.doc.get("name"),
        "server": r.server,
        "state": state,
        "reason": reason,
        "expected_pps": r.expected_pps,
        "doc": r.doc,
    })
}

async fn list(State(s): State<Arc<Shared>>) -> Result<Json<Value>, ApiError> {
    let all = tenants(&s).await?;
    Ok(Json(
        json!({ "tenant": all.into_values().collect::<Vec<_>>() }),
    ))
}

async fn one(
    State(s): State<Arc<Shared>>,
    UrlPath(id): UrlPath<u32>,
) -> Result<Json<Value>, ApiError> {
    tenants(&s).await?.remove(&id).map(Json).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("tenant {id} is not in the cluster"),
        )
    })
}

async fn remove(
    State(s): State<Arc<Shared>>,
    UrlPath(id): UrlPath<u32>,
) -> Result<StatusCode, ApiError> {
    match s.remove(id).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(AdmitError::NotLeader) => Err(not_leader(&s).await),
        Err(e) => Err(e.into()),
    }
}

/// Splits an admission body into buffetd's document (validated with the tenants-file
/// code) and the expected rate.
fn parse_admission(body: &[u8], default_pps: f64) -> Result<(u32, Value, f64), ApiError> {
    let (id, doc, pps) = parse_doc(body, None)?;
    Ok((id, doc, pps.unwrap_or(default_pps)))
}

/// Splits a tenant body into buffetd's document (validated with the tenants-file code)
/// and the expected rate if given. With `path_id` (an update), a missing `id` is that one
/// and another one is refused.
fn parse_doc(body: &[u8], path_id: Option<u32>) -> Result<(u32, Value, Option<f64>), ApiError> {
    let mut v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}")))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "a tenant is a JSON object"))?;
    if let Some(id) = path_id {
        match obj.get("id") {
            None => {
                obj.insert("id".into(), json!(id));
            }
            Some(x) if x.as_u64() == Some(u64::from(id)) => {}
            Some(x) => {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("id: the body's id {x} is not the path's {id}"),
                ))
            }
        }
    }
    let pps = match obj.remove("expected_pps") {
        None => None,
        Some(x) => x
            .as_f64()
            .filter(|p| p.is_finite() && *p >= 0.0)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("expected_pps: a number of packets per second >= 0, got {x}"),
                )
            })
            .map(Some)?,
    };
    let cfg =
        schema::parse_tenant(&v).map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e))?;
    let size = v.to_string().len();
    if size > schema::MAX_DOC_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the tenant's document is {size} bytes of JSON; at most {} (etcd stores it \
                 in one request)",
                schema::MAX_DOC_BYTES
            ),
        ));
    }
    Ok((cfg.id.0, v, pps))
}

async fn admit(State(s): State<Arc<Shared>>, body: Bytes) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let (id, doc, pps) = parse_admission(&body, s.cfg.default_expected_pps)?;
    let (server, rev) = match s.place(id, doc, pps).await {
        Ok(x) => x,
        Err(AdmitError::Exists(server, rev)) => (server, rev),
        Err(AdmitError::NotLeader) => return Err(not_leader(&s).await),
        Err(e) => return Err(e.into()),
    };
    answer(&s, id, &server, rev, Written::Admission, t0).await
}

async fn update(
    State(s): State<Arc<Shared>>,
    UrlPath(id): UrlPath<u32>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let (_, doc, pps) = parse_doc(&body, Some(id))?;
    // A tenant's updates apply one at a time: while its previous change is not applied
    // on its server, this one waits (up to the admission timeout, then 409), so that a
    // refusal puts back the document the server last ran.
    let deadline = tokio::time::Instant::now() + s.cfg.admit_timeout;
    let mut statuses = s.statuses.subscribe();
    let up = loop {
        match s.update(id, doc.clone(), pps).await {
            Ok(x) => break x,
            Err(AdmitError::Busy(..)) if tokio::time::Instant::now() < deadline => {
                // Until the tenant's next status, or a moment (a status may come before
                // the leader acted on it, or not come through this channel).
                let soon = tokio::time::Instant::now() + Duration::from_millis(250);
                let _ = tokio::time::timeout_at(soon.min(deadline), async {
                    loop {
                        match statuses.recv().await {
                            Ok((t, _)) if t == id => return,
                            Err(RecvError::Closed) => return,
                            _ => {}
                        }
                    }
                })
                .await;
            }
            Err(AdmitError::NotLeader) => return Err(not_leader(&s).await),
            Err(e) => return Err(e.into()),
        }
    };
    let written = match up.moved_from {
        Some(from) => Written::Move(from),
        None => Written::Update,
    };
    answer(&s, id, &up.server, up.rev, written, t0).await
}

/// What an admission or update handler wrote to etcd, for its answer's wording.
enum Written {
    Admission,
    Update,
    /// An update that moved the tenant off this server (which does not offer its new
    /// chain's NFs).
    Move(String),
}

/// Waits until the placed Agent has applied what was written at `rev` for tenant `id`
/// on `server`, and answers: 201 (admission) or 200 (update) with the time it took once
/// the tenant is live with it; the server's refusal (its status and reason) when it
/// failed; 504 when it was not applied within the admission timeout.
async fn answer(
    s: &Arc<Shared>,
    id: u32,
    server: &str,
    rev: i64,
    written: Written,
    t0: Instant,
) -> Result<Response, ApiError> {
    let Some(st) = s.wait_status(id, server, rev).await else {
        let timeout = s.cfg.admit_timeout;
        return Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            match written {
                Written::Admission => format!(
                    "tenant {id} is placed on {server} but not live after {timeout:?}; it stays \
                     placed (GET /v1/tenants/{id} shows when it is)"
                ),
                Written::Update => format!(
                    "the update of tenant {id} is written for {server} but not applied after \
                     {timeout:?} (GET /v1/tenants/{id} shows when it is)"
                ),
                Written::Move(from) => format!(
                    "the update of tenant {id} moves it from {from} to {server}, which has not \
                     applied it after {timeout:?} (GET /v1/tenants/{id} shows when it has)"
                ),
            },
        ));
    };
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    match (st.state, written) {
        (Outcome::Live, Written::Admission) => Ok((
            StatusCode::CREATED,
            Json(json!({ "id": id, "server": server, "state": "live", "placement_ms": ms })),
        )
            .into_response()),
        (Outcome::Live, Written::Update) => Ok((
            StatusCode::OK,
            Json(json!({ "id": id, "server": server, "state": "live", "update_ms": ms })),
        )
            .into_response()),
        (Outcome::Live, Written::Move(from)) => Ok((
            StatusCode::OK,
            Json(json!({
                "id": id, "server": server, "moved_from": from, "state": "live",
                "update_ms": ms,
            })),
        )
            .into_response()),
        (Outcome::Failed, written) => {
            s.forget_failed(id, &st).await;
            let reason = st.reason.as_deref().unwrap_or("no reason given");
            Err(ApiError::new(
                refusal_status(&st),
                match written {
                    Written::Admission => format!("tenant {id} failed on {server}: {reason}"),
                    Written::Update => format!(
                        "the update of tenant {id} was refused by {server}: {reason}; it keeps \
                         its previous document"
                    ),
                    Written::Move(from) => format!(
                        "the update of tenant {id} was refused by {server} (it moved there \
                         because {from} does not offer its new chain's NFs): {reason}; it goes \
                         back to {from} with its previous document"
                    ),
                },
            ))
        }
    }
}

/// The status a server's refusal maps to: its own client error or 503, else 502.
fn refusal_status(st: &Status) -> StatusCode {
    st.code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .filter(|c| c.is_client_error() || *c == StatusCode::SERVICE_UNAVAILABLE)
        .unwrap_or(StatusCode::BAD_GATEWAY)
}
