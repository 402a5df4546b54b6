//! The host half of the nfp offload (nic-firmware/xdp/dispatcher_offload.bpf.c): the NIC
//! classifies, counts, tags and selects each tenant's worker queue, but has no clock, so
//! the timeslot boundary of Algorithm 1 runs here, from the NIC's per-tenant counters.
//!
//! [`OffloadPlanner::boundary`] takes the packets each tenant sent in the timeslot that
//! just ended and applies step 3 of docs/scheduler.md to every tenant, in tenant-slot
//! order, as if each sent its first packet of the new timeslot now: `tmp` is the tenant's
//! count (its policed packets included), a worker's `last_nb` what reached it (the NIC's
//! per-worker counter; by default the sum of its tenants' counts), an overloaded worker
//! (`last_nb >= MAX_NB`) gives the tenant to the live worker with the lowest `last_nb`
//! (ties: lowest id) if it fits, `times` counts detections and a report is due while
//! `times > threshold`. The caller writes the moves into the NIC's tenant rows.
//!
//! Where decisions differ from the driver-mode program (which runs the step per packet):
//! a tenant moves at the boundary, before its first packet, and every tenant is visited
//! even if it stays idle in the new timeslot; tenants are visited in slot order, not in
//! the order their first packets arrive; and the NIC cannot police a tenant by itself
//! (MAX_NB needs a clock): the host does it, late (below).
//!
//! [`OffloadDispatcher`] is the rest of the host half, over the program's maps: it writes
//! the exact-match tables and the tenant rows, reads the per-tenant counters, polices a
//! tenant once its count in the timeslot passes its MAX_NB (the row's `policed` flag,
//! cleared at the next boundary; the NIC has no clock to do it itself), and at each
//! boundary runs the planner above and writes its moves back. It is driven by
//! [`OffloadDispatcher::tick`] with the host's clock, several times per timeslot: the
//! boundary needs one tick per timeslot, but policing happens only on the ticks within a
//! timeslot, and a tenant over its MAX_NB passes until the next of them.
//!
//! Where it runs: a program offloaded to an nfp must be bound to the device when it is
//! loaded, which aya 0.14 cannot do, and there is no nfp here. The dispatcher loads the
//! same program built with `-DBF_OFFLOAD_HOST_BUILD`, which leaves out the one store the
//! kernel accepts only on an offload device (`ctx->rx_queue_index`), and runs frames
//! through it with BPF_PROG_TEST_RUN ([`OffloadDispatcher::run`]); the per-worker
//! counter says which queue the NIC would have chosen. Everything else (parsing,
//! classification, counters, policing flag, DSCP tag) is the offloaded program itself.
//!
//! Its classifier is a subset of buffet-dispatch's: exact destination address with a
//! TCP or UDP destination port, or an exact destination address alone
//! ([`OffloadRuleError`] names what else a rule asks for). The NIC always prefers an
//! exact rule to an address-only one, so a rule set where buffet-dispatch's priorities
//! would decide otherwise, or two tenants with the same key, is refused: what is
//! admitted classifies as buffet-dispatch would, except IPv4 packets with options,
//! whose ports the NIC does not read (only address-only rules match them), and frames
//! the software parser refuses as malformed for a length field (IPv4 total length,
//! IPv6 payload length, TCP data offset, a UDP header shorter than 8 bytes): the NIC
//! reads only the bytes it needs and classifies them.

use std::collections::HashMap;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, MapError};
use aya::programs::{ProgramError, TestRun, TestRunOptions, Xdp};
use aya::Ebpf;
use buffet_dispatch::classifier::Match;
use buffet_dispatch::{Event, OverloadReport, RuleError, TenantSlot, WorkerId};

use crate::{load_program, map_data, map_err, offload_host_object, take_map, LoadError};

/// One tenant's move at a boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// The tenant.
    pub tenant: TenantSlot,
    /// Its old worker.
    pub from: WorkerId,
    /// Its new worker.
    pub to: WorkerId,
}

/// What a boundary decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoundaryPlan {
    /// Tenants to move (write their rows' worker).
    pub moves: Vec<Move>,
    /// Overload reports for the Agent.
    pub overloads: Vec<OverloadReport>,
}

#[derive(Clone, Copy, Debug)]
struct Worker {
    max_nb: u64,
    times: u32,
    live: bool,
}

/// The host's Tenant Table (tenant -> worker) and Worker Table (MAX_NB, TIMES) for an
/// offloaded dispatcher.
#[derive(Clone, Debug, Default)]
pub struct OffloadPlanner {
    tenants: Vec<Option<WorkerId>>,
    workers: Vec<Worker>,
    threshold: u32,
}

impl OffloadPlanner {
    /// No workers, no tenants; overload reports while TIMES exceeds `threshold`.
    pub fn new(threshold: u32) -> Self {
        OffloadPlanner {
            threshold,
            ..OffloadPlanner::default()
        }
    }

    /// Adds a live worker with MAX_NB `max_nb`.
    pub fn add_worker(&mut self, max_nb: u64) -> WorkerId {
        self.workers.push(Worker {
            max_nb,
            times: 0,
            live: true,
        });
        WorkerId((self.workers.len() - 1) as u16)
    }

    /// Places tenant `slot` on `worker`.
    pub fn assign(&mut self, slot: TenantSlot, worker: WorkerId) {
        let i = slot.0 as usize;
        if self.tenants.len() <= i {
            self.tenants.resize(i + 1, None);
        }
        self.tenants[i] = Some(worker);
    }

    /// Forgets tenant `slot` (it is no longer visited at boundaries).
    pub fn remove(&mut self, slot: TenantSlot) {
        if let Some(t) = self.tenants.get_mut(slot.0 as usize) {
            *t = None;
        }
    }

    /// The worker of `slot`.
    pub fn worker_of(&self, slot: TenantSlot) -> Option<WorkerId> {
        self.tenants.get(slot.0 as usize).copied().flatten()
    }

    /// The boundary into timeslot `slot`: `counts[t]` is what tenant slot `t` sent in the
    /// timeslot that ended (missing entries count 0).
    pub fn boundary(&mut self, slot: u64, counts: &[u64]) -> BoundaryPlan {
        let mut last = vec![0u64; self.workers.len()];
        for (t, w) in self.tenants.iter().enumerate() {
            if let (Some(w), Some(&n)) = (w, counts.get(t)) {
                if let Some(l) = last.get_mut(w.index()) {
                    *l = l.saturating_add(n);
                }
            }
        }
        self.boundary_with_loads(slot, counts, &last)
    }

    /// [`boundary`](Self::boundary) where the workers' `last_nb` are given: `loads[w]`
    /// is what reached worker `w` in the timeslot that ended (missing entries count 0).
    /// A tenant's count includes its policed packets; its worker's load does not (a
    /// policed packet never reaches the worker: docs/scheduler.md, step 2).
    pub fn boundary_with_loads(
        &mut self,
        slot: u64,
        counts: &[u64],
        loads: &[u64],
    ) -> BoundaryPlan {
        let mut last: Vec<u64> = (0..self.workers.len())
            .map(|w| loads.get(w).copied().unwrap_or(0))
            .collect();
        let mut plan = BoundaryPlan::default();
        for t in 0..self.tenants.len() {
            let Some(w) = self.tenants[t] else { continue };
            let wi = w.index();
            if wi >= self.workers.len() || !self.workers[wi].live {
                continue;
            }
            let tmp = counts.get(t).copied().unwrap_or(0);
            if last[wi] < self.workers[wi].max_nb {
                self.workers[wi].times = 0;
                continue;
            }
            let mig = (0..self.workers.len())
                .filter(|&i| self.workers[i].live)
                .min_by_key(|&i| (last[i], i))
                .unwrap_or(wi);
            if mig != wi && last[mig].saturating_add(tmp) < self.workers[mig].max_nb {
                let to = WorkerId(mig as u16);
                self.tenants[t] = Some(to);
                last[wi] = last[wi].saturating_sub(tmp);
                last[mig] += tmp;
                plan.moves.push(Move {
                    tenant: TenantSlot(t as u32),
                    from: w,
                    to,
                });
            }
            let wk = &mut self.workers[wi];
            wk.times = wk.times.saturating_add(1);
            if wk.times > self.threshold {
                plan.overloads.push(OverloadReport { worker: w, slot });
            }
        }
        plan
    }
}

/// The program's name in the offload object.
pub const OFFLOAD_PROGRAM_NAME: &str = "buffet_dispatch_offload";
/// Tenant slots the offloaded tables hold (`BF_OFF_MAX_TENANTS`).
pub const OFFLOAD_MAX_TENANTS: u32 = 64;
/// Workers, one RX queue each (`BF_OFF_MAX_WORKERS`).
pub const OFFLOAD_MAX_WORKERS: u16 = 16;
/// Entries of each exact-match table.
pub const OFFLOAD_TABLE_ENTRIES: usize = 4096;

/// The twin of `struct bf_off_key`: destination address (IPv4 mapped into
/// `::ffff:0:0/96`), destination port (host order) and protocol; port and protocol 0 in
/// the address-only table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct OffKey {
    pub(crate) dst_addr: [u8; 16],
    pub(crate) dst_port: u16,
    pub(crate) proto: u8,
    pub(crate) is_v6: u8,
}

/// The twin of `struct bf_off_tenant`: a tenant's row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OffTenant {
    pub(crate) worker: u32,
    pub(crate) policed: u32,
}

/// Index of `bf_off_stats`.
const ST_MALFORMED: u32 = 0;
const ST_UNMATCHED: u32 = 1;
const ST_POLICED: u32 = 2;

/// How the host half runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffloadConfig {
    /// `timeslot = now_ns >> shift`.
    pub shift: u32,
    /// Overload reports while a worker's TIMES exceeds this.
    pub threshold: u32,
}

/// Why a tenant's rules cannot go into the offloaded tables. Nothing was written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OffloadRuleError {
    /// The rule is invalid for any classifier.
    #[error("rule {index}: {source}")]
    Invalid {
        /// Index in the tenant's rules.
        index: usize,
        /// Why.
        source: RuleError,
    },
    /// The rule asks for something the NIC's exact-match tables cannot express.
    #[error(
        "rule {index}: the offloaded classifier matches an exact destination address, \
         with or without a TCP/UDP destination port, and nothing else: {what}"
    )]
    Unsupported {
        /// Index in the tenant's rules.
        index: usize,
        /// What the rule asks for.
        what: String,
    },
    /// Another tenant already holds the same key.
    #[error("rule {index}: {key} already belongs to tenant slot {owner}")]
    Taken {
        /// Index in the tenant's rules.
        index: usize,
        /// The key (`10.0.0.1 udp/53`, or `10.0.0.1` for an address-only rule).
        key: String,
        /// The tenant slot holding it.
        owner: u32,
    },
    /// buffet-dispatch's priorities (lower wins; equal: the earlier admitted) would
    /// decide between this tenant's rule and another tenant's rule for the same address
    /// otherwise than the NIC, which always prefers the exact rule to the address-only
    /// one.
    #[error(
        "rule {index}: on {addr}, this {mine} rule (priority {priority}) would {outcome} \
         tenant slot {other}'s {theirs} rule (priority {other_priority}) in the software \
         classifier, but the NIC always prefers exact rules; {advice}",
        mine = if *new_is_exact { "exact" } else { "address-only" },
        theirs = if *new_is_exact { "address-only" } else { "exact" },
        outcome = if *new_is_exact { "lose to" } else { "win over" },
        advice = if *new_is_exact {
            format!("give this rule a priority below {other_priority}")
        } else {
            format!("give this rule a priority of {other_priority} or more")
        },
    )]
    PriorityConflict {
        /// Index in the tenant's rules.
        index: usize,
        /// The address.
        addr: std::net::IpAddr,
        /// Whether this tenant's rule is the exact one.
        new_is_exact: bool,
        /// This tenant's rule's priority.
        priority: u32,
        /// The other tenant.
        other: u32,
        /// The other tenant's best priority among its rules on that key.
        other_priority: u32,
    },
    /// A table has no room.
    #[error("rule {index}: the {table} table is full ({capacity} entries)")]
    Full {
        /// Index in the tenant's rules.
        index: usize,
        /// `exact` or `address`.
        table: &'static str,
        /// Its size.
        capacity: usize,
    },
}

/// Why admitting to or removing from the offloaded tables failed. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum OffloadAdmitError {
    /// The slot is beyond the tables.
    #[error("{tenant}: the offloaded tables hold tenant slots 0..{capacity} only")]
    TooManyTenants {
        /// The slot.
        tenant: TenantSlot,
        /// [`OFFLOAD_MAX_TENANTS`].
        capacity: u32,
    },
    /// At most [`OFFLOAD_MAX_WORKERS`] workers (RX queues).
    #[error("the offloaded dispatcher holds at most {capacity} workers")]
    TooManyWorkers {
        /// [`OFFLOAD_MAX_WORKERS`].
        capacity: u16,
    },
    /// The slot is taken.
    #[error("{0} is already admitted to the offloaded dispatcher")]
    DuplicateSlot(TenantSlot),
    /// The slot is not admitted.
    #[error("{0} is not admitted to the offloaded dispatcher")]
    NotAdmitted(TenantSlot),
    /// No such worker.
    #[error("{tenant}: no worker {worker}")]
    UnknownWorker {
        /// The tenant.
        tenant: TenantSlot,
        /// The worker asked for.
        worker: u16,
    },
    /// A rule does not fit.
    #[error("{tenant}, {source}")]
    Rule {
        /// The tenant.
        tenant: TenantSlot,
        /// Why.
        source: OffloadRuleError,
    },
    /// A map write failed; what was written before it is undone.
    #[error("writing the offloaded dispatcher's maps: {0}")]
    Map(#[from] MapError),
    /// A map write failed and undoing the keys written before it failed too.
    #[error(
        "{tenant}: writing the offloaded dispatcher's maps: {source}; the keys {left:?} \
         could not be taken out again and still point to the slot"
    )]
    Partial {
        /// The tenant.
        tenant: TenantSlot,
        /// The first failure.
        source: MapError,
        /// The keys left in the tables.
        left: Vec<String>,
    },
}

/// One frame through the program (BPF_PROG_TEST_RUN).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OffloadVerdict {
    /// Passed to `worker`'s RX queue, for `tenant`.
    Pass {
        /// The tenant.
        tenant: TenantSlot,
        /// The worker (RX queue).
        worker: WorkerId,
    },
    /// Dropped: the tenant is policed until the next boundary.
    Policed(TenantSlot),
    /// Dropped: no rule matched.
    Unmatched,
    /// Dropped: the frame did not parse.
    Malformed,
}

/// What one [`tick`](OffloadDispatcher::tick) did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tick {
    /// The boundary plan, when the tick crossed into a new timeslot (its moves are
    /// written, every policed flag cleared).
    pub boundary: Option<BoundaryPlan>,
    /// Tenants policed by this tick: their count in the timeslot passed their MAX_NB.
    pub policed: Vec<TenantSlot>,
}

/// A tenant as the host half keeps it.
#[derive(Clone, Debug)]
struct Admitted {
    max_nb: u64,
    policed: bool,
    /// Its counter at the start of the current timeslot.
    base: u64,
    /// Its keys: (address-only table?, key, priority).
    keys: Vec<(bool, OffKey, u32)>,
}

/// The host half of the offloaded Packet Dispatcher over the program's maps (see the
/// module documentation).
pub struct OffloadDispatcher {
    ebpf: Ebpf,
    cfg: OffloadConfig,
    planner: OffloadPlanner,
    exact: BpfHashMap<MapData, OffKey, u32>,
    addr: BpfHashMap<MapData, OffKey, u32>,
    rows: Array<MapData, OffTenant>,
    tenant_pkts: Array<MapData, u64>,
    worker_pkts: Array<MapData, u64>,
    stats: Array<MapData, u64>,
    n_workers: u16,
    tenants: HashMap<u32, Admitted>,
    /// Key owners, with the rule's priority: (address-only table?, key) -> (slot,
    /// priority).
    owners: HashMap<(bool, OffKey), (u32, u32)>,
    slot: Option<u64>,
    /// The workers' counters at the start of the current timeslot.
    worker_base: Vec<u64>,
    /// Each tenant row as last written to the NIC; rows that differ from what the host
    /// wants are written on every tick, so a failed write is retried.
    written: HashMap<u32, OffTenant>,
    events: Vec<Event>,
}

impl std::fmt::Debug for OffloadDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadDispatcher")
            .field("cfg", &self.cfg)
            .field("workers", &self.n_workers)
            .field("tenants", &self.tenants.len())
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

/// The keys of one rule: `(address-only table?, key)`.
fn offload_key(index: usize, m: &Match) -> Result<(bool, OffKey), OffloadRuleError> {
    m.validate()
        .map_err(|source| OffloadRuleError::Invalid { index, source })?;
    let unsupported = |what: String| OffloadRuleError::Unsupported { index, what };
    let others: [(&str, bool); 7] = [
        ("in_port", m.in_port.is_some()),
        ("src_mac", m.src_mac.is_some()),
        ("dst_mac", m.dst_mac.is_some()),
        ("vlan", m.vlan.is_some()),
        ("src_ip", m.src_ip.is_some()),
        ("src_port", m.src_port.is_some()),
        ("dscp", m.dscp.is_some()),
    ];
    let named: Vec<&str> = others.iter().filter(|o| o.1).map(|o| o.0).collect();
    if !named.is_empty() {
        return Err(unsupported(format!("it matches {}", named.join(", "))));
    }
    let Some(dst) = m.dst_ip else {
        return Err(unsupported("it has no destination address".into()));
    };
    let full = if dst.is_ipv4() { 32 } else { 128 };
    if dst.len() != full {
        return Err(unsupported(format!("{dst} is a prefix")));
    }
    let mut key = OffKey {
        is_v6: u8::from(!dst.is_ipv4()),
        ..OffKey::default()
    };
    key.dst_addr = match dst.addr() {
        std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(a) => a.octets(),
    };
    match (m.protocol, m.dst_port) {
        (None, None) => Ok((true, key)),
        (Some(p), None) => Err(unsupported(format!(
            "protocol {p} without a destination port"
        ))),
        (None, Some(_)) => Err(unsupported(
            "a destination port without protocol tcp or udp (the key holds the protocol)".into(),
        )),
        (Some(p), Some(_)) if p != 6 && p != 17 => Err(unsupported(format!(
            "ports of protocol {p} (the NIC parses TCP and UDP ports only)"
        ))),
        (Some(_), Some(r)) if r.lo != r.hi => {
            Err(unsupported(format!("the port range {}-{}", r.lo, r.hi)))
        }
        (Some(_), Some(r)) if r.lo == 0 => Err(unsupported(
            "destination port 0 (the NIC's key for a packet without ports)".into(),
        )),
        (Some(p), Some(r)) => {
            key.proto = p;
            key.dst_port = r.lo;
            Ok((false, key))
        }
    }
}

/// The address of a key, for messages.
fn key_addr(k: &OffKey) -> std::net::IpAddr {
    let v6 = std::net::Ipv6Addr::from(k.dst_addr);
    match (k.is_v6, v6.to_ipv4_mapped()) {
        (0, Some(v4)) => v4.into(),
        _ => v6.into(),
    }
}

/// A key as the messages show it: `10.0.0.1 udp/53`, or the address alone.
fn key_text(is_addr: bool, k: &OffKey) -> String {
    let addr = key_addr(k);
    match (is_addr, k.proto) {
        (true, _) => addr.to_string(),
        (false, 6) => format!("{addr} tcp/{}", k.dst_port),
        (false, 17) => format!("{addr} udp/{}", k.dst_port),
        (false, p) => format!("{addr} protocol {p}/{}", k.dst_port),
    }
}

/// The address-only twin of an exact key.
fn addr_only(k: &OffKey) -> OffKey {
    OffKey {
        dst_port: 0,
        proto: 0,
        ..*k
    }
}

impl OffloadDispatcher {
    /// Loads the offload program's host build (verified by the kernel) with no workers,
    /// tenants or rules; see the module documentation for why it is not the device build.
    pub fn load_host_build(cfg: OffloadConfig) -> Result<OffloadDispatcher, LoadError> {
        let mut ebpf = load_program(
            offload_host_object()?,
            OFFLOAD_PROGRAM_NAME,
            "program buffet_dispatch_offload",
        )?;
        // The tables' sizes, which the `Full` checks rely on.
        let entries = |name: &'static str| -> Result<u32, LoadError> {
            let map = ebpf.map(name).ok_or(LoadError::Missing(name))?;
            map_data(map)
                .ok_or(LoadError::Missing(name))?
                .info()
                .map(|i| i.max_entries())
                .map_err(map_err(name))
        };
        let (exact_entries, addr_entries) = (entries("bf_off_exact")?, entries("bf_off_addr")?);
        let exact = BpfHashMap::try_from(take_map(&mut ebpf, "bf_off_exact")?)
            .map_err(map_err("bf_off_exact"))?;
        let addr = BpfHashMap::try_from(take_map(&mut ebpf, "bf_off_addr")?)
            .map_err(map_err("bf_off_addr"))?;
        let rows = Array::try_from(take_map(&mut ebpf, "bf_off_tenants")?)
            .map_err(map_err("bf_off_tenants"))?;
        let tenant_pkts = Array::try_from(take_map(&mut ebpf, "bf_off_tenant_pkts")?)
            .map_err(map_err("bf_off_tenant_pkts"))?;
        let worker_pkts = Array::try_from(take_map(&mut ebpf, "bf_off_worker_pkts")?)
            .map_err(map_err("bf_off_worker_pkts"))?;
        let stats = Array::try_from(take_map(&mut ebpf, "bf_off_stats")?)
            .map_err(map_err("bf_off_stats"))?;
        let sizes: [(&'static str, u32, u32); 4] = [
            ("bf_off_exact", exact_entries, OFFLOAD_TABLE_ENTRIES as u32),
            ("bf_off_addr", addr_entries, OFFLOAD_TABLE_ENTRIES as u32),
            ("bf_off_tenants", rows.len(), OFFLOAD_MAX_TENANTS),
            (
                "bf_off_worker_pkts",
                worker_pkts.len(),
                u32::from(OFFLOAD_MAX_WORKERS),
            ),
        ];
        for (name, found, expected) in sizes {
            if found != expected {
                return Err(LoadError::Size {
                    name,
                    what: "entries",
                    found,
                    expected,
                });
            }
        }
        Ok(OffloadDispatcher {
            ebpf,
            cfg,
            planner: OffloadPlanner::new(cfg.threshold),
            exact,
            addr,
            rows,
            tenant_pkts,
            worker_pkts,
            stats,
            n_workers: 0,
            tenants: HashMap::new(),
            owners: HashMap::new(),
            slot: None,
            worker_base: Vec::new(),
            written: HashMap::new(),
            events: Vec::new(),
        })
    }

    /// Adds a live worker (the next RX queue) with MAX_NB `max_nb` packets per timeslot.
    pub fn add_worker(&mut self, max_nb: u64) -> Result<WorkerId, OffloadAdmitError> {
        if self.n_workers >= OFFLOAD_MAX_WORKERS {
            return Err(OffloadAdmitError::TooManyWorkers {
                capacity: OFFLOAD_MAX_WORKERS,
            });
        }
        let w = self.planner.add_worker(max_nb);
        let now = self.worker_pkts.get(&u32::from(w.0), 0)?;
        self.worker_base.push(now);
        self.n_workers += 1;
        Ok(w)
    }

    /// Checks `rules` of tenant `slot` against the tables as they are: the keys, or the
    /// first reason they cannot go in.
    fn plan(
        &self,
        slot: u32,
        rules: &[(u32, Match)],
    ) -> Result<Vec<(bool, OffKey, u32)>, OffloadRuleError> {
        let mut keys: Vec<(bool, OffKey, u32)> = Vec::with_capacity(rules.len());
        let (mut exact_n, mut addr_n) = (self.exact_len(), self.addr_len());
        for (index, (priority, m)) in rules.iter().enumerate() {
            let (is_addr, key) = offload_key(index, m)?;
            if let Some(&(owner, _)) = self.owners.get(&(is_addr, key)) {
                if owner != slot {
                    return Err(OffloadRuleError::Taken {
                        index,
                        key: key_text(is_addr, &key),
                        owner,
                    });
                }
            }
            // Another tenant's rules on the same address in the other table: the NIC
            // picks the exact one; so must the priorities (lower wins, ties to the
            // earlier admitted, which is theirs).
            for ((o_addr, o_key), &(owner, o_prio)) in &self.owners {
                if owner == slot || *o_addr == is_addr || addr_only(o_key) != addr_only(&key) {
                    continue;
                }
                // Theirs were admitted first: they win ties.
                let wrong = if is_addr {
                    *priority < o_prio
                } else {
                    *priority >= o_prio
                };
                if wrong {
                    return Err(OffloadRuleError::PriorityConflict {
                        index,
                        addr: key_addr(&key),
                        new_is_exact: !is_addr,
                        priority: *priority,
                        other: owner,
                        other_priority: o_prio,
                    });
                }
            }
            if !keys.iter().any(|&(a, k, _)| a == is_addr && k == key)
                && !self.owners.contains_key(&(is_addr, key))
            {
                let (n, table) = if is_addr {
                    (&mut addr_n, "address")
                } else {
                    (&mut exact_n, "exact")
                };
                if *n >= OFFLOAD_TABLE_ENTRIES {
                    return Err(OffloadRuleError::Full {
                        index,
                        table,
                        capacity: OFFLOAD_TABLE_ENTRIES,
                    });
                }
                *n += 1;
            }
            keys.push((is_addr, key, *priority));
        }
        Ok(keys)
    }

    fn exact_len(&self) -> usize {
        self.owners.keys().filter(|k| !k.0).count()
    }

    fn addr_len(&self) -> usize {
        self.owners.keys().filter(|k| k.0).count()
    }

    /// Checks that the offloaded classifier can express `rules` next to every rule it
    /// holds now (nothing is written).
    pub fn check_rules(&self, rules: &[(u32, Match)]) -> Result<(), OffloadRuleError> {
        self.plan(u32::MAX, rules).map(drop)
    }

    /// Admits tenant `slot` on `worker` with MAX_NB `max_nb` packets per timeslot (0:
    /// unlimited) and its classifier `rules` (`(priority, match)`, lower priority wins,
    /// as in buffet-dispatch). Refused, changing nothing, when the slot, a rule or the
    /// tables do not allow it. A map write the kernel refuses is undone as far as the
    /// kernel lets it (the error says so when it does not).
    pub fn admit(
        &mut self,
        slot: TenantSlot,
        rules: &[(u32, Match)],
        max_nb: u64,
        worker: WorkerId,
    ) -> Result<(), OffloadAdmitError> {
        if slot.0 >= OFFLOAD_MAX_TENANTS {
            return Err(OffloadAdmitError::TooManyTenants {
                tenant: slot,
                capacity: OFFLOAD_MAX_TENANTS,
            });
        }
        if self.tenants.contains_key(&slot.0) {
            return Err(OffloadAdmitError::DuplicateSlot(slot));
        }
        if worker.0 >= self.n_workers {
            return Err(OffloadAdmitError::UnknownWorker {
                tenant: slot,
                worker: worker.0,
            });
        }
        let keys = self
            .plan(slot.0, rules)
            .map_err(|source| OffloadAdmitError::Rule {
                tenant: slot,
                source,
            })?;
        // The row first, so a packet classified to the tenant always finds it; its
        // counter as it is now is where its timeslot count starts.
        let row = OffTenant {
            worker: u32::from(worker.0),
            policed: 0,
        };
        self.rows.set(slot.0, row, 0)?;
        self.written.insert(slot.0, row);
        let base = self.tenant_pkts.get(&slot.0, 0)?;
        let mut written: Vec<(bool, OffKey)> = Vec::new();
        for &(is_addr, key, _) in &keys {
            if written.contains(&(is_addr, key)) {
                continue;
            }
            let map = if is_addr {
                &mut self.addr
            } else {
                &mut self.exact
            };
            if let Err(e) = map.insert(key, slot.0, 0) {
                let mut left = Vec::new();
                for (a, k) in written {
                    let map = if a { &mut self.addr } else { &mut self.exact };
                    if map.remove(&k).is_err() {
                        left.push(key_text(a, &k));
                    }
                }
                return Err(if left.is_empty() {
                    OffloadAdmitError::Map(e)
                } else {
                    OffloadAdmitError::Partial {
                        tenant: slot,
                        source: e,
                        left,
                    }
                });
            }
            written.push((is_addr, key));
        }
        for &(is_addr, key, priority) in &keys {
            // A tenant's best priority on a key is what the conflict checks compare.
            self.owners
                .entry((is_addr, key))
                .and_modify(|(_, p)| *p = (*p).min(priority))
                .or_insert((slot.0, priority));
        }
        self.planner.assign(slot, worker);
        self.tenants.insert(
            slot.0,
            Admitted {
                max_nb,
                policed: false,
                base,
                keys,
            },
        );
        Ok(())
    }

    /// Removes tenant `slot`: its keys, so that no packet classifies to it any more (its
    /// row stays as it was, unreachable, until the slot is admitted again). When the
    /// kernel refuses to remove a key, the tenant stays admitted with the keys not yet
    /// removed, and removing it again goes on from there.
    pub fn remove(&mut self, slot: TenantSlot) -> Result<(), OffloadAdmitError> {
        let Some(t) = self.tenants.get_mut(&slot.0) else {
            return Err(OffloadAdmitError::NotAdmitted(slot));
        };
        while let Some(&(is_addr, key, _)) = t.keys.last() {
            // A key two of its rules share is in the table once.
            let shared = t
                .keys
                .iter()
                .filter(|&&(a, k, _)| a == is_addr && k == key)
                .count()
                > 1;
            if !shared {
                let map = if is_addr {
                    &mut self.addr
                } else {
                    &mut self.exact
                };
                match map.remove(&key) {
                    Ok(()) | Err(MapError::KeyNotFound) => {}
                    Err(MapError::SyscallError(e))
                        if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(e.into()),
                }
                self.owners.remove(&(is_addr, key));
            }
            t.keys.pop();
        }
        self.tenants.remove(&slot.0);
        self.planner.remove(slot);
        Ok(())
    }

    /// The host's step at `now_ns`: in a new timeslot, the boundary (tenants' and
    /// workers' counts of the timeslot that ended, the planner's moves, every policed
    /// flag cleared); within one, policing (a tenant whose count in the timeslot passed
    /// its MAX_NB is policed until the boundary). Then every tenant row that differs from
    /// what the host wants is written, so a write the kernel refused is retried on the
    /// next tick. Tick several times per timeslot: policing lags by the interval between
    /// ticks, and happens only on ticks within a timeslot. A tick that missed timeslots
    /// spreads the counts evenly over them. The first call starts the first timeslot.
    pub fn tick(&mut self, now_ns: u64) -> Result<Tick, MapError> {
        let slot = now_ns >> self.cfg.shift;
        let mut out = Tick::default();
        let mut slots: Vec<u32> = self.tenants.keys().copied().collect();
        slots.sort_unstable();
        let mut now = Vec::with_capacity(slots.len());
        for &t in &slots {
            now.push(self.tenant_pkts.get(&t, 0)?);
        }
        let workers_now = self.worker_packets()?;
        match self.slot {
            None => {
                self.slot = Some(slot);
                for (t, n) in slots.iter().zip(&now) {
                    if let Some(a) = self.tenants.get_mut(t) {
                        a.base = *n;
                    }
                }
                self.worker_base = workers_now;
            }
            Some(cur) if slot > cur => {
                let span = slot - cur;
                let mut counts = vec![0u64; OFFLOAD_MAX_TENANTS as usize];
                for (&t, &n) in slots.iter().zip(&now) {
                    counts[t as usize] = n.wrapping_sub(self.tenants[&t].base) / span;
                }
                let loads: Vec<u64> = workers_now
                    .iter()
                    .zip(&self.worker_base)
                    .map(|(n, b)| n.wrapping_sub(*b) / span)
                    .collect();
                let plan = self.planner.boundary_with_loads(slot, &counts, &loads);
                for (&t, &n) in slots.iter().zip(&now) {
                    if let Some(a) = self.tenants.get_mut(&t) {
                        a.base = n;
                        a.policed = false;
                    }
                }
                self.worker_base = workers_now;
                self.events
                    .extend(plan.moves.iter().map(|m| Event::Migration {
                        tenant: m.tenant,
                        from: m.from,
                        to: m.to,
                        slot,
                    }));
                self.events
                    .extend(plan.overloads.iter().map(|o| Event::Overload {
                        worker: o.worker,
                        slot: o.slot,
                    }));
                self.slot = Some(slot);
                out.boundary = Some(plan);
            }
            Some(_) => {
                for (&t, &n) in slots.iter().zip(&now) {
                    let Some(a) = self.tenants.get_mut(&t) else {
                        continue;
                    };
                    if a.max_nb != 0 && !a.policed && n.wrapping_sub(a.base) > a.max_nb {
                        a.policed = true;
                        out.policed.push(TenantSlot(t));
                    }
                }
            }
        }
        self.sync_rows(&slots)?;
        Ok(out)
    }

    /// Writes every admitted tenant's row that differs from the host's view (its
    /// worker, its policed flag).
    fn sync_rows(&mut self, slots: &[u32]) -> Result<(), MapError> {
        for &t in slots {
            let Some(a) = self.tenants.get(&t) else {
                continue;
            };
            let want = OffTenant {
                worker: self
                    .planner
                    .worker_of(TenantSlot(t))
                    .map_or(0, |w| u32::from(w.0)),
                policed: u32::from(a.policed),
            };
            if self.written.get(&t) != Some(&want) {
                self.rows.set(t, want, 0)?;
                self.written.insert(t, want);
            }
        }
        Ok(())
    }

    /// Migrations and overload reports of the boundaries so far, oldest first.
    pub fn drain_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// The worker of tenant `slot`, as the host half placed it.
    pub fn worker_of(&self, slot: TenantSlot) -> Option<WorkerId> {
        self.tenants
            .contains_key(&slot.0)
            .then(|| self.planner.worker_of(slot))
            .flatten()
    }

    /// Tenant `slot`'s row as the program reads it: (worker, policed).
    pub fn row(&self, slot: TenantSlot) -> Result<(WorkerId, bool), MapError> {
        let r = self.rows.get(&slot.0, 0)?;
        Ok((WorkerId(r.worker as u16), r.policed != 0))
    }

    /// The program's per-worker counters (packets passed to each worker's RX queue).
    pub fn worker_packets(&self) -> Result<Vec<u64>, MapError> {
        (0..u32::from(self.n_workers))
            .map(|w| self.worker_pkts.get(&w, 0))
            .collect()
    }

    /// The program's counter of tenant `slot` (every packet classified to it, policed
    /// ones included).
    pub fn tenant_packets(&self, slot: TenantSlot) -> Result<u64, MapError> {
        self.tenant_pkts.get(&slot.0, 0)
    }

    /// The program's drop counters: (malformed, unmatched, policed).
    pub fn drops(&self) -> Result<(u64, u64, u64), MapError> {
        Ok((
            self.stats.get(&ST_MALFORMED, 0)?,
            self.stats.get(&ST_UNMATCHED, 0)?,
            self.stats.get(&ST_POLICED, 0)?,
        ))
    }

    /// Runs one frame through the program (BPF_PROG_TEST_RUN): its verdict, read from the
    /// counters it moved, and the frame as it left (DSCP tag applied).
    pub fn run(&mut self, frame: &[u8]) -> Result<(OffloadVerdict, Vec<u8>), OffloadRunError> {
        if frame.len() < 14 {
            return Err(OffloadRunError::TooShort { len: frame.len() });
        }
        let workers_before = self.worker_packets()?;
        let drops_before = self.drops()?;
        let mut slots: Vec<u32> = self.tenants.keys().copied().collect();
        slots.sort_unstable();
        let tenants_before: Vec<u64> = slots
            .iter()
            .map(|&t| self.tenant_pkts.get(&t, 0))
            .collect::<Result<_, _>>()?;
        let mut out = vec![0u8; frame.len() + 64];
        let res = {
            let prog: &Xdp = self
                .ebpf
                .program(OFFLOAD_PROGRAM_NAME)
                .ok_or(ProgramError::NotLoaded)?
                .try_into()?;
            let mut opts = TestRunOptions::new();
            opts.data_in = Some(frame);
            opts.data_out = Some(&mut out);
            prog.test_run(opts)?
        };
        out.truncate(res.data_size_out as usize);
        let tenant = slots
            .iter()
            .zip(&tenants_before)
            .find(|&(&t, &n)| self.tenant_pkts.get(&t, 0).is_ok_and(|m| m != n))
            .map(|(&t, _)| TenantSlot(t));
        let drops = self.drops()?;
        let verdict = match (res.return_value, tenant) {
            // XDP_PASS
            (2, Some(tenant)) => {
                let now = self.worker_packets()?;
                let w = (0..now.len())
                    .find(|&i| now[i] != workers_before[i])
                    .ok_or(OffloadRunError::Unexplained(res.return_value))?;
                OffloadVerdict::Pass {
                    tenant,
                    worker: WorkerId(w as u16),
                }
            }
            // XDP_DROP
            (1, Some(tenant)) if drops.2 != drops_before.2 => OffloadVerdict::Policed(tenant),
            (1, None) if drops.1 != drops_before.1 => OffloadVerdict::Unmatched,
            (1, None) if drops.0 != drops_before.0 => OffloadVerdict::Malformed,
            (r, _) => return Err(OffloadRunError::Unexplained(r)),
        };
        Ok((verdict, out))
    }
}

/// Running a frame through the offload program failed.
#[derive(Debug, thiserror::Error)]
pub enum OffloadRunError {
    /// Shorter than an Ethernet header (BPF_PROG_TEST_RUN refuses it).
    #[error("a frame of {len} bytes is shorter than an Ethernet header")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// BPF_PROG_TEST_RUN failed.
    #[error("running the offload program (BPF_PROG_TEST_RUN): {0}")]
    TestRun(#[from] ProgramError),
    /// A counter could not be read.
    #[error("reading the offload program's counters: {0}")]
    Map(#[from] MapError),
    /// The return code and the counters disagree (a program and host out of step).
    #[error("the offload program returned {0} without the counters that explain it")]
    Unexplained(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two workers of MAX_NB 10; tenants 0 (8 packets) and 1 (4) on w0, 2 (1) on w1;
    /// threshold 0.
    #[test]
    fn boundary_moves_the_first_tenant_that_fits_and_reports() {
        let mut p = OffloadPlanner::new(0);
        let (w0, w1) = (p.add_worker(10), p.add_worker(10));
        p.assign(TenantSlot(0), w0);
        p.assign(TenantSlot(1), w0);
        p.assign(TenantSlot(2), w1);
        // w0.last = 12 >= 10: overloaded. Tenant 0 (tmp 8): lowest last is w1 (1);
        // 1 + 8 < 10 -> moves (w0.last 4, w1.last 9); times(w0) 1 > 0 -> report.
        // Tenant 1: w0.last 4 < 10 -> not overloaded, times(w0) = 0. Tenant 2: w1.last
        // 9 < 10 -> times(w1) = 0.
        let plan = p.boundary(5, &[8, 4, 1]);
        assert_eq!(
            plan.moves,
            [Move {
                tenant: TenantSlot(0),
                from: w0,
                to: w1
            }]
        );
        assert_eq!(
            plan.overloads,
            [OverloadReport {
                worker: w0,
                slot: 5
            }]
        );
        assert_eq!(p.worker_of(TenantSlot(0)), Some(w1));
        // Next boundary: w1 carries 8 + 1 = 9 < 10, w0 4: nothing moves.
        let plan = p.boundary(6, &[8, 4, 1]);
        assert_eq!(plan, BoundaryPlan::default());
    }

    /// An overloaded worker whose tenant fits nowhere keeps it; `times` grows and the
    /// reports start once it exceeds the threshold; a quiet slot resets it.
    #[test]
    fn no_fit_counts_detections_and_a_quiet_slot_resets() {
        let mut p = OffloadPlanner::new(1);
        let (w0, w1) = (p.add_worker(4), p.add_worker(4));
        p.assign(TenantSlot(0), w0);
        p.assign(TenantSlot(1), w1);
        // w0.last 6 >= 4; w1.last 3: 3 + 6 < 4 fails -> stays; times 1 (not > 1).
        let plan = p.boundary(1, &[6, 3]);
        assert!(plan.moves.is_empty() && plan.overloads.is_empty());
        // Again: times 2 > 1 -> report.
        let plan = p.boundary(2, &[6, 3]);
        assert_eq!(
            plan.overloads,
            [OverloadReport {
                worker: w0,
                slot: 2
            }]
        );
        // Quiet: w0.last 0 < 4 -> times 0; then overloaded again: times 1, no report.
        assert_eq!(p.boundary(3, &[0, 3]), BoundaryPlan::default());
        assert_eq!(p.boundary(4, &[6, 3]), BoundaryPlan::default());
        // Tenant 2 joins w0. w0.last 3 + 2 >= 4 (tenant 1 idle: counts 0). Tenant 0
        // (tmp 3): w1.last 0 + 3 < 4 -> moves; times(w0) 2 > 1 -> report. Tenant 2:
        // w0.last 2 < 4 -> times 0.
        p.assign(TenantSlot(2), w0);
        let plan = p.boundary(5, &[3, 0, 2]);
        assert_eq!(
            plan.moves,
            [Move {
                tenant: TenantSlot(0),
                from: w0,
                to: w1
            }]
        );
        assert_eq!(
            plan.overloads,
            [OverloadReport {
                worker: w0,
                slot: 5
            }]
        );
    }
}
