//! HTTP text helpers for NFs that inspect requests (host blacklists, DPI).
//!
//! What it does: reduces a host as written in a request to the name to look up. What it
//! does not do: no request parsing, no header iteration, no allocation, no lowercasing
//! (callers compare ignoring ASCII case, or lowercase into their own buffer).

/// A URL/HTTP host as written (a `Host:` header value or an absolute-form target's
/// authority) reduced to the name to look up: surrounding ASCII whitespace trimmed, user
/// info up to the last `@` dropped, an IPv6 literal `[...]` kept whole (it never equals a
/// domain), otherwise cut at the first `:` (the port), and one trailing `.` dropped.
///
/// Returns a subslice of `value`; it never allocates or panics. ASCII case is kept.
///
/// ```
/// use buffet_sdk::http::normalise_host;
///
/// assert_eq!(normalise_host(b"  Example.COM:8080 "), b"Example.COM");
/// assert_eq!(normalise_host(b"user:pw@a.b.c.:1"), b"a.b.c");
/// assert_eq!(normalise_host(b"[::1]:80"), b"[::1]");
/// assert_eq!(normalise_host(b"x@"), b"");
/// ```
pub fn normalise_host(value: &[u8]) -> &[u8] {
    let mut h = value.trim_ascii();
    if let Some(at) = h.iter().rposition(|&b| b == b'@') {
        h = &h[at + 1..];
    }
    if h.first() == Some(&b'[') {
        let end = h.iter().position(|&b| b == b']').map_or(h.len(), |e| e + 1);
        return &h[..end];
    }
    if let Some(colon) = h.iter().position(|&b| b == b':') {
        h = &h[..colon];
    }
    h.strip_suffix(b".").unwrap_or(h)
}
