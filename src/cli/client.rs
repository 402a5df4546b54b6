//! The client of `buffetd`: `buffet tenant add|update|rm|ls|show|apply|token`,
//! `buffet stats`, `buffet workers ls|add|rm`, `buffet events`, `buffet reload`; and of
//! buffet-orchestrator: `buffet servers ls|drain|undrain`.
//!
//! The daemon's address and token come from `--api URL` / `--token T` or the
//! environment variables `BUFFET_API` / `BUFFET_TOKEN`. Output is a human table by
//! default, the daemon's JSON with `--json`. A daemon error is printed as its status and
//! message (and, for a missing or refused token, what to do) and fails the command. `buffet tenant ls` also reads buffet-orchestrator's
//! listing (rows of placements: server, state and the document under `doc`), told apart
//! by its rows' shape, and prints it as placements. HTTP via ureq (blocking, no TLS: put
//! a TLS-terminating proxy in front of a daemon that listens beyond loopback). This module does not
//! validate tenants beyond what `buffet tenant apply` reads from a file: the daemon does.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use buffet_config::tenants::{self, Format};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

/// Where the daemon is and who we are.
#[derive(Args, Debug, Clone)]
pub struct ApiArgs {
    /// The daemon's API, e.g. http://127.0.0.1:7878 (a bare 127.0.0.1:7878 means http).
    #[arg(
        long,
        env = "BUFFET_API",
        default_value = "http://127.0.0.1:7878",
        global = true
    )]
    pub api: String,
    /// Bearer token (the admin token, or a tenant's for reading its own tenant).
    #[arg(long, env = "BUFFET_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Print the daemon's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Who is at `api`, for messages: `buffetd`, or `buffet-orchestrator` for
    /// `buffet servers`.
    #[arg(skip = "buffetd")]
    pub peer: &'static str,
}

/// `buffet tenant ...`.
#[derive(Args, Debug)]
pub struct TenantArgs {
    /// The daemon.
    #[command(flatten)]
    pub api: ApiArgs,
    /// What to do.
    #[command(subcommand)]
    pub action: TenantAction,
}

/// A tenant operation.
#[derive(Subcommand, Debug)]
pub enum TenantAction {
    /// Admit a tenant: a JSON admission document (the tenants-file schema) from
    /// --file, or one built from --id, --name, --rule, --max-nb, --policy.
    Add(TenantSpecArgs),
    /// Change a tenant in place: its whole new document (policy, name, rules, MAX_NB),
    /// which replaces the old one; a field not given is not kept. To change one field,
    /// edit the output of `buffet tenant show ID` and pass it with --file.
    Update(TenantSpecArgs),
    /// Remove a tenant.
    Rm {
        /// Tenant id.
        id: u32,
    },
    /// List tenants.
    Ls,
    /// Show one tenant.
    Show {
        /// Tenant id.
        id: u32,
    },
    /// Make the daemon's tenants match a tenants file (.toml or .json): admit, update
    /// and remove, all or nothing.
    Apply {
        /// The tenants file.
        file: PathBuf,
        /// Only say what would change.
        #[arg(long)]
        dry_run: bool,
    },
    /// Create a token that can read only this tenant (printed once).
    Token {
        /// Tenant id.
        id: u32,
    },
}

/// A tenant given on the command line.
#[derive(Args, Debug)]
pub struct TenantSpecArgs {
    /// A JSON file holding one tenant (`{"id": 7, "rules": [...], "policy": {...}}`);
    /// a tenants file goes to `buffet tenant apply`.
    #[arg(long, conflicts_with_all = ["id", "name", "rule", "max_nb", "policy"])]
    pub file: Option<PathBuf>,
    /// Tenant id.
    #[arg(long, required_unless_present = "file")]
    pub id: Option<u32>,
    /// Name.
    #[arg(long)]
    pub name: Option<String>,
    /// A classifier rule as `field=value,...` (e.g. `dst_ip=10.0.3.0/24,priority=10`);
    /// repeat for more rules.
    #[arg(long)]
    pub rule: Vec<String>,
    /// MAX_NB per timeslot (0 = unlimited; default: the daemon's).
    #[arg(long)]
    pub max_nb: Option<u64>,
    /// The NF policy as JSON.
    #[arg(long)]
    pub policy: Option<String>,
}

/// `buffet stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// The daemon.
    #[command(flatten)]
    pub api: ApiArgs,
    /// Only this tenant (a tenant token reads only its own: it needs --tenant).
    #[arg(long)]
    pub tenant: Option<u32>,
    /// Print again every second until interrupted.
    #[arg(long)]
    pub watch: bool,
}

/// `buffet workers ...`.
#[derive(Args, Debug)]
pub struct WorkersArgs {
    /// The daemon.
    #[command(flatten)]
    pub api: ApiArgs,
    /// What to do.
    #[command(subcommand)]
    pub action: WorkersAction,
}

/// A worker operation.
#[derive(Subcommand, Debug)]
pub enum WorkersAction {
    /// List workers.
    Ls,
    /// Launch a worker.
    Add,
    /// Terminate a worker (its tenants move, its queued packets still run).
    Rm {
        /// Worker id.
        id: u16,
    },
}

/// `buffet servers ...`: the servers of a cluster, from buffet-orchestrator (`--api` is
/// an Orchestrator's address, `--token` its admin token or, for `ls`, its reader token).
#[derive(Args, Debug)]
pub struct ServersArgs {
    /// The Orchestrator.
    #[command(flatten)]
    pub api: ApiArgs,
    /// What to do.
    #[command(subcommand)]
    pub action: ServersAction,
}

/// A cluster server operation.
#[derive(Subcommand, Debug)]
pub enum ServersAction {
    /// List the registered servers: tenants, rate, capacity, overload, drain, and the NFs
    /// they offer to chains.
    Ls,
    /// Drain a server: no tenant is placed on it any more, and its tenants move to
    /// servers that fit them (one that fits nowhere stays, served, until room appears).
    Drain {
        /// Server id.
        id: String,
    },
    /// End a server's drain: it is chosen for tenants again.
    Undrain {
        /// Server id.
        id: String,
    },
}

/// `buffet events`.
#[derive(Args, Debug)]
pub struct EventsArgs {
    /// The daemon.
    #[command(flatten)]
    pub api: ApiArgs,
    /// Accepted for compatibility: `buffet events` always follows the stream.
    #[arg(long, hide = true)]
    pub follow: bool,
}

/// `buffet reload`.
#[derive(Args, Debug)]
pub struct ReloadArgs {
    /// The daemon.
    #[command(flatten)]
    pub api: ApiArgs,
}

/// A request to the daemon that failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon answered with an error.
    #[error("{peer}: {status}: {message}{}", hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default())]
    Status {
        /// Who answered: `buffetd` or `buffet-orchestrator`.
        peer: &'static str,
        /// HTTP status.
        status: u16,
        /// The daemon's message.
        message: String,
        /// What to do about it, when the client can tell.
        hint: Option<String>,
    },
    /// No answer.
    #[error("cannot reach {peer} at {api}: {message}")]
    Transport {
        /// Who was asked: `buffetd` or `buffet-orchestrator`.
        peer: &'static str,
        /// The address.
        api: String,
        /// Why.
        message: String,
    },
}

impl ClientError {
    /// The error with `hint` as what to do, when it is the daemon's `status`.
    fn with_hint(self, status: u16, hint: &str) -> ClientError {
        match self {
            ClientError::Status {
                peer,
                status: s,
                message,
                hint: None,
            } if s == status => ClientError::Status {
                peer,
                status: s,
                message,
                hint: Some(hint.to_owned()),
            },
            other => other,
        }
    }
}

/// How to get a token the daemon takes, after a 401.
const TOKEN_HINT_NONE: &str = "no token given: set BUFFET_TOKEN or pass --token (buffetd \
    writes a generated admin token to <data_dir>/admin.token)";
const TOKEN_HINT_UNKNOWN: &str = "buffetd does not know the token given (BUFFET_TOKEN or \
    --token): the admin token is in <data_dir>/admin.token (or api.admin_token_file, or \
    BUFFETD_ADMIN_TOKEN), a tenant's comes from `buffet tenant token ID`";

impl ApiArgs {
    /// `--api` as a base URL: a bare `host:port` is taken as `http://host:port`.
    fn base(&self) -> String {
        let api = self.api.trim_end_matches('/');
        if api.contains("://") {
            api.to_owned()
        } else {
            format!("http://{api}")
        }
    }

    /// The daemon's error answer as a [`ClientError`], with what to do when the status
    /// says it (a missing or unknown token, a tenant token reading more than its tenant).
    fn status_error(&self, path: &str, status: u16, r: ureq::Response) -> ClientError {
        let text = r.into_string().unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or(text);
        let hint = match status {
            401 | 403 if self.peer != "buffetd" => Some(
                "pass the Orchestrator's admin token (the reader token only lists) with \
                 --token or BUFFET_TOKEN",
            ),
            401 if self.token.is_none() => Some(TOKEN_HINT_NONE),
            401 => Some(TOKEN_HINT_UNKNOWN),
            403 if path == "/v1/stats" => Some(
                "a tenant token reads only its own tenant: pass --tenant ID (the admin token \
                 reads every tenant)",
            ),
            403 => Some(
                "a tenant token only reads its own tenant (`buffet stats --tenant ID`, \
                 `buffet tenant show ID`); everything else needs the admin token",
            ),
            _ => None,
        };
        ClientError::Status {
            peer: self.peer,
            status,
            message,
            hint: hint.map(str::to_owned),
        }
    }

    fn transport_error(&self, e: ureq::Error) -> ClientError {
        ClientError::Transport {
            peer: self.peer,
            api: self.api.clone(),
            message: e.to_string(),
        }
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        self.request_untimed(method, path)
            .timeout(Duration::from_secs(60))
    }

    /// A request with no deadline (the event stream).
    fn request_untimed(&self, method: &str, path: &str) -> ureq::Request {
        let url = format!("{}{path}", self.base());
        let mut r = ureq::request(method, &url);
        if let Some(t) = &self.token {
            r = r.set("Authorization", &format!("Bearer {t}"));
        }
        r
    }

    fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, ClientError> {
        let req = self.request(method, path);
        let res = match body {
            Some(b) => req
                .set("Content-Type", "application/json")
                .send_string(&b.to_string()),
            None => req.call(),
        };
        match res {
            Ok(r) => {
                let text = r.into_string().unwrap_or_default();
                Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
            }
            Err(ureq::Error::Status(status, r)) => Err(self.status_error(path, status, r)),
            Err(e) => Err(self.transport_error(e)),
        }
    }

    fn print(&self, out: &mut dyn Write, v: &Value) -> anyhow::Result<()> {
        writeln!(out, "{}", serde_json::to_string_pretty(v)?)?;
        Ok(())
    }
}

/// Parses `field=value,...` into a rule object (numbers where the schema has numbers).
fn parse_rule(text: &str) -> anyhow::Result<Value> {
    let mut rule = serde_json::Map::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .with_context(|| format!("--rule {text:?}: {part:?} is not field=value"))?;
        let numeric = matches!(k, "priority" | "in_port" | "vlan" | "dscp");
        let value = match v.parse::<u64>() {
            Ok(n) if numeric || matches!(k, "src_port" | "dst_port" | "protocol") => json!(n),
            Err(_) if numeric => {
                anyhow::bail!("--rule {text:?}: {k} is a number, not {v:?}")
            }
            _ => json!(v),
        };
        rule.insert(k.to_owned(), value);
    }
    Ok(Value::Object(rule))
}

impl TenantSpecArgs {
    fn document(&self) -> anyhow::Result<Value> {
        if let Some(f) = &self.file {
            let text = std::fs::read_to_string(f).with_context(|| format!("{}", f.display()))?;
            let tenants_file = "--file takes one tenant as JSON ({\"id\": 7, \"rules\": \
                [...], \"policy\": {...}}); for a tenants file use `buffet tenant apply FILE`";
            let doc: Value = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}: not JSON ({e}); {tenants_file}", f.display()))?;
            if doc.get("tenant").is_some_and(Value::is_array) {
                anyhow::bail!(
                    "{}: a tenants file (a list of tenants); {tenants_file}",
                    f.display()
                );
            }
            return Ok(doc);
        }
        let mut doc = serde_json::Map::new();
        doc.insert("id".into(), json!(self.id));
        if let Some(n) = &self.name {
            doc.insert("name".into(), json!(n));
        }
        let rules = self
            .rule
            .iter()
            .map(|r| parse_rule(r))
            .collect::<anyhow::Result<Vec<_>>>()?;
        doc.insert("rules".into(), Value::Array(rules));
        if let Some(m) = self.max_nb {
            doc.insert("max_nb".into(), json!(m));
        }
        if let Some(p) = &self.policy {
            let v: Value = serde_json::from_str(p).context("--policy is not JSON")?;
            doc.insert("policy".into(), v);
        }
        Ok(Value::Object(doc))
    }
}

/// A tenants file as the JSON the daemon takes (`{"tenant": [...]}`), validated here
/// first with the same code as `buffet replay`, so that a bad file is named before any
/// request.
fn tenants_file_json(file: &std::path::Path) -> anyhow::Result<Value> {
    tenants::load(file)?;
    let text = std::fs::read_to_string(file).with_context(|| format!("{}", file.display()))?;
    Ok(match Format::of_path(file)? {
        Format::Json => serde_json::from_str(&text)?,
        Format::Toml => {
            let v: toml::Value = toml::from_str(&text)?;
            serde_json::to_value(v)?
        }
    })
}

fn rules_text(t: &Value) -> String {
    t["rules"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| {
                    r.as_object()
                        .map(|o| {
                            o.iter()
                                .map(|(k, v)| match v {
                                    Value::String(s) => format!("{k}={s}"),
                                    v => format!("{k}={v}"),
                                })
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default()
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// A JSON value as table text (strings without quotes).
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
}

/// Whether `list` is buffet-orchestrator's tenant listing (each row the tenant's
/// placement: `server`, `state`, and its admission document under `doc`) rather than
/// buffetd's (each row the admission document itself).
fn is_orchestrator_listing(list: &[Value]) -> bool {
    list.iter()
        .any(|t| t.get("doc").is_some_and(Value::is_object) && t.get("state").is_some())
}

/// buffet-orchestrator's tenant listing: where each tenant is placed and in what state
/// (`live`, `pending`, `failed`, `unplaced`, with the reason), and its rules.
fn print_placement_rows(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>8}  {:<20} {:<24} {:<9} {:>12}  rules",
        "id", "name", "server", "state", "expected_pps"
    )?;
    for t in list {
        let state = match t["reason"].as_str() {
            Some(r) => format!("{} ({r})", cell(&t["state"])),
            None => cell(&t["state"]),
        };
        writeln!(
            out,
            "{:>8}  {:<20} {:<24} {:<9} {:>12}  {}",
            cell(&t["id"]),
            t["name"].as_str().unwrap_or(""),
            cell(&t["server"]),
            state,
            cell(&t["expected_pps"]),
            rules_text(&t["doc"])
        )?;
    }
    Ok(())
}

fn print_tenant_rows(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    if is_orchestrator_listing(list) {
        return print_placement_rows(out, list);
    }
    writeln!(out, "{:>8}  {:<20} {:>10}  rules", "id", "name", "max_nb")?;
    for t in list {
        writeln!(
            out,
            "{:>8}  {:<20} {:>10}  {}",
            cell(&t["id"]),
            t["name"].as_str().unwrap_or(""),
            cell(&t["max_nb"]),
            rules_text(t)
        )?;
        // A stored tenant buffetd could not re-admit at start (`not_restored`): said
        // under its row, with why.
        if let Some(state) = t["state"].as_str() {
            writeln!(
                out,
                "{:>8}  not running ({state}): {}",
                "",
                t["reason"].as_str().unwrap_or("")
            )?;
        }
    }
    Ok(())
}

fn print_stats_rows(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>8}  {:<16} {:>6} {:>12} {:>14} {:>12} {:>10} {:>5}",
        "tenant", "name", "worker", "packets", "bytes", "passed", "dropped", "quar"
    )?;
    for t in list {
        let dropped: u64 = t["drops"]
            .as_object()
            .map(|m| m.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
        writeln!(
            out,
            "{:>8}  {:<16} {:>6} {:>12} {:>14} {:>12} {:>10} {:>5}",
            cell(&t["id"]),
            t["name"].as_str().unwrap_or(""),
            cell(&t["worker"]),
            cell(&t["packets"]),
            cell(&t["bytes"]),
            cell(&t["passed"]),
            dropped,
            if t["quarantined"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            }
        )?;
    }
    Ok(())
}

/// Runs `buffet tenant ...`.
pub fn tenant(a: &TenantArgs) -> anyhow::Result<()> {
    let api = &a.api;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match &a.action {
        TenantAction::Add(spec) => {
            let v = api.send("POST", "/v1/tenants", Some(&spec.document()?))?;
            if api.json {
                api.print(&mut out, &v)?;
            } else {
                writeln!(out, "admitted tenant {}", v["id"])?;
            }
        }
        TenantAction::Update(spec) => {
            let doc = spec.document()?;
            let id = doc["id"]
                .as_u64()
                .context("the tenant document has no id")?;
            let v = api
                .send("PUT", &format!("/v1/tenants/{id}"), Some(&doc))
                .map_err(|e| match &spec.file {
                    Some(_) => e,
                    None => e.with_hint(422, &update_hint(id)),
                })?;
            if api.json {
                api.print(&mut out, &v)?;
            } else {
                writeln!(out, "updated tenant {id}")?;
            }
        }
        TenantAction::Rm { id } => {
            api.send("DELETE", &format!("/v1/tenants/{id}"), None)?;
            if !api.json {
                writeln!(out, "removed tenant {id}")?;
            }
        }
        TenantAction::Ls => {
            let v = api.send("GET", "/v1/tenants", None)?;
            if api.json {
                api.print(&mut out, &v)?;
            } else {
                print_tenant_rows(&mut out, v["tenant"].as_array().map_or(&[], |a| a))?;
            }
        }
        TenantAction::Show { id } => {
            let v = api.send("GET", &format!("/v1/tenants/{id}"), None)?;
            api.print(&mut out, &v)?;
        }
        TenantAction::Apply { file, dry_run } => {
            let body = tenants_file_json(file)?;
            let path = if *dry_run {
                "/v1/tenants?dry_run=true"
            } else {
                "/v1/tenants"
            };
            let v = api.send("PUT", path, Some(&body))?;
            if api.json {
                api.print(&mut out, &v)?;
            } else {
                let verb = if *dry_run { "would be " } else { "" };
                for k in ["added", "updated", "removed", "unchanged"] {
                    writeln!(out, "{verb}{k}: {}", v[k])?;
                }
            }
        }
        TenantAction::Token { id } => {
            let v = api.send("POST", &format!("/v1/tenants/{id}/tokens"), None)?;
            if api.json {
                api.print(&mut out, &v)?;
            } else {
                writeln!(out, "{}", v["token"].as_str().unwrap_or_default())?;
            }
        }
    }
    Ok(())
}

/// What to do after buffetd refused an update built from flags: the document replaces
/// the tenant's whole one, so what was not given is gone from it.
fn update_hint(id: u64) -> String {
    format!(
        "`buffet tenant update` sends the tenant's whole new document, which replaces the \
         old one (fields not given are not kept): give every field the tenant keeps \
         (--rule, --policy, --name, --max-nb), or save `buffet tenant show {id}`, edit it \
         and pass it with --file"
    )
}

/// Runs `buffet stats`.
pub fn stats(a: &StatsArgs) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    loop {
        let mut out = stdout.lock();
        let rows = match a.tenant {
            Some(id) => {
                let v = a
                    .api
                    .send("GET", &format!("/v1/tenants/{id}/stats"), None)?;
                if a.api.json {
                    a.api.print(&mut out, &v)?;
                }
                vec![v]
            }
            None => {
                let v = a.api.send("GET", "/v1/stats", None)?;
                if a.api.json {
                    a.api.print(&mut out, &v)?;
                }
                v["tenants"].as_array().cloned().unwrap_or_default()
            }
        };
        if !a.api.json {
            print_stats_rows(&mut out, &rows)?;
        }
        out.flush()?;
        if !a.watch {
            return Ok(());
        }
        drop(out);
        std::thread::sleep(Duration::from_secs(1));
        if !a.api.json {
            println!();
        }
    }
}

/// Refuses what is not a server id before it goes into a URL (`../tenants/7?` would
/// name another route).
fn server_id(id: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        buffet_orchestrator::schema::valid_server_id(id),
        "{id:?} is not a server id (1 to 64 of [A-Za-z0-9._-], not . or ..)"
    );
    Ok(())
}

/// `buffet servers ls|drain|undrain`, against buffet-orchestrator.
pub fn servers(a: &ServersArgs) -> anyhow::Result<()> {
    let api = &ApiArgs {
        peer: "buffet-orchestrator",
        ..a.api.clone()
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match &a.action {
        ServersAction::Ls => {
            let v = api.send("GET", "/v1/servers", None)?;
            if api.json {
                return api.print(&mut out, &v);
            }
            writeln!(
                out,
                "{:<16} {:>7} {:>12} {:>12} {:<9} {:<10} offered",
                "server", "tenants", "pps", "capacity", "state", "api"
            )?;
            for l in v["servers"].as_array().map_or(&[][..], |a| a) {
                let state = if l["draining"] == json!(true) {
                    "draining"
                } else if !l["overloaded"].is_null() {
                    "overload"
                } else {
                    "ok"
                };
                let offered = match l["offered"].as_array() {
                    None => "-".to_owned(),
                    Some(o) if o.is_empty() => "(one NF, no chains)".to_owned(),
                    Some(o) => o.iter().map(cell).collect::<Vec<_>>().join(","),
                };
                let pps = l["pps"].as_f64().map_or("-".into(), |p| format!("{p:.0}"));
                let capacity = l["capacity_pps"]
                    .as_f64()
                    .map_or("unlimited".into(), |c| format!("{c:.0}"));
                writeln!(
                    out,
                    "{:<16} {:>7} {:>12} {:>12} {:<9} {:<10} {offered}",
                    cell(&l["server"]),
                    cell(&l["tenants"]),
                    pps,
                    capacity,
                    state,
                    cell(&l["api"]),
                )?;
            }
        }
        ServersAction::Drain { id } => {
            server_id(id)?;
            let v = api.send("POST", &format!("/v1/servers/{id}/drain"), None)?;
            if api.json {
                api.print(&mut out, &v)?;
            } else {
                writeln!(
                    out,
                    "draining {id}: {} tenants still placed on it (`buffet servers ls` and \
                     `buffet tenant ls` show them leave)",
                    cell(&v["tenants_left"])
                )?;
            }
        }
        ServersAction::Undrain { id } => {
            server_id(id)?;
            api.send("DELETE", &format!("/v1/servers/{id}/drain"), None)?;
            if !api.json {
                writeln!(out, "{id} is no longer drained")?;
            }
        }
    }
    Ok(())
}

/// Runs `buffet workers ...`.
pub fn workers(a: &WorkersArgs) -> anyhow::Result<()> {
    let api = &a.api;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match a.action {
        WorkersAction::Ls => {
            let v = api.send("GET", "/v1/workers", None)?;
            if api.json {
                return api.print(&mut out, &v);
            }
            writeln!(
                out,
                "{:>6} {:>5} {:>14} {:>14}",
                "worker", "live", "packets", "busy_cycles"
            )?;
            for w in v["workers"].as_array().map_or(&[][..], |a| a) {
                writeln!(
                    out,
                    "{:>6} {:>5} {:>14} {:>14}",
                    cell(&w["id"]),
                    cell(&w["live"]),
                    cell(&w["packets"]),
                    cell(&w["busy_cycles"])
                )?;
            }
        }
        WorkersAction::Add => {
            let v = api.send("POST", "/v1/workers", None)?;
            if api.json {
                api.print(&mut out, &v)?;
            } else {
                writeln!(out, "launched worker {}", v["id"])?;
            }
        }
        WorkersAction::Rm { id } => {
            api.send("DELETE", &format!("/v1/workers/{id}"), None)?;
            if !api.json {
                writeln!(out, "terminated worker {id}")?;
            }
        }
    }
    Ok(())
}

/// Runs `buffet reload`: the daemon reads its config again and applies, all or nothing,
/// what may change while running; prints the fields that changed.
pub fn reload(a: &ReloadArgs) -> anyhow::Result<()> {
    let api = &a.api;
    let v = api.send("POST", "/v1/reload", None)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if api.json {
        return api.print(&mut out, &v);
    }
    let changed: Vec<&str> = v["changed"]
        .as_array()
        .map_or(&[][..], |a| a)
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if changed.is_empty() {
        writeln!(out, "config reloaded: nothing changed")?;
    } else {
        writeln!(out, "config reloaded: {}", changed.join(", "))?;
    }
    Ok(())
}

/// Runs `buffet events`: prints each server-sent event as it comes (one JSON object per
/// line with `--json`) until the daemon ends the stream.
pub fn events(a: &EventsArgs) -> anyhow::Result<()> {
    let path = "/v1/events";
    let resp = match a.api.request_untimed("GET", path).call() {
        Ok(r) => r,
        Err(ureq::Error::Status(status, r)) => {
            return Err(a.api.status_error(path, status, r).into())
        }
        Err(e) => return Err(a.api.transport_error(e).into()),
    };
    let reader = BufReader::new(resp.into_reader());
    let stdout = std::io::stdout();
    let mut kind = String::new();
    for line in reader.lines() {
        let line = line?;
        if let Some(k) = line.strip_prefix("event:") {
            kind = k.trim().to_owned();
        } else if let Some(d) = line.strip_prefix("data:") {
            let mut out = stdout.lock();
            if a.api.json {
                writeln!(out, "{}", d.trim())?;
            } else {
                writeln!(out, "{kind:<18} {}", d.trim())?;
            }
            out.flush()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_from_the_command_line() {
        assert_eq!(
            parse_rule("dst_ip=10.0.3.0/24,priority=10,protocol=udp,dst_port=53").unwrap(),
            json!({ "dst_ip": "10.0.3.0/24", "priority": 10, "protocol": "udp", "dst_port": 53 })
        );
        assert_eq!(
            parse_rule("dst_port=5000-5099").unwrap(),
            json!({ "dst_port": "5000-5099" })
        );
        assert!(parse_rule("dst_ip").is_err());
        let e = parse_rule("dst_ip=10.0.3.0/24,priority=abc")
            .unwrap_err()
            .to_string();
        assert!(e.contains("priority is a number, not \"abc\""), "{e}");
    }

    #[test]
    fn tenant_ls_reads_the_orchestrators_listing_and_buffetds() {
        // buffet-orchestrator's GET /v1/tenants rows (api.rs `view`): placement and state,
        // the admission document under `doc`.
        let orchestrator = json!({ "tenant": [
            { "id": 1, "name": "acme", "server": "edge-1", "state": "live", "reason": null,
              "expected_pps": 1000.0,
              "doc": { "id": 1, "name": "acme", "max_nb": 64,
                       "rules": [ { "dst_ip": "10.1.0.0/16" } ] } },
            { "id": 2, "name": null, "server": null, "state": "unplaced",
              "reason": "no server has room", "expected_pps": 5e6,
              "doc": { "id": 2, "rules": [ { "vlan": 7 } ] } },
        ] });
        let mut out = Vec::new();
        print_tenant_rows(&mut out, orchestrator["tenant"].as_array().unwrap()).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        for want in ["id", "name", "server", "state", "expected_pps", "rules"] {
            assert!(lines[0].contains(want), "{text}");
        }
        let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            words(lines[1]),
            [
                "1",
                "acme",
                "edge-1",
                "live",
                "1000.0",
                "dst_ip=10.1.0.0/16"
            ],
            "{text}"
        );
        assert_eq!(
            words(lines[2]),
            [
                "2",
                "-",
                "unplaced",
                "(no",
                "server",
                "has",
                "room)",
                "5000000.0",
                "vlan=7"
            ],
            "{text}"
        );
        // buffetd's rows are the documents themselves: the usual columns; a stored tenant
        // not running has its state and reason on the line under its row.
        let daemon = [
            json!({ "id": 3, "name": "b", "max_nb": 32, "rules": [ { "vlan": 9 } ] }),
            json!({ "id": 4, "name": "c", "max_nb": 32, "rules": [ { "vlan": 10 } ],
                    "state": "not_restored", "reason": "isolation: asks for mpk" }),
        ];
        let mut out = Vec::new();
        print_tenant_rows(&mut out, &daemon).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(&format!(
                "{:>8}  {:<20} {:>10}  rules",
                "id", "name", "max_nb"
            )),
            "{text}"
        );
        assert_eq!(
            words(text.lines().nth(1).unwrap()),
            ["3", "b", "32", "vlan=9"]
        );
        assert_eq!(
            words(text.lines().nth(2).unwrap()),
            ["4", "c", "32", "vlan=10"]
        );
        assert_eq!(
            text.lines().nth(3).unwrap().trim(),
            "not running (not_restored): isolation: asks for mpk"
        );
        assert_eq!(text.lines().count(), 4, "{text}");
    }
}
