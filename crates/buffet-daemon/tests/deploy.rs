//! deploy/ against the daemon: every metric the Grafana dashboard queries is one that
//! `/metrics` exports (scraped from a running daemon); the systemd unit keeps to its
//! capabilities and hardening and writes only the data directory of its config; the
//! Kubernetes manifests parse as YAML (yaml-rust2, a YAML 1.2 parser): buffetd's
//! ConfigMap is a valid buffetd config and its DaemonSet mounts the config, the token
//! Secret and the data directory where that config says, with the four capabilities
//! only; the orchestrator's Deployment and Service agree on its port.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use buffet_daemon::{Daemon, DaemonConfig};
use serde_json::{json, Value};
use yaml_rust2::{Yaml, YamlLoader};

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

/// Every document of a YAML file, parsed by a YAML 1.2 parser.
fn yaml_docs(path: &str) -> Vec<Yaml> {
    let text = std::fs::read_to_string(repo(path)).unwrap();
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn text<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str()
        .unwrap_or_else(|| panic!("{what}: not a string: {y:?}"))
}

fn list<'a>(y: &'a Yaml, what: &str) -> &'a [Yaml] {
    y.as_vec()
        .unwrap_or_else(|| panic!("{what}: not a list: {y:?}"))
}

#[test]
fn the_kubernetes_manifests_hold_a_valid_config_and_mount_what_it_reads() {
    let docs = yaml_docs("deploy/kubernetes/buffetd.yaml");
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(k))
            .unwrap_or_else(|| panic!("no {k}"))
    };
    for d in &docs {
        assert!(d["apiVersion"].as_str().is_some(), "{d:?}");
        assert!(d["metadata"]["name"].as_str().is_some(), "{d:?}");
        assert_eq!(d["metadata"]["namespace"].as_str(), Some("buffet"));
    }
    let (cm, secret, ds) = (kind("ConfigMap"), kind("Secret"), kind("DaemonSet"));
    assert_eq!(ds["apiVersion"].as_str(), Some("apps/v1"));
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"].as_bool(), Some(true));
    // The config: valid, as the daemon reads it.
    let cfg = DaemonConfig::parse(
        Path::new("buffetd-config"),
        text(&cm["data"]["buffet.toml"], "ConfigMap data buffet.toml"),
    )
    .unwrap();
    let containers = list(&pod["containers"], "containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    // The container's --config is the ConfigMap's key under its mount.
    let args: Vec<&str> = list(&c["args"], "args")
        .iter()
        .map(|a| text(a, "arg"))
        .collect();
    let at = args.iter().position(|a| *a == "--config").unwrap();
    let config_path = Path::new(args[at + 1]);
    let mounts: BTreeMap<&str, &str> = list(&c["volumeMounts"], "volumeMounts")
        .iter()
        .map(|m| {
            (
                text(&m["name"], "mount name"),
                text(&m["mountPath"], "mountPath"),
            )
        })
        .collect();
    let volumes = list(&pod["volumes"], "volumes");
    let volume_of = |source: &str, key: &str, name: &str| -> &str {
        volumes
            .iter()
            .find(|v| v[source][key].as_str() == Some(name))
            .map(|v| text(&v["name"], "volume name"))
            .unwrap_or_else(|| panic!("no volume from {source} {name}"))
    };
    let cm_name = text(&cm["metadata"]["name"], "ConfigMap name");
    let config_mount = mounts[volume_of("configMap", "name", cm_name)];
    assert_eq!(config_path, Path::new(config_mount).join("buffet.toml"));
    let secret_name = text(&secret["metadata"]["name"], "Secret name");
    let token_mount = mounts[volume_of("secret", "secretName", secret_name)];
    let token_file = cfg.api.admin_token_file.as_ref().unwrap();
    assert_eq!(token_file.parent().unwrap(), Path::new(token_mount));
    let key = token_file.file_name().unwrap().to_str().unwrap();
    assert!(
        secret["stringData"][key].as_str().is_some(),
        "the Secret has no key {key}"
    );
    assert!(mounts.values().any(|m| Path::new(m) == cfg.data_dir));
    // Capabilities: all dropped, then the four, nothing else.
    let caps = &c["securityContext"]["capabilities"];
    let names = |y: &Yaml| -> Vec<String> {
        list(y, "capabilities")
            .iter()
            .map(|c| text(c, "capability").to_owned())
            .collect()
    };
    assert_eq!(names(&caps["drop"]), ["ALL"]);
    assert_eq!(
        names(&caps["add"]),
        ["NET_ADMIN", "BPF", "NET_RAW", "IPC_LOCK"]
    );
    assert_eq!(
        c["securityContext"]["allowPrivilegeEscalation"].as_bool(),
        Some(false)
    );
    // The probes ask the API's own health routes on the configured port.
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["path"].as_str(), Some(path));
        assert_eq!(
            c[probe]["httpGet"]["port"].as_i64(),
            Some(i64::from(cfg.api.listen.port()))
        );
    }
}

#[test]
fn the_orchestrator_deployment_and_its_service_agree() {
    let docs = yaml_docs("deploy/orchestrator.yaml");
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(k))
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let (dep, svc) = (kind("Deployment"), kind("Service"));
    assert_eq!(dep["apiVersion"].as_str(), Some("apps/v1"));
    // Two replicas: the etcd election picks the leader.
    assert!(dep["spec"]["replicas"].as_i64().is_some_and(|r| r >= 2));
    let c = &list(&dep["spec"]["template"]["spec"]["containers"], "containers")[0];
    let args: Vec<&str> = list(&c["args"], "args")
        .iter()
        .map(|a| text(a, "arg"))
        .collect();
    assert!(args.iter().any(|a| a.starts_with("--etcd=")), "{args:?}");
    let listen = args
        .iter()
        .find_map(|a| a.strip_prefix("--listen="))
        .expect("--listen");
    let port: i64 = listen.rsplit(':').next().unwrap().parse().unwrap();
    let ports = list(&c["ports"], "ports");
    assert_eq!(ports[0]["containerPort"].as_i64(), Some(port));
    let port_name = text(&ports[0]["name"], "port name");
    // The Service selects the Deployment's pods and targets that port.
    assert_eq!(
        svc["spec"]["selector"]["app"],
        dep["spec"]["template"]["metadata"]["labels"]["app"]
    );
    let sp = &list(&svc["spec"]["ports"], "service ports")[0];
    assert_eq!(sp["targetPort"].as_str(), Some(port_name));
    // The admin token comes from the Secret, mounted read-only where --admin-token-file
    // points; the probes ask /healthz, the one route without a token.
    let secret = kind("Secret");
    let token_file = args
        .iter()
        .find_map(|a| a.strip_prefix("--admin-token-file="))
        .expect("--admin-token-file");
    let mounts = list(&c["volumeMounts"], "volumeMounts");
    let mount = mounts
        .iter()
        .find(|m| token_file.starts_with(&format!("{}/", text(&m["mountPath"], "mountPath"))))
        .unwrap_or_else(|| panic!("{token_file} is on no volume mount"));
    assert_eq!(mount["readOnly"].as_bool(), Some(true));
    let key = token_file.rsplit('/').next().unwrap();
    let volumes = list(&dep["spec"]["template"]["spec"]["volumes"], "volumes");
    let vol = volumes
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mount's volume");
    assert_eq!(vol["secret"]["secretName"], secret["metadata"]["name"]);
    assert!(
        !secret["stringData"][key].is_badvalue(),
        "the Secret has no {key}"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"].as_str(), Some("/healthz"));
    }
}
