//! DPI: drop HTTP requests to a per-tenant domain blacklist (the NSX test case).
//!
//! A TCP packet whose payload starts with an HTTP/1.x request line (`GET`, `HEAD`,
//! `POST`, `PUT`, `DELETE`, `CONNECT`, `OPTIONS`, `TRACE` or `PATCH`, then a space) is an
//! HTTP request. Its host is taken from
//!
//! * the request target, when it is in absolute form (`GET http://host/ HTTP/1.1`) or
//!   authority form (`CONNECT host:443 HTTP/1.1`) — RFC 9112 says the target wins over
//!   the `Host` header then; otherwise
//! * every `Host:` header line (name case-insensitive) before the blank line ending the
//!   header block. A request is blocked if *any* of its `Host` headers is blacklisted, so
//!   a second `Host` cannot smuggle a blacklisted name past the first.
//!
//! The host is normalised before the lookup: surrounding whitespace, user info (`u@`),
//! the `:port` suffix and one trailing dot are removed, and ASCII letters are lowercased.
//! It is blocked when it **equals** a blacklisted domain or is a **subdomain** of one
//! (`ads.example.com` is blocked by `example.com`; `badexample.com` is not). Blocked
//! requests are dropped with [`DropCause::Policy`].
//!
//! Everything else passes: non-TCP packets, TCP payloads that are not a request line
//! (responses, continuation segments), and requests without a host (counted as
//! `no_host`). A header line cut off by the end of the segment is not evaluated (counted
//! as `truncated_headers`): its value might be a prefix of the real one. A host longer
//! than 253 bytes after normalisation cannot be a DNS name; the request is dropped with
//! [`DropCause::Malformed`] and counted as `malformed`. Lookups use a stack buffer: no
//! allocation per packet.
//!
//! Policy (TOML):
//! ```toml
//! [tenant.policy]
//! blacklist = ["example.com", "Ads.Tracker.NET."]   # case and one trailing dot ignored
//! ports = [80, 8080]     # optional: only inspect these TCP destination ports (default: all)
//! ```

use buffet_sdk::http::normalise_host;
use buffet_sdk::{DropCause, InitError, MemorySpec, NetworkFunction, Packet, Verdict};
use rustc_hash::FxHashMap;
use serde::Deserialize;

use crate::firewall::indexed_counter_name;

/// Longest host name (RFC 1035 presentation form without the trailing dot).
pub const MAX_HOST_LEN: usize = 253;

/// Default maximum blacklist size per tenant.
pub const DEFAULT_MAX_DOMAINS: u32 = 65_536;

const METHODS: [&[u8]; 9] = [
    b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH",
];

/// A tenant's DPI policy (see the module doc for a TOML example).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpiPolicy {
    /// Blocked domains; each also blocks its subdomains.
    #[serde(default)]
    pub blacklist: Vec<String>,
    /// TCP destination ports to inspect (default: every port).
    pub ports: Option<Vec<u16>>,
}

/// Counters of one tenant's DPI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DpiCounters {
    /// Packets seen.
    pub packets: u64,
    /// Packets recognised as HTTP requests.
    pub http_requests: u64,
    /// Requests dropped because their host is blacklisted.
    pub blocked: u64,
    /// Requests without a host (passed).
    pub no_host: u64,
    /// Requests whose header block did not end in this segment (a cut-off last line is
    /// not evaluated).
    pub truncated_headers: u64,
    /// Requests dropped because their host cannot be a domain name (too long).
    pub malformed: u64,
}

/// One tenant's DPI state.
#[derive(Debug, Default)]
pub struct DpiState {
    /// Normalised domain -> index in `domains`.
    index: FxHashMap<Box<[u8]>, u32>,
    domains: Vec<String>,
    hits: Vec<u64>,
    ports: Option<Vec<u16>>,
    counters: DpiCounters,
}

/// Why a domain in a policy is unusable.
fn normalise_domain(raw: &str) -> Result<String, String> {
    let d = raw.trim();
    let d = d.strip_suffix('.').unwrap_or(d).to_ascii_lowercase();
    if d.is_empty() {
        return Err("empty domain".into());
    }
    if d.len() > MAX_HOST_LEN {
        return Err(format!("longer than {MAX_HOST_LEN} bytes"));
    }
    if d.split('.').any(str::is_empty) {
        return Err(format!("`{raw}` has an empty label"));
    }
    if let Some(c) = d
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.'))
    {
        return Err(format!(
            "`{raw}` contains `{c}`; write a domain (subdomains are included), not a pattern or URL"
        ));
    }
    Ok(d)
}

/// What the host extraction found in one request.
enum HostLookup {
    /// A host is blacklisted (its index).
    Blocked(u32),
    /// At least one host, none blacklisted.
    Clean,
    /// No host.
    Missing,
    /// A host longer than [`MAX_HOST_LEN`].
    TooLong,
}

impl DpiState {
    /// Builds a tenant's state from its policy; at most `max_domains` domains.
    pub fn from_policy(policy: &DpiPolicy, max_domains: u32) -> Result<Self, InitError> {
        if policy.blacklist.len() > max_domains as usize {
            return Err(InitError::invalid(
                "blacklist",
                format!(
                    "{} domains exceed the registered maximum of {max_domains}",
                    policy.blacklist.len()
                ),
            ));
        }
        let mut st = DpiState::default();
        for (i, raw) in policy.blacklist.iter().enumerate() {
            let d = normalise_domain(raw)
                .map_err(|m| InitError::invalid(format!("blacklist[{i}]"), m))?;
            let next = st.domains.len() as u32;
            if let std::collections::hash_map::Entry::Vacant(e) =
                st.index.entry(d.clone().into_bytes().into_boxed_slice())
            {
                e.insert(next);
                st.domains.push(d);
            }
        }
        st.hits = vec![0; st.domains.len()];
        if let Some(ports) = &policy.ports {
            if ports.is_empty() {
                return Err(InitError::invalid(
                    "ports",
                    "empty list; omit `ports` to inspect every port",
                ));
            }
            if let Some(i) = ports.iter().position(|&p| p == 0) {
                return Err(InitError::invalid(format!("ports[{i}]"), "port 0"));
            }
            st.ports = Some(ports.clone());
        }
        Ok(st)
    }

    /// Inspects one packet. Never allocates.
    pub fn process(&mut self, pkt: &Packet<'_>) -> Verdict {
        self.counters.packets += 1;
        let Some(tcp) = pkt.tcp() else {
            return Verdict::Pass;
        };
        if let Some(ports) = &self.ports {
            if !ports.contains(&tcp.destination_port()) {
                return Verdict::Pass;
            }
        }
        let payload = pkt.payload();
        let Some((method, target, rest)) = request_line(payload) else {
            return Verdict::Pass;
        };
        self.counters.http_requests += 1;
        let lookup = if method == b"CONNECT" {
            self.check_host(target)
        } else if let Some(authority) = absolute_authority(target) {
            self.check_host(authority)
        } else {
            self.check_headers(rest)
        };
        match lookup {
            HostLookup::Blocked(i) => {
                self.hits[i as usize] += 1;
                self.counters.blocked += 1;
                Verdict::Drop(DropCause::Policy)
            }
            HostLookup::Clean => Verdict::Pass,
            HostLookup::Missing => {
                self.counters.no_host += 1;
                Verdict::Pass
            }
            HostLookup::TooLong => {
                self.counters.malformed += 1;
                Verdict::Drop(DropCause::Malformed)
            }
        }
    }

    /// Walks the header lines after the request line.
    fn check_headers(&mut self, mut rest: &[u8]) -> HostLookup {
        let mut found = HostLookup::Missing;
        loop {
            let Some(eol) = rest.iter().position(|&b| b == b'\n') else {
                // The segment ends inside the header block.
                self.counters.truncated_headers += 1;
                return found;
            };
            let line = strip_cr(&rest[..eol]);
            rest = &rest[eol + 1..];
            if line.is_empty() {
                return found;
            }
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            if !line[..colon].eq_ignore_ascii_case(b"host") {
                continue;
            }
            match self.check_host(&line[colon + 1..]) {
                HostLookup::Missing => {}
                HostLookup::Clean => found = HostLookup::Clean,
                stop => return stop,
            }
        }
    }

    /// Normalises one host value and looks it and its parent domains up.
    fn check_host(&self, value: &[u8]) -> HostLookup {
        let host = normalise_host(value);
        if host.is_empty() {
            return HostLookup::Missing;
        }
        if host.len() > MAX_HOST_LEN {
            return HostLookup::TooLong;
        }
        let mut buf = [0u8; MAX_HOST_LEN];
        let lower = &mut buf[..host.len()];
        lower.copy_from_slice(host);
        lower.make_ascii_lowercase();
        let mut suffix: &[u8] = lower;
        loop {
            if let Some(&i) = self.index.get(suffix) {
                return HostLookup::Blocked(i);
            }
            match suffix.iter().position(|&b| b == b'.') {
                Some(dot) => suffix = &suffix[dot + 1..],
                None => return HostLookup::Clean,
            }
        }
    }

    /// The normalised blacklist, in policy order (duplicates removed).
    pub fn domains(&self) -> &[String] {
        &self.domains
    }

    /// Blocked requests per blacklisted domain, aligned with [`domains`](Self::domains).
    pub fn domain_hits(&self) -> &[u64] {
        &self.hits
    }

    /// The counters.
    pub fn counters(&self) -> &DpiCounters {
        &self.counters
    }

    /// Named counters, as `summary()` reports them.
    pub fn summary(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        let mut v = vec![
            ("packets", c.packets),
            ("http_requests", c.http_requests),
            ("blocked", c.blocked),
            ("no_host", c.no_host),
            ("truncated_headers", c.truncated_headers),
            ("malformed", c.malformed),
        ];
        v.extend(
            self.hits
                .iter()
                .enumerate()
                .map(|(i, &h)| (indexed_counter_name("blacklist_hits", i), h)),
        );
        v
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// `METHOD SP target SP ...` at the start of the payload: (method, target, bytes after
/// the request line). The request line must end within the payload.
fn request_line(payload: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let sp = payload.iter().take(8).position(|&b| b == b' ')?;
    let method = &payload[..sp];
    if !METHODS.contains(&method) {
        return None;
    }
    let after = &payload[sp + 1..];
    let eol = after.iter().position(|&b| b == b'\n')?;
    let line = strip_cr(&after[..eol]);
    let target_end = line.iter().position(|&b| b == b' ').unwrap_or(line.len());
    Some((method, &line[..target_end], &after[eol + 1..]))
}

/// The authority of an absolute-form target (`http://host:port/path`).
fn absolute_authority(target: &[u8]) -> Option<&[u8]> {
    let scheme_end = target.windows(3).position(|w| w == b"://")?;
    let scheme = &target[..scheme_end];
    if !(scheme.eq_ignore_ascii_case(b"http") || scheme.eq_ignore_ascii_case(b"https")) {
        return None;
    }
    let rest = &target[scheme_end + 3..];
    let end = rest
        .iter()
        .position(|&b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The DPI NF (multi-tenant).
#[derive(Clone, Debug)]
pub struct Dpi {
    max_domains: u32,
}

impl Default for Dpi {
    fn default() -> Self {
        Dpi {
            max_domains: DEFAULT_MAX_DOMAINS,
        }
    }
}

impl Dpi {
    /// A DPI whose tenants may blacklist up to `max_domains` domains each.
    pub fn with_max_domains(max_domains: u32) -> Self {
        Dpi { max_domains }
    }
}

impl NetworkFunction for Dpi {
    type State = DpiState;
    type Policy = DpiPolicy;

    // The default handle_group: the worker runs each packet as it parses it.
    const PER_PACKET: bool = true;

    fn name(&self) -> &'static str {
        "dpi"
    }

    fn register(&self) -> MemorySpec {
        // Per domain: its bytes twice (key and name, ~32 each), the index entry, the hit
        // counter, and the String/Box headers.
        let per_domain = 2 * 32 + 16 + 4 + 8 + 24;
        MemorySpec::with_extra::<DpiState>(self.max_domains as usize * per_domain)
    }

    fn init(&self, policy: &DpiPolicy, state: &mut DpiState) -> Result<(), InitError> {
        *state = DpiState::from_policy(policy, self.max_domains)?;
        Ok(())
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut DpiState) -> Verdict {
        state.process(pkt)
    }

    fn summary(&self, state: &DpiState) -> Vec<(&'static str, u64)> {
        state.summary()
    }
}

/// The single-tenant DPI: the same logic over one plain state, no framework.
/// The benchmark baseline.
#[derive(Debug)]
pub struct SingleTenantDpi {
    /// The one tenant's state.
    pub state: DpiState,
}

impl SingleTenantDpi {
    /// A DPI enforcing `policy`.
    pub fn new(policy: &DpiPolicy) -> Result<Self, InitError> {
        Ok(SingleTenantDpi {
            state: DpiState::from_policy(policy, DEFAULT_MAX_DOMAINS)?,
        })
    }

    /// Processes one packet.
    #[inline]
    pub fn handle(&mut self, pkt: &mut Packet<'_>) -> Verdict {
        self.state.process(pkt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use buffet_sdk::PacketMeta;
    use etherparse::PacketBuilder;

    const DROP: Verdict = Verdict::Drop(DropCause::Policy);

    fn tcp_to(dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([192, 168, 0, 10], [192, 168, 1, 1], 64)
            .tcp(40000, dport, 1, 1000)
            .write(&mut v, payload)
            .unwrap();
        v
    }

    fn get(host: &str) -> Vec<u8> {
        tcp_to(
            80,
            format!(
                "GET /index.html HTTP/1.1\r\nUser-Agent: t\r\nHost: {host}\r\nAccept: */*\r\n\r\n"
            )
            .as_bytes(),
        )
    }

    fn run(st: &mut DpiState, bytes: &[u8]) -> Verdict {
        let mut b = bytes.to_vec();
        let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        Dpi::default().handle(&mut p, st)
    }

    fn state(toml_text: &str) -> DpiState {
        let p: DpiPolicy = toml::from_str(toml_text).unwrap();
        let mut st = DpiState::default();
        Dpi::default().init(&p, &mut st).unwrap();
        st
    }

    #[test]
    fn blocks_domains_and_subdomains_case_insensitively_with_ports_stripped() {
        let mut st = state(r#"blacklist = ["example.com", "Ads.Tracker.NET."]"#);
        for host in [
            "example.com",
            "EXAMPLE.com",
            "www.example.com",
            "a.b.c.Example.COM",
            "example.com:8080",
            "example.com.",
            "  example.com  ",
            "user@example.com:80",
            "ads.tracker.net",
            "x.ads.tracker.net",
        ] {
            assert_eq!(run(&mut st, &get(host)), DROP, "{host}");
        }
        for host in [
            "badexample.com",
            "example.com.evil",
            "example.org",
            "tracker.net",
            "[::1]:80",
            "10.0.0.1",
        ] {
            assert_eq!(run(&mut st, &get(host)), Verdict::Pass, "{host}");
        }
        assert_eq!(st.domains(), ["example.com", "ads.tracker.net"]);
        assert_eq!(st.domain_hits(), &[8, 2]);
        let c = *st.counters();
        assert_eq!((c.http_requests, c.blocked, c.no_host), (16, 10, 0));
        let s = Dpi::default().summary(&st);
        assert!(s.contains(&("blacklist_hits[1]", 2)), "{s:?}");
    }

    #[test]
    fn target_authority_wins_and_every_host_header_counts() {
        let mut st = state(r#"blacklist = ["evil.com"]"#);
        let abs = tcp_to(
            80,
            b"GET http://www.evil.com:80/x HTTP/1.1\r\nHost: fine.org\r\n\r\n",
        );
        assert_eq!(run(&mut st, &abs), DROP);
        let abs_ok = tcp_to(
            80,
            b"GET https://fine.org/x HTTP/1.1\r\nHost: evil.com\r\n\r\n",
        );
        assert_eq!(run(&mut st, &abs_ok), Verdict::Pass);
        let connect = tcp_to(
            8080,
            b"CONNECT evil.com:443 HTTP/1.1\r\nHost: evil.com:443\r\n\r\n",
        );
        assert_eq!(run(&mut st, &connect), DROP);
        let two = tcp_to(
            80,
            b"GET / HTTP/1.1\r\nHost: fine.org\r\nhOsT:evil.com\r\n\r\n",
        );
        assert_eq!(run(&mut st, &two), DROP);
        // After the blank line: body, not headers.
        let body = tcp_to(
            80,
            b"POST / HTTP/1.1\r\nHost: fine.org\r\n\r\nHost: evil.com\r\n",
        );
        assert_eq!(run(&mut st, &body), Verdict::Pass);
        // Bare LF line endings are accepted.
        let lf = tcp_to(80, b"GET / HTTP/1.0\nHost: evil.com\n\n");
        assert_eq!(run(&mut st, &lf), DROP);
    }

    #[test]
    fn non_http_and_hostless_requests_pass_and_are_counted() {
        let mut st = state(r#"blacklist = ["evil.com"]"#);
        let no_host = tcp_to(80, b"GET / HTTP/1.0\r\nAccept: */*\r\n\r\n");
        assert_eq!(run(&mut st, &no_host), Verdict::Pass);
        let empty_host = tcp_to(80, b"GET / HTTP/1.1\r\nHost:\r\n\r\n");
        assert_eq!(run(&mut st, &empty_host), Verdict::Pass);
        assert_eq!(st.counters().no_host, 2);
        for payload in [
            &b"HTTP/1.1 200 OK\r\nHost: evil.com\r\n\r\n"[..],
            b"get / HTTP/1.1\r\nHost: evil.com\r\n\r\n",
            b"GETX / HTTP/1.1\r\nHost: evil.com\r\n\r\n",
            b"GET",
            b"",
            b"\x16\x03\x01\x02\x00evil.com",
        ] {
            assert_eq!(run(&mut st, &tcp_to(80, payload)), Verdict::Pass);
        }
        let mut udp = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([192, 168, 0, 1], [192, 168, 0, 2], 64)
            .udp(1, 80)
            .write(&mut udp, b"GET / HTTP/1.1\r\nHost: evil.com\r\n\r\n")
            .unwrap();
        assert_eq!(run(&mut st, &udp), Verdict::Pass);
        let c = *st.counters();
        assert_eq!((c.packets, c.http_requests, c.blocked), (9, 2, 0));
    }

    #[test]
    fn truncated_and_malformed_requests_are_counted_never_panic() {
        let mut st = state(r#"blacklist = ["evil.com"]"#);
        // The Host line is cut by the end of the segment: not evaluated.
        let cut = tcp_to(80, b"GET / HTTP/1.1\r\nHost: evil.c");
        assert_eq!(run(&mut st, &cut), Verdict::Pass);
        // A complete Host line in an unfinished header block is evaluated.
        let partial = tcp_to(80, b"GET / HTTP/1.1\r\nHost: evil.com\r\nAccept: te");
        assert_eq!(run(&mut st, &partial), DROP);
        assert_eq!(st.counters().truncated_headers, 1);
        // A request line without its end: not recognised as a request.
        assert_eq!(run(&mut st, &tcp_to(80, b"GET /very/long")), Verdict::Pass);
        let long = format!("GET / HTTP/1.1\r\nHost: {}.com\r\n\r\n", "a".repeat(300));
        assert_eq!(
            run(&mut st, &tcp_to(80, long.as_bytes())),
            Verdict::Drop(DropCause::Malformed)
        );
        assert_eq!(st.counters().malformed, 1);
        // Every prefix of a real request, as a segment payload.
        let full = b"GET http://x.evil.com/ HTTP/1.1\r\nHost: a@evil.com:1\r\n\r\n";
        for n in 0..full.len() {
            let _ = run(&mut st, &tcp_to(80, &full[..n]));
        }
        let mut seed = 0xdead_beef_cafe_f00du64;
        for _ in 0..3000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 200) as usize;
            let mut payload: Vec<u8> = b"GET ".to_vec();
            payload.extend((0..len).map(|i| {
                [b'\r', b'\n', b':', b'@', b'[', b'.', b'h', b' '][(seed >> (i % 61)) as usize & 7]
            }));
            let _ = run(&mut st, &tcp_to(80, &payload));
        }
    }

    #[test]
    fn port_filter_limits_inspection() {
        let mut st = state("blacklist = [\"evil.com\"]\nports = [80]");
        assert_eq!(run(&mut st, &get("evil.com")), DROP);
        let other = tcp_to(8080, b"GET / HTTP/1.1\r\nHost: evil.com\r\n\r\n");
        assert_eq!(run(&mut st, &other), Verdict::Pass);
        assert_eq!(st.counters().http_requests, 1);
    }

    #[test]
    fn invalid_policies_name_the_field() {
        for (text, field) in [
            (r#"blacklist = ["ok.com", ""]"#, "blacklist[1]"),
            (r#"blacklist = ["http://evil.com/"]"#, "blacklist[0]"),
            (r#"blacklist = ["*.evil.com"]"#, "blacklist[0]"),
            (r#"blacklist = ["a..b"]"#, "blacklist[0]"),
            ("ports = []", "ports"),
            ("ports = [80, 0]", "ports[1]"),
        ] {
            let p: DpiPolicy = toml::from_str(text).unwrap();
            let e = Dpi::default()
                .init(&p, &mut DpiState::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{text}: {e}");
        }
        let long = DpiPolicy {
            blacklist: vec![format!("{}.com", "a".repeat(260))],
            ports: None,
        };
        assert!(Dpi::default()
            .init(&long, &mut DpiState::default())
            .is_err());
        assert!(toml::from_str::<DpiPolicy>("blacklist = []\nblocklist = []").is_err());
        assert!(toml::from_str::<DpiPolicy>("ports = [70000]").is_err());
        let two: DpiPolicy = toml::from_str(r#"blacklist = ["a.com", "b.com"]"#).unwrap();
        let e = Dpi::with_max_domains(1)
            .init(&two, &mut DpiState::default())
            .unwrap_err();
        assert!(e.to_string().contains("`blacklist`"), "{e}");
    }

    #[test]
    fn two_tenants_with_overlapping_addresses_keep_their_own_policy_and_state() {
        // Same 192.168.0.0/16 clients and servers, different blacklists.
        let mut a = state(r#"blacklist = ["evil.com"]"#);
        let mut b = state(r#"blacklist = ["news.org", "example.com"]"#);
        let packets = [
            get("www.evil.com"),
            get("news.org"),
            get("example.com"),
            get("ok.net"),
        ];
        let va: Vec<_> = packets.iter().map(|p| run(&mut a, p)).collect();
        let vb: Vec<_> = packets.iter().map(|p| run(&mut b, p)).collect();
        assert_eq!(va, [DROP, Verdict::Pass, Verdict::Pass, Verdict::Pass]);
        assert_eq!(vb, [Verdict::Pass, DROP, DROP, Verdict::Pass]);
        assert_eq!((a.counters().blocked, b.counters().blocked), (1, 2));
        assert_eq!(a.domain_hits(), &[1]);
        assert_eq!(b.domain_hits(), &[1, 1]);
    }

    #[test]
    fn single_tenant_variant_matches_the_nf() {
        let policy: DpiPolicy = toml::from_str(r#"blacklist = ["evil.com"]"#).unwrap();
        let mut single = SingleTenantDpi::new(&policy).unwrap();
        let mut st = DpiState::default();
        Dpi::default().init(&policy, &mut st).unwrap();
        for pkt in [get("evil.com"), get("good.com")] {
            let mut b = pkt.clone();
            let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
            assert_eq!(single.handle(&mut p), run(&mut st, &pkt));
        }
        assert_eq!(single.state.counters(), st.counters());
    }
}
