//! What the Worker Pool tests share: frames, tenant specs, a pipeline configuration.
#![allow(dead_code)]

use buffet_dispatch::{DispatcherConfig, Match, SchedulerConfig};
use buffet_io::PacketBuf;
use buffet_nfs::monitor::MonitorPolicy;
use buffet_sdk::{NetworkFunction, TenantId};
use buffet_worker::{Dataplane, PipelineConfig, TenantSpec, WorkerSource};
use etherparse::PacketBuilder;
use std::sync::{Arc, Mutex};

/// An Ethernet/IPv4/UDP frame from 192.168.0.1 to 10.0.`tenant`.1 (in tenant `tenant`'s
/// prefix, see [`rules`]), from UDP port `src_port` to 53, carrying `payload`.
pub fn udp_frame(tenant: u32, src_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4([192, 168, 0, 1], [10, 0, tenant as u8, 1], 64)
        .udp(src_port, 53)
        .write(&mut v, payload)
        .unwrap();
    v
}

/// A frame of `tenant` carrying `payload`, from UDP port 1000 + `tenant` (a flow of its
/// own per tenant).
pub fn frame(tenant: u32, payload: &[u8]) -> Vec<u8> {
    udp_frame(tenant, 1000 + tenant as u16, payload)
}

/// A frame of `tenant` from UDP port 1000 whose payload is `seq`, big-endian (read back
/// with [`seq_of`]).
pub fn seq_frame(tenant: u32, seq: u32) -> Vec<u8> {
    udp_frame(tenant, 1000, &seq.to_be_bytes())
}

/// A frame of `tenant` from UDP port 1000 carrying `b"payload"`.
pub fn plain_frame(tenant: u32) -> Vec<u8> {
    udp_frame(tenant, 1000, b"payload")
}

/// The sequence number a [`seq_frame`] carries: its last four bytes.
pub fn seq_of(frame: &[u8]) -> u32 {
    u32::from_be_bytes(frame[frame.len() - 4..].try_into().unwrap())
}

/// Tenant `tenant`'s dispatch rule: priority 100, destination 10.0.`tenant`.0/24.
pub fn rules(tenant: u32) -> Vec<(u32, Match)> {
    vec![(
        100,
        Match {
            dst_ip: Some(format!("10.0.{tenant}.0/24").parse().unwrap()),
            ..Match::default()
        },
    )]
}

/// Tenant `tenant`, named `t<tenant>`, with its [`rules`], no MAX_NB and `policy`.
pub fn spec_with<P>(tenant: u32, policy: P) -> TenantSpec<P> {
    TenantSpec {
        id: TenantId(tenant),
        name: format!("t{tenant}"),
        rules: rules(tenant),
        max_nb: 0,
        policy,
    }
}

/// A Monitor tenant with the default policy (see [`spec_with`]).
pub fn spec(tenant: u32) -> TenantSpec<MonitorPolicy> {
    spec_with(tenant, MonitorPolicy::default())
}

/// `workers` unpinned workers, rings of 64, bursts of 32, timeslots of 2^`shift` ns and a
/// migration threshold of 3.
pub fn cfg(workers: u16, shift: u32) -> PipelineConfig {
    PipelineConfig {
        workers,
        pin: false,
        ring_size: 64,
        burst: 32,
        dispatcher: DispatcherConfig {
            sched: SchedulerConfig {
                shift,
                threshold: 3,
            },
            ..DispatcherConfig::default()
        },
        ..PipelineConfig::default()
    }
}

/// Runs `f` (a control call) on another thread while this one applies the data plane's
/// commands, until it has its answer.
pub fn answered<N: NetworkFunction, T: Send + 'static>(
    dataplane: &mut Dataplane<N>,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let h = std::thread::spawn(f);
    while !h.is_finished() {
        dataplane.apply_commands();
    }
    h.join().unwrap()
}

/// What a test hands a worker fed by its own source: frames to process and frames to
/// reject.
#[derive(Default)]
pub struct Inbox {
    pub frames: Vec<PacketBuf>,
    pub rejected: Vec<PacketBuf>,
}

/// A worker's own source (as the XDP Packet Dispatcher feeds each worker's AF_XDP
/// socket), delivering what the test puts in its [`Inbox`].
pub struct TestSource(pub Arc<Mutex<Inbox>>);

impl WorkerSource for TestSource {
    fn receive(
        &mut self,
        burst: &mut Vec<PacketBuf>,
        rejected: &mut Vec<PacketBuf>,
        max: usize,
    ) -> usize {
        let mut inbox = self.0.lock().unwrap();
        rejected.append(&mut inbox.rejected);
        let n = inbox.frames.len().min(max);
        burst.extend(inbox.frames.drain(..n));
        n
    }
}

/// The inbox a test fills for one worker's [`TestSource`].
pub type SharedInbox = Arc<Mutex<Inbox>>;

/// `n` workers' own sources, each with the inbox the test fills.
pub fn test_sources(n: usize) -> (Vec<SharedInbox>, Vec<Box<dyn WorkerSource>>) {
    let inboxes: Vec<SharedInbox> = (0..n).map(|_| Arc::default()).collect();
    let sources = inboxes
        .iter()
        .map(|i| Box::new(TestSource(i.clone())) as Box<dyn WorkerSource>)
        .collect();
    (inboxes, sources)
}

/// `frame` in an mbuf, tagged for tenant slot `slot` (as the XDP program tags it).
pub fn tagged_buf(frame: &[u8], slot: buffet_dispatch::TenantSlot) -> PacketBuf {
    let mut b = PacketBuf::heap();
    assert!(b.fill(frame));
    b.tenant = slot;
    b
}
