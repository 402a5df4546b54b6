//! The Packet Dispatcher: classifier + scheduler + tagging, sans-IO.

use buffet_sdk::{L3Kind, Layout, Packet, PacketMeta, ParseError, TenantId};

use crate::classifier::{Classifier, Match, Rule, RuleError};
use crate::scheduler::{
    Planner, SchedOutcome, Scheduler, SchedulerConfig, TenantError, WorkerError,
};
use crate::tagging::{tag_dscp, MAX_DSCP};
use crate::{TenantSlot, WorkerId};

/// Events kept for [`Dispatcher::drain_events`] at most; beyond that new events are
/// counted in [`DispatchStats::events_lost`] and dropped, so a caller that never drains
/// cannot make the dispatcher grow without bound.
pub const MAX_PENDING_EVENTS: usize = 1 << 16;

/// Whether passed packets get the tenant tagged into them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TagMode {
    /// Leave the bytes alone.
    #[default]
    None,
    /// Write the tenant's slot into the DSCP bits (IPv4 checksum fixed). Only slots
    /// 0..=63 can then be admitted.
    Dscp,
}

/// What to do with packets no rule matches. They are counted either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnmatchedPolicy {
    /// Drop them.
    #[default]
    Drop,
    /// Treat them as this tenant's (dropped as unmatched while no such tenant exists).
    ToTenant(TenantSlot),
}

/// Dispatcher parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatcherConfig {
    /// Timeslot scheduler parameters.
    pub sched: SchedulerConfig,
    /// Tagging of passed packets.
    pub tag: TagMode,
    /// Unmatched packets.
    pub unmatched: UnmatchedPolicy,
    /// The scheduler's planner: Algorithm 1 alone (the default) or ours at every timeslot
    /// boundary (see [`crate::scheduler`]).
    pub planner: Planner,
}

/// Why a packet was dropped by the dispatcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DispatchDrop {
    /// The frame could not be parsed.
    Malformed(ParseError),
    /// No rule matched (or the tag named no admitted tenant).
    Unmatched,
    /// The tenant exceeded its per-slot budget.
    Policed(TenantSlot),
    /// The tenant's worker is gone and no worker is live.
    NoLiveWorker,
}

/// The dispatcher's answer for one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Hand the packet to `worker`, for `tenant`.
    Pass {
        /// The chosen worker.
        worker: WorkerId,
        /// The tenant it belongs to.
        tenant: TenantSlot,
    },
    /// Drop it.
    Drop(DispatchDrop),
}

impl Decision {
    /// True for a pass.
    pub fn is_pass(self) -> bool {
        matches!(self, Decision::Pass { .. })
    }

    /// The worker, for a pass.
    pub fn worker(self) -> Option<WorkerId> {
        match self {
            Decision::Pass { worker, .. } => Some(worker),
            Decision::Drop(_) => None,
        }
    }
}

/// Something the control plane should hear about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A tenant moved workers (the packet that moved it already went to `to`).
    Migration {
        /// The tenant.
        tenant: TenantSlot,
        /// Its old worker.
        from: WorkerId,
        /// Its new worker.
        to: WorkerId,
        /// The slot it happened in.
        slot: u64,
    },
    /// A worker stayed overloaded beyond the threshold (the paper's report to the Agent).
    Overload {
        /// The worker.
        worker: WorkerId,
        /// The slot of the detection.
        slot: u64,
    },
}

/// Why the Packet Dispatcher refused to admit or remove a tenant. On error nothing
/// changed. Tenant ids are not the dispatcher's business: it knows tenants by the slot
/// the tenant registry gave them, and duplicate ids are refused there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// The slot is taken.
    #[error("{0} is already occupied")]
    DuplicateSlot(TenantSlot),
    /// A rule is invalid.
    #[error("rule {index}: {source}")]
    InvalidRule {
        /// Position of the rule in the list given.
        index: usize,
        /// What is wrong with it.
        source: RuleError,
    },
    /// DSCP tagging carries 6 bits: slots above 63 cannot be tagged.
    #[error("{0} cannot be tagged into DSCP (at most 63)")]
    SlotNotTaggable(TenantSlot),
    /// No tenant in this slot.
    #[error("no tenant in {0}")]
    UnknownTenant(TenantSlot),
    /// The scheduler refused the placement.
    #[error(transparent)]
    Placement(TenantError),
}

/// Dispatcher counters. Every packet lands in exactly one of: a `malformed` reason,
/// `unmatched` (when dropped), `policed`, `no_live_worker`, `passes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Malformed frames per reason, indexed by [`ParseError::index`].
    pub malformed: [u64; ParseError::ALL.len()],
    /// Packets no rule matched (including those sent on by
    /// [`UnmatchedPolicy::ToTenant`]), and tags naming no admitted tenant.
    pub unmatched: u64,
    /// Of `unmatched`, those dropped.
    pub unmatched_dropped: u64,
    /// Policed packets per tenant slot (reset when a slot is admitted).
    pub policed: Vec<u64>,
    /// Passed packets per worker.
    pub passes: Vec<u64>,
    /// Packets dropped because no worker was live.
    pub no_live_worker: u64,
    /// Migrations made.
    pub migrations: u64,
    /// Overload reports raised.
    pub overloads: u64,
    /// Events dropped because [`MAX_PENDING_EVENTS`] were pending.
    pub events_lost: u64,
}

impl DispatchStats {
    /// Malformed frames of one reason.
    pub fn malformed_of(&self, e: ParseError) -> u64 {
        self.malformed[e.index()]
    }

    /// Malformed frames, all reasons.
    pub fn malformed_total(&self) -> u64 {
        self.malformed.iter().sum()
    }

    /// Policed packets of a slot.
    pub fn policed_of(&self, slot: TenantSlot) -> u64 {
        self.policed.get(slot.index()).copied().unwrap_or(0)
    }

    /// Passed packets of a worker.
    pub fn passes_of(&self, w: WorkerId) -> u64 {
        self.passes.get(w.index()).copied().unwrap_or(0)
    }
}

/// Classifier + scheduler + tagging. See the crate docs.
#[derive(Debug)]
pub struct Dispatcher {
    cfg: DispatcherConfig,
    classifier: Classifier,
    sched: Scheduler,
    events: Vec<Event>,
    stats: DispatchStats,
}

impl Dispatcher {
    /// A dispatcher with no workers and no tenants.
    pub fn new(cfg: DispatcherConfig) -> Self {
        Dispatcher {
            cfg,
            classifier: Classifier::new(),
            sched: {
                let mut s = Scheduler::new(cfg.sched);
                s.set_planner(cfg.planner);
                s
            },
            events: Vec::with_capacity(256),
            stats: DispatchStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> DispatcherConfig {
        self.cfg
    }

    /// Adds a live worker of capacity `max_nb` packets per slot (callers validate it is
    /// above 0; see [`Scheduler::add_worker`], including its panic beyond 65 536).
    pub fn add_worker(&mut self, max_nb: u64) -> WorkerId {
        let w = self.sched.add_worker(max_nb);
        self.stats.passes.resize(self.sched.worker_count(), 0);
        w
    }

    /// Stops a worker, moving its tenants to live workers; returns the moves (see
    /// [`Scheduler::terminate_worker`]).
    pub fn terminate_worker(&mut self, w: WorkerId) -> Vec<(TenantSlot, WorkerId)> {
        self.sched.terminate_worker(w)
    }

    /// Marks a worker live or not (see [`Scheduler::set_worker_live`]); returns the
    /// tenant moves it caused.
    pub fn set_worker_live(
        &mut self,
        w: WorkerId,
        live: bool,
    ) -> Result<Vec<(TenantSlot, WorkerId)>, WorkerError> {
        self.sched.set_worker_live(w, live)
    }

    /// Changes a worker's capacity (packets per slot).
    pub fn set_worker_max(&mut self, w: WorkerId, max_nb: u64) -> Result<(), WorkerError> {
        self.sched.set_worker_max(w, max_nb)
    }

    /// Moves a tenant to a live worker (a planner's decision).
    pub fn assign(&mut self, slot: TenantSlot, worker: WorkerId) -> Result<(), TenantError> {
        self.sched.assign(slot, worker)
    }

    /// Changes a tenant's per-slot budget (0: unlimited).
    pub fn set_tenant_max(&mut self, slot: TenantSlot, max_nb: u64) -> Result<(), TenantError> {
        self.sched.set_tenant_max(slot, max_nb)
    }

    /// Admits a tenant with its classifier rules `(priority, match)` and per-slot budget
    /// `max_nb` (0: unlimited) on the live worker with the fewest tenants (ties: lowest
    /// id). Returns that worker. On error nothing changed.
    pub fn admit(
        &mut self,
        slot: TenantSlot,
        rules: Vec<(u32, Match)>,
        max_nb: u64,
    ) -> Result<WorkerId, DispatchError> {
        let worker = self
            .sched
            .spread_choice()
            .ok_or(DispatchError::Placement(TenantError::NoLiveWorker));
        self.admit_inner(slot, rules, max_nb, worker)
    }

    /// [`Dispatcher::admit`] on a given worker.
    pub fn admit_on(
        &mut self,
        slot: TenantSlot,
        rules: Vec<(u32, Match)>,
        max_nb: u64,
        worker: WorkerId,
    ) -> Result<WorkerId, DispatchError> {
        self.admit_inner(slot, rules, max_nb, Ok(worker))
    }

    fn admit_inner(
        &mut self,
        slot: TenantSlot,
        rules: Vec<(u32, Match)>,
        max_nb: u64,
        worker: Result<WorkerId, DispatchError>,
    ) -> Result<WorkerId, DispatchError> {
        // Validate everything first: from here on nothing may fail.
        match self.sched.check_new_slot(slot) {
            Err(TenantError::DuplicateSlot(s)) => return Err(DispatchError::DuplicateSlot(s)),
            Err(e) => return Err(DispatchError::Placement(e)),
            Ok(()) => {}
        }
        if self.cfg.tag == TagMode::Dscp && slot.0 > u32::from(MAX_DSCP) {
            return Err(DispatchError::SlotNotTaggable(slot));
        }
        for (index, (_, m)) in rules.iter().enumerate() {
            m.validate()
                .map_err(|source| DispatchError::InvalidRule { index, source })?;
        }
        let worker = worker?;
        self.sched
            .check_live(worker)
            .map_err(DispatchError::Placement)?;

        self.sched
            .add_tenant(slot, worker, max_nb)
            .map_err(DispatchError::Placement)?;
        for (priority, fields) in rules {
            let inserted = self.classifier.insert(Rule {
                priority,
                tenant: slot,
                fields,
            });
            if let Err(e) = inserted {
                // Unreachable: validated above. Undo anyway, so the promise holds.
                self.classifier.remove_tenant(slot);
                let _ = self.sched.remove_tenant(slot);
                return Err(DispatchError::InvalidRule {
                    index: 0,
                    source: e,
                });
            }
        }
        let i = slot.index();
        if self.stats.policed.len() <= i {
            self.stats.policed.resize(i + 1, 0);
        }
        self.stats.policed[i] = 0;
        Ok(worker)
    }

    /// Replaces an admitted tenant's classifier rules and per-slot budget in one step:
    /// every new rule is validated first, and on error nothing changed. The tenant keeps
    /// its slot, its worker and its Load Monitor counters; from the next packet on, only
    /// the new rules classify to it.
    pub fn replace_rules(
        &mut self,
        slot: TenantSlot,
        rules: Vec<(u32, Match)>,
        max_nb: u64,
    ) -> Result<(), DispatchError> {
        if !self.has_tenant(slot) {
            return Err(DispatchError::UnknownTenant(slot));
        }
        for (index, (_, m)) in rules.iter().enumerate() {
            m.validate()
                .map_err(|source| DispatchError::InvalidRule { index, source })?;
        }
        self.sched
            .set_tenant_max(slot, max_nb)
            .map_err(DispatchError::Placement)?;
        self.classifier.remove_tenant(slot);
        for (index, (priority, fields)) in rules.into_iter().enumerate() {
            // Validated above: cannot fail.
            self.classifier
                .insert(Rule {
                    priority,
                    tenant: slot,
                    fields,
                })
                .map_err(|source| DispatchError::InvalidRule { index, source })?;
        }
        Ok(())
    }

    /// Removes a tenant: its rules and its Load Monitor row.
    pub fn remove(&mut self, slot: TenantSlot) -> Result<(), DispatchError> {
        self.sched
            .remove_tenant(slot)
            .map_err(|_| DispatchError::UnknownTenant(slot))?;
        self.classifier.remove_tenant(slot);
        Ok(())
    }

    /// Parses, classifies, schedules and (per [`TagMode`]) tags one frame that arrived
    /// on `in_port` at `ts_ns`. Never allocates (events go to a reused, bounded buffer)
    /// and never panics.
    pub fn dispatch(&mut self, ts_ns: u64, in_port: u16, frame: &mut [u8]) -> Decision {
        self.dispatch_with_layout(ts_ns, in_port, frame).0
    }

    /// [`dispatch`](Self::dispatch), also returning the header [`Layout`] found while
    /// parsing (for every frame that parsed, passed or not), so the worker can rebuild the
    /// packet with [`Packet::from_layout`] instead of parsing it again. Tagging changes no
    /// offsets, so the layout stays valid for the tagged bytes.
    pub fn dispatch_with_layout(
        &mut self,
        ts_ns: u64,
        in_port: u16,
        frame: &mut [u8],
    ) -> (Decision, Option<Layout>) {
        let meta = PacketMeta {
            in_port,
            ts_ns,
            tenant: TenantId::default(),
        };
        let (class, layout, l3, is_v4) = match Packet::parse(frame, meta) {
            Err(e) => {
                self.stats.malformed[e.index()] += 1;
                return (Decision::Drop(DispatchDrop::Malformed(e)), None);
            }
            Ok(pkt) => (
                self.classifier.classify(&pkt),
                pkt.layout(),
                pkt.l3_offset(),
                pkt.l3_kind() == L3Kind::Ipv4,
            ),
        };
        let slot = match (class, self.cfg.unmatched) {
            (Some(s), _) => s,
            (None, UnmatchedPolicy::ToTenant(s)) if self.has_tenant(s) => {
                self.stats.unmatched += 1;
                s
            }
            (None, _) => {
                self.stats.unmatched += 1;
                self.stats.unmatched_dropped += 1;
                return (Decision::Drop(DispatchDrop::Unmatched), Some(layout));
            }
        };
        let d = self.schedule_tagged(ts_ns, slot);
        if let (Decision::Pass { tenant, .. }, TagMode::Dscp) = (d, self.cfg.tag) {
            // Admission keeps slots within 0..=63 in this mode, and parsing checked the
            // IP header fits, so this cannot fail; a failure would leave the bytes as
            // they were, which a worker re-classifies.
            let _ = tag_dscp(frame, l3, is_v4, tenant.0 as u8);
        }
        (d, Some(layout))
    }

    /// Schedules a packet of tenant `slot` (classified elsewhere, e.g. tagged by the NIC)
    /// arriving at `ts_ns`. An unadmitted slot counts and drops as unmatched.
    pub fn schedule_tagged(&mut self, ts_ns: u64, slot: TenantSlot) -> Decision {
        let outcome = self.sched.schedule(ts_ns, slot);
        if self.sched.has_planned() {
            self.report_planned(ts_ns);
        }
        match outcome {
            SchedOutcome::Pass {
                worker,
                migrated_from,
                overload,
            } => {
                if let Some(from) = migrated_from {
                    self.stats.migrations += 1;
                    let slot_no = self.sched.timeslot_of(ts_ns);
                    self.push_event(Event::Migration {
                        tenant: slot,
                        from,
                        to: worker,
                        slot: slot_no,
                    });
                }
                if let Some(r) = overload {
                    self.stats.overloads += 1;
                    self.push_event(Event::Overload {
                        worker: r.worker,
                        slot: r.slot,
                    });
                }
                if let Some(n) = self.stats.passes.get_mut(worker.index()) {
                    *n += 1;
                }
                Decision::Pass {
                    worker,
                    tenant: slot,
                }
            }
            SchedOutcome::Policed => {
                if let Some(n) = self.stats.policed.get_mut(slot.index()) {
                    *n += 1;
                }
                Decision::Drop(DispatchDrop::Policed(slot))
            }
            SchedOutcome::NoLiveWorker => {
                self.stats.no_live_worker += 1;
                Decision::Drop(DispatchDrop::NoLiveWorker)
            }
            SchedOutcome::UnknownTenant => {
                self.stats.unmatched += 1;
                self.stats.unmatched_dropped += 1;
                Decision::Drop(DispatchDrop::Unmatched)
            }
        }
    }

    /// Counts and reports the moves the slot-boundary planner just made (cold: once per
    /// timeslot at most).
    #[cold]
    fn report_planned(&mut self, ts_ns: u64) {
        let slot_no = self.sched.timeslot_of(ts_ns);
        let moves: Vec<_> = self.sched.take_planned().collect();
        for (tenant, from, to) in moves {
            self.stats.migrations += 1;
            self.push_event(Event::Migration {
                tenant,
                from,
                to,
                slot: slot_no,
            });
        }
    }

    fn push_event(&mut self, e: Event) {
        if self.events.len() < MAX_PENDING_EVENTS {
            self.events.push(e);
        } else {
            self.stats.events_lost += 1;
        }
    }

    /// Takes the pending events, oldest first. The buffer is kept for reuse.
    pub fn drain_events(&mut self) -> impl Iterator<Item = Event> + '_ {
        self.events.drain(..)
    }

    /// Counters.
    pub fn stats(&self) -> &DispatchStats {
        &self.stats
    }

    /// The scheduler (Tenant and Worker Tables), read-only.
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// The classifier, read-only.
    pub fn classifier(&self) -> &Classifier {
        &self.classifier
    }

    /// Whether a tenant is admitted in `slot`.
    pub fn has_tenant(&self, slot: TenantSlot) -> bool {
        self.sched.tenant(slot).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classifier::PortRange;
    use crate::tagging::read_dscp;
    use etherparse::{Ipv4Header, PacketBuilder};

    /// An IPv4/UDP frame to `dst_port` with DSCP 0.
    fn udp(dst_port: u16) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(4000, dst_port)
            .write(&mut v, b"payload")
            .unwrap();
        v
    }

    fn port(p: u16) -> Vec<(u32, Match)> {
        vec![(
            10,
            Match {
                dst_port: Some(PortRange::single(p)),
                ..Match::default()
            },
        )]
    }

    fn cfg(tag: TagMode) -> DispatcherConfig {
        DispatcherConfig {
            sched: SchedulerConfig {
                shift: 0,
                threshold: 0,
            },
            tag,
            unmatched: UnmatchedPolicy::Drop,
            planner: Planner::Greedy,
        }
    }

    #[test]
    fn malformed_frames_are_counted_by_reason() {
        let mut d = Dispatcher::new(DispatcherConfig::default());
        d.add_worker(100);
        let good = udp(80);
        let mut cases: Vec<(Vec<u8>, ParseError)> = vec![
            (good[..5].to_vec(), ParseError::TruncatedEthernet),
            (good[..20].to_vec(), ParseError::TruncatedIp),
        ];
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        cases.push((arp, ParseError::UnsupportedEtherType));
        let mut long = good.clone();
        long[16] = 0xff; // IPv4 total length beyond the buffer
        cases.push((long, ParseError::LengthBeyondBuffer));
        cases.push((good[..5].to_vec(), ParseError::TruncatedEthernet));
        for (mut f, why) in cases {
            assert_eq!(
                d.dispatch(0, 0, &mut f),
                Decision::Drop(DispatchDrop::Malformed(why))
            );
        }
        let st = d.stats();
        assert_eq!(st.malformed_of(ParseError::TruncatedEthernet), 2);
        assert_eq!(st.malformed_of(ParseError::TruncatedIp), 1);
        assert_eq!(st.malformed_of(ParseError::UnsupportedEtherType), 1);
        assert_eq!(st.malformed_of(ParseError::LengthBeyondBuffer), 1);
        assert_eq!(st.malformed_total(), 5);
        assert_eq!(st.unmatched, 0);
        assert_eq!(st.passes_of(WorkerId(0)), 0);
    }

    #[test]
    fn unmatched_is_counted_and_dropped_or_redirected() {
        let mut d = Dispatcher::new(DispatcherConfig::default());
        d.add_worker(100);
        d.admit(TenantSlot(0), port(80), 0).unwrap();
        assert_eq!(
            d.dispatch(0, 0, &mut udp(81)),
            Decision::Drop(DispatchDrop::Unmatched)
        );
        assert_eq!(
            d.dispatch(0, 0, &mut udp(80)),
            Decision::Pass {
                worker: WorkerId(0),
                tenant: TenantSlot(0)
            }
        );
        // A tag naming no tenant is unmatched too.
        assert_eq!(
            d.schedule_tagged(0, TenantSlot(5)),
            Decision::Drop(DispatchDrop::Unmatched)
        );
        assert_eq!((d.stats().unmatched, d.stats().unmatched_dropped), (2, 2));

        let mut d = Dispatcher::new(DispatcherConfig {
            unmatched: UnmatchedPolicy::ToTenant(TenantSlot(1)),
            ..DispatcherConfig::default()
        });
        d.add_worker(100);
        // The default tenant is not admitted yet: dropped.
        assert_eq!(
            d.dispatch(0, 0, &mut udp(81)),
            Decision::Drop(DispatchDrop::Unmatched)
        );
        d.admit(TenantSlot(1), vec![], 0).unwrap();
        assert_eq!(
            d.dispatch(0, 0, &mut udp(81)),
            Decision::Pass {
                worker: WorkerId(0),
                tenant: TenantSlot(1)
            }
        );
        assert_eq!((d.stats().unmatched, d.stats().unmatched_dropped), (2, 1));
    }

    /// Everything observable about a dispatcher's tenants, for "nothing changed".
    fn snapshot(d: &Dispatcher) -> String {
        format!(
            "{:?} {} {:?}",
            d.scheduler().tenants().collect::<Vec<_>>(),
            d.classifier().len(),
            (0..4)
                .map(|i| d.has_tenant(TenantSlot(i)))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn admit_errors_change_nothing() {
        let mut d = Dispatcher::new(cfg(TagMode::Dscp));
        assert_eq!(
            d.admit(TenantSlot(0), port(80), 0),
            Err(DispatchError::Placement(TenantError::NoLiveWorker))
        );
        let w0 = d.add_worker(100);
        let w1 = d.add_worker(100);
        assert_eq!(d.admit(TenantSlot(0), port(80), 0), Ok(w0));
        let before = snapshot(&d);
        let bad_rules = vec![
            (1, Match::default()),
            (
                2,
                Match {
                    dscp: Some(99),
                    ..Match::default()
                },
            ),
        ];
        let errors = [
            (
                d.admit(TenantSlot(0), port(81), 0),
                DispatchError::DuplicateSlot(TenantSlot(0)),
            ),
            (
                d.admit(TenantSlot(1), bad_rules, 0),
                DispatchError::InvalidRule {
                    index: 1,
                    source: RuleError::DscpOutOfRange(99),
                },
            ),
            (
                d.admit(TenantSlot(64), port(81), 0),
                DispatchError::SlotNotTaggable(TenantSlot(64)),
            ),
            (
                d.admit_on(TenantSlot(1), port(81), 0, WorkerId(9)),
                DispatchError::Placement(TenantError::UnknownWorker(WorkerId(9))),
            ),
            (
                d.remove(TenantSlot(3)).map(|()| w0),
                DispatchError::UnknownTenant(TenantSlot(3)),
            ),
        ];
        for (got, want) in errors {
            assert_eq!(got, Err(want));
            assert_eq!(snapshot(&d), before);
        }
        d.terminate_worker(w1);
        assert_eq!(
            d.admit_on(TenantSlot(1), port(81), 0, w1),
            Err(DispatchError::Placement(TenantError::WorkerNotLive(w1)))
        );
        assert_eq!(snapshot(&d), before);
        // The error message names the rule.
        let e = DispatchError::InvalidRule {
            index: 1,
            source: RuleError::DscpOutOfRange(99),
        };
        assert_eq!(e.to_string(), "rule 1: DSCP 99 exceeds 63");
    }

    #[test]
    fn admit_spreads_and_remove_forgets() {
        let mut d = Dispatcher::new(DispatcherConfig::default());
        for _ in 0..3 {
            d.add_worker(1000);
        }
        let placed: Vec<_> = (0..5)
            .map(|i| d.admit(TenantSlot(i), port(80 + i as u16), 0).unwrap().0)
            .collect();
        assert_eq!(placed, [0, 1, 2, 0, 1]);
        assert!(d.has_tenant(TenantSlot(3)));
        d.remove(TenantSlot(3)).unwrap();
        assert!(!d.has_tenant(TenantSlot(3)));
        assert_eq!(
            d.dispatch(0, 0, &mut udp(83)),
            Decision::Drop(DispatchDrop::Unmatched)
        );
        // The slot can be reused. Tenants per worker now: w0 1 (tenant 0),
        // w1 2, w2 1 -> fewest, tie -> lowest id: w0.
        assert_eq!(d.admit(TenantSlot(3), port(83), 0), Ok(WorkerId(0)));
        assert!(d.dispatch(0, 0, &mut udp(83)).is_pass());
    }

    #[test]
    fn replace_rules_swaps_all_or_nothing() {
        let mut d = Dispatcher::new(DispatcherConfig::default());
        d.add_worker(1000);
        d.admit(TenantSlot(1), port(80), 0).unwrap();
        assert!(d.dispatch(0, 0, &mut udp(80)).is_pass());
        // An invalid second rule: nothing changes.
        let mut bad = port(81);
        bad.push((
            10,
            Match {
                dscp: Some(99),
                ..Match::default()
            },
        ));
        assert!(matches!(
            d.replace_rules(TenantSlot(1), bad, 0),
            Err(DispatchError::InvalidRule { index: 1, .. })
        ));
        assert!(d.dispatch(0, 0, &mut udp(80)).is_pass());
        assert_eq!(
            d.dispatch(0, 0, &mut udp(81)),
            Decision::Drop(DispatchDrop::Unmatched)
        );
        assert_eq!(
            d.replace_rules(TenantSlot(2), port(81), 0),
            Err(DispatchError::UnknownTenant(TenantSlot(2)))
        );
        // The swap: the new port classifies to the tenant, the old one no longer does,
        // and the new budget polices.
        d.replace_rules(TenantSlot(1), port(81), 1).unwrap();
        assert_eq!(
            d.dispatch(0, 0, &mut udp(80)),
            Decision::Drop(DispatchDrop::Unmatched)
        );
        assert!(d.dispatch(1 << 40, 0, &mut udp(81)).is_pass());
        assert!(!d.dispatch(1 << 40, 0, &mut udp(81)).is_pass());
    }

    #[test]
    fn the_layout_of_the_one_parse_travels_with_the_decision() {
        let mut d = Dispatcher::new(cfg(TagMode::Dscp));
        d.add_worker(100);
        d.admit(TenantSlot(5), port(80), 0).unwrap();
        let mut f = udp(80);
        let (decision, layout) = d.dispatch_with_layout(7, 3, &mut f);
        assert!(decision.is_pass());
        // Tagged in place, and the layout still describes the tagged bytes.
        assert_eq!(read_dscp(&f, 14, true), Ok(5));
        let meta = PacketMeta {
            in_port: 3,
            ts_ns: 7,
            tenant: TenantId::default(),
        };
        let len = f.len();
        let fresh = Packet::parse(&mut f.clone(), meta).unwrap().layout();
        assert_eq!(layout, Some(fresh));
        let p = Packet::from_layout(&mut f, len, meta, fresh).unwrap();
        assert_eq!(p.ports(), Some((4000, 80)));
        // Unmatched frames parsed too; malformed ones have no layout.
        assert!(d.dispatch_with_layout(7, 3, &mut udp(81)).1.is_some());
        assert_eq!(d.dispatch_with_layout(7, 3, &mut [0u8; 10]).1, None);
    }

    #[test]
    fn end_to_end_policing_migration_overload_and_tagging() {
        let mut d = Dispatcher::new(cfg(TagMode::Dscp));
        let w0 = d.add_worker(2);
        let w1 = d.add_worker(10);
        d.admit_on(TenantSlot(5), port(80), 3, w0).unwrap();
        d.admit_on(TenantSlot(6), port(81), 0, w0).unwrap();
        let pass = |w: WorkerId, t: u32| Decision::Pass {
            worker: w,
            tenant: TenantSlot(t),
        };
        // Slot 0: tenant 5 sends 4 (budget 3: the 4th is policed), tenant 6 sends 1;
        // w0 carries 3 + 1 = 4 packets.
        for _ in 0..3 {
            assert_eq!(d.dispatch(0, 0, &mut udp(80)), pass(w0, 5));
        }
        assert_eq!(
            d.dispatch(0, 0, &mut udp(80)),
            Decision::Drop(DispatchDrop::Policed(TenantSlot(5)))
        );
        assert_eq!(d.dispatch(0, 0, &mut udp(81)), pass(w0, 6));
        // Slot 1: tenant 5 first: tmp 4, w0.last 4 >= 2 -> overload; w1.last 0;
        // 0 + 4 < 10 -> migrate to w1 (w0.last 0, w1.last 4); times 1 > threshold 0 ->
        // overload report (w0, 1).
        let mut f = udp(80);
        assert_eq!(d.dispatch(1, 0, &mut f), pass(w1, 5));
        // Tagged: DSCP = slot 5, checksum still right.
        assert_eq!(read_dscp(&f, 14, true), Ok(5));
        let (h, _) = Ipv4Header::from_slice(&f[14..]).unwrap();
        assert_eq!(h.header_checksum, h.calc_header_checksum());
        // Tenant 6: tmp 1, w0.last 0 < 2 -> times 0, stays.
        assert_eq!(d.dispatch(1, 0, &mut udp(81)), pass(w0, 6));
        let events: Vec<Event> = d.drain_events().collect();
        assert_eq!(
            events,
            [
                Event::Migration {
                    tenant: TenantSlot(5),
                    from: w0,
                    to: w1,
                    slot: 1
                },
                Event::Overload {
                    worker: w0,
                    slot: 1
                }
            ]
        );
        assert_eq!(d.drain_events().count(), 0);
        let st = d.stats();
        assert_eq!(st.policed_of(TenantSlot(5)), 1);
        assert_eq!(st.policed_of(TenantSlot(6)), 0);
        assert_eq!((st.passes_of(w0), st.passes_of(w1)), (5, 1));
        assert_eq!((st.migrations, st.overloads), (1, 1));
        // Dropped frames are not tagged.
        let mut dropped = udp(99);
        let orig = dropped.clone();
        d.dispatch(1, 0, &mut dropped);
        assert_eq!(dropped, orig);
    }

    #[test]
    fn terminated_workers_get_nothing() {
        let mut d = Dispatcher::new(DispatcherConfig::default());
        let w0 = d.add_worker(100);
        let w1 = d.add_worker(100);
        d.admit_on(TenantSlot(0), port(80), 0, w0).unwrap();
        assert_eq!(d.terminate_worker(w0), [(TenantSlot(0), w1)]);
        assert_eq!(
            d.dispatch(0, 0, &mut udp(80)),
            Decision::Pass {
                worker: w1,
                tenant: TenantSlot(0)
            }
        );
        assert_eq!(d.terminate_worker(w1), []);
        assert_eq!(
            d.dispatch(0, 0, &mut udp(80)),
            Decision::Drop(DispatchDrop::NoLiveWorker)
        );
        assert_eq!(d.stats().no_live_worker, 1);
        assert_eq!(d.set_worker_live(w0, true), Ok(vec![(TenantSlot(0), w0)]));
        assert_eq!(
            d.schedule_tagged(0, TenantSlot(0)),
            Decision::Pass {
                worker: w0,
                tenant: TenantSlot(0)
            }
        );
    }

    #[test]
    fn garbage_frames_never_panic() {
        let mut d = Dispatcher::new(cfg(TagMode::Dscp));
        d.add_worker(5);
        d.add_worker(5);
        for t in 0..8u32 {
            d.admit(TenantSlot(t), port(80 + t as u16), 3).unwrap();
        }
        let good = udp(80);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut passes = 0;
        for i in 0..30_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Mutate a few bytes of a good frame, sometimes truncate it.
            let mut f = good.clone();
            for k in 0..(seed % 4) {
                let at = ((seed >> (8 * k + 3)) as usize) % f.len();
                f[at] = (seed >> (8 * k + 11)) as u8;
            }
            if seed & 0x100 != 0 {
                f.truncate((seed >> 20) as usize % (f.len() + 1));
            }
            if d.dispatch(i / 7, (seed >> 40) as u16 % 2, &mut f).is_pass() {
                passes += 1;
            }
        }
        let st = d.stats();
        let policed: u64 = st.policed.iter().sum();
        let passed: u64 = st.passes.iter().sum();
        assert_eq!(passed, passes);
        assert_eq!(
            st.malformed_total() + st.unmatched_dropped + policed + st.no_live_worker + passed,
            30_000,
            "every frame is accounted for exactly once"
        );
        assert!(passes > 0 && st.malformed_total() > 0);
    }

    #[test]
    fn pending_events_are_bounded() {
        let mut d = Dispatcher::new(cfg(TagMode::None));
        let w0 = d.add_worker(0); // always overloaded, threshold 0: one report per slot
        d.admit_on(TenantSlot(0), vec![], 0, w0).unwrap();
        let n = MAX_PENDING_EVENTS as u64 + 10;
        for ts in 0..n {
            d.schedule_tagged(ts, TenantSlot(0));
        }
        assert_eq!(d.stats().overloads, n);
        assert_eq!(d.stats().events_lost, 10);
        assert_eq!(d.drain_events().count(), MAX_PENDING_EVENTS);
    }
}
