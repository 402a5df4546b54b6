//! Fuzz target: the tenants file parser of buffet-config and the policy parsers.
//!
//! The first byte picks the format (even: TOML, odd: JSON), the rest is the file's text.
//! A file that parses is then taken as far as a run takes it: every tenant's policy is
//! decoded as each reference NF's policy and given to that NF's `init`, and the tenants'
//! rules are admitted into a Packet Dispatcher. Each whitespace-separated word of the text
//! also goes through the SDK's value parsers (prefixes, port ranges, MACs, protocols).
//! Every malformed input must come back as an `Err`; nothing may panic.
#![no_main]

use std::path::Path;

use buffet_config::tenants::{self, Format};
use buffet_config::Policy;
use buffet_dispatch::{Dispatcher, DispatcherConfig};
use buffet_nfs::{Dpi, Firewall, FlowFwd, Ids, Ipsec, L2Fwd, MacSwap, Monitor, Policer};
use buffet_sdk::policy::{parse_mac, parse_protocol, IpPrefix, PortRange};
use buffet_sdk::{NetworkFunction, TenantSlot};
use libfuzzer_sys::fuzz_target;

fn init<N: NetworkFunction>(nf: &N, policy: &Policy) {
    if let Ok(p) = policy.decode::<N::Policy>() {
        let mut state = N::State::default();
        let _ = nf.init(&p, &mut state);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    for word in text.split_whitespace().take(64) {
        let word = word.trim_matches(|c| c == '"' || c == ',' || c == '[' || c == ']');
        let _ = word.parse::<IpPrefix>();
        let _ = word.parse::<PortRange>();
        let _ = parse_mac(word);
        let _ = parse_protocol(word);
    }
    let (format, path) = if first.is_multiple_of(2) {
        (Format::Toml, Path::new("fuzz.toml"))
    } else {
        (Format::Json, Path::new("fuzz.json"))
    };
    let Ok(list) = tenants::parse(format, path, text) else {
        return;
    };
    let mut d = Dispatcher::new(DispatcherConfig::default());
    d.add_worker(1_000);
    for t in list.iter().take(16) {
        let _ = t.name.len();
        let _ = d.admit(TenantSlot(t.id.0 % 1024), t.rules.clone(), t.max_nb);
        init(&Monitor::default(), &t.policy);
        init(&Firewall::default(), &t.policy);
        init(&Ids::default(), &t.policy);
        init(&Dpi::default(), &t.policy);
        init(&MacSwap, &t.policy);
        init(&Policer, &t.policy);
        init(&L2Fwd::default(), &t.policy);
        init(&FlowFwd::default(), &t.policy);
        init(&Ipsec::default(), &t.policy);
    }
});
