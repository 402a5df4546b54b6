//! buffetd's configuration file (`buffet.toml`): the ports, the NF and its isolation
//! level, the data plane's shape (workers, timeslot, MAX_NB), the API's address and
//! limits, the data directory and where the admin token comes from.
//!
//! Every table rejects unknown fields. [`DaemonConfig::load`] parses and validates; the
//! first problem is one [`ConfigError`] naming the file and the field. This module reads
//! files only: it starts nothing and reads no token (see [`crate::auth`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use buffet_config::isolation::Isolation;
use buffet_config::registry::{with_registered_names, EbpfEngine, NfSpec};
use serde::Deserialize;

/// `:LINE:COLUMN` after the file's name, or nothing when the place is unknown.
fn at(location: &Option<(usize, usize)>) -> String {
    location.map_or_else(String::new, |(l, c)| format!(":{l}:{c}"))
}

/// Line and column (from 1; the column in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not TOML, an unknown field, or a value of the wrong type: one line,
    /// `FILE:LINE:COLUMN: message`, the place being where the parser stopped (the
    /// unknown key, the bad value).
    #[error("{}{}: {message}", path.display(), at(.location))]
    Syntax {
        /// The file.
        path: PathBuf,
        /// Line and column (from 1) of the problem, when the parser gives one.
        location: Option<(usize, usize)>,
        /// The parser's message, without its snippet of the file.
        message: String,
    },
    /// A field's value is out of range or contradicts another.
    #[error("{}: {field}: {message}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// The field, e.g. `dataplane.workers` or `port[1].path`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Where the store (`buffetd.redb`) and a generated admin token live.
    pub data_dir: PathBuf,
    /// The control API.
    #[serde(default)]
    pub api: ApiConfig,
    /// The NF every tenant runs.
    pub nf: NfConfig,
    /// Workers, timeslot, capacity.
    #[serde(default)]
    pub dataplane: DataplaneConfig,
    /// The Agent's reaction to overload reports.
    #[serde(default)]
    pub agent: AgentConfig,
    /// Where traffic comes from; port `i` of the data plane is `port[i]`.
    #[serde(default, rename = "port")]
    pub ports: Vec<PortConfig>,
    /// Agent mode: one server of a cluster placed through etcd (docs/cluster.md);
    /// absent, a single server that never touches etcd.
    #[serde(default)]
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// Where the Packet Dispatcher runs (software thread, or the XDP program).
    #[serde(default)]
    pub dispatch: DispatchConfig,
}

/// `[api]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// Address the HTTP API listens on (`--listen` overrides it).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// A file holding the admin bearer token (first line). Without it, the environment
    /// variable `BUFFETD_ADMIN_TOKEN`; without that, a token generated into
    /// `<data_dir>/admin.token`.
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
    /// Largest request body, in bytes.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// A request (body included) that takes longer than this is answered 408.
    #[serde(default = "default_timeout_ms")]
    pub request_timeout_ms: u64,
    /// A connection whose request head (request line and headers) is not complete
    /// within this is closed: a client trickling its headers holds a connection no
    /// longer. Also how long an idle keep-alive connection stays open.
    #[serde(default = "default_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// Most connections open at once; further clients wait in the listen backlog.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: default_listen(),
            admin_token_file: None,
            max_body_bytes: default_max_body(),
            request_timeout_ms: default_timeout_ms(),
            header_read_timeout_ms: default_timeout_ms(),
            max_connections: default_max_connections(),
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7878))
}

fn default_max_body() -> usize {
    1 << 20
}

fn default_timeout_ms() -> u64 {
    10_000
}

fn default_max_connections() -> usize {
    256
}

/// `[nf]`: exactly one of `name`, `nf_lib`, `nf_ebpf`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfConfig {
    /// A reference NF (`monitor`, `firewall`, ...).
    #[serde(default)]
    pub name: Option<String>,
    /// A C NF: a shared object implementing include/buffet.h.
    #[serde(default)]
    pub nf_lib: Option<PathBuf>,
    /// An eBPF NF: a `clang -target bpf` object.
    #[serde(default)]
    pub nf_ebpf: Option<PathBuf>,
    /// How an eBPF NF runs.
    #[serde(default)]
    pub ebpf_engine: EbpfEngine,
    /// The isolation level; default: `safe` for a reference NF, `mpk` for a C NF,
    /// `ebpf` for an eBPF NF.
    #[serde(default)]
    pub isolation: Option<Isolation>,
    /// The NFs a tenant's own chain may name as stages (`"firewall"`, `"c:x.so"`,
    /// `"ebpf:x.o"`, or the name of an NF the program embedding the daemon registered,
    /// read with [`DaemonConfig::load_registered`]), loaded at start. Empty (the default): no chains, every tenant runs
    /// this table's NF. Not empty: the data plane runs a chain per tenant, and this
    /// table's NF is the one-stage chain of a tenant that names none (docs/chains.md).
    #[serde(default)]
    pub offered: Vec<String>,
}

impl NfConfig {
    /// The NF this table names.
    pub fn spec(&self) -> Result<NfSpec, String> {
        match (&self.name, &self.nf_lib, &self.nf_ebpf) {
            (Some(n), None, None) => n
                .parse()
                .map(NfSpec::Reference)
                .map_err(|e: buffet_config::RegistryError| e.to_string()),
            (None, Some(lib), None) => Ok(NfSpec::C(lib.clone())),
            (None, None, Some(obj)) => Ok(NfSpec::Ebpf {
                path: obj.clone(),
                engine: self.ebpf_engine,
            }),
            _ => Err("give exactly one of name, nf_lib, nf_ebpf".into()),
        }
    }

    /// The NFs of `offered`, each once; the error names the entry (`nf.offered[1]`).
    pub fn offered_specs(&self) -> Result<Vec<NfSpec>, (String, String)> {
        let mut out: Vec<NfSpec> = Vec::new();
        for (i, text) in self.offered.iter().enumerate() {
            let field = format!("nf.offered[{i}]");
            let spec: NfSpec = text
                .parse()
                .map_err(|e: buffet_config::RegistryError| (field.clone(), e.to_string()))?;
            if out.contains(&spec) {
                return Err((field, format!("{text:?} is offered twice")));
            }
            out.push(spec);
        }
        if out.len() > 64 {
            return Err(("nf.offered".into(), "at most 64 NFs".into()));
        }
        Ok(out)
    }
}

/// `[dataplane]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataplaneConfig {
    /// Workers launched at start.
    #[serde(default = "default_workers")]
    pub workers: u16,
    /// Most workers the Agent (or the API) may have live at once.
    #[serde(default = "default_max_workers")]
    pub max_workers: u16,
    /// Each worker's MAX_NB per timeslot (0 = unlimited: never overloaded).
    #[serde(default)]
    pub worker_max_nb: u64,
    /// MAX_NB of a tenant whose admission gives none (0 = unlimited).
    #[serde(default)]
    pub default_tenant_max_nb: u64,
    /// Timeslot = timestamp_ns >> shift (30 ≈ 1.07 s).
    #[serde(default = "default_shift")]
    pub shift: u32,
    /// Overload reports once a worker's TIMES exceeds this.
    #[serde(default = "default_threshold")]
    pub threshold: u32,
    /// Who moves tenants off overloaded workers: "greedy" (the paper's Algorithm 1, per
    /// packet; the default) or "ours" (a plan at every timeslot boundary,
    /// docs/scheduler.md).
    #[serde(default = "default_planner")]
    pub planner: String,
    /// Tenant Table slots: the most tenants admitted at once.
    #[serde(default = "default_tenant_slots")]
    pub tenant_slots: u32,
    /// Address space of the Memory Manager's arena, MiB.
    #[serde(default = "default_arena_mib")]
    pub arena_mib: u64,
    /// Pin worker `i` to core `i`.
    #[serde(default)]
    pub pin: bool,
    /// Idle threads: after 200 µs without a frame, the data plane and the workers block
    /// (on their sockets and on each other's notices: a frame, a command or an API
    /// request wakes them at once) and look again at least this often, µs (a
    /// backstop); 0 = never block (they poll, napping 20-50 µs between polls).
    #[serde(default = "default_idle_wait_us")]
    pub idle_wait_us: u64,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        DataplaneConfig {
            workers: default_workers(),
            max_workers: default_max_workers(),
            worker_max_nb: 0,
            default_tenant_max_nb: 0,
            shift: default_shift(),
            threshold: default_threshold(),
            planner: default_planner(),
            tenant_slots: default_tenant_slots(),
            arena_mib: default_arena_mib(),
            pin: false,
            idle_wait_us: default_idle_wait_us(),
        }
    }
}

fn default_workers() -> u16 {
    2
}
fn default_max_workers() -> u16 {
    8
}
fn default_shift() -> u32 {
    30
}
fn default_threshold() -> u32 {
    3
}
fn default_planner() -> String {
    "greedy".into()
}
fn default_tenant_slots() -> u32 {
    1024
}
fn default_arena_mib() -> u64 {
    1024
}
fn default_idle_wait_us() -> u64 {
    buffet_worker::DEFAULT_IDLE_WAIT.as_micros() as u64
}

/// `[agent]`: what an overload report from the scheduler does.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Launch a worker when one is reported overloaded and fewer than
    /// `dataplane.max_workers` are live; when none can be launched, refuse new tenants
    /// (503 with the reason) until the operator launches or removes capacity.
    #[serde(default = "yes")]
    pub launch_on_overload: bool,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            launch_on_overload: true,
        }
    }
}

fn yes() -> bool {
    true
}

/// One `[[port]]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PortConfig {
    /// The seeded synthetic generator, paced to the wall clock (no root, no NIC).
    Generator(GeneratorPort),
    /// A pcap file, replayed once at its own pace (then the port is idle).
    Pcap(PcapPort),
    /// A live interface through an AF_PACKET socket (CAP_NET_RAW): frames received
    /// there are processed, passed frames sent back out of it.
    #[serde(rename = "af_packet")]
    AfPacket(AfPacketPortConfig),
    /// Live interface queues through AF_XDP sockets (one per queue, one UMEM) and their
    /// redirect program (CAP_NET_ADMIN, CAP_BPF, CAP_NET_RAW); passed frames go back
    /// out of the first queue.
    #[serde(rename = "af_xdp")]
    AfXdp(AfXdpPortConfig),
    /// A DPDK ethdev, as `buffet run --port dpdk` opens it (root; a buffetd built with
    /// the cargo feature `io-dpdk`, which validation checks); passed frames go back out
    /// of it. One per process: DPDK's EAL starts once.
    #[serde(rename = "dpdk")]
    Dpdk(DpdkPortConfig),
}

/// `kind = "dpdk"`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpdkPortConfig {
    /// The kernel interface behind DPDK's `net_af_packet` vdev (`buffet run --iface`),
    /// unless `eal` chooses devices itself.
    pub iface: String,
    /// More EAL arguments after those derived from `iface`, each split at whitespace
    /// (`buffet run --eal`): `["--no-huge -l 0"]`, or `["-a 0000:3b:00.0"]` for a NIC
    /// bound to a DPDK driver instead of the vdev.
    #[serde(default)]
    pub eal: Vec<String>,
    /// Put the device in promiscuous mode.
    #[serde(default)]
    pub promisc: bool,
}

impl DpdkPortConfig {
    /// `eal` split at whitespace, as `buffet run --eal` splits its values.
    pub fn eal_args(&self) -> Vec<String> {
        self.eal
            .iter()
            .flat_map(|s| s.split_whitespace().map(str::to_owned))
            .collect()
    }
}

/// `kind = "af_packet"`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AfPacketPortConfig {
    /// The interface (`eth0`).
    pub iface: String,
    /// Put it in promiscuous mode while the port is open.
    #[serde(default)]
    pub promisc: bool,
}

/// `kind = "af_xdp"`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AfXdpPortConfig {
    /// The interface.
    pub iface: String,
    /// The queue passed frames are sent on (and, without `queues`, the one queue read):
    /// 0, or the first of `queues`.
    #[serde(default)]
    pub queue: Option<u32>,
    /// The receive queues, one socket each over one UMEM, read round robin (`[0, 1, 2,
    /// 3]`; with `dispatch.mode = "xdp"`, one socket per queue and worker); `queue` must
    /// be among them. Absent: `queue` alone.
    #[serde(default)]
    pub queues: Option<Vec<u32>>,
    /// Where the redirect program attaches: `auto` (native, else generic), `native`,
    /// `generic`.
    #[serde(default = "default_xdp_mode")]
    pub xdp_mode: String,
}

/// Why `name` cannot be an interface name (Linux: 1 to 15 bytes, no `/`, no blank).
fn iface_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > 15 {
        return Some(format!("{name:?} is not an interface name (1 to 15 bytes)"));
    }
    if name.contains('/') || name.contains(char::is_whitespace) || name == "." || name == ".." {
        return Some(format!("{name:?} is not an interface name"));
    }
    None
}

fn default_xdp_mode() -> String {
    "auto".into()
}

impl AfXdpPortConfig {
    /// The queue passed frames are sent on.
    pub fn tx_queue(&self) -> u32 {
        self.queue
            .or_else(|| self.queues.as_ref().and_then(|q| q.first().copied()))
            .unwrap_or(0)
    }
}

/// `kind = "generator"`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorPort {
    /// Tenants of the address plan: tenant `i` (0-based) sends to `10.(i/256).(i%256).0/24`.
    pub tenants: u32,
    /// Aggregate mean rate, packets per second of wall-clock time.
    pub rate_pps: f64,
    /// Seed of the traffic model.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// A tenant's peak rate relative to its mean (1 = constant).
    #[serde(default = "default_peak")]
    pub peak_factor: f64,
    /// Mean concurrent flows per tenant.
    #[serde(default = "default_flows")]
    pub flows_per_tenant: u32,
}

fn default_seed() -> u64 {
    1
}
fn default_peak() -> f64 {
    4.0
}
fn default_flows() -> u32 {
    16
}

/// `kind = "pcap"`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcapPort {
    /// The capture (Ethernet link type).
    pub path: PathBuf,
}

impl DaemonConfig {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<DaemonConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// [`load`](Self::load) for a program that embeds the daemon and registered its own
    /// NFs under `registered` (`RegisteredStages::registered_names`): `nf.offered` may
    /// name them too. Any other name is still an unknown NF, named as `nf.offered[i]`.
    pub fn load_registered(
        path: &Path,
        registered: &[String],
    ) -> Result<DaemonConfig, ConfigError> {
        with_registered_names(registered, || Self::load(path))
    }

    /// [`parse`](Self::parse) with `registered` NF names, as
    /// [`load_registered`](Self::load_registered).
    pub fn parse_registered(
        path: &Path,
        text: &str,
        registered: &[String],
    ) -> Result<DaemonConfig, ConfigError> {
        with_registered_names(registered, || Self::parse(path, text))
    }

    /// Parses and validates `text` (`path` only names it in errors).
    pub fn parse(path: &Path, text: &str) -> Result<DaemonConfig, ConfigError> {
        let cfg: DaemonConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            location: e.span().map(|span| line_column(text, span.start)),
            // toml's Display adds a multi-line snippet; its message alone is one line
            // (made sure of: stderr and the reload's 422 get one line each).
            message: e.message().trim().replace('\n', "; "),
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// The interfaces whose frames reach the data plane through XDP: those of the
    /// `af_xdp` ports (with `dispatch.mode = "xdp"`, the one the XDP Packet Dispatcher
    /// runs on), in config order. An XDP program and an AF_XDP socket see a frame
    /// without the 802.1Q tag the NIC or its driver took out on receive (VLAN offload),
    /// so a tenant's `vlan` rule may match none of their frames.
    pub fn xdp_ifaces(&self) -> Vec<String> {
        let mut ifaces: Vec<String> = Vec::new();
        for p in &self.ports {
            if let PortConfig::AfXdp(x) = p {
                if !ifaces.contains(&x.iface) {
                    ifaces.push(x.iface.clone());
                }
            }
        }
        ifaces
    }

    /// Checks ranges and combinations; the error names the field.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: &str, message: String| {
            Err(ConfigError::Field {
                path: path.to_owned(),
                field: field.to_owned(),
                message,
            })
        };
        if let Err(e) = self.nf.spec() {
            return bad("nf", e);
        }
        if let Err((field, e)) = self.nf.offered_specs() {
            return bad(&field, e);
        }
        let d = &self.dataplane;
        if d.workers == 0 || d.workers > 256 {
            return bad(
                "dataplane.workers",
                format!("must be 1..=256, got {}", d.workers),
            );
        }
        if d.max_workers < d.workers || d.max_workers > 256 {
            return bad(
                "dataplane.max_workers",
                format!(
                    "must be between dataplane.workers ({}) and 256, got {}",
                    d.workers, d.max_workers
                ),
            );
        }
        if d.shift >= 64 {
            return bad(
                "dataplane.shift",
                format!("must be below 64, got {}", d.shift),
            );
        }
        if let Err(e) = d.planner.parse::<buffet_dispatch::Planner>() {
            return bad("dataplane.planner", e);
        }
        if d.tenant_slots == 0 || d.tenant_slots > 1 << 20 {
            return bad(
                "dataplane.tenant_slots",
                format!("must be 1..=1048576, got {}", d.tenant_slots),
            );
        }
        if d.arena_mib == 0 || d.arena_mib > 1 << 24 {
            return bad(
                "dataplane.arena_mib",
                format!("must be 1..=16777216, got {}", d.arena_mib),
            );
        }
        if d.idle_wait_us > 1_000_000 {
            return bad(
                "dataplane.idle_wait_us",
                format!("must be 0..=1000000, got {}", d.idle_wait_us),
            );
        }
        if self.api.max_body_bytes < 1024 {
            return bad(
                "api.max_body_bytes",
                format!("must be at least 1024, got {}", self.api.max_body_bytes),
            );
        }
        if self.api.request_timeout_ms == 0 {
            return bad("api.request_timeout_ms", "must be at least 1".into());
        }
        if self.api.header_read_timeout_ms == 0 {
            return bad("api.header_read_timeout_ms", "must be at least 1".into());
        }
        if self.api.max_connections == 0 || self.api.max_connections > 1 << 20 {
            return bad(
                "api.max_connections",
                format!("must be 1..=1048576, got {}", self.api.max_connections),
            );
        }
        if let Err((field, message)) = self.dispatch.check(self) {
            return bad(&field, message);
        }
        if let Some(Err((field, message))) = self.cluster.as_ref().map(|c| c.check()) {
            return bad(&format!("cluster.{field}"), message);
        }
        for (i, p) in self.ports.iter().enumerate() {
            match p {
                PortConfig::Generator(g) => {
                    if g.tenants == 0 || g.tenants > buffet_io::gen::MAX_TENANTS {
                        return bad(
                            &format!("port[{i}].tenants"),
                            format!(
                                "must be 1..={}, got {}",
                                buffet_io::gen::MAX_TENANTS,
                                g.tenants
                            ),
                        );
                    }
                    if !(g.rate_pps.is_finite() && g.rate_pps > 0.0 && g.rate_pps <= 1e8) {
                        return bad(
                            &format!("port[{i}].rate_pps"),
                            format!("must be > 0 and <= 1e8, got {}", g.rate_pps),
                        );
                    }
                    let check = buffet_io::gen::GenConfig {
                        tenants: g.tenants,
                        mean_rate_pps: g.rate_pps,
                        peak_factor: g.peak_factor,
                        flows_per_tenant: g.flows_per_tenant,
                        seed: g.seed,
                        ..buffet_io::gen::GenConfig::default()
                    };
                    if let Err(buffet_io::gen::GenError::InvalidConfig { field, reason }) =
                        check.validate()
                    {
                        return bad(&format!("port[{i}].{field}"), reason);
                    }
                }
                PortConfig::Pcap(p) => {
                    if !p.path.is_file() {
                        return bad(
                            &format!("port[{i}].path"),
                            format!("{} is not a readable file", p.path.display()),
                        );
                    }
                }
                PortConfig::AfPacket(AfPacketPortConfig { iface, .. }) => {
                    if let Some(why) = iface_problem(iface) {
                        return bad(&format!("port[{i}].iface"), why);
                    }
                }
                PortConfig::AfXdp(x) => {
                    if let Some(why) = iface_problem(&x.iface) {
                        return bad(&format!("port[{i}].iface"), why);
                    }
                    if let Some(qs) = &x.queues {
                        let field = format!("port[{i}].queues");
                        if qs.is_empty() {
                            return bad(&field, "must name at least one queue".into());
                        }
                        if let Some(q) = qs
                            .iter()
                            .enumerate()
                            .find_map(|(k, q)| qs[..k].contains(q).then_some(q))
                        {
                            return bad(&field, format!("queue {q} is named twice"));
                        }
                        if !qs.contains(&x.tx_queue()) {
                            return bad(
                                &format!("port[{i}].queue"),
                                format!(
                                    "{} is not among port[{i}].queues {qs:?} (passed frames \
                                     leave through one of the queues read)",
                                    x.tx_queue()
                                ),
                            );
                        }
                    }
                    if !["auto", "native", "generic"].contains(&x.xdp_mode.as_str()) {
                        return bad(
                            &format!("port[{i}].xdp_mode"),
                            format!(
                                "must be \"auto\", \"native\" or \"generic\", got {:?}",
                                x.xdp_mode
                            ),
                        );
                    }
                }
                PortConfig::Dpdk(d) => {
                    if !cfg!(feature = "io-dpdk") {
                        return bad(
                            &format!("port[{i}].kind"),
                            "\"dpdk\": this buffetd was built without the io-dpdk feature; \
                             build it with `cargo build --release --features io-dpdk` \
                             (needs Debian's dpdk-dev 22.11, see docs/ports.md)"
                                .into(),
                        );
                    }
                    if let Some(why) = iface_problem(&d.iface) {
                        return bad(&format!("port[{i}].iface"), why);
                    }
                    let first = self
                        .ports
                        .iter()
                        .position(|p| matches!(p, PortConfig::Dpdk(_)));
                    if let Some(j) = first.filter(|&j| j < i) {
                        return bad(
                            &format!("port[{i}].kind"),
                            format!(
                                "\"dpdk\" again: port[{j}] is DPDK already, and DPDK's EAL \
                                 starts once per process (one DPDK port per buffetd)"
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// `[dispatch]`: where the Packet Dispatcher runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchConfig {
    /// `software` (the default: a dispatcher thread reads the ports and feeds the
    /// workers) or `xdp` (the XDP Packet Dispatcher classifies, schedules and tags in the
    /// NIC path and redirects each frame to its worker's own AF_XDP socket).
    #[serde(default)]
    pub mode: DispatchMode,
}

/// `dispatch.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DispatchMode {
    /// A dispatcher thread in the data plane.
    #[default]
    Software,
    /// The XDP program (nic-firmware/xdp/dispatcher.bpf.c) on the one `af_xdp` port.
    Xdp,
}

impl DispatchConfig {
    /// Whether the XDP Packet Dispatcher runs.
    pub fn is_xdp(&self) -> bool {
        self.mode == DispatchMode::Xdp
    }

    /// The combinations `dispatch.mode = "xdp"` needs: exactly one port, of kind
    /// `af_xdp` (its `queue`, or each of its `queues`, is where every worker has a
    /// socket, each queue below the program's [`buffet_xdp::MAX_QUEUES`]; its `xdp_mode`
    /// where the program attaches, `auto` meaning generic); the Greedy planner (the program runs
    /// Algorithm 1 only); a Worker Table and Tenant Table the program's maps hold. The
    /// error is (field, message).
    pub fn check(&self, cfg: &DaemonConfig) -> Result<(), (String, String)> {
        if !self.is_xdp() {
            return Ok(());
        }
        match cfg.ports.as_slice() {
            [PortConfig::AfXdp(x)] => {
                let (field, queues) = match &x.queues {
                    Some(q) => ("port[0].queues", q.clone()),
                    None => ("port[0].queue", vec![x.tx_queue()]),
                };
                if let Err(e) = buffet_xdp::check_queues(&queues) {
                    return Err((field.into(), format!("dispatch.mode = \"xdp\": {e}")));
                }
            }
            [] => {
                return Err((
                    "dispatch.mode".into(),
                    "\"xdp\" needs one [[port]] of kind \"af_xdp\", the interface the \
                     program attaches to; there is none"
                        .into(),
                ))
            }
            [other] => {
                return Err((
                    "port[0].kind".into(),
                    format!(
                        "dispatch.mode = \"xdp\" needs kind \"af_xdp\" (the program feeds \
                         AF_XDP sockets), got \"{}\"",
                        port_kind(other)
                    ),
                ))
            }
            more => {
                return Err((
                    "port".into(),
                    format!(
                        "dispatch.mode = \"xdp\" serves exactly one af_xdp port, got {}",
                        more.len()
                    ),
                ))
            }
        }
        let d = &cfg.dataplane;
        if d.planner != "greedy" {
            return Err((
                "dataplane.planner".into(),
                format!(
                    "dispatch.mode = \"xdp\" runs Algorithm 1 in the program: only \
                     \"greedy\", got {:?}",
                    d.planner
                ),
            ));
        }
        let max = buffet_xdp::MAX_WORKERS;
        if d.max_workers > max {
            return Err((
                "dataplane.max_workers".into(),
                format!(
                    "dispatch.mode = \"xdp\": the program's Worker Table holds {max} \
                     workers, got {}",
                    d.max_workers
                ),
            ));
        }
        if d.tenant_slots > buffet_xdp::MAX_TENANTS {
            return Err((
                "dataplane.tenant_slots".into(),
                format!(
                    "dispatch.mode = \"xdp\": the program's Tenant Table holds {} \
                     tenants, got {}",
                    buffet_xdp::MAX_TENANTS,
                    d.tenant_slots
                ),
            ));
        }
        Ok(())
    }
}

fn port_kind(p: &PortConfig) -> &'static str {
    match p {
        PortConfig::Generator(_) => "generator",
        PortConfig::Pcap(_) => "pcap",
        PortConfig::AfPacket(_) => "af_packet",
        PortConfig::AfXdp(_) => "af_xdp",
        PortConfig::Dpdk(_) => "dpdk",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DaemonConfig, ConfigError> {
        DaemonConfig::parse(Path::new("b.toml"), text)
    }

    const MINIMAL: &str = "data_dir = \"/tmp/x\"\n[nf]\nname = \"monitor\"\n";

    #[test]
    fn a_syntax_error_or_an_unknown_field_is_one_line_with_its_place() {
        let unknown = format!("{MINIMAL}[api]\nlisten = \"127.0.0.1:1\"\n  bogus = 1\n");
        let e = parse(&unknown).unwrap_err().to_string();
        assert!(e.starts_with("b.toml:6:3: unknown field `bogus`"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        let broken = format!("{MINIMAL}[dataplane\nworkers = 1\n");
        let e = parse(&broken).unwrap_err().to_string();
        assert!(e.starts_with("b.toml:4:"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    #[test]
    fn a_minimal_config_takes_the_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.api.listen, default_listen());
        assert_eq!(c.dataplane.workers, 2);
        assert!(c.ports.is_empty());
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = parse(&format!("{MINIMAL}[dataplane]\nwrokers = 3\n")).unwrap_err();
        assert!(e.to_string().contains("unknown field `wrokers`"), "{e}");
        let e = parse(&format!(
            "{MINIMAL}[[port]]\nkind = \"generator\"\ntenants = 2\nrate_pps = 10.0\nrte = 1\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("unknown field `rte`"), "{e}");
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let e = parse(&format!("{MINIMAL}[dataplane]\nworkers = 0\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.toml: dataplane.workers: must be 1..=256, got 0"
        );
        let e = parse(&format!(
            "{MINIMAL}[[port]]\nkind = \"generator\"\ntenants = 2\nrate_pps = 10.0\npeak_factor = 99.0\n"
        ))
        .unwrap_err();
        assert!(
            e.to_string().starts_with("b.toml: port[0].peak_factor:"),
            "{e}"
        );
        let e = parse(&format!("{MINIMAL}[dataplane]\nplanner = \"best\"\n")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("b.toml: dataplane.planner: unknown planner \"best\""),
            "{e}"
        );
        let c = parse(&format!("{MINIMAL}[dataplane]\nplanner = \"ours\"\n")).unwrap();
        assert_eq!(c.dataplane.planner, "ours");
        let e = parse(&format!("{MINIMAL}[dataplane]\nidle_wait_us = 1000001\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.toml: dataplane.idle_wait_us: must be 0..=1000000, got 1000001"
        );
        let c = parse(&format!("{MINIMAL}[dataplane]\nidle_wait_us = 0\n")).unwrap();
        assert_eq!(c.dataplane.idle_wait_us, 0);
        let e = parse("data_dir = \"/x\"\n[nf]\nname = \"nope\"\n").unwrap_err();
        assert!(
            e.to_string().starts_with("b.toml: nf: unknown NF \"nope\""),
            "{e}"
        );
    }

    #[test]
    fn offered_chain_nfs_are_checked_and_named() {
        let c = parse(&format!("{MINIMAL}offered = [\"firewall\", \"dpi\"]\n")).unwrap();
        assert_eq!(c.nf.offered_specs().unwrap().len(), 2);
        let e = parse(&format!("{MINIMAL}offered = [\"firewall\", \"nope\"]\n")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("b.toml: nf.offered[1]: unknown NF \"nope\""),
            "{e}"
        );
        let e = parse(&format!("{MINIMAL}offered = [\"dpi\", \"dpi\"]\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.toml: nf.offered[1]: \"dpi\" is offered twice"
        );
    }

    #[test]
    fn offered_may_name_the_embedders_registered_nfs() {
        let text = format!("{MINIMAL}offered = [\"firewall\", \"my-nf\"]\n");
        let path = Path::new("b.toml");
        // Without the embedder's names, `my-nf` is an unknown NF at its index.
        let e = DaemonConfig::parse(path, &text).unwrap_err().to_string();
        assert!(
            e.starts_with("b.toml: nf.offered[1]: unknown NF \"my-nf\""),
            "{e}"
        );
        let names = vec!["my-nf".to_owned()];
        let c = DaemonConfig::parse_registered(path, &text, &names).unwrap();
        let specs = with_registered_names(&names, || c.nf.offered_specs()).unwrap();
        assert_eq!(specs[1], NfSpec::Registered("my-nf".into()));
        // Another embedder's name is still unknown, named by its index.
        let text = format!("{MINIMAL}offered = [\"my-nf\", \"their-nf\"]\n");
        let e = DaemonConfig::parse_registered(path, &text, &names)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("b.toml: nf.offered[1]: unknown NF \"their-nf\""),
            "{e}"
        );
    }

    const AF_XDP: &str = "[[port]]\nkind = \"af_xdp\"\niface = \"eth0\"\n";

    /// The interfaces a `vlan` rule may not match on: those of the `af_xdp` ports,
    /// each once, and no other port's.
    #[test]
    fn the_xdp_interfaces_are_the_af_xdp_ports() {
        let generator = "[[port]]\nkind = \"generator\"\ntenants = 1\nrate_pps = 1\n";
        let packet = "[[port]]\nkind = \"af_packet\"\niface = \"eth2\"\n";
        let c = parse(&format!("{MINIMAL}{generator}{packet}")).unwrap();
        assert!(c.xdp_ifaces().is_empty());
        let c = parse(&format!(
            "{MINIMAL}{generator}{AF_XDP}queue = 1\n{packet}{AF_XDP}\
             [[port]]\nkind = \"af_xdp\"\niface = \"eth1\"\n"
        ))
        .unwrap();
        assert_eq!(c.xdp_ifaces(), ["eth0", "eth1"]);
    }

    #[test]
    fn af_xdp_queues_are_a_set_holding_the_transmit_queue() {
        let c = parse(&format!("{MINIMAL}{AF_XDP}queues = [2, 3]\n")).unwrap();
        let PortConfig::AfXdp(x) = &c.ports[0] else {
            panic!("{:?}", c.ports)
        };
        assert_eq!((x.tx_queue(), x.queues.as_deref()), (2, Some(&[2, 3][..])));
        let c = parse(&format!("{MINIMAL}{AF_XDP}queue = 1\n")).unwrap();
        let PortConfig::AfXdp(x) = &c.ports[0] else {
            panic!("{:?}", c.ports)
        };
        assert_eq!((x.tx_queue(), x.queues.as_deref()), (1, None));
        let e = parse(&format!("{MINIMAL}{AF_XDP}queues = [0, 1, 0]\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.toml: port[0].queues: queue 0 is named twice"
        );
        let e = parse(&format!("{MINIMAL}{AF_XDP}queues = []\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.toml: port[0].queues: must name at least one queue"
        );
        let e = parse(&format!("{MINIMAL}{AF_XDP}queue = 5\nqueues = [0, 1]\n")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("b.toml: port[0].queue: 5 is not among port[0].queues [0, 1]"),
            "{e}"
        );
    }

    const DPDK: &str = "[[port]]\nkind = \"dpdk\"\niface = \"veth0\"\neal = [\"--no-huge -l 0\"]\n";

    #[cfg(not(feature = "io-dpdk"))]
    #[test]
    fn a_dpdk_port_needs_a_build_with_io_dpdk() {
        let e = parse(&format!("{MINIMAL}{DPDK}")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.toml: port[0].kind: \"dpdk\": this buffetd was built without the io-dpdk \
             feature; build it with `cargo build --release --features io-dpdk` (needs \
             Debian's dpdk-dev 22.11, see docs/ports.md)"
        );
    }

    #[cfg(feature = "io-dpdk")]
    #[test]
    fn a_dpdk_port_takes_eal_arguments_once_per_process() {
        let c = parse(&format!("{MINIMAL}{DPDK}")).unwrap();
        let PortConfig::Dpdk(d) = &c.ports[0] else {
            panic!("{:?}", c.ports)
        };
        assert_eq!(d.iface, "veth0");
        assert_eq!(d.eal_args(), ["--no-huge", "-l", "0"]);
        let e = parse(&format!("{MINIMAL}{DPDK}{DPDK}")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("b.toml: port[1].kind: \"dpdk\" again: port[0] is DPDK already"),
            "{e}"
        );
        let e = parse(&format!(
            "{MINIMAL}[[port]]\nkind = \"dpdk\"\niface = \"a b\"\n"
        ))
        .unwrap_err();
        assert!(e.to_string().starts_with("b.toml: port[0].iface:"), "{e}");
    }

    const XDP: &str = "[dispatch]\nmode = \"xdp\"\n";

    #[test]
    fn xdp_dispatch_takes_one_af_xdp_port() {
        let c = parse(&format!("{MINIMAL}{XDP}{AF_XDP}")).unwrap();
        assert!(c.dispatch.is_xdp());
        assert!(!parse(MINIMAL).unwrap().dispatch.is_xdp());
        let e = parse(&format!("{MINIMAL}{XDP}")).unwrap_err();
        assert!(e.to_string().starts_with("b.toml: dispatch.mode:"), "{e}");
        let e = parse(&format!(
            "{MINIMAL}{XDP}[[port]]\nkind = \"generator\"\ntenants = 2\nrate_pps = 10.0\n"
        ))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.toml: port[0].kind: dispatch.mode = \"xdp\" needs kind \"af_xdp\" (the \
             program feeds AF_XDP sockets), got \"generator\""
        );
        let e = parse(&format!(
            "{MINIMAL}{XDP}[[port]]\nkind = \"af_packet\"\niface = \"eth0\"\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("got \"af_packet\""), "{e}");
        let e = parse(&format!("{MINIMAL}{XDP}{AF_XDP}{AF_XDP}")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("b.toml: port: dispatch.mode = \"xdp\" serves exactly one"),
            "{e}"
        );
        parse(&format!("{MINIMAL}{XDP}{AF_XDP}queues = [0, 1, 2, 3]\n")).unwrap();
        let e = parse(&format!("{MINIMAL}{XDP}{AF_XDP}queues = [0, 64]\n")).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "b.toml: port[0].queues: dispatch.mode = \"xdp\": receive queue 64: the XDP \
                 dispatcher's XSKMAP holds sockets for queues 0 to 63"
            ),
            "{e}"
        );
        parse(&format!("{MINIMAL}{XDP}{AF_XDP}queues = [1]\n")).unwrap();
        let e = parse(&format!("{MINIMAL}[dispatch]\nmode = \"nic\"\n")).unwrap_err();
        assert!(e.to_string().contains("unknown variant `nic`"), "{e}");
    }

    #[test]
    fn xdp_dispatch_refuses_what_the_program_cannot_run() {
        let e = parse(&format!(
            "{MINIMAL}{XDP}{AF_XDP}[dataplane]\nplanner = \"ours\"\n"
        ))
        .unwrap_err();
        assert!(
            e.to_string().starts_with("b.toml: dataplane.planner:"),
            "{e}"
        );
        let e = parse(&format!(
            "{MINIMAL}{XDP}{AF_XDP}[dataplane]\ntenant_slots = 20000\n"
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("b.toml: dataplane.tenant_slots: dispatch.mode = \"xdp\""),
            "{e}"
        );
        // The software dispatcher takes them.
        parse(&format!(
            "{MINIMAL}{AF_XDP}[dataplane]\nplanner = \"ours\"\ntenant_slots = 20000\n"
        ))
        .unwrap();
        // The Worker Table check itself (the [dataplane] check already caps at 256).
        let mut c = parse(&format!("{MINIMAL}{XDP}{AF_XDP}")).unwrap();
        c.dataplane.max_workers = buffet_xdp::MAX_WORKERS + 1;
        let (field, _) = c.dispatch.check(&c).unwrap_err();
        assert_eq!(field, "dataplane.max_workers");
    }

    #[test]
    fn the_example_config_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/buffet.example.toml");
        let c = DaemonConfig::load(&path).unwrap();
        assert!(!c.ports.is_empty());
    }
}
