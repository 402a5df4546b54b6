//! etcd's v3 JSON gateway (`/v3/...` on its client URL), for tests that write keys the
//! way another program would: a lease, a put under it, a read, a revocation. Keys and
//! values travel base64-encoded, int64s as strings.

use std::time::Duration;

use serde_json::{json, Value};

fn post(url: &str, path: &str, body: Value) -> Value {
    let (s, v) = buffet_testkit::http::try_json(
        "POST",
        &format!("{url}{path}"),
        None,
        Some(&body.to_string()),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|| panic!("etcd {path}: no answer"));
    assert_eq!(s, 200, "etcd {path}: {v}");
    v
}

/// An int64 as the gateway gives it (a string, or absent for 0).
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap(),
        Value::Number(n) => n.as_i64().unwrap(),
        _ => 0,
    }
}

/// A new lease of `ttl_s` seconds (not kept alive).
pub fn grant(url: &str, ttl_s: u64) -> i64 {
    int(&post(url, "/v3/lease/grant", json!({ "TTL": ttl_s }))["ID"])
}

/// Revokes `lease`: etcd deletes every key under it.
pub fn revoke(url: &str, lease: i64) {
    post(url, "/v3/lease/revoke", json!({ "ID": lease.to_string() }));
}

/// Puts `key` = `value` under `lease` (0: none).
pub fn put(url: &str, key: &str, value: &str, lease: i64) {
    post(
        url,
        "/v3/kv/put",
        json!({ "key": encode(key.as_bytes()), "value": encode(value.as_bytes()),
                "lease": lease.to_string() }),
    );
}

/// `key`'s value and lease, if it exists.
pub fn get(url: &str, key: &str) -> Option<(String, i64)> {
    let v = post(
        url,
        "/v3/kv/range",
        json!({ "key": encode(key.as_bytes()) }),
    );
    let kv = v["kvs"].as_array()?.first()?;
    let value = decode(kv["value"].as_str().unwrap_or(""));
    Some((String::from_utf8(value).unwrap(), int(&kv["lease"])))
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn decode(text: &str) -> Vec<u8> {
    let digits: Vec<u32> = text
        .bytes()
        .filter(|&c| c != b'=')
        .map(|c| ALPHABET.iter().position(|&a| a == c).unwrap() as u32)
        .collect();
    let mut out = Vec::new();
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0, |n, (i, d)| n | d << (18 - 6 * i));
        out.extend(n.to_be_bytes()[1..chunk.len()].iter());
    }
    out
}
