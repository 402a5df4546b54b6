//! The data plane as the daemon sees it: the NF chosen in the config is loaded, its
//! pipeline built ([`buffet_worker::build`]) and its
//! [`Dataplane`](buffet_worker::Dataplane) driven on a thread of its own. With `nf.offered`
//! in the config the pipeline's NF is a [`Chain`] holding the configured NF (the one-stage
//! chain of a tenant that names none) and every offered stage NF, loaded at start, so that
//! the Memory Manager's regions cover them all and a tenant's own chain is its policy;
//! without it, the configured NF itself. A program that embeds the daemon can offer its own
//! NFs as stages by name ([`start_registered`], with the registry `buffet`'s command uses).
//! The API reaches the data plane only through the pipeline's [`Control`] handle, behind
//! the NF-independent [`Plane`] trait object. Control requests become the pipeline's
//! `Command`s, applied between bursts: other tenants' traffic never waits for tokio.
//!
//! The generator port is paced to the wall clock ([`SourcePort::paced`]), so that a
//! daemon on a machine without a NIC carries traffic at a configured rate forever.
//! This module does not parse requests, persist anything or authenticate.

use std::any::Any;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use buffet_config::chain::{self, Chain, RegisteredStages, DEFAULT_KEY};
use buffet_config::isolation::{self, Isolation};
use buffet_config::registry::{with_registered_names, NfSpec, NfVisitor, RegisteredNf};
use buffet_config::TenantConfig;
use buffet_dispatch::{DispatcherConfig, SchedulerConfig, WorkerId};
use buffet_io::afpacket::{AfPacketConfig, AfPacketPort};
use buffet_io::afxdp::{AfXdpConfig, AfXdpPort, XdpMode};
use buffet_io::gen::{GenConfig, Generator};
use buffet_io::pcap::PcapReader;
use buffet_io::{Port, SourcePort};
use buffet_memory::ArenaConfig;
use buffet_sdk::{PortId, TenantId};
use buffet_worker::{Control, PipelineConfig, PipelineError, Report, TenantSpec, WorkerEvent};
use crossbeam::channel::Receiver;

use crate::config::{DaemonConfig, PortConfig};
use crate::repeats::RepeatedLines;
use crate::xdp::{XdpChangeError, XdpSide, XdpStart, XdpStartError};

/// Opens a `kind = "dpdk"` port as `buffet run --port dpdk` does (the EAL arguments
/// derived from the interface, then the config's `eal`), saying on stderr which EAL
/// arguments it uses and which device it took.
#[cfg(feature = "io-dpdk")]
fn open_dpdk(d: &crate::config::DpdkPortConfig, id: PortId) -> Result<Box<dyn Port>, String> {
    use buffet_io::dpdk::{DpdkConfig, DpdkPort, DPDK_VERSION};
    let cfg = DpdkConfig {
        promisc: d.promisc,
        ..DpdkConfig::for_iface(&d.iface, &d.eal_args(), id)
    };
    eprintln!(
        "buffetd: dpdk {DPDK_VERSION} on {}: EAL arguments: {}",
        d.iface,
        cfg.eal_args.join(" ")
    );
    let port = DpdkPort::open(cfg).map_err(|e| e.to_string())?;
    eprintln!(
        "buffetd: dpdk on {}: port {} ({})",
        d.iface,
        port.port_id(),
        port.device()
    );
    Ok(Box::new(port))
}

/// A `kind = "dpdk"` port in a build without DPDK (validation refuses it first).
#[cfg(not(feature = "io-dpdk"))]
fn open_dpdk(d: &crate::config::DpdkPortConfig, _id: PortId) -> Result<Box<dyn Port>, String> {
    Err(format!(
        "dpdk on {}: this buffetd was built without the io-dpdk feature",
        d.iface
    ))
}

/// Why a data-plane operation failed. When a control call returns it, nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    /// The tenant's policy is not one the NF understands: `tenant 9:
    /// policy.flow_capacity: invalid type: ...`.
    #[error("tenant {tenant}: {error}")]
    Policy {
        /// The tenant.
        tenant: u32,
        /// The refused field and why.
        error: buffet_config::tenants::PolicyError,
    },
    /// The tenant's chain names an NF this server does not offer, or a stage's policy
    /// or guard is invalid (the message names the tenant, the stage and the field).
    #[error("{0}")]
    Chain(String),
    /// The pipeline refused.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// The XDP Packet Dispatcher's maps refused (a rule it cannot express, no worker
    /// left to launch).
    #[error(transparent)]
    Xdp(#[from] XdpChangeError),
}

/// Why the data plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The NF could not be named or loaded.
    #[error("nf: {0}")]
    Nf(String),
    /// The isolation level cannot be used.
    #[error(transparent)]
    Isolation(#[from] buffet_config::IsolationError),
    /// The pipeline could not be built.
    #[error("data plane: {0}")]
    Pipeline(#[from] PipelineError),
    /// A port could not be opened.
    #[error("port[{index}]: {message}")]
    Port {
        /// Its index in the config.
        index: usize,
        /// Why.
        message: String,
    },
    /// The data plane thread could not be started.
    #[error("cannot start the data plane thread: {0}")]
    Spawn(std::io::Error),
    /// The XDP Packet Dispatcher could not be set up.
    #[error(transparent)]
    Xdp(#[from] XdpStartError),
}

/// The data plane's control surface, whatever the NF: every call blocks until the data
/// plane applied it (call from a blocking context, not from an async task).
pub trait Plane: Send + Sync {
    /// The NF, as configured (`monitor`, `c:nf.so`).
    fn nf(&self) -> &str;
    /// The isolation level every tenant runs at.
    fn level(&self) -> Isolation;
    /// The names of the NFs the embedding program registered ([`start_registered`]):
    /// a tenant document's `chain[i].nf` may name them, parsed inside
    /// [`with_registered_names`]. Default: none.
    fn registered_names(&self) -> &[String] {
        &[]
    }
    /// The NFs a tenant's own chain may name (`nf.offered`, as a chain's stages name
    /// them: `firewall`, `c:nf.so`, `my-nf`); empty when the server runs one NF for every
    /// tenant and refuses chains. The Agent reports them, so that the Orchestrator places
    /// a chain only where its NFs run. Default: empty.
    fn offered(&self) -> &[String] {
        &[]
    }
    /// Checks that the NF understands the tenant's policy (decoding only; `init` runs
    /// at admission).
    fn check_policy(&self, t: &TenantConfig) -> Result<(), PlaneError>;
    /// Admits a tenant: `init` builds its state in its region, then the dispatcher learns
    /// its rules.
    fn admit(&self, t: &TenantConfig) -> Result<(), PlaneError>;
    /// Replaces a tenant's policy: the old state serves until the new one is built.
    fn update_policy(&self, t: &TenantConfig) -> Result<(), PlaneError>;
    /// Changes tenant `new.id` from `old` to `new` in place, in one data-plane step: the
    /// new policy's state is built while the old state and rules serve, then the packets
    /// already dispatched finish on the old state and the new rules and state are
    /// installed together between bursts (the pipeline's `Control::update`), so no packet
    /// meets the new rules with the old policy or the reverse; then the weight. On error
    /// nothing changed. Overlap with other tenants' rules is the caller's check.
    fn update(&self, old: &TenantConfig, new: &TenantConfig) -> Result<(), PlaneError>;
    /// Removes a tenant; its region is zeroed and returned.
    fn remove(&self, id: TenantId) -> Result<(), PlaneError>;
    /// A snapshot of every counter.
    fn report(&self) -> Result<Report, PlaneError>;
    /// Launches a worker.
    fn launch_worker(&self) -> Result<u16, PlaneError>;
    /// Terminates a worker; its tenants move.
    fn terminate_worker(&self, id: u16) -> Result<(), PlaneError>;
    /// Lifts a tenant's quarantine.
    fn release(&self, id: u32) -> Result<(), PlaneError>;
    /// The events channel (migrations, overload reports, faults, worker changes).
    fn events(&self) -> Receiver<WorkerEvent>;
    /// Told every event read from [`events`](Self::events), before anyone else: with the
    /// XDP Packet Dispatcher, a worker found stuck or dead has its Worker Table row
    /// closed and its tenants' rows moved to live workers.
    fn on_event(&self, _e: &WorkerEvent) {}
    /// Asks the data plane to finish what is in flight and stop.
    fn stop(&self);
    /// Adds to the final report (the data plane thread's, once stopped) what the data
    /// plane does not count itself: with the XDP Packet Dispatcher, the program's
    /// counters and the frames the kernel dropped at the workers' sockets, as every
    /// [`report`](Plane::report) taken while running has them.
    fn complete_report(&self, r: &mut Report);
}

struct Typed<N: RegisteredNf> {
    control: Control<N>,
    nf: String,
    level: Isolation,
    /// Chains: the keys of the offered stage NFs (`None`: one NF for every tenant).
    offered: Option<Vec<String>>,
    /// The names the embedding program registered (what tenant documents may parse).
    registered: Vec<String>,
    /// `dispatch.mode = "xdp"`: the program and the workers' sockets.
    xdp: Option<Arc<XdpSide>>,
    /// One launch at a time (the API's and the Agent's): a launched worker's data-plane
    /// id must be the next row of the program's Worker Table.
    launching: std::sync::Mutex<()>,
}

impl<N: RegisteredNf> Typed<N> {
    /// The tenant's policy as the pipeline's NF takes it: its NF policy, or with chains
    /// its chain (its own stages, or the configured NF with its policy).
    fn policy(&self, t: &TenantConfig) -> Result<N::Policy, PlaneError> {
        let decode = |p: &buffet_config::tenants::Policy| {
            p.decode_field::<N::Policy>()
                .map_err(|error| PlaneError::Policy {
                    tenant: t.id.0,
                    error,
                })
        };
        if self.offered.is_none() {
            if !t.chain.is_empty() {
                return Err(PlaneError::Chain(format!(
                    "tenant {}: chain: this server runs one NF ({}) for every tenant; \
                     a tenant's own chain needs nf.offered in the server's config",
                    t.id, self.nf
                )));
            }
            return decode(&t.policy);
        }
        let chained = chain::chained_tenants(std::slice::from_ref(t));
        decode(&chained[0].policy)
    }

    /// With chains: every stage names an offered NF, and every stage's policy and guard
    /// build (the tenants file's own check, [`Chain::check_tenants`]).
    fn check_chain(&self, t: &TenantConfig) -> Result<(), PlaneError> {
        let Some(offered) = &self.offered else {
            return Ok(());
        };
        for (k, s) in t.chain.iter().enumerate() {
            let key = s.nf.to_string();
            if !offered.contains(&key) {
                return Err(PlaneError::Chain(format!(
                    "tenant {}: chain[{k}].nf: {key} is not offered by this server \
                     (nf.offered: {})",
                    t.id,
                    offered.join(", ")
                )));
            }
        }
        let nf: &dyn Any = self.control.nf();
        if let Some(chain) = nf.downcast_ref::<Chain>() {
            chain
                .check_tenants(std::slice::from_ref(t), Path::new("request"))
                .map_err(|e| PlaneError::Chain(e.to_string()))?;
        }
        Ok(())
    }
}

impl<N: RegisteredNf> Plane for Typed<N> {
    fn nf(&self) -> &str {
        &self.nf
    }

    fn level(&self) -> Isolation {
        self.level
    }

    fn registered_names(&self) -> &[String] {
        &self.registered
    }

    fn offered(&self) -> &[String] {
        self.offered.as_deref().unwrap_or_default()
    }

    fn check_policy(&self, t: &TenantConfig) -> Result<(), PlaneError> {
        self.check_chain(t)?;
        self.policy(t)?;
        if let Some(x) = &self.xdp {
            x.check_rules(t.id.0, &t.rules)?;
        }
        Ok(())
    }

    fn admit(&self, t: &TenantConfig) -> Result<(), PlaneError> {
        let policy = self.policy(t)?;
        if let Some(x) = &self.xdp {
            // Before the state is built: a rule the program cannot express changes nothing.
            x.check_rules(t.id.0, &t.rules)?;
        }
        let slot = self.control.admit(TenantSpec {
            id: t.id,
            name: t.name.clone(),
            rules: t.rules.clone(),
            max_nb: t.max_nb,
            policy,
        })?;
        let undo = |e: PlaneError| {
            let _ = self.control.remove(t.id);
            Err(e)
        };
        if t.weight > 1 {
            if let Err(e) = self.control.set_weight(t.id, t.weight) {
                return undo(e.into());
            }
        }
        if let Some(x) = &self.xdp {
            // Then the program's maps: its frames reach it from here on.
            if let Err(e) = x.admit(t.id.0, slot, &t.rules, t.max_nb) {
                return undo(e.into());
            }
        }
        Ok(())
    }

    fn update_policy(&self, t: &TenantConfig) -> Result<(), PlaneError> {
        let policy = self.policy(t)?;
        self.control.update_policy(t.id, &policy)?;
        Ok(())
    }

    fn update(&self, old: &TenantConfig, new: &TenantConfig) -> Result<(), PlaneError> {
        let policy = if (&old.policy, &old.chain) != (&new.policy, &new.chain) {
            Some(self.policy(new)?)
        } else {
            None
        };
        let classified = (&old.name, &old.rules, old.max_nb) != (&new.name, &new.rules, new.max_nb);
        if policy.is_some() || classified {
            self.control.update(
                new.id,
                new.name.clone(),
                new.rules.clone(),
                new.max_nb,
                policy.as_ref(),
            )?;
        }
        if let (Some(x), true) = (
            &self.xdp,
            (&old.rules, old.max_nb) != (&new.rules, new.max_nb),
        ) {
            // The new state is published; now the program's rules (docs/daemon.md).
            let slot = self
                .control
                .slot_of(new.id)
                .ok_or(PipelineError::Unknown(new.id))?;
            if let Err(e) = x.update(new.id.0, slot, &new.rules, new.max_nb) {
                // Back to the old state and rules in the data plane too.
                let back = (&old.policy, &old.chain) != (&new.policy, &new.chain);
                let old_policy = if back { self.policy(old).ok() } else { None };
                let _ = self.control.update(
                    old.id,
                    old.name.clone(),
                    old.rules.clone(),
                    old.max_nb,
                    old_policy.as_ref(),
                );
                return Err(e.into());
            }
        }
        if old.weight != new.weight {
            self.control.set_weight(new.id, new.weight)?;
        }
        Ok(())
    }

    fn remove(&self, id: TenantId) -> Result<(), PlaneError> {
        let Some(x) = &self.xdp else {
            return Ok(self.control.remove(id)?);
        };
        let slot = self.control.slot_of(id).ok_or(PipelineError::Unknown(id))?;
        // Out of the program's maps first, then the frames already redirected drain,
        // then the state goes (its region zeroed).
        x.remove(slot)?;
        let stuck = x.drain(|w| self.control.worker_progress(w));
        if !stuck.is_empty() {
            eprintln!(
                "buffetd: removing tenant {id}: workers {stuck:?} did not empty their \
                 sockets within {:?}; its slot stays retired until they do (or end)",
                crate::xdp::DRAIN_TIMEOUT
            );
        }
        match self.control.remove_holding(id, &stuck) {
            Ok(()) => {
                x.forget(slot);
                Ok(())
            }
            Err(e) => {
                let _ = x.restore(id.0, slot);
                Err(e.into())
            }
        }
    }

    fn report(&self) -> Result<Report, PlaneError> {
        let mut r = self.control.report()?;
        if let Some(x) = &self.xdp {
            xdp_report(x, &self.control, &mut r);
        }
        Ok(r)
    }

    fn launch_worker(&self) -> Result<u16, PlaneError> {
        let Some(x) = &self.xdp else {
            return Ok(self.control.launch_worker()?.0);
        };
        let _one = self
            .launching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (source, fds) = x.take_socket()?;
        // The worker polls its sockets from the start; then they go into the XSKMAP
        // (one per queue) and its row opens, so the program sends it nothing before it
        // runs.
        let w = self.control.launch_worker_with(source)?;
        if let Err(e) = x.open_worker(w, &fds) {
            let _ = self.control.terminate_worker(w);
            return Err(e.into());
        }
        Ok(w.0)
    }

    fn terminate_worker(&self, id: u16) -> Result<(), PlaneError> {
        let w = WorkerId(id);
        if let Some(x) = &self.xdp {
            // The program stops choosing it first; then the data plane stops it, and it
            // runs everything in its sockets before its thread ends.
            if x.is_live(w) {
                match x.close_worker(w) {
                    // Closed meanwhile (found stuck or dead): stop it all the same.
                    Ok(_)
                    | Err(XdpChangeError::Worker(buffet_xdp::WorkerTableError::NotLive(_))) => {}
                    Err(XdpChangeError::Worker(buffet_xdp::WorkerTableError::LastWorker(w))) => {
                        return Err(PlaneError::Pipeline(PipelineError::LastWorker(w)));
                    }
                    Err(other) => return Err(other.into()),
                }
            } else {
                // Closed already (found stuck or dead, or by an earlier call that failed
                // taking its sockets out): its sockets go back to the spare pool, so
                // none of its XSKMAP entries may stay.
                x.clear_sockets(w)?;
            }
        }
        Ok(self.control.terminate_worker(w)?)
    }

    fn on_event(&self, e: &WorkerEvent) {
        let Some(x) = &self.xdp else {
            return;
        };
        let w = match e {
            WorkerEvent::WorkerStuck { worker, .. } | WorkerEvent::WorkerDied { worker, .. } => {
                WorkerId(*worker)
            }
            _ => return,
        };
        if !x.is_live(w) {
            return;
        }
        match x.close_worker(w) {
            Ok(moved) => eprintln!(
                "buffetd: xdp: worker {} lost: its Worker Table row closed, {moved} tenants \
                 moved to live workers",
                w.0
            ),
            Err(e) => eprintln!("buffetd: xdp: worker {} lost: {e}", w.0),
        }
    }

    fn release(&self, id: u32) -> Result<(), PlaneError> {
        Ok(self.control.release(buffet_sdk::TenantId(id))?)
    }

    fn events(&self) -> Receiver<WorkerEvent> {
        self.control.events().clone()
    }

    fn stop(&self) {
        if let Some(x) = &self.xdp {
            // Nothing new arrives; the workers then empty their sockets as they stop.
            let control = self.control.clone();
            if let Err(e) = x.detach(move |ev| control.dispatcher_events(ev)) {
                eprintln!("buffetd: detaching the XDP Packet Dispatcher: {e}");
            }
        }
        self.control.stop();
    }

    fn complete_report(&self, r: &mut Report) {
        if let Some(x) = &self.xdp {
            xdp_report(x, &self.control, r);
        }
    }
}

/// The report of a data plane fed by the XDP program: each tenant's worker is the
/// program's Tenant Table row (the program migrates tenants itself), the frames it
/// policed are the tenant's `policed` drops, and the program's input, unmatched,
/// no-live-worker and no-socket counts are the global ones (the data plane's own
/// dispatcher sees no frame).
fn xdp_report<N: RegisteredNf>(x: &XdpSide, control: &Control<N>, r: &mut Report) {
    let slots: Vec<Option<buffet_dispatch::TenantSlot>> =
        r.tenants.iter().map(|t| control.slot_of(t.id)).collect();
    let known: Vec<buffet_dispatch::TenantSlot> = slots.iter().flatten().copied().collect();
    let (stats, rows) = x.snapshot(&known);
    let mut rows = rows.into_iter();
    for (t, slot) in r.tenants.iter_mut().zip(&slots) {
        if slot.is_none() {
            continue;
        }
        if let Some(Some((w, policed))) = rows.next() {
            t.worker = w.0;
            if policed > 0 {
                *t.drops.entry("policed").or_default() += policed;
            }
        }
    }
    let g = &mut r.global;
    g.input_packets += stats.packets;
    g.unmatched += stats.unmatched;
    g.no_live_worker += stats.no_live_worker;
    g.no_socket += stats.no_socket;
    if stats.malformed > 0 {
        *g.malformed.entry("xdp").or_default() += stats.malformed;
    }
    // Frames it passed that the kernel dropped at a worker's socket, as `buffet run`.
    let lost = x.socket_drops();
    g.oversize += lost.oversize;
    g.socket_dropped += lost.dropped;
}

/// A started data plane: its control surface and the thread that drives it (which
/// returns the final report once stopped and drained).
pub struct Started {
    /// The control surface.
    pub plane: Arc<dyn Plane>,
    /// The data plane's thread.
    pub thread: JoinHandle<Report>,
}

/// Loads the configured NF, builds the pipeline, opens the ports and starts the data
/// plane's thread.
pub fn start(cfg: &DaemonConfig, config_path: &Path) -> Result<Started, StartError> {
    start_registered(cfg, config_path, &())
}

/// [`start`] for a program that embeds the daemon with NFs of its own registered by name
/// (`registered`: the registry `buffet`'s command uses for `NfSpec::Registered`, e.g.
/// `buffet::cli::Registry`, or any [`RegisteredStages`]). `nf.offered` may name them
/// (read the config with [`DaemonConfig::load_registered`]); each offered one is built
/// once, as a safe Rust stage NF, and tenants' chains in the API name it like a reference
/// NF. The config's `[nf]` table still names the default stage.
pub fn start_registered(
    cfg: &DaemonConfig,
    config_path: &Path,
    registered: &dyn RegisteredStages,
) -> Result<Started, StartError> {
    let names = registered.registered_names();
    let spec = cfg.nf.spec().map_err(StartError::Nf)?;
    let level = isolation::resolve(cfg.nf.isolation, &spec, &[], config_path)?;
    if level == Isolation::Mpk {
        isolation::mpk()?;
    }
    let pipeline = pipeline_config(cfg, level);
    let (ports, xdp) = open_ports(cfg)?;
    if level == Isolation::TrustedNative {
        eprintln!("buffetd: {}", isolation::TRUSTED_NATIVE_WARNING);
    }
    let nf = spec
        .load_at(level)
        .map_err(|e| StartError::Nf(e.to_string()))?;
    let offered = with_registered_names(&names, || cfg.nf.offered_specs())
        .map_err(|(field, e)| StartError::Nf(format!("{field}: {e}")))?;
    if offered.is_empty() {
        return nf.visit(Build {
            name: spec.to_string(),
            level,
            pipeline,
            ports,
            offered: None,
            registered: names,
            xdp,
            idle_wait: idle_wait(cfg),
        });
    }
    // Chains: the configured NF under the default key, then every offered stage NF.
    let mut chain = nf.visit(AsDefault(spec.kind()));
    for (i, s) in offered.iter().enumerate() {
        if let NfSpec::Registered(name) = s {
            chain = registered.add_stage(name, chain).map_err(|_| {
                StartError::Nf(format!(
                    "nf.offered[{i}]: {name}: no NF of this program is registered under \
                     this name"
                ))
            })?;
            continue;
        }
        let loaded = s
            .load_at(level)
            .map_err(|e| StartError::Nf(format!("nf.offered[{i}]: {s}: {e}")))?;
        chain = chain.with_loaded(s, loaded);
    }
    if level == Isolation::Mpk {
        // Each C stage's part of a tenant's region under its own protection key, as
        // `buffet replay`/`run` do: a tenant's C stage cannot touch the C stage beside it.
        chain = chain.stage_keys(isolation::mpk()?);
    }
    // Every tenant's chain region holds parts of the largest stage NF's region: refused
    // here, naming that stage, rather than at the first tenant's admission.
    chain
        .check_region(pipeline.arena.largest_region())
        .map_err(|e| StartError::Nf(format!("nf.offered: {e}")))?;
    Build {
        name: spec.to_string(),
        level,
        pipeline,
        ports,
        offered: Some(offered.iter().map(ToString::to_string).collect()),
        registered: names,
        xdp,
        idle_wait: idle_wait(cfg),
    }
    .visit(chain)
}

/// [`start`] with an NF the caller built (an NF author's own), run at the `safe` level
/// for every tenant; the config's `[nf]` table is not used. Ports, data plane and
/// dispatch as [`start`]. To offer an own NF as a named chain stage beside the
/// configured ones instead, see [`start_registered`].
pub fn start_nf<N: RegisteredNf>(cfg: &DaemonConfig, nf: N) -> Result<Started, StartError> {
    let level = Isolation::Safe;
    let pipeline = pipeline_config(cfg, level);
    let (ports, xdp) = open_ports(cfg)?;
    Build {
        name: nf.name().to_owned(),
        level,
        pipeline,
        ports,
        offered: None,
        registered: Vec::new(),
        xdp,
        idle_wait: idle_wait(cfg),
    }
    .visit(nf)
}

/// The pipeline's shape from `[dataplane]`.
fn pipeline_config(cfg: &DaemonConfig, level: Isolation) -> PipelineConfig {
    let d = &cfg.dataplane;
    PipelineConfig {
        workers: d.workers,
        worker_max_nb: if d.worker_max_nb == 0 {
            u64::MAX
        } else {
            d.worker_max_nb
        },
        dispatcher: DispatcherConfig {
            sched: SchedulerConfig {
                shift: d.shift,
                threshold: d.threshold,
            },
            // Checked when the config was read.
            planner: d.planner.parse().unwrap_or_default(),
            ..DispatcherConfig::default()
        },
        tenant_capacity: d.tenant_slots,
        arena: ArenaConfig::mib(d.arena_mib),
        pin: d.pin,
        domain: level.domain(),
        ..PipelineConfig::default()
    }
}

/// The ports a config opens, and the XDP Packet Dispatcher's part when it runs.
type Opened = (Vec<Box<dyn Port>>, Option<XdpStart>);

/// Opens the configured ports, or with `dispatch.mode = "xdp"` the XDP Packet
/// Dispatcher's port, program and sockets.
fn open_ports(cfg: &DaemonConfig) -> Result<Opened, StartError> {
    let mut ports: Vec<Box<dyn Port>> = Vec::new();
    // `dispatch.mode = "xdp"`: the one af_xdp port (checked when the config was read)
    // and the program, instead of the ports below.
    let xdp = match (cfg.dispatch.is_xdp(), cfg.ports.as_slice()) {
        (true, [PortConfig::AfXdp(x)]) => Some(crate::xdp::open(cfg, x)?),
        _ => None,
    };
    for (index, p) in cfg.ports.iter().enumerate().filter(|_| xdp.is_none()) {
        let id = index as PortId;
        ports.push(match p {
            PortConfig::Generator(g) => {
                let gen = Generator::new(GenConfig {
                    seed: g.seed,
                    tenants: g.tenants,
                    flows_per_tenant: g.flows_per_tenant,
                    duration_ns: u64::MAX,
                    mean_rate_pps: g.rate_pps,
                    peak_factor: g.peak_factor,
                    ..GenConfig::default()
                })
                .map_err(|e| StartError::Port {
                    index,
                    message: e.to_string(),
                })?;
                Box::new(SourcePort::new(id, "generator", gen).paced())
            }
            PortConfig::Pcap(pc) => {
                let reader = PcapReader::open(&pc.path).map_err(|e| StartError::Port {
                    index,
                    message: format!("{}: {e}", pc.path.display()),
                })?;
                Box::new(SourcePort::new(
                    id,
                    format!("pcap:{}", pc.path.display()),
                    reader,
                ))
            }
            PortConfig::AfPacket(ap) => Box::new(
                AfPacketPort::open(AfPacketConfig {
                    promisc: ap.promisc,
                    ..AfPacketConfig::new(&ap.iface, id)
                })
                .map_err(|e| StartError::Port {
                    index,
                    message: e.to_string(),
                })?,
            ),
            PortConfig::AfXdp(x) => Box::new(
                AfXdpPort::open(AfXdpConfig {
                    queue: x.tx_queue(),
                    queues: x.queues.clone().unwrap_or_default(),
                    frames: AfXdpConfig::frames_for_queues(x.queues.as_ref().map_or(1, Vec::len)),
                    redirect: Some(match x.xdp_mode.as_str() {
                        "native" => XdpMode::Native,
                        "generic" => XdpMode::Generic,
                        // Checked when the config was read.
                        _ => XdpMode::Auto,
                    }),
                    ..AfXdpConfig::new(&x.iface, id)
                })
                .map_err(|e| StartError::Port {
                    index,
                    message: e.to_string(),
                })?,
            ),
            PortConfig::Dpdk(d) => {
                open_dpdk(d, id).map_err(|message| StartError::Port { index, message })?
            }
        });
    }
    Ok((ports, xdp))
}

/// A [`Chain`] holding the configured NF as the default stage.
struct AsDefault(buffet_config::registry::NfKind);

impl NfVisitor for AsDefault {
    type Output = Chain;

    fn visit<N: RegisteredNf>(self, nf: N) -> Chain {
        Chain::new().with_kind(DEFAULT_KEY, nf, self.0)
    }
}

struct Build {
    /// The NF as reports name it.
    name: String,
    level: Isolation,
    pipeline: PipelineConfig,
    ports: Vec<Box<dyn Port>>,
    offered: Option<Vec<String>>,
    registered: Vec<String>,
    xdp: Option<XdpStart>,
    /// How long the idle data plane and workers block at most (`dataplane.idle_wait_us`).
    idle_wait: Duration,
}

/// `dataplane.idle_wait_us`.
fn idle_wait(cfg: &DaemonConfig) -> Duration {
    Duration::from_micros(cfg.dataplane.idle_wait_us)
}

impl NfVisitor for Build {
    type Output = Result<Started, StartError>;

    fn visit<N: RegisteredNf>(self, nf: N) -> Self::Output {
        let (control, mut dataplane, xdp) = match self.xdp {
            None => {
                let (c, d) = buffet_worker::build(nf, self.pipeline)?;
                (c, d, None)
            }
            Some(x) => {
                // Each worker polls its own socket; the data plane owns the port (fill,
                // completion and transmit rings: passed frames leave through it).
                let (c, mut d) = buffet_worker::build_with_sources(nf, self.pipeline, x.sources)?;
                d.add_port(Box::new(x.port));
                (c, d, Some((x.side, x.iface, x.mode)))
            }
        };
        for p in self.ports {
            dataplane.add_port(p);
        }
        dataplane.set_idle_wait(self.idle_wait);
        let thread = std::thread::Builder::new()
            .name("buffet-dataplane".into())
            .spawn(move || {
                // Until stopped: ports that end (a pcap) leave the data plane idle, still
                // applying control commands; idle, it blocks until a frame or a command.
                // A port whose error repeats (retried every 10 ms) is printed once per
                // period with its count; an interface that went down or away is said
                // each time (the kernel says it once).
                let mut lines = RepeatedLines::default();
                dataplane.serve(|e| {
                    if e.is_link_lost() {
                        eprintln!("buffetd: data plane: {e}");
                        return;
                    }
                    for line in lines.lines(&e.to_string(), Instant::now()) {
                        eprintln!("buffetd: data plane: {line}");
                    }
                });
                for line in lines.finish(Instant::now()) {
                    eprintln!("buffetd: data plane: {line}");
                }
                dataplane.finish()
            })
            .map_err(StartError::Spawn)?;
        let side = match xdp {
            None => None,
            Some((side, iface, mode)) => {
                let sink = control.clone();
                if let Err(e) = side.attach(&iface, mode, move |ev| sink.dispatcher_events(ev)) {
                    control.stop();
                    let _ = thread.join();
                    return Err(e.into());
                }
                Some(side)
            }
        };
        let plane = Typed {
            control,
            nf: self.name,
            level: self.level,
            offered: self.offered,
            registered: self.registered,
            xdp: side,
            launching: std::sync::Mutex::new(()),
        };
        Ok(Started {
            plane: Arc::new(plane),
            thread,
        })
    }
}
