//! One worker thread: pop a burst, group it into per-tenant Packet Buffers, run the NF.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use buffet_dispatch::{TenantSlot, WorkerId};
use buffet_memory::TenantTable;
use buffet_sdk::{NetworkFunction, Packet, PacketMeta, TenantId, Verdict};
use crossbeam::queue::ArrayQueue;
use crossbeam::utils::Backoff;

use crate::mbuf::{Mbuf, Outcome};
use crate::stats::{bump, GroupTally, WorkerCounters};
use crate::sys;

/// A message from a worker to the control side.
pub(crate) enum Notice {
    /// The handler panicked while processing this tenant's group.
    Fault {
        tenant: TenantSlot,
        worker: WorkerId,
        message: String,
    },
}

/// What a worker thread shares with the pipeline.
pub(crate) struct Shared<N: NetworkFunction> {
    pub nf: Arc<N>,
    pub table: Arc<TenantTable<N::State>>,
    /// Indexed by tenant slot; set once a tenant faulted.
    pub quarantined: Arc<[AtomicBool]>,
    pub notices: Arc<ArrayQueue<Notice>>,
    /// Tenant ids by slot, for packet metadata (written at admission, before traffic).
    pub ids: Arc<[std::sync::atomic::AtomicU32]>,
}

impl<N: NetworkFunction> Clone for Shared<N> {
    fn clone(&self) -> Self {
        Shared {
            nf: self.nf.clone(),
            table: self.table.clone(),
            quarantined: self.quarantined.clone(),
            notices: self.notices.clone(),
            ids: self.ids.clone(),
        }
    }
}

pub(crate) struct WorkerThread<N: NetworkFunction> {
    pub engine: Engine<N>,
    pub rx: Arc<ArrayQueue<Box<Mbuf>>>,
    pub done: Arc<ArrayQueue<Box<Mbuf>>>,
    pub stop: Arc<AtomicBool>,
    pub burst: usize,
    pub pin: Option<usize>,
}

/// What one worker does to a burst, without the thread around it: group by tenant into
/// Packet Buffers, load each tenant's state once, run the NF, account. The worker
/// threads run it; benchmarks and embedders can run it inline on their own core.
pub struct Engine<N: NetworkFunction> {
    id: WorkerId,
    shared: Shared<N>,
    counters: Arc<WorkerCounters>,
}

impl<N: NetworkFunction> WorkerThread<N> {
    pub(crate) fn run(self) {
        if let Some(core) = self.pin {
            sys::pin_to_core(core);
        }
        let mut burst: Vec<Box<Mbuf>> = Vec::with_capacity(self.burst);
        let backoff = Backoff::new();
        loop {
            while burst.len() < self.burst {
                match self.rx.pop() {
                    Some(m) => burst.push(m),
                    None => break,
                }
            }
            if burst.is_empty() {
                if self.stop.load(Ordering::Acquire) && self.rx.is_empty() {
                    return;
                }
                if backoff.is_completed() {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                } else {
                    backoff.snooze();
                }
                continue;
            }
            backoff.reset();
            self.engine.process(&mut burst);
            for m in burst.drain(..) {
                let mut m = m;
                let back = Backoff::new();
                while let Err(again) = self.done.push(m) {
                    m = again;
                    back.snooze();
                }
            }
        }
    }
}

impl<N: NetworkFunction> Engine<N> {
    pub(crate) fn with_shared(
        id: WorkerId,
        shared: Shared<N>,
        counters: Arc<WorkerCounters>,
    ) -> Self {
        Engine {
            id,
            shared,
            counters,
        }
    }

    /// An engine over `table` (tenant slots below `capacity`), for running bursts
    /// inline. Tenant ids in packet metadata come from the table.
    pub fn new(nf: Arc<N>, table: Arc<TenantTable<N::State>>) -> Self {
        let cap = table.capacity();
        let ids: Arc<[std::sync::atomic::AtomicU32]> = (0..cap)
            .map(|_| std::sync::atomic::AtomicU32::new(0))
            .collect();
        for (slot, id) in table.ids() {
            ids[slot as usize].store(id.0, Ordering::Relaxed);
        }
        let shared = Shared {
            nf,
            table,
            quarantined: (0..cap).map(|_| AtomicBool::new(false)).collect(),
            notices: Arc::new(ArrayQueue::new(64)),
            ids,
        };
        Engine {
            id: WorkerId(0),
            shared,
            counters: Arc::new(WorkerCounters::new(cap)),
        }
    }

    /// Packets processed so far.
    pub fn packets(&self) -> u64 {
        self.counters.packets.load(Ordering::Relaxed)
    }

    /// Runs one burst: group by tenant (stable), then one state load per group. Each
    /// mbuf's `outcome` holds the result afterwards.
    pub fn process(&self, burst: &mut [Box<Mbuf>]) {
        stable_sort_by_tenant(burst);
        let t0 = sys::cycles();
        let mut start = 0;
        while start < burst.len() {
            let tenant = burst[start].tenant;
            let end = start
                + burst[start..]
                    .iter()
                    .take_while(|m| m.tenant == tenant)
                    .count();
            self.run_group(tenant, &mut burst[start..end]);
            start = end;
        }
        bump(&self.counters.packets, burst.len() as u64);
        bump(&self.counters.bursts, 1);
        bump(&self.counters.busy_cycles, sys::cycles().wrapping_sub(t0));
    }

    fn run_group(&self, tenant: TenantSlot, group: &mut [Box<Mbuf>]) {
        let t0 = sys::cycles();
        let idx = tenant.0 as usize;
        let mut tally = GroupTally::default();
        for m in group.iter() {
            tally.packets += 1;
            tally.bytes += m.len() as u64;
        }
        let quarantined = self
            .shared
            .quarantined
            .get(idx)
            .is_none_or(|q| q.load(Ordering::Acquire));
        let entry = self.shared.table.get(tenant.0);
        match (&*entry, quarantined) {
            (Some(entry), false) => {
                let id = TenantId(self.shared.ids[idx].load(Ordering::Relaxed));
                let nf = &*self.shared.nf;
                let mut state = entry.lock();
                let result = catch_unwind(AssertUnwindSafe(|| {
                    for m in group.iter_mut() {
                        let meta = PacketMeta {
                            in_port: m.in_port,
                            ts_ns: m.ts_ns,
                            tenant: id,
                        };
                        m.outcome = match Packet::parse(m.data_mut(), meta) {
                            Ok(mut pkt) => Outcome::Nf(nf.handle(&mut pkt, &mut state)),
                            Err(_) => Outcome::Malformed,
                        };
                    }
                }));
                drop(state);
                if let Err(panic) = result {
                    self.quarantine(tenant, panic_message(&*panic), group);
                }
            }
            (Some(_), true) => group
                .iter_mut()
                .for_each(|m| m.outcome = Outcome::Quarantined),
            (None, _) => group.iter_mut().for_each(|m| m.outcome = Outcome::NoTenant),
        }
        for m in group.iter() {
            match m.outcome {
                Outcome::Nf(Verdict::Drop(cause)) => tally.nf_drops[cause.index()] += 1,
                Outcome::Nf(_) => tally.passed += 1,
                Outcome::Malformed => tally.malformed += 1,
                Outcome::NoTenant => tally.no_tenant += 1,
                Outcome::Quarantined | Outcome::Pending => tally.quarantined += 1,
            }
        }
        if let Some(row) = self.counters.tenants.get(idx) {
            row.publish(&tally, sys::cycles().wrapping_sub(t0));
        }
    }

    fn quarantine(&self, tenant: TenantSlot, message: String, group: &mut [Box<Mbuf>]) {
        if let Some(q) = self.shared.quarantined.get(tenant.0 as usize) {
            q.store(true, Ordering::Release);
        }
        // Packets of the faulting group that had not completed are dropped as quarantined;
        // the ones the handler finished before the fault keep their verdicts.
        for m in group.iter_mut().filter(|m| m.outcome == Outcome::Pending) {
            m.outcome = Outcome::Quarantined;
        }
        let _ = self.shared.notices.push(Notice::Fault {
            tenant,
            worker: self.id,
            message,
        });
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "handler panicked".to_string()
    }
}

/// Stable insertion sort by tenant: bursts are small (≤ 64), it allocates nothing, and
/// keeps each tenant's packets in arrival order.
fn stable_sort_by_tenant(burst: &mut [Box<Mbuf>]) {
    for i in 1..burst.len() {
        let mut j = i;
        while j > 0 && burst[j - 1].tenant > burst[j].tenant {
            burst.swap(j - 1, j);
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_is_stable_and_groups_tenants() {
        let mut v: Vec<Box<Mbuf>> = [3u32, 1, 3, 2, 1, 3]
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut m = Mbuf::boxed();
                m.tenant = TenantSlot(*t);
                m.ts_ns = i as u64;
                m
            })
            .collect();
        stable_sort_by_tenant(&mut v);
        let got: Vec<(u32, u64)> = v.iter().map(|m| (m.tenant.0, m.ts_ns)).collect();
        assert_eq!(got, vec![(1, 1), (1, 4), (2, 3), (3, 0), (3, 2), (3, 5)]);
    }
}
