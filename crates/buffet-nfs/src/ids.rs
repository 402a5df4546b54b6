//! IDS: per-tenant signature matching over the L4 payload with Aho-Corasick.
//!
//! A tenant's signatures are content strings, optionally restricted to a protocol,
//! addresses and ports, each case-sensitive or not (`nocase`). All of a tenant's contents
//! are compiled at `init` into two Aho-Corasick automata (one case-sensitive, one ASCII
//! case-insensitive); a packet's L4 payload (after the TCP, UDP or SCTP common header —
//! SCTP chunks are scanned whole; the IP payload for other protocols) is scanned once per
//! automaton, and a signature matches when **all** of its contents occur in the payload and
//! its header restrictions hold. Matching is per packet: there is no stream reassembly, so
//! a content split across two segments is not seen.
//!
//! **Modes.** `alert` (the default): matching packets pass; each matching signature is
//! counted. `block`: a packet matching any signature is dropped with
//! [`DropCause::Policy`]. In both modes a matching signature produces an alert record
//! (tenant, signature id, 5-tuple, time), kept in a bounded ring of recent alerts
//! ([`IdsState::recent_alerts`]) that the control plane reads and turns into log lines
//! ([`IdsState::log_line`]). The NF does no I/O. Records are **rate limited** by packet
//! time: at most `log_per_second` per tenant per second (`ts_ns / 10^9`); alerts beyond
//! that are counted as `log_suppressed` and not recorded.
//!
//! # Rule format
//!
//! One rule per line; blank lines and lines starting with `#` are ignored. A small subset
//! of Snort's syntax:
//!
//! ```text
//! alert tcp any 80 (msg:"short form: src port, dst port"; content:"evil"; nocase; sid:1001;)
//! alert tcp 192.168.0.0/16 any -> any 80 (msg:"Snort form"; content:"GET"; content:"/etc/passwd"; sid:1002; rev:1;)
//! alert udp any any -> 10.0.0.0/8 53 (msg:"hex bytes"; content:"|07|example|03|com"; sid:1003;)
//! alert ip any any (content:"x-attack"; sid:1004;)
//! ```
//!
//! * action: `alert` (or `drop`, accepted for Snort compatibility): the tenant's `mode`
//!   decides what a match does.
//! * protocol: `tcp`, `udp`, `icmp`, `icmpv6`, `sctp` or `ip` (any).
//! * header: `<src port> <dst port>`, or `<src addr> <src port> -> <dst addr> <dst port>`;
//!   addresses are `any` or a prefix (`192.168.0.0/16`, `2001:db8::/32`); ports are `any`,
//!   `80`, `1024:65535`, `:1023` or `1024:`. A port restriction only matches packets that
//!   carry ports (TCP, UDP and SCTP, first fragments). A prefix matches only addresses of
//!   its own family: `10.0.0.0/8` never matches the IPv6 address `::ffff:10.0.0.1`.
//! * options, each ending with `;`:
//!   `content:"..."` (required, repeatable; `|41 42|` writes bytes in hex, `\"`, `\\`,
//!   `\;` escape), `nocase` (makes the content before it case-insensitive),
//!   `msg:"..."`, `sid:<n>` (required, unique in the rule set), and `rev`, `classtype`,
//!   `priority` (accepted and ignored). Anything else is an error.
//!
//! A rule that does not parse rejects the policy with an [`InitError`] naming its line
//! (`rules[line 3]`). Use [`parse_rules`] to check a rule file off line.
//!
//! Policy (TOML):
//! ```toml
//! [tenant.policy]
//! mode = "block"            # "alert" (default) or "block"
//! log_per_second = 10       # optional (default 10): alert records per second of packet time
//! recent_alerts = 64        # optional (default 64): capacity of the recent-alerts ring
//! rules = '''
//! alert tcp any 80 (msg:"evil in HTTP"; content:"evil"; nocase; sid:1001;)
//! alert udp any any -> any 53 (msg:"bad domain"; content:"|03|bad|03|com"; sid:1002;)
//! '''
//! ```

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use buffet_sdk::policy::{IpPrefix, NumOrName};
use buffet_sdk::{
    DropCause, FlowKey, InitError, MemorySpec, NetworkFunction, Packet, TenantId, Verdict,
};
use serde::Deserialize;

use crate::firewall::{prefix_or_any, proto_or_any, rule_hits_name};

/// Default alert records per tenant per second of packet time.
pub const DEFAULT_LOG_PER_SECOND: u32 = 10;

/// Default capacity of the recent-alerts ring.
pub const DEFAULT_RECENT_ALERTS: u32 = 64;

/// What a match does for one tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdsMode {
    /// Pass the packet, count and record the alert.
    #[default]
    Alert,
    /// Drop the packet ([`DropCause::Policy`]), count and record the alert.
    Block,
}

/// A tenant's IDS policy (see the module doc for the rule format and a TOML example).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdsPolicy {
    /// `alert` (default) or `block`.
    #[serde(default)]
    pub mode: IdsMode,
    /// The signatures, in the rule format of the module doc.
    pub rules: String,
    /// Alert records kept per second of packet time (default 10; 0: none).
    pub log_per_second: Option<u32>,
    /// Capacity of the recent-alerts ring (default 64).
    pub recent_alerts: Option<u32>,
}

/// One content string of a signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Content {
    /// The bytes to find.
    pub bytes: Vec<u8>,
    /// ASCII case-insensitive (`nocase`).
    pub nocase: bool,
}

/// One parsed signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Line of the rule text it came from (1-based).
    pub line: usize,
    /// Signature id (`sid`).
    pub sid: u32,
    /// Message (`msg`), empty when absent.
    pub msg: String,
    /// IP protocol (`None`: any).
    pub proto: Option<u8>,
    /// Source prefix (`None`: any address, IPv4 or IPv6).
    pub src: Option<IpPrefix>,
    /// Inclusive source-port range.
    pub src_ports: (u16, u16),
    /// Destination prefix (`None`: any address).
    pub dst: Option<IpPrefix>,
    /// Inclusive destination-port range.
    pub dst_ports: (u16, u16),
    /// Contents that must all occur in the payload.
    pub contents: Vec<Content>,
}

impl Signature {
    /// True when the packet header satisfies the signature's restrictions. A prefix
    /// matches only addresses of its own family (the key's [`l3`](FlowKey::l3)).
    fn header_matches(&self, key: &FlowKey, has_ports: bool) -> bool {
        let any_ports = |r: (u16, u16)| r == (0, u16::MAX);
        self.proto.is_none_or(|p| p == key.proto)
            && self.src.is_none_or(|p| p.contains_flow_src(key))
            && self.dst.is_none_or(|p| p.contains_flow_dst(key))
            && ((any_ports(self.src_ports) && any_ports(self.dst_ports))
                || (has_ports
                    && (self.src_ports.0..=self.src_ports.1).contains(&key.src_port)
                    && (self.dst_ports.0..=self.dst_ports.1).contains(&key.dst_port)))
    }
}

/// Parses rule text (see the module doc). Errors name the line: `rules[line N]`.
pub fn parse_rules(text: &str) -> Result<Vec<Signature>, InitError> {
    let mut sigs: Vec<Signature> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let sig = parse_rule(trimmed, line)
            .map_err(|m| InitError::invalid(format!("rules[line {line}]"), m))?;
        if let Some(prev) = sigs.iter().find(|s| s.sid == sig.sid) {
            return Err(InitError::invalid(
                format!("rules[line {line}]"),
                format!("sid {} already used on line {}", sig.sid, prev.line),
            ));
        }
        sigs.push(sig);
    }
    Ok(sigs)
}

fn parse_rule(text: &str, line: usize) -> Result<Signature, String> {
    let open = text
        .find('(')
        .ok_or("expected `(options)` after the rule header")?;
    let options = text[open + 1..]
        .trim_end()
        .strip_suffix(')')
        .ok_or("the options must end with `)`")?;
    let header: Vec<&str> = text[..open].split_whitespace().collect();
    let (action, proto, src, sport, dst, dport) = match header[..] {
        [a, p, sp, dp] => (a, p, "any", sp, "any", dp),
        [a, p, s, sp, "->", d, dp] => (a, p, s, sp, d, dp),
        [_, _, _, _, "<>", _, _] => return Err("bidirectional `<>` rules are not supported".into()),
        _ => {
            return Err(format!(
                "header `{}` is neither `action proto src_port dst_port` nor \
                 `action proto src_addr src_port -> dst_addr dst_port`",
                text[..open].trim()
            ))
        }
    };
    if !matches!(action, "alert" | "drop") {
        return Err(format!("unknown action `{action}` (alert or drop)"));
    }
    let proto = proto_or_any(&NumOrName::Name(proto.into())).map_err(|e| e.to_string())?;
    let prefix = |s: &str| prefix_or_any(s).map_err(|e| e.to_string());
    let mut sig = Signature {
        line,
        sid: 0,
        msg: String::new(),
        proto,
        src: prefix(src)?,
        src_ports: parse_snort_ports(sport)?,
        dst: prefix(dst)?,
        dst_ports: parse_snort_ports(dport)?,
        contents: Vec::new(),
    };
    let mut sid = None;
    for opt in split_options(options)? {
        let (name, value) = match opt.split_once(':') {
            Some((n, v)) => (n.trim(), Some(v.trim())),
            None => (opt.trim(), None),
        };
        match (name, value) {
            ("content", Some(v)) => sig.contents.push(Content {
                bytes: parse_content(v)?,
                nocase: false,
            }),
            ("nocase", None) => {
                sig.contents
                    .last_mut()
                    .ok_or("`nocase` before any `content`")?
                    .nocase = true;
            }
            ("msg", Some(v)) => sig.msg = unquote(v)?,
            ("sid", Some(v)) => {
                sid = Some(
                    v.parse::<u32>()
                        .map_err(|_| format!("sid `{v}` is not a number"))?,
                )
            }
            ("rev" | "classtype" | "priority", Some(_)) => {}
            ("", _) => return Err("empty option".into()),
            ("nocase", Some(_)) => return Err("option `nocase` takes no value".into()),
            (n, None) if ["content", "msg", "sid", "rev", "classtype", "priority"].contains(&n) => {
                return Err(format!("option `{n}` needs a value"))
            }
            (n, _) => return Err(format!("unsupported option `{n}`")),
        }
    }
    sig.sid = sid.ok_or("missing `sid`")?;
    if sig.contents.is_empty() {
        return Err("a signature needs at least one `content`".into());
    }
    Ok(sig)
}

/// Splits `name:value; name; ...` on `;` outside double quotes.
fn split_options(s: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return Err("unterminated string".into());
    }
    if !s[start..].trim().is_empty() {
        return Err(format!("option `{}` must end with `;`", s[start..].trim()));
    }
    Ok(out.into_iter().filter(|o| !o.trim().is_empty()).collect())
}

fn unquote(v: &str) -> Result<String, String> {
    let bytes = parse_quoted(v, false)?;
    String::from_utf8(bytes).map_err(|_| "message is not UTF-8".into())
}

fn parse_content(v: &str) -> Result<Vec<u8>, String> {
    if v.starts_with('!') {
        return Err("negated content is not supported".into());
    }
    let bytes = parse_quoted(v, true)?;
    if bytes.is_empty() {
        return Err("empty content".into());
    }
    Ok(bytes)
}

/// A double-quoted string with `\` escapes and (when `hex`) `|xx xx|` byte runs.
fn parse_quoted(v: &str, hex: bool) -> Result<Vec<u8>, String> {
    let inner = v
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or_else(|| format!("expected a double-quoted string, found `{v}`"))?;
    let mut out = Vec::with_capacity(inner.len());
    let mut it = inner.bytes();
    while let Some(b) = it.next() {
        match b {
            b'\\' => out.push(it.next().ok_or("dangling `\\`")?),
            b'|' if hex => {
                let mut digits = Vec::new();
                loop {
                    match it.next().ok_or("unterminated `|hex|` run")? {
                        b'|' => break,
                        b' ' => {}
                        d if d.is_ascii_hexdigit() => digits.push(d),
                        d => return Err(format!("`{}` in a `|hex|` run", d as char)),
                    }
                }
                if digits.is_empty() || digits.len() % 2 != 0 {
                    return Err("a `|hex|` run needs whole bytes".into());
                }
                for pair in digits.chunks(2) {
                    let s = std::str::from_utf8(pair).map_err(|_| "bad hex")?;
                    out.push(u8::from_str_radix(s, 16).map_err(|_| "bad hex")?);
                }
            }
            b'"' => return Err("unescaped `\"` inside a string".into()),
            b => out.push(b),
        }
    }
    Ok(out)
}

/// Snort port syntax: `any`, `80`, `1024:65535`, `:1023`, `1024:`.
fn parse_snort_ports(s: &str) -> Result<(u16, u16), String> {
    let num = |t: &str| {
        t.parse::<u16>()
            .map_err(|_| format!("`{t}` is not a port number"))
    };
    if s.eq_ignore_ascii_case("any") {
        return Ok((0, u16::MAX));
    }
    let range = match s.split_once(':') {
        Some(("", hi)) => (0, num(hi)?),
        Some((lo, "")) => (num(lo)?, u16::MAX),
        Some((lo, hi)) => (num(lo)?, num(hi)?),
        None => {
            let p = num(s)?;
            (p, p)
        }
    };
    if range.0 > range.1 {
        return Err(format!("empty port range `{s}`"));
    }
    Ok(range)
}

/// One alert, as recorded in the recent-alerts ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AlertRecord {
    /// Packet time (ns).
    pub ts_ns: u64,
    /// The tenant the packet belongs to.
    pub tenant: TenantId,
    /// The matching signature's id.
    pub sid: u32,
    /// Index of the signature in the tenant's rule set.
    pub rule: u32,
    /// The packet's 5-tuple and address family.
    pub flow: FlowKey,
    /// Whether the packet was dropped.
    pub blocked: bool,
}

/// Counters of one tenant's IDS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdsCounters {
    /// Packets seen.
    pub packets: u64,
    /// Payload bytes scanned.
    pub scanned_bytes: u64,
    /// Signature matches (a packet matching two signatures counts two).
    pub alerts: u64,
    /// Packets that matched at least one signature.
    pub alerted_packets: u64,
    /// Packets dropped (block mode).
    pub blocked: u64,
    /// Alert records written to the ring.
    pub logged: u64,
    /// Alerts not recorded because of the per-second limit.
    pub log_suppressed: u64,
}

/// Per-tenant limits the IDS registers memory for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdsLimits {
    /// Signatures per tenant.
    pub max_rules: u32,
    /// Heap bytes of a tenant's two automata.
    pub max_automaton_bytes: u32,
    /// Capacity of the recent-alerts ring.
    pub max_recent_alerts: u32,
}

impl Default for IdsLimits {
    fn default() -> Self {
        IdsLimits {
            max_rules: 1024,
            max_automaton_bytes: 8 << 20,
            max_recent_alerts: 1024,
        }
    }
}

/// One tenant's IDS state.
#[derive(Debug, Default)]
pub struct IdsState {
    sigs: Vec<Signature>,
    mode: IdsMode,
    /// Case-sensitive and case-insensitive automata, with their pattern -> global
    /// pattern index maps.
    cs: Option<AhoCorasick>,
    cs_ids: Vec<u32>,
    ci: Option<AhoCorasick>,
    ci_ids: Vec<u32>,
    /// Global pattern index -> rule index.
    pattern_rule: Vec<u32>,
    /// Scratch, sized at init: per-pattern and per-rule "seen in packet `gen`" marks.
    generation: u32,
    pattern_seen: Vec<u32>,
    rule_seen: Vec<u32>,
    rule_applies: Vec<bool>,
    rule_found: Vec<u32>,
    matched: Vec<u32>,
    hits: Vec<u64>,
    counters: IdsCounters,
    log_per_second: u32,
    log_second: u64,
    log_in_second: u32,
    ring: Vec<AlertRecord>,
    ring_cap: usize,
    ring_next: usize,
}

impl IdsState {
    /// Builds a tenant's state from its policy, within `limits`.
    pub fn from_policy(policy: &IdsPolicy, limits: &IdsLimits) -> Result<Self, InitError> {
        let sigs = parse_rules(&policy.rules)?;
        if sigs.len() > limits.max_rules as usize {
            return Err(InitError::invalid(
                "rules",
                format!(
                    "{} signatures exceed the registered maximum of {}",
                    sigs.len(),
                    limits.max_rules
                ),
            ));
        }
        let ring_cap = policy.recent_alerts.unwrap_or(DEFAULT_RECENT_ALERTS);
        if ring_cap == 0 || ring_cap > limits.max_recent_alerts {
            return Err(InitError::invalid(
                "recent_alerts",
                format!("{ring_cap} is not in 1..={}", limits.max_recent_alerts),
            ));
        }
        let mut pattern_rule = Vec::new();
        let (mut cs_pats, mut cs_ids, mut ci_pats, mut ci_ids) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (r, sig) in sigs.iter().enumerate() {
            for c in &sig.contents {
                let g = pattern_rule.len() as u32;
                pattern_rule.push(r as u32);
                if c.nocase {
                    ci_pats.push(c.bytes.as_slice());
                    ci_ids.push(g);
                } else {
                    cs_pats.push(c.bytes.as_slice());
                    cs_ids.push(g);
                }
            }
        }
        let build = |pats: &[&[u8]], nocase: bool| -> Result<Option<AhoCorasick>, InitError> {
            if pats.is_empty() {
                return Ok(None);
            }
            AhoCorasickBuilder::new()
                .match_kind(MatchKind::Standard)
                .ascii_case_insensitive(nocase)
                .build(pats)
                .map(Some)
                .map_err(|e| InitError::invalid("rules", format!("cannot build the matcher: {e}")))
        };
        let cs = build(&cs_pats, false)?;
        let ci = build(&ci_pats, true)?;
        let bytes: usize = [&cs, &ci]
            .iter()
            .filter_map(|a| a.as_ref().map(AhoCorasick::memory_usage))
            .sum();
        if bytes > limits.max_automaton_bytes as usize {
            return Err(InitError::OutOfMemory {
                needed: bytes,
                available: limits.max_automaton_bytes as usize,
            });
        }
        let (n_pat, n_rules) = (pattern_rule.len(), sigs.len());
        Ok(IdsState {
            mode: policy.mode,
            cs,
            cs_ids,
            ci,
            ci_ids,
            pattern_rule,
            generation: 0,
            pattern_seen: vec![0; n_pat],
            rule_seen: vec![0; n_rules],
            rule_applies: vec![false; n_rules],
            rule_found: vec![0; n_rules],
            matched: Vec::with_capacity(n_rules),
            hits: vec![0; n_rules],
            counters: IdsCounters::default(),
            log_per_second: policy.log_per_second.unwrap_or(DEFAULT_LOG_PER_SECOND),
            log_second: u64::MAX,
            log_in_second: 0,
            ring: Vec::with_capacity(ring_cap as usize),
            ring_cap: ring_cap as usize,
            ring_next: 0,
            sigs,
        })
    }

    /// Scans one packet. Never allocates.
    pub fn process(&mut self, pkt: &Packet<'_>) -> Verdict {
        self.counters.packets += 1;
        let payload = pkt.payload();
        if payload.is_empty() || self.sigs.is_empty() {
            return Verdict::Pass;
        }
        self.counters.scanned_bytes += payload.len() as u64;
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.pattern_seen.fill(0);
            self.rule_seen.fill(0);
            self.generation = 1;
        }
        self.matched.clear();
        let key = pkt.flow_key();
        let has_ports = pkt.ports().is_some();
        let mut scan = Scan {
            generation: self.generation,
            key: &key,
            has_ports,
            sigs: &self.sigs,
            pattern_rule: &self.pattern_rule,
            pattern_seen: &mut self.pattern_seen,
            rule_seen: &mut self.rule_seen,
            rule_applies: &mut self.rule_applies,
            rule_found: &mut self.rule_found,
            matched: &mut self.matched,
        };
        for (ac, ids) in [(&self.cs, &self.cs_ids), (&self.ci, &self.ci_ids)] {
            let Some(ac) = ac else { continue };
            let Ok(iter) = ac.try_find_overlapping_iter(payload) else {
                continue;
            };
            for m in iter {
                if let Some(&g) = ids.get(m.pattern().as_usize()) {
                    scan.found(g as usize);
                }
            }
        }
        if self.matched.is_empty() {
            return Verdict::Pass;
        }
        self.matched.sort_unstable();
        let blocked = self.mode == IdsMode::Block;
        self.counters.alerted_packets += 1;
        let now = pkt.meta().ts_ns;
        for i in 0..self.matched.len() {
            let r = self.matched[i] as usize;
            self.hits[r] += 1;
            self.counters.alerts += 1;
            let record = AlertRecord {
                ts_ns: now,
                tenant: pkt.tenant(),
                sid: self.sigs[r].sid,
                rule: r as u32,
                flow: key,
                blocked,
            };
            self.log(record);
        }
        if blocked {
            self.counters.blocked += 1;
            Verdict::Drop(DropCause::Policy)
        } else {
            Verdict::Pass
        }
    }

    /// Records an alert unless this second's budget is spent.
    fn log(&mut self, a: AlertRecord) {
        let second = a.ts_ns / 1_000_000_000;
        if second != self.log_second {
            self.log_second = second;
            self.log_in_second = 0;
        }
        if self.log_in_second >= self.log_per_second {
            self.counters.log_suppressed += 1;
            return;
        }
        self.log_in_second += 1;
        self.counters.logged += 1;
        if self.ring.len() < self.ring_cap {
            self.ring.push(a);
        } else if let Some(slot) = self.ring.get_mut(self.ring_next) {
            *slot = a;
        }
        self.ring_next = (self.ring_next + 1) % self.ring_cap.max(1);
    }

    /// The recorded alerts still in the ring, oldest first.
    pub fn recent_alerts(&self) -> impl Iterator<Item = &AlertRecord> {
        let split = if self.ring.len() < self.ring_cap {
            0
        } else {
            self.ring_next
        };
        self.ring[split..].iter().chain(&self.ring[..split])
    }

    /// A log line for an alert record: tenant, signature id and message, action, 5-tuple.
    pub fn log_line(&self, a: &AlertRecord) -> String {
        let msg = self
            .sigs
            .get(a.rule as usize)
            .map_or("", |s| s.msg.as_str());
        let f = &a.flow;
        format!(
            "ids tenant={} sid={} msg={:?} action={} proto={} {} -> {} ts_ns={}",
            a.tenant,
            a.sid,
            msg,
            if a.blocked { "block" } else { "alert" },
            f.proto,
            endpoint(f.src_addr(), f.src_port),
            endpoint(f.dst_addr(), f.dst_port),
            a.ts_ns
        )
    }

    /// The signatures, in rule-text order.
    pub fn signatures(&self) -> &[Signature] {
        &self.sigs
    }

    /// Matches per signature, aligned with [`signatures`](Self::signatures).
    pub fn rule_hits(&self) -> &[u64] {
        &self.hits
    }

    /// The counters.
    pub fn counters(&self) -> &IdsCounters {
        &self.counters
    }

    /// Named counters, as `summary()` reports them (`rule_hits[i]` follows rule order).
    pub fn summary(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        let mut v = vec![
            ("packets", c.packets),
            ("scanned_bytes", c.scanned_bytes),
            ("alerts", c.alerts),
            ("alerted_packets", c.alerted_packets),
            ("blocked", c.blocked),
            ("logged", c.logged),
            ("log_suppressed", c.log_suppressed),
        ];
        v.extend(
            self.hits
                .iter()
                .enumerate()
                .map(|(i, &h)| (rule_hits_name(i), h)),
        );
        v
    }
}

fn endpoint(addr: std::net::IpAddr, port: u16) -> String {
    match addr {
        std::net::IpAddr::V4(a) => format!("{a}:{port}"),
        std::net::IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// The per-packet bookkeeping of one scan (borrows the state's scratch arrays).
struct Scan<'s> {
    generation: u32,
    key: &'s FlowKey,
    has_ports: bool,
    sigs: &'s [Signature],
    pattern_rule: &'s [u32],
    pattern_seen: &'s mut [u32],
    rule_seen: &'s mut [u32],
    rule_applies: &'s mut [bool],
    rule_found: &'s mut [u32],
    matched: &'s mut Vec<u32>,
}

impl Scan<'_> {
    /// Pattern `g` occurs in the payload.
    #[inline]
    fn found(&mut self, g: usize) {
        let gen = self.generation;
        if self.pattern_seen[g] == gen {
            return;
        }
        self.pattern_seen[g] = gen;
        let r = self.pattern_rule[g] as usize;
        if self.rule_seen[r] != gen {
            self.rule_seen[r] = gen;
            self.rule_found[r] = 0;
            self.rule_applies[r] = self.sigs[r].header_matches(self.key, self.has_ports);
        }
        if !self.rule_applies[r] {
            return;
        }
        self.rule_found[r] += 1;
        if self.rule_found[r] as usize == self.sigs[r].contents.len() {
            // At most once per rule per packet, so within the capacity reserved at init.
            self.matched.push(r as u32);
        }
    }
}

/// The IDS NF (multi-tenant).
#[derive(Clone, Debug, Default)]
pub struct Ids {
    limits: IdsLimits,
}

impl Ids {
    /// An IDS whose tenants stay within `limits`.
    pub fn with_limits(limits: IdsLimits) -> Self {
        Ids { limits }
    }
}

impl NetworkFunction for Ids {
    type State = IdsState;
    type Policy = IdsPolicy;

    // The default handle_group: the worker runs each packet as it parses it.
    const PER_PACKET: bool = true;

    fn name(&self) -> &'static str {
        "ids"
    }

    fn register(&self) -> MemorySpec {
        let l = &self.limits;
        // Signatures with a little text each and their scratch, the automata, the ring.
        let per_rule = std::mem::size_of::<Signature>() + 128 + 32;
        let extra = l.max_rules as usize * per_rule
            + l.max_automaton_bytes as usize
            + l.max_recent_alerts as usize * std::mem::size_of::<AlertRecord>();
        MemorySpec::with_extra::<IdsState>(extra)
    }

    fn init(&self, policy: &IdsPolicy, state: &mut IdsState) -> Result<(), InitError> {
        *state = IdsState::from_policy(policy, &self.limits)?;
        Ok(())
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut IdsState) -> Verdict {
        state.process(pkt)
    }

    fn summary(&self, state: &IdsState) -> Vec<(&'static str, u64)> {
        state.summary()
    }
}

/// The single-tenant IDS: the same logic over one plain state, no framework.
/// The benchmark baseline.
#[derive(Debug)]
pub struct SingleTenantIds {
    /// The one tenant's state.
    pub state: IdsState,
}

impl SingleTenantIds {
    /// An IDS enforcing `policy` with the default limits.
    pub fn new(policy: &IdsPolicy) -> Result<Self, InitError> {
        Ok(SingleTenantIds {
            state: IdsState::from_policy(policy, &IdsLimits::default())?,
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

    const SEC: u64 = 1_000_000_000;
    const DROP: Verdict = Verdict::Drop(DropCause::Policy);

    fn tcp(src: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(src, [192, 168, 100, 1], 64)
            .tcp(sport, dport, 1, 1000)
            .write(&mut v, payload)
            .unwrap();
        v
    }

    fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([192, 168, 0, 1], [10, 0, 0, 53], 64)
            .udp(sport, dport)
            .write(&mut v, payload)
            .unwrap();
        v
    }

    fn run_at(st: &mut IdsState, bytes: &[u8], ts_ns: u64, tenant: u32) -> Verdict {
        let mut b = bytes.to_vec();
        let meta = PacketMeta {
            ts_ns,
            tenant: TenantId(tenant),
            ..Default::default()
        };
        let mut p = Packet::parse(&mut b, meta).unwrap();
        Ids::default().handle(&mut p, st)
    }

    fn run(st: &mut IdsState, bytes: &[u8]) -> Verdict {
        run_at(st, bytes, 0, 1)
    }

    fn state(mode: &str, rules: &str) -> IdsState {
        let p = IdsPolicy {
            mode: if mode == "block" {
                IdsMode::Block
            } else {
                IdsMode::Alert
            },
            rules: rules.into(),
            ..Default::default()
        };
        let mut st = IdsState::default();
        Ids::default().init(&p, &mut st).unwrap();
        st
    }

    const RULES: &str = r#"
        # web attacks
        alert tcp any 80 (msg:"evil"; content:"evil"; nocase; sid:1001;)
        alert tcp 192.168.0.0/16 any -> any 80 (msg:"passwd"; content:"GET"; content:"/etc/passwd"; sid:1002; rev:2;)
        alert udp any any -> 10.0.0.0/8 53 (msg:"bad domain"; content:"|03|bad|03|com"; sid:1003; classtype:trojan;)
        alert ip any any (msg:"Case Sensitive"; content:"AtTaCk"; sid:1004;)
    "#;

    #[test]
    fn parses_the_documented_format() {
        let sigs = parse_rules(RULES).unwrap();
        assert_eq!(sigs.len(), 4);
        assert_eq!((sigs[0].sid, sigs[0].line), (1001, 3));
        assert_eq!(sigs[0].dst_ports, (80, 80));
        assert!(sigs[0].contents[0].nocase);
        assert_eq!(sigs[1].src.unwrap().to_string(), "192.168.0.0/16");
        assert_eq!(sigs[1].contents.len(), 2);
        assert_eq!(sigs[2].contents[0].bytes, b"\x03bad\x03com");
        assert_eq!(sigs[3].proto, None);
        let s = parse_rules(r#"drop tcp any 1024: (msg:"a \"q\"; b"; content:"x\;y"; sid:7;)"#)
            .unwrap();
        assert_eq!(s[0].msg, "a \"q\"; b");
        assert_eq!(s[0].contents[0].bytes, b"x;y");
        assert_eq!(s[0].dst_ports, (1024, 65535));
    }

    #[test]
    fn alert_mode_passes_counts_and_records() {
        let mut st = state("alert", RULES);
        let evil = tcp(
            [192, 168, 0, 1],
            40000,
            80,
            b"GET /EVIL.html HTTP/1.1\r\n\r\n",
        );
        assert_eq!(run(&mut st, &evil), Verdict::Pass);
        let passwd = tcp(
            [192, 168, 0, 1],
            40000,
            80,
            b"GET /etc/passwd HTTP/1.0\r\n\r\n",
        );
        assert_eq!(run(&mut st, &passwd), Verdict::Pass);
        // Same content, source outside the prefix: no match.
        let outside = tcp(
            [172, 16, 0, 1],
            40000,
            80,
            b"GET /etc/passwd HTTP/1.0\r\n\r\n",
        );
        assert_eq!(run(&mut st, &outside), Verdict::Pass);
        // Port restriction: "evil" towards port 8080 does not match 1001.
        assert_eq!(
            run(&mut st, &tcp([1, 1, 1, 1], 1, 8080, b"evil")),
            Verdict::Pass
        );
        let dns = udp(5353, 53, b"\x00\x01\x03bad\x03com\x00");
        assert_eq!(run(&mut st, &dns), Verdict::Pass);
        // Case-sensitive content.
        assert_eq!(run(&mut st, &udp(1, 2, b"attack")), Verdict::Pass);
        assert_eq!(run(&mut st, &udp(1, 2, b"..AtTaCk..")), Verdict::Pass);
        assert_eq!(st.rule_hits(), &[1, 1, 1, 1]);
        let c = *st.counters();
        assert_eq!(
            (c.packets, c.alerts, c.alerted_packets, c.blocked),
            (7, 4, 4, 0)
        );
        let sids: Vec<u32> = st.recent_alerts().map(|a| a.sid).collect();
        assert_eq!(sids, [1001, 1002, 1003, 1004]);
        let line = st.log_line(st.recent_alerts().next().unwrap());
        assert!(
            line.contains("tenant=1")
                && line.contains("sid=1001")
                && line.contains("192.168.0.1:40000 -> 192.168.100.1:80")
                && line.contains("action=alert"),
            "{line}"
        );
    }

    #[test]
    fn block_mode_drops_matches_and_passes_the_rest() {
        let mut st = state("block", RULES);
        assert_eq!(run(&mut st, &tcp([1, 1, 1, 1], 1, 80, b"so EvIl")), DROP);
        assert_eq!(
            run(&mut st, &tcp([1, 1, 1, 1], 1, 80, b"benign")),
            Verdict::Pass
        );
        // A packet matching two signatures counts both, drops once.
        let both = tcp([192, 168, 3, 3], 1, 80, b"GET /etc/passwd?evil");
        assert_eq!(run(&mut st, &both), DROP);
        let c = *st.counters();
        assert_eq!((c.alerts, c.alerted_packets, c.blocked), (3, 2, 2));
        assert_eq!(st.rule_hits(), &[2, 1, 0, 0]);
        assert!(st.recent_alerts().all(|a| a.blocked));
    }

    /// A prefix matches only its own IP version: `::ffff:192.168.0.1` over IPv6 is not
    /// in `192.168.0.0/16`.
    #[test]
    fn prefixes_never_match_ipv4_mapped_ipv6_sources() {
        let mut st = state("block", RULES);
        let payload = b"GET /etc/passwd HTTP/1.0\r\n\r\n";
        let mut v6 = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv6(
                std::net::Ipv4Addr::new(192, 168, 0, 1)
                    .to_ipv6_mapped()
                    .octets(),
                [9; 16],
                64,
            )
            .tcp(40000, 80, 1, 1000)
            .write(&mut v6, payload)
            .unwrap();
        assert_eq!(run(&mut st, &v6), Verdict::Pass);
        assert_eq!(
            run(&mut st, &tcp([192, 168, 0, 1], 40000, 80, payload)),
            DROP
        );
        assert_eq!(st.rule_hits(), &[0, 1, 0, 0]);
    }

    /// SCTP port restrictions match SCTP ports; the content is found in the chunks.
    #[test]
    fn sctp_port_rules_match_sctp_ports() {
        use crate::test_frames::sctp;
        let mut st = state(
            "block",
            r#"alert sctp any any -> any 3868 (msg:"diameter"; content:"evil"; sid:1;)"#,
        );
        let to = |port| sctp("10.0.0.1", "10.0.0.2", 40000, port, b"an evil request");
        assert_eq!(run(&mut st, &to(3868)), DROP);
        assert_eq!(run(&mut st, &to(3869)), Verdict::Pass);
        assert_eq!(st.rule_hits(), &[1]);
        let a = st.recent_alerts().next().copied().unwrap();
        assert_eq!(
            (a.flow.proto, a.flow.src_port, a.flow.dst_port),
            (132, 40000, 3868)
        );
        assert!(
            st.log_line(&a).contains("10.0.0.1:40000 -> 10.0.0.2:3868"),
            "{}",
            st.log_line(&a)
        );
    }

    /// An alert keeps the packet's address family: an IPv6 packet from
    /// `::ffff:10.3.1.1` is logged as that IPv6 address, never as IPv4 `10.3.1.1`, and a
    /// host rule for one form does not match the other.
    #[test]
    fn alerts_and_rules_keep_the_address_family() {
        use crate::test_frames::udp;
        let mut st = state(
            "alert",
            "alert udp 10.3.1.1 any -> any any (content:\"x\"; sid:1;)\n\
             alert udp ::ffff:10.3.1.1 any -> any any (content:\"x\"; sid:2;)\n\
             alert udp any any -> any 53 (content:\"x\"; sid:3;)",
        );
        let v6 = udp("::ffff:10.3.1.1", "::ffff:10.3.1.2", 5000, 53, b"x");
        let v4 = udp("10.3.1.1", "10.3.1.2", 5000, 53, b"x");
        run(&mut st, &v6);
        assert_eq!(st.rule_hits(), &[0, 1, 1]);
        run(&mut st, &v4);
        assert_eq!(st.rule_hits(), &[1, 1, 2]);
        let lines: Vec<String> = st.recent_alerts().map(|a| st.log_line(a)).collect();
        assert_eq!(lines.len(), 4);
        for l in &lines[..2] {
            assert!(
                l.contains("[::ffff:10.3.1.1]:5000 -> [::ffff:10.3.1.2]:53"),
                "{l}"
            );
        }
        for l in &lines[2..] {
            assert!(l.contains(" 10.3.1.1:5000 -> 10.3.1.2:53"), "{l}");
        }
    }

    #[test]
    fn a_signature_needs_every_content() {
        let mut st = state("block", RULES);
        let only_get = tcp([192, 168, 0, 1], 1, 80, b"GET /index.html");
        assert_eq!(run(&mut st, &only_get), Verdict::Pass);
        let repeated = tcp([192, 168, 0, 1], 1, 80, b"GET GET GET /etc/pass");
        assert_eq!(run(&mut st, &repeated), Verdict::Pass);
        assert_eq!(st.counters().alerts, 0);
    }

    #[test]
    fn log_records_are_rate_limited_per_second_of_packet_time() {
        let p = IdsPolicy {
            rules: RULES.into(),
            log_per_second: Some(3),
            recent_alerts: Some(4),
            ..Default::default()
        };
        let mut st = IdsState::from_policy(&p, &IdsLimits::default()).unwrap();
        let evil = tcp([1, 1, 1, 1], 1, 80, b"evil");
        for i in 0..10 {
            run_at(&mut st, &evil, 5 * SEC + i * 1000, 1);
        }
        assert_eq!((st.counters().logged, st.counters().log_suppressed), (3, 7));
        for i in 0..2 {
            run_at(&mut st, &evil, 6 * SEC + i, 1);
        }
        assert_eq!((st.counters().logged, st.counters().log_suppressed), (5, 7));
        assert_eq!(st.counters().alerts, 12);
        // The ring keeps the 4 most recent records, oldest first.
        let ts: Vec<u64> = st.recent_alerts().map(|a| a.ts_ns).collect();
        assert_eq!(ts, [5 * SEC + 1000, 5 * SEC + 2000, 6 * SEC, 6 * SEC + 1]);
    }

    #[test]
    fn empty_truncated_and_garbage_payloads_never_panic() {
        let mut st = state("block", RULES);
        assert_eq!(run(&mut st, &tcp([1, 1, 1, 1], 1, 80, b"")), Verdict::Pass);
        let good = tcp([1, 1, 1, 1], 1, 80, b"some evil payload");
        for n in 0..good.len() {
            let mut b = good[..n].to_vec();
            // Truncated frames fail to parse (counted by the framework), never reach us.
            assert!(Packet::parse(&mut b, PacketMeta::default()).is_err());
        }
        // A frame whose IP length ends before the full payload: only the covered bytes
        // are scanned, so the cut "evil" is not seen.
        let mut cut = tcp([1, 1, 1, 1], 1, 80, b"xxxxev");
        cut.extend_from_slice(b"il");
        assert_eq!(run(&mut st, &cut), Verdict::Pass);
        let mut seed = 0x1234_5678_9abc_def1u64;
        for _ in 0..2000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 300) as usize;
            let payload: Vec<u8> = (0..len).map(|i| (seed >> (i % 57)) as u8).collect();
            let _ = run(&mut st, &udp(1, 53, &payload));
            let _ = run(&mut st, &tcp([192, 168, 1, 1], 2, 80, &payload));
        }
        assert_eq!(st.counters().packets, 4002);
    }

    #[test]
    fn unparsable_signatures_name_the_line() {
        let cases = [
            ("alert tcp any 80 (content:\"x\"; sid:1;)\nalert tcp any 80 (content:\"y\";)", 2, "sid"),
            ("\n\nalert tcp any 80 (content:\"x\"; pcre:\"/a/\"; sid:1;)", 3, "pcre"),
            ("alert tcp any 80 content:\"x\"; sid:1;", 1, "("),
            ("alert tcp any 80 (content:\"x\"; sid:1", 1, ")"),
            ("alert tcp any (content:\"x\"; sid:1;)", 1, "header"),
            ("alert tcp any any <> any 80 (content:\"x\"; sid:1;)", 1, "<>"),
            ("alert tcpp any 80 (content:\"x\"; sid:1;)", 1, "tcpp"),
            ("pass tcp any 80 (content:\"x\"; sid:1;)", 1, "pass"),
            ("alert tcp any 99999 (content:\"x\"; sid:1;)", 1, "99999"),
            ("alert tcp any 90:80 (content:\"x\"; sid:1;)", 1, "90:80"),
            ("alert tcp 10.0.0.1/8 any -> any 80 (content:\"x\"; sid:1;)", 1, "host bits"),
            ("alert tcp any 80 (content:\"|4|\"; sid:1;)", 1, "hex"),
            ("alert tcp any 80 (content:\"|zz|\"; sid:1;)", 1, "hex"),
            ("alert tcp any 80 (content:\"\"; sid:1;)", 1, "empty"),
            ("alert tcp any 80 (content:x; sid:1;)", 1, "quoted"),
            ("alert tcp any 80 (content:\"x; sid:1;)", 1, "unterminated"),
            ("alert tcp any 80 (nocase; content:\"x\"; sid:1;)", 1, "nocase"),
            ("alert tcp any 80 (msg:\"m\"; sid:1;)", 1, "content"),
            ("alert tcp any 80 (content:\"x\"; sid:one;)", 1, "sid"),
            ("alert tcp any 80 (content:\"x\"; sid:1; rev:1)", 1, "`;`"),
            ("a\nalert tcp any 80 (content:\"x\"; sid:5;)", 1, "line 1"),
            (
                "alert tcp any 80 (content:\"x\"; sid:5;)\nalert udp any 80 (content:\"y\"; sid:5;)",
                2,
                "sid 5",
            ),
        ];
        for (text, line, word) in cases {
            let p = IdsPolicy {
                rules: text.into(),
                ..Default::default()
            };
            let e = Ids::default()
                .init(&p, &mut IdsState::default())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("rules[line {line}]")) && e.contains(word),
                "{text:?}: {e}"
            );
        }
        let e = Ids::default()
            .init(
                &IdsPolicy {
                    rules: String::new(),
                    recent_alerts: Some(0),
                    ..Default::default()
                },
                &mut IdsState::default(),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("recent_alerts"), "{e}");
        assert!(toml::from_str::<IdsPolicy>("rules = ''\nsignatures = ''").is_err());
        assert!(toml::from_str::<IdsPolicy>("rules = ''\nmode = \"drop\"").is_err());
        let limited = Ids::with_limits(IdsLimits {
            max_rules: 1,
            ..Default::default()
        });
        let two = IdsPolicy {
            rules:
                "alert ip any any (content:\"a\"; sid:1;)\nalert ip any any (content:\"b\"; sid:2;)"
                    .into(),
            ..Default::default()
        };
        let e = limited.init(&two, &mut IdsState::default()).unwrap_err();
        assert!(e.to_string().contains("`rules`"), "{e}");
        let tiny = Ids::with_limits(IdsLimits {
            max_automaton_bytes: 16,
            ..Default::default()
        });
        let e = tiny.init(&two, &mut IdsState::default()).unwrap_err();
        assert!(matches!(e, InitError::OutOfMemory { .. }), "{e}");
    }

    #[test]
    fn policy_loads_from_toml() {
        let p: IdsPolicy = toml::from_str(
            r#"
            mode = "block"
            log_per_second = 5
            rules = '''
            alert tcp any 80 (msg:"evil"; content:"evil"; nocase; sid:1001;)
            '''
            "#,
        )
        .unwrap();
        let mut st = IdsState::default();
        Ids::default().init(&p, &mut st).unwrap();
        assert_eq!(run(&mut st, &tcp([1, 1, 1, 1], 1, 80, b"EVIL")), DROP);
        assert_eq!(
            Ids::default()
                .summary(&st)
                .iter()
                .find(|(k, _)| *k == "rule_hits[0]"),
            Some(&("rule_hits[0]", 1))
        );
    }

    #[test]
    fn two_tenants_with_overlapping_addresses_keep_their_own_policy_and_state() {
        // Both tenants' traffic is 192.168.0.0/16; only their signatures and modes differ.
        let mut a = state(
            "block",
            "alert tcp 192.168.0.0/16 any -> any 80 (content:\"evil\"; sid:1;)",
        );
        let mut b = state(
            "alert",
            "alert tcp any any (content:\"good\"; sid:2;)\nalert tcp any any (content:\"evil\"; sid:3;)",
        );
        let packets = [
            tcp([192, 168, 1, 1], 1000, 80, b"evil"),
            tcp([192, 168, 1, 1], 1000, 80, b"good"),
            tcp([192, 168, 1, 1], 1000, 8080, b"evil"),
        ];
        let va: Vec<_> = packets.iter().map(|p| run_at(&mut a, p, 0, 1)).collect();
        let vb: Vec<_> = packets.iter().map(|p| run_at(&mut b, p, 0, 2)).collect();
        assert_eq!(va, [DROP, Verdict::Pass, Verdict::Pass]);
        assert_eq!(vb, [Verdict::Pass; 3]);
        assert_eq!(a.rule_hits(), &[1]);
        assert_eq!(b.rule_hits(), &[1, 2]);
        assert_eq!((a.counters().blocked, b.counters().blocked), (1, 0));
        assert_eq!((a.counters().alerts, b.counters().alerts), (1, 3));
        assert!(a
            .recent_alerts()
            .all(|r| r.tenant == TenantId(1) && r.sid == 1));
        assert!(b
            .recent_alerts()
            .all(|r| r.tenant == TenantId(2) && r.sid != 1));
    }

    #[test]
    fn single_tenant_variant_matches_the_nf() {
        let policy = IdsPolicy {
            mode: IdsMode::Block,
            rules: RULES.into(),
            ..Default::default()
        };
        let mut single = SingleTenantIds::new(&policy).unwrap();
        let mut st = IdsState::default();
        Ids::default().init(&policy, &mut st).unwrap();
        for pkt in [tcp([1; 4], 1, 80, b"evil"), tcp([1; 4], 1, 80, b"fine")] {
            let mut b = pkt.clone();
            let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
            assert_eq!(single.handle(&mut p), run_at(&mut st, &pkt, 0, 0));
        }
        assert_eq!(single.state.counters(), st.counters());
    }
}
