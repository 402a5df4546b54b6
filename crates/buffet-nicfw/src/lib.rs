//! The host build of `nic-firmware/common`, the dispatcher core in portable C that the
//! XDP program and the Netronome Micro-C plugin include, behind a safe Rust API.
//!
//! What it does: [`CScheduler`] runs the C scheduler step (the Buffet paper's
//! Algorithm 1, exactly as docs/scheduler.md specifies it) over Tenant Table and Worker
//! Table arrays it owns; [`tag_dscp`] and [`checksum_update`] are the C DSCP tag with the
//! RFC 1624 checksum fix; [`extract_key`] is the C key extraction (Ethernet, one VLAN
//! tag, IPv4/IPv6, TCP/UDP ports). Results use `buffet-dispatch`'s and `buffet-sdk`'s
//! types, so they compare directly with the Rust reference (tests/equivalence.rs, and
//! `buffet trace --engine c`).
//!
//! What it does not do: classify by rules, place tenants (spread placement and worker
//! evacuation are control-plane work of the Rust [`Scheduler`]), or run in the NIC. It
//! exists to prove the C core equal to the Rust dispatcher on the host.
//!
//! The C code is compiled by build.rs with `-ffreestanding` (no libc). All FFI is in the
//! private `sys` module.
//!
//! [`Scheduler`]: buffet_dispatch::scheduler::Scheduler
#![deny(unsafe_code)]

pub mod abi;
mod sys;

use buffet_dispatch::scheduler::{
    OverloadReport, SchedOutcome, SchedulerConfig, TenantError, WorkerError, MAX_TENANT_SLOTS,
};
use buffet_dispatch::{TagError, TenantSlot, WorkerId};
use buffet_sdk::ParseError;

/// The C scheduler: the Tenant Table and Worker Table rows `nic-firmware/common` works
/// on, and its parameters.
#[derive(Clone, Debug, Default)]
pub struct CScheduler {
    cfg: SchedulerConfig,
    tenants: Vec<sys::TenantRow>,
    workers: Vec<sys::WorkerRow>,
}

/// A tenant's row as the C core holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CTenantRow {
    /// The worker its packets go to.
    pub worker: WorkerId,
    /// The timeslot of its last packet; `None` before its first.
    pub cur_slot: Option<u64>,
    /// Packets (passed and policed) in `cur_slot`.
    pub pkt_nb: u64,
    /// MAX_NB per timeslot (0: unlimited).
    pub max_nb: u64,
}

/// A Worker Table row as the C core holds it (rolled lazily, as in the Rust scheduler).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CWorkerRow {
    /// The timeslot the counters refer to; `None` before the first roll.
    pub cur_slot: Option<u64>,
    /// Packets passed in `cur_slot`.
    pub pkt_nb: u64,
    /// Previous timeslot's packets, as adjusted by migrations.
    pub last_nb: u64,
    /// MAX_NB per timeslot.
    pub max_nb: u64,
    /// Consecutive overload detections.
    pub times: u32,
}

impl CScheduler {
    /// An empty scheduler: no workers, no tenants.
    pub fn new(cfg: SchedulerConfig) -> Self {
        CScheduler {
            cfg,
            ..CScheduler::default()
        }
    }

    /// The configuration.
    pub fn config(&self) -> SchedulerConfig {
        self.cfg
    }

    /// The timeslot of a timestamp, computed by the C core (`ts_ns >> shift`, 0 when
    /// `shift >= 64`).
    pub fn timeslot_of(&self, ts_ns: u64) -> u64 {
        sys::timeslot(ts_ns, self.cfg.shift)
    }

    /// Adds a live worker with MAX_NB `max_nb` (taken literally: 0 is always overloaded).
    pub fn add_worker(&mut self, max_nb: u64) -> Result<WorkerId, WorkerError> {
        let id = u16::try_from(self.workers.len()).map_err(|_| WorkerError::TooManyWorkers)?;
        self.workers.push(sys::WorkerRow {
            max_nb,
            live: 1,
            ..sys::WorkerRow::default()
        });
        Ok(WorkerId(id))
    }

    /// Admits a tenant in tenant slot `tenant` on the live worker `worker`, with MAX_NB
    /// `max_nb` (0: unlimited). On error nothing changed.
    pub fn add_tenant(
        &mut self,
        tenant: TenantSlot,
        worker: WorkerId,
        max_nb: u64,
    ) -> Result<(), TenantError> {
        if tenant.0 >= MAX_TENANT_SLOTS {
            return Err(TenantError::SlotOutOfRange(tenant));
        }
        match self.workers.get(worker.index()) {
            None => return Err(TenantError::UnknownWorker(worker)),
            Some(w) if w.live == 0 => return Err(TenantError::WorkerNotLive(worker)),
            Some(_) => {}
        }
        let i = tenant.index();
        if self.tenants.get(i).is_some_and(|t| t.present != 0) {
            return Err(TenantError::DuplicateSlot(tenant));
        }
        if self.tenants.len() <= i {
            self.tenants.resize(i + 1, sys::TenantRow::default());
        }
        self.tenants[i] = sys::TenantRow {
            worker: worker.0,
            max_nb,
            present: 1,
            ..sys::TenantRow::default()
        };
        Ok(())
    }

    /// One C scheduling step for a packet of tenant slot `tenant` at `ts_ns`. Never
    /// allocates.
    pub fn schedule(&mut self, ts_ns: u64, tenant: TenantSlot) -> SchedOutcome {
        let o = sys::schedule(
            &mut self.tenants,
            &mut self.workers,
            self.cfg.shift,
            self.cfg.threshold,
            ts_ns,
            tenant.0,
        );
        match o.kind {
            sys::PASS => SchedOutcome::Pass {
                worker: WorkerId(o.worker),
                migrated_from: (o.migrated != 0).then_some(WorkerId(o.from)),
                overload: (o.overload != 0).then_some(OverloadReport {
                    worker: WorkerId(o.overload_worker),
                    slot: o.overload_slot,
                }),
            },
            sys::POLICED => SchedOutcome::Policed,
            sys::NO_LIVE_WORKER => SchedOutcome::NoLiveWorker,
            _ => SchedOutcome::UnknownTenant,
        }
    }

    /// The row of the tenant in tenant slot `tenant`.
    pub fn tenant(&self, tenant: TenantSlot) -> Option<CTenantRow> {
        let t = self
            .tenants
            .get(tenant.index())
            .filter(|t| t.present != 0)?;
        Some(CTenantRow {
            worker: WorkerId(t.worker),
            cur_slot: (t.has_slot != 0).then_some(t.cur_slot),
            pkt_nb: t.pkt_nb,
            max_nb: t.max_nb,
        })
    }

    /// A worker's row, as last written.
    pub fn worker(&self, w: WorkerId) -> Option<CWorkerRow> {
        let r = self.workers.get(w.index())?;
        Some(CWorkerRow {
            cur_slot: (r.has_slot != 0).then_some(r.cur_slot),
            pkt_nb: r.pkt_nb,
            last_nb: r.last_nb,
            max_nb: r.max_nb,
            times: r.times,
        })
    }
}

/// The C DSCP tag: writes `dscp` into the IP header at `l3_offset` (ECN kept, IPv4
/// checksum fixed per RFC 1624). Same contract and errors as
/// [`buffet_dispatch::tagging::tag_dscp`]; on error the bytes are unchanged.
pub fn tag_dscp(bytes: &mut [u8], l3_offset: usize, is_v4: bool, dscp: u8) -> Result<(), TagError> {
    let truncated = TagError::Truncated {
        offset: l3_offset,
        len: bytes.len(),
    };
    let Ok(off) = u32::try_from(l3_offset) else {
        // Beyond any frame the C core takes; the range check comes first, as in Rust.
        if dscp > buffet_dispatch::tagging::MAX_DSCP {
            return Err(TagError::DscpOutOfRange(dscp));
        }
        return Err(truncated);
    };
    match sys::tag_dscp(bytes, off, is_v4, dscp) {
        0 => Ok(()),
        1 => Err(TagError::DscpOutOfRange(dscp)),
        2 => Err(truncated),
        _ => Err(TagError::WrongIpVersion {
            expected: if is_v4 { 4 } else { 6 },
            found: bytes[l3_offset] >> 4,
        }),
    }
}

/// The C RFC 1624 update (eqn. 3): checksum `hc` after a 16-bit word changed from `old`
/// to `new`.
pub fn checksum_update(hc: u16, old: u16, new: u16) -> u16 {
    sys::checksum_update(hc, old, new)
}

/// The classification fields of a frame, as the C core extracts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameKey {
    /// The input port given.
    pub in_port: u16,
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// The VLAN id of the one tag, if any.
    pub vlan: Option<u16>,
    /// IPv6 (else IPv4).
    pub is_v6: bool,
    /// IPv4 protocol / IPv6 first next-header.
    pub proto: u8,
    /// DSCP.
    pub dscp: u8,
    /// TCP/UDP ports (first fragment only).
    pub ports: Option<(u16, u16)>,
    /// Source address, IPv4 mapped into `::ffff:0:0/96`.
    pub src_addr: [u8; 16],
    /// Destination address, likewise.
    pub dst_addr: [u8; 16],
    /// Byte offset of the IP header.
    pub l3_offset: u16,
    /// Byte offset of the IP payload.
    pub l4_offset: u16,
}

/// The C key extraction: the checks of `buffet_sdk::Packet::parse`, in its order, with
/// its errors.
pub fn extract_key(frame: &[u8], in_port: u16) -> Result<FrameKey, ParseError> {
    let (rc, k) = sys::extract_key(frame, in_port);
    if rc != 0 {
        let i = usize::try_from(rc - 1).unwrap_or(usize::MAX);
        return Err(*ParseError::ALL
            .get(i)
            .unwrap_or(&ParseError::UnsupportedEtherType));
    }
    Ok(FrameKey {
        in_port: k.in_port,
        src_mac: k.src_mac,
        dst_mac: k.dst_mac,
        vlan: (k.has_vlan != 0).then_some(k.vlan),
        is_v6: k.is_v6 != 0,
        proto: k.proto,
        dscp: k.dscp,
        ports: (k.has_ports != 0).then_some((k.src_port, k.dst_port)),
        src_addr: k.src_addr,
        dst_addr: k.dst_addr,
        l3_offset: k.l3_offset,
        l4_offset: k.l4_offset,
    })
}
