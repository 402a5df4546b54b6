//! deploy/ against the daemon: every metric the Grafana dashboard queries is one that
//! `/metrics` exports (scraped from a running daemon); the systemd unit keeps to its
//! capabilities and hardening and writes only the data directory of its config; the
//! Kubernetes manifests are well-formed YAML documents whose ConfigMap is a valid
//! buffetd config and whose DaemonSet mounts the config, the token Secret and the data
//! directory where that config says. (No YAML parser is in the dependency tree: the
//! checks are structural.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use buffet_daemon::{Daemon, DaemonConfig};
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-for-deploy-tests-0123";

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

/// Every `buffet_*` name in a PromQL expression.
fn metric_names(expr: &str, out: &mut BTreeSet<String>) {
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("buffet_") {
        let start = i + at;
        let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        if start > 0 && ident(b[start - 1]) {
            i = start + 1;
            continue;
        }
        let mut end = start;
        while end < b.len() && ident(b[end]) {
            end += 1;
        }
        out.insert(expr[start..end].to_owned());
        i = end;
    }
}

fn queries(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                match (k.as_str(), x) {
                    ("expr" | "query", Value::String(s)) => metric_names(s, out),
                    _ => queries(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| queries(x, out)),
        _ => {}
    }
}

#[test]
fn every_dashboard_query_names_an_exported_metric() {
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(repo("deploy/grafana/buffet.json")).unwrap())
            .unwrap();
    let mut wanted = BTreeSet::new();
    queries(&dash, &mut wanted);
    assert!(wanted.len() >= 15, "{wanted:?}");
    for p in dash["panels"].as_array().unwrap() {
        assert!(
            p["targets"].as_array().is_some_and(|t| !t.is_empty()),
            "panel {} has no query",
            p["title"]
        );
    }

    // A daemon with a tenant that passes and one whose packets its NF drops.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin.token"), ADMIN).unwrap();
    let text = format!(
        "data_dir = \"{d}/data\"\n[api]\nlisten = \"127.0.0.1:0\"\nadmin_token_file = \"{d}/admin.token\"\n\
         [nf]\nname = \"firewall\"\n[dataplane]\nworkers = 2\ntenant_slots = 16\narena_mib = 64\n\
         [[port]]\nkind = \"generator\"\ntenants = 2\nrate_pps = 20000\n",
        d = dir.path().display()
    );
    let d = Daemon::start(
        DaemonConfig::parse(Path::new("t.toml"), &text).unwrap(),
        Path::new("t.toml"),
    )
    .unwrap();
    let base = format!("http://{}", d.addr());
    for (id, policy) in [(1, "allow"), (2, "deny")] {
        let body = json!({ "id": id, "rules": [ { "dst_ip": format!("10.0.{}.0/24", id - 1) } ],
                           "policy": { "default": policy } });
        ureq::post(&format!("{base}/v1/tenants"))
            .set("Authorization", &format!("Bearer {ADMIN}"))
            .send_json(body)
            .unwrap();
    }
    let t0 = Instant::now();
    let exported = loop {
        let text = ureq::get(&format!("{base}/metrics"))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        let names: BTreeSet<String> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.split(['{', ' ']).next().unwrap_or("").to_owned())
            .collect();
        if names.contains("buffet_tenant_drops_total") || t0.elapsed() > Duration::from_secs(20) {
            break names;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    d.stop().unwrap();
    let missing: Vec<_> = wanted.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics /metrics does not export: {missing:?}; exported: {exported:?}"
    );
}

/// `[section] -> key -> values` of a systemd unit (a key may repeat).
fn unit(text: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut section = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(s.to_owned());
            out.entry(s.to_owned()).or_default();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("line {}: not key=value: {line}", n + 1));
        let s = section
            .clone()
            .unwrap_or_else(|| panic!("line {}: outside a section", n + 1));
        let k = k.trim();
        assert!(
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric()),
            "line {}: bad key {k:?}",
            n + 1
        );
        out.entry(s)
            .or_default()
            .entry(k.to_owned())
            .or_default()
            .push(v.trim().to_owned());
    }
    out
}

#[test]
fn the_systemd_unit_parses_and_keeps_to_its_capabilities() {
    let u = unit(&std::fs::read_to_string(repo("deploy/systemd/buffetd.service")).unwrap());
    assert_eq!(u.keys().collect::<Vec<_>>(), ["Install", "Service", "Unit"]);
    let s = &u["Service"];
    let one = |k: &str| -> &str {
        let v = s.get(k).unwrap_or_else(|| panic!("[Service] {k} missing"));
        assert_eq!(v.len(), 1, "{k} given twice");
        &v[0]
    };
    let caps: BTreeSet<&str> = ["CAP_NET_ADMIN", "CAP_BPF", "CAP_NET_RAW", "CAP_IPC_LOCK"].into();
    for k in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        assert_eq!(
            one(k).split_whitespace().collect::<BTreeSet<_>>(),
            caps,
            "{k}"
        );
    }
    assert_eq!(one("ProtectSystem"), "strict");
    assert_eq!(one("NoNewPrivileges"), "yes");
    for k in [
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelModules",
    ] {
        assert_eq!(one(k), "yes", "{k}");
    }
    assert!(one("ExecReload").contains("-HUP"));
    // The config the unit starts with is valid, and its data_dir is the one writable path.
    let exec: Vec<&str> = one("ExecStart").split_whitespace().collect();
    assert!(exec[0].ends_with("/buffetd"), "{exec:?}");
    let at = exec.iter().position(|a| *a == "--config").unwrap();
    assert_eq!(exec[at + 1], "/etc/buffet/buffet.toml");
    let cfg = DaemonConfig::load(&repo("deploy/systemd/buffet.toml")).unwrap();
    assert_eq!(Path::new(one("ReadWritePaths")), cfg.data_dir);
    assert!(cfg
        .api
        .admin_token_file
        .as_ref()
        .is_some_and(|f| f.starts_with("/etc/buffet")));
    assert!(cfg.api.listen.ip().is_loopback());
}

/// One YAML document: `(indent, key, value)` per mapping line; list items are read as
/// the mapping they start. Enough to check structure, not a YAML parser.
type Yaml = Vec<(usize, String, String)>;

fn yaml_docs(text: &str) -> Vec<(Yaml, String)> {
    let mut docs = Vec::new();
    for raw in text.split("\n---\n").skip(1) {
        let mut doc = Vec::new();
        let mut block: Option<usize> = None;
        for line in raw.lines() {
            let indent = line.len() - line.trim_start().len();
            let t = line.trim();
            if let Some(b) = block {
                if t.is_empty() || indent > b {
                    continue;
                }
                block = None;
            }
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            assert!(!line.contains('\t'), "a tab in YAML: {line:?}");
            let (indent, t) = match t.strip_prefix("- ") {
                Some(rest) => (indent + 2, rest),
                None => (indent, t),
            };
            let (k, v) = t
                .split_once(':')
                .unwrap_or_else(|| panic!("not `key: value`: {line:?}"));
            let v = v.trim().to_owned();
            if v == "|" {
                block = Some(indent);
            }
            doc.push((indent, k.trim().to_owned(), v));
        }
        docs.push((doc, raw.to_owned()));
    }
    docs
}

fn get<'a>(doc: &'a Yaml, key: &str) -> Vec<&'a str> {
    doc.iter()
        .filter(|(_, k, _)| k == key)
        .map(|(_, _, v)| v.trim_matches('"'))
        .collect()
}

/// The literal block under `key: |`.
fn block(raw: &str, key: &str) -> String {
    let mut lines = raw.lines().skip_while(|l| l.trim() != format!("{key}: |"));
    let head = lines.next().unwrap();
    let base = head.len() - head.trim_start().len();
    let body: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > base)
        .collect();
    let indent = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap();
    body.iter()
        .map(|l| l.get(indent..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_kubernetes_manifests_hold_a_valid_config_and_mount_what_it_reads() {
    let text = std::fs::read_to_string(repo("deploy/kubernetes/buffetd.yaml")).unwrap();
    let docs = yaml_docs(&text);
    let kind = |k: &str| {
        docs.iter()
            .find(|(d, _)| get(d, "kind").first() == Some(&k))
            .unwrap_or_else(|| panic!("no {k}"))
    };
    for (d, _) in &docs {
        assert_eq!(get(d, "apiVersion").len(), 1);
        assert!(!get(d, "name").is_empty());
        assert_eq!(get(d, "namespace").first(), Some(&"buffet"));
    }
    let (cm, cm_raw) = kind("ConfigMap");
    let (secret, _) = kind("Secret");
    let (ds, ds_raw) = kind("DaemonSet");
    assert_eq!(get(ds, "apiVersion"), ["apps/v1"]);
    assert_eq!(get(ds, "hostNetwork"), ["true"]);
    // The config: valid, as the daemon reads it.
    let cfg =
        DaemonConfig::parse(Path::new("buffetd-config"), &block(cm_raw, "buffet.toml")).unwrap();
    let cm_name = get(cm, "name")[0];
    let secret_name = get(secret, "name")[0];
    // The container's --config is the ConfigMap's key under its mount.
    let args = ds_raw
        .lines()
        .find(|l| l.trim_start().starts_with("args:"))
        .unwrap();
    let config_path = args
        .split('"')
        .skip_while(|a| *a != "--config")
        .nth(2)
        .unwrap();
    let mounts: BTreeMap<&str, &str> = {
        let names: Vec<&str> = ds
            .iter()
            .skip_while(|(_, k, _)| k != "volumeMounts")
            .skip(1)
            .take_while(|(_, k, _)| k != "volumes")
            .filter(|(_, k, _)| k == "name")
            .map(|(_, _, v)| v.as_str())
            .collect();
        let paths = get(ds, "mountPath");
        names.into_iter().zip(paths).collect()
    };
    let volume_of = |source_key: &str, name: &str| -> String {
        // `- name: X` then `<kind>:` then `<source_key>: name`.
        let vols: Vec<&(usize, String, String)> =
            ds.iter().skip_while(|(_, k, _)| k != "volumes").collect();
        let at = vols
            .iter()
            .position(|(_, k, v)| k == source_key && v == name)
            .unwrap_or_else(|| panic!("no volume from {source_key} {name}"));
        vols[..at]
            .iter()
            .rev()
            .find(|(_, k, _)| k == "name")
            .map(|(_, _, v)| v.clone())
            .unwrap()
    };
    let config_mount = mounts[volume_of("name", cm_name).as_str()];
    assert_eq!(
        Path::new(config_path),
        Path::new(config_mount).join("buffet.toml")
    );
    let token_mount = mounts[volume_of("secretName", secret_name).as_str()];
    let token_file = cfg.api.admin_token_file.as_ref().unwrap();
    assert_eq!(token_file.parent().unwrap(), Path::new(token_mount));
    let key = token_file.file_name().unwrap().to_str().unwrap();
    assert_eq!(get(secret, key).len(), 1, "the Secret has no key {key}");
    assert!(mounts.values().any(|m| Path::new(m) == cfg.data_dir));
    // Capabilities: the four, nothing else.
    let add = ds_raw
        .lines()
        .find(|l| l.trim_start().starts_with("add:"))
        .unwrap();
    for c in ["NET_ADMIN", "BPF", "NET_RAW", "IPC_LOCK"] {
        assert!(add.contains(&format!("\"{c}\"")), "{add}");
    }
    assert_eq!(add.matches('"').count(), 8, "{add}");
    assert_eq!(get(ds, "allowPrivilegeEscalation"), ["false"]);
}
