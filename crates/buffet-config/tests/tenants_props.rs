//! Property tests (proptest): a tenants file says the same thing in TOML and in JSON. Any
//! set of tenants — names, MAX_NB, rules with priorities, prefixes, protocols by name or
//! number, ports or port ranges, DSCP, and NF policies with nested tables, arrays,
//! integers at both ends of their range, floats, booleans and strings, and chains of
//! stages with their own policies and `when` guards — written in both formats parses to
//! the same validated tenants, with what was written.

use std::path::Path;

use buffet_config::tenants::{parse, Format};
use buffet_sdk::TenantId;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// A policy value both formats can write (TOML has no null; JSON no NaN).
fn policy_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        "[a-z0-9 ._/-]{0,12}".prop_map(Value::from),
        (-1.0e9f64..1.0e9).prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            // TOML arrays may mix types; keep them homogeneous for older readers anyway.
            proptest::collection::vec(any::<i64>().prop_map(Value::from), 0..4)
                .prop_map(Value::Array),
            proptest::collection::btree_map("[a-z][a-z0-9_]{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn rule() -> impl Strategy<Value = Value> {
    (
        proptest::option::of(0u32..1000),
        (
            0u8..=255,
            prop_oneof![Just(8u8), Just(16), Just(24), Just(32)],
        ),
        prop_oneof![
            Just(json!("udp")),
            Just(json!("tcp")),
            Just(json!(17)),
            Just(json!(6))
        ],
        proptest::option::of(prop_oneof![
            (1u16..=65535).prop_map(Value::from),
            (1u16..1000, 0u16..1000).prop_map(|(lo, w)| json!(format!("{lo}-{}", lo + w))),
        ]),
        proptest::option::of(0u8..64),
    )
        .prop_map(|(priority, (b, len), protocol, dst_port, dscp)| {
            let net = u32::from_be_bytes([10, b, 7, 0]) & (u32::MAX << (32 - u32::from(len)));
            let [a, b, c, d] = net.to_be_bytes();
            let mut r = Map::new();
            if let Some(p) = priority {
                r.insert("priority".into(), json!(p));
            }
            r.insert("dst_ip".into(), json!(format!("{a}.{b}.{c}.{d}/{len}")));
            r.insert("protocol".into(), protocol);
            if let Some(p) = dst_port {
                r.insert("dst_port".into(), p);
            }
            if let Some(d) = dscp {
                r.insert("dscp".into(), json!(d));
            }
            Value::Object(r)
        })
}

/// A chain stage: a reference NF, an optional policy, an optional `when` guard.
fn stage() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just("firewall"), Just("monitor"), Just("dpi"), Just("ids")],
        proptest::option::of(proptest::collection::btree_map(
            "[a-z][a-z0-9_]{0,6}",
            policy_value(),
            0..3,
        )),
        proptest::option::of((
            prop_oneof![Just(json!("udp")), Just(json!("tcp")), Just(json!(6))],
            proptest::option::of(1u16..=65535),
            proptest::option::of(any::<u32>()),
        )),
    )
        .prop_map(|(nf, policy, when)| {
            let mut s = Map::new();
            s.insert("nf".into(), json!(nf));
            if let Some(p) = policy {
                s.insert("policy".into(), Value::Object(p.into_iter().collect()));
            }
            if let Some((protocol, port, mark)) = when {
                let mut w = Map::new();
                w.insert("protocol".into(), protocol);
                if let Some(p) = port {
                    w.insert("dst_port".into(), json!(p));
                }
                if let Some(m) = mark {
                    w.insert("mark".into(), json!(m));
                }
                s.insert("when".into(), Value::Object(w));
            }
            Value::Object(s)
        })
}

fn tenant(id: u32) -> impl Strategy<Value = Value> {
    (
        proptest::option::of("[A-Za-z][A-Za-z0-9 _-]{0,10}"),
        proptest::option::of(0u64..=i64::MAX as u64),
        proptest::collection::vec(rule(), 1..4),
        proptest::option::of(proptest::collection::btree_map(
            "[a-z][a-z0-9_]{0,6}",
            policy_value(),
            0..5,
        )),
        proptest::option::of(proptest::collection::vec(stage(), 1..4)),
    )
        .prop_map(move |(name, max_nb, rules, policy, chain)| {
            let mut t = Map::new();
            t.insert("id".into(), json!(id));
            if let Some(n) = name {
                t.insert("name".into(), json!(n));
            }
            if let Some(m) = max_nb {
                t.insert("max_nb".into(), json!(m));
            }
            t.insert("rules".into(), Value::Array(rules));
            match (chain, policy) {
                // A tenant with a chain gives its policies per stage.
                (Some(c), _) => {
                    t.insert("chain".into(), Value::Array(c));
                }
                (None, Some(p)) => {
                    t.insert("policy".into(), Value::Object(p.into_iter().collect()));
                }
                (None, None) => {}
            }
            Value::Object(t)
        })
}

fn tenants() -> impl Strategy<Value = Vec<Value>> {
    proptest::collection::btree_set(1u32..100_000, 1..5)
        .prop_flat_map(|ids| ids.into_iter().map(tenant).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn toml_and_json_tenants_files_say_the_same(tenants in tenants()) {
        let doc = json!({ "tenant": tenants });
        let json_text = serde_json::to_string_pretty(&doc).unwrap();
        let toml_text = toml::to_string(&doc).unwrap();
        let from_json = parse(Format::Json, Path::new("t.json"), &json_text)
            .unwrap_or_else(|e| panic!("{e}\n{json_text}"));
        let from_toml = parse(Format::Toml, Path::new("t.toml"), &toml_text)
            .unwrap_or_else(|e| panic!("{e}\n{toml_text}"));
        prop_assert_eq!(&from_json, &from_toml, "{}", toml_text);
        for (t, raw) in from_json.iter().zip(&tenants) {
            prop_assert_eq!(t.id, TenantId(raw["id"].as_u64().unwrap() as u32));
            let name = raw.get("name").and_then(Value::as_str).map(str::to_owned);
            prop_assert_eq!(&t.name, &name.unwrap_or_else(|| format!("tenant-{}", t.id.0)));
            prop_assert_eq!(t.max_nb, raw.get("max_nb").and_then(Value::as_u64).unwrap_or(0));
            let rules = raw["rules"].as_array().unwrap();
            prop_assert_eq!(t.rules.len(), rules.len());
            for ((priority, m), r) in t.rules.iter().zip(rules) {
                if let Some(p) = r.get("priority") {
                    prop_assert_eq!(u64::from(*priority), p.as_u64().unwrap());
                }
                prop_assert_eq!(
                    m.dst_ip.map(|p| p.to_string()),
                    r["dst_ip"].as_str().map(str::to_owned)
                );
                prop_assert_eq!(m.dscp.map(u64::from), r.get("dscp").and_then(Value::as_u64));
            }
            let policy = raw.get("policy").cloned().unwrap_or_else(|| json!({}));
            prop_assert_eq!(t.policy.as_value(), &policy);
            let stages = raw.get("chain").and_then(Value::as_array).cloned().unwrap_or_default();
            prop_assert_eq!(t.chain.len(), stages.len());
            for (s, raw) in t.chain.iter().zip(&stages) {
                prop_assert_eq!(s.nf.to_string(), raw["nf"].as_str().unwrap());
                let policy = raw.get("policy").cloned().unwrap_or_else(|| json!({}));
                prop_assert_eq!(s.policy.as_value(), &policy);
                let mark = raw.get("when").and_then(|w| w.get("mark")).and_then(Value::as_u64);
                prop_assert_eq!(s.when.as_ref().and_then(|w| w.mark()).map(u64::from), mark);
            }
        }
    }
}
