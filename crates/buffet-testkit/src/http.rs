//! One HTTP request to a JSON API (buffetd's, an orchestrator's) as the tests make it: an
//! optional bearer token, an optional JSON body, and the answer as `(status, JSON body)`
//! whatever the status (`Null` when the body is not JSON). Blocking, with a timeout.

use std::time::Duration;

use serde_json::Value;

/// `method url` with `token` as a bearer token and `body` as JSON; `None` when no answer
/// came (refused, reset, timed out, or a body that could not be read to its end).
pub fn try_json(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<&str>,
    timeout: Duration,
) -> Option<(u16, Value)> {
    let mut req = ureq::request(method, url).timeout(timeout);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let res = match body {
        Some(b) => req.set("Content-Type", "application/json").send_string(b),
        None => req.call(),
    };
    let resp = match res {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(_) => return None,
    };
    let status = resp.status();
    let text = resp.into_string().ok()?;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// [`json`] to `path` of the API listening on `addr` (`http://{addr}{path}`), with
/// `body` as a JSON value.
pub fn api(
    addr: impl std::fmt::Display,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
    timeout: Duration,
) -> (u16, Value) {
    let body = body.map(Value::to_string);
    json(
        method,
        &format!("http://{addr}{path}"),
        token,
        body.as_deref(),
        timeout,
    )
}

/// [`try_json`] that panics, naming the request, when no answer came.
pub fn json(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<&str>,
    timeout: Duration,
) -> (u16, Value) {
    try_json(method, url, token, body, timeout)
        .unwrap_or_else(|| panic!("{method} {url}: no answer within {timeout:?}"))
}
