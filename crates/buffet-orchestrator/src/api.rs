//! The Orchestrator's HTTP/JSON API (axum). Writes go to the leader; a follower answers
//! them 503 naming the leader (`{"error": ..., "leader": URL}`). Reads come from etcd,
//! on any Orchestrator.
//!
//! | method and path | what |
//! |---|---|
//! | `POST /v1/tenants` | admit: buffetd's admission document plus optional `expected_pps`; answers once the tenant is live (201) or failed (the server's status and reason), 504 after `--admit-timeout` |
//! | `GET /v1/tenants`, `GET /v1/tenants/{id}` | tenants with their server and state (`live`, `failed`, `pending`, `unplaced`) |
//! | `DELETE /v1/tenants/{id}` | remove from the cluster (204) |
//! | `GET /v1/servers` | registered servers with their last load report and headroom |
//! | `GET /v1/leader` | the leader's URL, and whether this one leads |
//! | `GET /healthz` | liveness |
//!
//! [`ApiError`] maps every failure to its status in one place.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use buffet_config::tenants::{self, Format};
use etcd_client::GetOptions;
use serde_json::{json, Value};

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
            AdmitError::NotLeader | AdmitError::Refusing(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdmitError::Duplicate(_) | AdmitError::Exists(..) => StatusCode::CONFLICT,
            AdmitError::Unknown(_) => StatusCode::NOT_FOUND,
            AdmitError::Place(PlaceError::TooLarge { .. }) => StatusCode::UNPROCESSABLE_ENTITY,
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

/// The router.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/v1/leader", get(leader))
        .route("/v1/servers", get(servers))
        .route("/v1/tenants", get(list).post(admit))
        .route("/v1/tenants/{id}", get(one).delete(remove))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .layer(axum::extract::DefaultBodyLimit::max(1 << 20))
        .with_state(shared)
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
    let mut c = s.client.clone();
    let g = c
        .get(schema::SERVERS, Some(GetOptions::new().with_prefix()))
        .await?;
    let list: Vec<Value> = g
        .kvs()
        .iter()
        .filter_map(|kv| serde_json::from_slice::<ServerLoad>(kv.value()).ok())
        .map(|l| {
            let mut v = serde_json::to_value(&l).unwrap_or_default();
            v["capacity_pps"] = json!(l.capacity_pps());
            v
        })
        .collect();
    Ok(Json(json!({ "servers": list })))
}

/// Every tenant record joined with its status.
async fn tenants(s: &Shared) -> Result<BTreeMap<u32, Value>, ApiError> {
    let mut c = s.client.clone();
    let t = c
        .get(schema::TENANTS, Some(GetOptions::new().with_prefix()))
        .await?;
    let rev = t.header().map_or(0, |h| h.revision());
    let st = c
        .get(
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
    Ok(t.kvs()
        .iter()
        .filter_map(|kv| {
            let id = schema::tenant_of(kv.key(), schema::TENANTS)?;
            let r: TenantRecord = serde_json::from_slice(kv.value()).ok()?;
            Some((id, view(id, &r, statuses.get(&id))))
        })
        .collect())
}

fn view(id: u32, r: &TenantRecord, st: Option<&Status>) -> Value {
    let (state, reason) = match (&r.server, st) {
        (None, _) => ("unplaced", r.reason.clone()),
        (Some(srv), Some(st)) if &st.server == srv => match st.state {
            Outcome::Live => ("live", None),
            Outcome::Failed => ("failed", st.reason.clone()),
        },
        (Some(_), _) => ("pending", None),
    };
    json!({
        "id": id,
        "name": r.doc.get("name"),
        "server": r.server,
        "state": state,
        "reason": reason,
        "expected_pps": r.expected_pps,
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
    let mut v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {e}")))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "a tenant is a JSON object"))?;
    let pps = match obj.remove("expected_pps") {
        None => default_pps,
        Some(x) => x
            .as_f64()
            .filter(|p| p.is_finite() && *p >= 0.0)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("expected_pps: a number of packets per second >= 0, got {x}"),
                )
            })?,
    };
    let text = json!({ "tenant": [v.clone()] }).to_string();
    let cfg = tenants::parse(Format::Json, Path::new("request"), &text)
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?
        .pop()
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "no tenant"))?;
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
    let Some(st) = s.wait_status(id, &server, rev).await else {
        return Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "tenant {id} is placed on {server} but not live after {:?}; it stays placed \
                 (GET /v1/tenants/{id} shows when it is)",
                s.cfg.admit_timeout
            ),
        ));
    };
    match st.state {
        Outcome::Live => Ok((
            StatusCode::CREATED,
            Json(json!({
                "id": id, "server": server, "state": "live",
                "placement_ms": t0.elapsed().as_secs_f64() * 1e3,
            })),
        )
            .into_response()),
        Outcome::Failed => {
            s.forget_failed(id, &st).await;
            let status = st
                .code
                .and_then(|c| StatusCode::from_u16(c).ok())
                .filter(|c| c.is_client_error() || *c == StatusCode::SERVICE_UNAVAILABLE)
                .unwrap_or(StatusCode::BAD_GATEWAY);
            Err(ApiError::new(
                status,
                format!(
                    "tenant {id} failed on {server}: {}",
                    st.reason.as_deref().unwrap_or("no reason given")
                ),
            ))
        }
    }
}
