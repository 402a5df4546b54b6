//! A seeded synthetic multi-tenant traffic generator on virtual time.
//!
//! [`Generator`] is a [`PacketSource`] producing real Ethernet II + IPv4 +
//! TCP/UDP frames (correct IPv4 and transport checksums, built with etherparse)
//! whose per-tenant rates vary over time the way the Buffet paper describes
//! production traffic (its Fig. 1): tenants usually send well below their
//! peak, peaks are staggered so only a few percent of tenants peak at once,
//! and flow sizes follow a data-centre distribution.
//!
//! # Address plan
//!
//! Tenant `i` (0-based) owns destination prefix `10.(i / 256).(i % 256).0/24`
//! ([`tenant_dst_prefix`]); every packet of tenant `i` goes to a host
//! `.1`–`.254` in that prefix, so a classifier rule "dst in
//! `tenant_dst_prefix(i)` → tenant i" recovers the ground truth that
//! [`Generator::tenant_of_last`] reports. Hence at most [`MAX_TENANTS`]
//! (65 536) tenants. Sources are random in `172.16.0.0/12`, source ports
//! random in 1024–65535; destination ports come from a few service ports (TCP:
//! 80, 443, 8080, 22, 3306, 6379; UDP: 53, 123, 443, 4789, 5060). MAC
//! addresses are fixed, locally administered (`02:00:00:00:00:01` →
//! `02:00:00:00:00:02`).
//!
//! # Traffic model
//!
//! * **Tenant weights.** Each tenant's mean rate is
//!   `mean_rate_pps · w_i / Σw`, with `w_i` log-normal (σ = 1): a few heavy
//!   tenants, many light ones.
//! * **ON/OFF rate profile, staggered.** A tenant's rate is its mean times a
//!   level that changes every `on_off_period_ns` (an *epoch*). Epochs come in
//!   cycles of [`PEAK_CYCLE_EPOCHS`] (40); in each cycle exactly one epoch, at a
//!   random position, is ON at level `peak_factor`; the others are OFF at a base
//!   level `b = (40 − peak_factor) / 39` jittered uniformly by up to ±50 % (less
//!   if needed so an OFF epoch never exceeds half the peak). The time-average
//!   level is therefore 1, so the aggregate mean rate is `mean_rate_pps`. Each
//!   tenant has its own random phase — where its epoch boundaries fall and where
//!   in its cycle it starts — so peaks are staggered: at any instant about
//!   1/40 = 2.5 % of tenants are at peak (the paper measured < 3 %), and a
//!   tenant spends 39/40 of its time below half its peak.
//! * **Flows.** Within a tenant, flows start as a Poisson process whose rate
//!   follows the tenant's level (`level · mean / E[packets per flow]`). Each
//!   flow's size in bytes is drawn from [`FlowSizeCdf::DATACENTER`]
//!   (piecewise-linear in log space; median 750 B, p90 50 KB, max 10 MB; mean
//!   ≈ 100 KB, so most flows are mice and most bytes are in elephants). A flow
//!   is cut into frames of [`MAX_FRAME_LEN`] bytes, the last one smaller, none
//!   below [`MIN_FRAME_LEN`]. Its first frame leaves when it starts; the rest
//!   leave as a Poisson process at `level · mean / flows_per_tenant` packets/s.
//!   This is an M/G/∞ system, so the number of concurrent flows per tenant
//!   fluctuates (Poisson) around `flows_per_tenant`, and the tenant's packet
//!   rate follows its level up to that flow-level noise. The generator starts in
//!   steady state: each tenant begins with about `flows_per_tenant` flows in
//!   progress (sizes drawn size-biased, part already sent), so the rate is
//!   right from t = 0.
//! * **Protocols.** A flow is UDP with probability `udp_share`, else TCP. TCP
//!   flows are one direction of a connection, not a conversation: the first
//!   frame carries SYN, the last FIN (a one-frame flow carries both), the others
//!   ACK, with sequence numbers advancing by the payload. Payload bytes are a
//!   fixed pseudo-random pattern from the seed.
//! * **Time and order.** Timestamps are virtual nanoseconds starting at 0,
//!   never the wall clock. An event heap keyed by each tenant's next event time
//!   emits packets in non-decreasing timestamp order. The stream ends at
//!   `duration_ns` or after `max_packets`, whichever comes first.
//! * **Determinism.** Everything is drawn from one ChaCha8 stream seeded with
//!   `seed`: the same config gives a byte-identical stream (on one platform;
//!   the model uses `f64` `ln`/`exp`).
//!
//! Cost per packet: one heap update over `tenants` entries, a few random
//! draws, and building the frame into a reused buffer (no allocation per
//! packet; a tenant's flow table only grows when it reaches a new maximum of
//! concurrent flows).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::Ipv4Addr;

use etherparse::PacketBuilder;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{PacketSource, RawPacket, SourceError};

/// Largest frame the generator emits (Ethernet header included, no FCS).
pub const MAX_FRAME_LEN: usize = 1500;
/// Smallest frame the generator emits.
pub const MIN_FRAME_LEN: usize = 64;
/// Most tenants the address plan can give a `/24` each.
pub const MAX_TENANTS: u32 = 65_536;
/// Most concurrent flows (`tenants · flows_per_tenant`) a config may ask for.
pub const MAX_TOTAL_FLOWS: u64 = 1 << 24;
/// Highest aggregate rate a config may ask for (one packet per virtual ns).
pub const MAX_RATE_PPS: f64 = 1e9;
/// Epochs per ON/OFF cycle: each tenant peaks in one epoch out of this many.
pub const PEAK_CYCLE_EPOCHS: u32 = 40;
/// Highest `peak_factor` (half the cycle length, so the OFF level stays > 0).
pub const MAX_PEAK_FACTOR: f64 = (PEAK_CYCLE_EPOCHS / 2) as f64;

const ETH_IPV4_LEN: usize = 14 + 20;
const TCP_HDR_LEN: usize = 20;
const UDP_HDR_LEN: usize = 8;
const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const TCP_PORTS: [u16; 8] = [80, 443, 443, 443, 8080, 22, 3306, 6379];
const UDP_PORTS: [u16; 6] = [53, 53, 123, 443, 4789, 5060];
/// Log-normal σ of the tenant weights.
const WEIGHT_SIGMA: f64 = 1.0;
/// Largest relative jitter of an OFF epoch's level.
const MAX_OFF_JITTER: f64 = 0.5;

/// The destination prefix owned by tenant `i` (0-based):
/// `10.(i / 256).(i % 256).0/24`. Defined for `i < MAX_TENANTS`; higher values
/// wrap (the generator refuses configs with more tenants).
pub fn tenant_dst_prefix(i: u32) -> (Ipv4Addr, u8) {
    let i = i % MAX_TENANTS;
    (Ipv4Addr::new(10, (i / 256) as u8, (i % 256) as u8, 0), 24)
}

/// Which tenant owns destination `dst` under the address plan
/// ([`tenant_dst_prefix`]); `None` outside `10.0.0.0/8`.
pub fn tenant_of_dst(dst: Ipv4Addr) -> Option<u32> {
    let o = dst.octets();
    (o[0] == 10).then(|| u32::from(o[1]) * 256 + u32::from(o[2]))
}

/// Errors of the traffic generator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenError {
    /// A [`GenConfig`] field is out of range.
    #[error("invalid generator config: {field}: {reason}")]
    InvalidConfig {
        /// The field's name.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// A frame could not be built (a bug: sizes are checked beforehand).
    #[error("generator could not build a frame: {reason}")]
    Build {
        /// etherparse's message.
        reason: String,
    },
}

/// Generator parameters. See the [module docs](self) for the model.
#[derive(Debug, Clone, PartialEq)]
pub struct GenConfig {
    /// Seed of the one random stream everything is drawn from.
    pub seed: u64,
    /// Number of tenants, 1 to [`MAX_TENANTS`].
    pub tenants: u32,
    /// Mean number of concurrent flows per tenant (≥ 1).
    pub flows_per_tenant: u32,
    /// Virtual duration of the stream in ns: no packet has `ts_ns >= duration_ns`.
    pub duration_ns: u64,
    /// Aggregate mean rate over all tenants, packets per (virtual) second.
    pub mean_rate_pps: f64,
    /// A tenant's peak rate relative to its mean, 1 to [`MAX_PEAK_FACTOR`]
    /// (1 = constant rate).
    pub peak_factor: f64,
    /// Length of an ON/OFF epoch in ns: how fast tenant rates change.
    pub on_off_period_ns: u64,
    /// Probability that a flow is UDP (else TCP), 0 to 1.
    pub udp_share: f64,
    /// Stop after this many packets (even before `duration_ns`).
    pub max_packets: Option<u64>,
}

impl Default for GenConfig {
    /// Seed 1, 8 tenants, 16 flows each, 1 s at 100 kpps aggregate, peaks 4×
    /// the mean, 10 ms epochs, 20 % UDP flows, no packet limit.
    fn default() -> Self {
        Self {
            seed: 1,
            tenants: 8,
            flows_per_tenant: 16,
            duration_ns: 1_000_000_000,
            mean_rate_pps: 100_000.0,
            peak_factor: 4.0,
            on_off_period_ns: 10_000_000,
            udp_share: 0.2,
            max_packets: None,
        }
    }
}

impl GenConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), GenError> {
        let bad = |field, reason: String| Err(GenError::InvalidConfig { field, reason });
        if self.tenants == 0 || self.tenants > MAX_TENANTS {
            return bad(
                "tenants",
                format!(
                    "must be 1..={MAX_TENANTS} (each tenant gets a /24 in 10.0.0.0/8), got {}",
                    self.tenants
                ),
            );
        }
        if self.flows_per_tenant == 0 {
            return bad("flows_per_tenant", "must be at least 1".to_string());
        }
        let total = u64::from(self.tenants) * u64::from(self.flows_per_tenant);
        if total > MAX_TOTAL_FLOWS {
            return bad(
                "flows_per_tenant",
                format!(
                    "tenants × flows_per_tenant = {total} exceeds {MAX_TOTAL_FLOWS} concurrent flows"
                ),
            );
        }
        if self.duration_ns == 0 {
            return bad("duration_ns", "must be > 0".to_string());
        }
        if !(self.mean_rate_pps.is_finite()
            && self.mean_rate_pps > 0.0
            && self.mean_rate_pps <= MAX_RATE_PPS)
        {
            return bad(
                "mean_rate_pps",
                format!(
                    "must be > 0 and <= {MAX_RATE_PPS:e}, got {}",
                    self.mean_rate_pps
                ),
            );
        }
        if !(self.peak_factor.is_finite() && (1.0..=MAX_PEAK_FACTOR).contains(&self.peak_factor)) {
            return bad(
                "peak_factor",
                format!(
                    "must be between 1 (constant rate) and {MAX_PEAK_FACTOR}, got {}",
                    self.peak_factor
                ),
            );
        }
        if self.on_off_period_ns == 0 {
            return bad("on_off_period_ns", "must be > 0".to_string());
        }
        if !(0.0..=1.0).contains(&self.udp_share) {
            return bad(
                "udp_share",
                format!("must be between 0 and 1, got {}", self.udp_share),
            );
        }
        Ok(())
    }
}

/// A flow-size distribution: a CDF over bytes, piecewise-linear in
/// log(bytes) between its points.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowSizeCdf {
    /// `(bytes, cumulative probability)`, both increasing, from `(min, 0)` to
    /// `(max, 1)`.
    points: &'static [(f64, f64)],
}

impl FlowSizeCdf {
    /// A data-centre flow-size CDF in the spirit of Benson et al. (IMC 2010),
    /// the distribution Buffet's evaluation used: 80 % of flows under 10 KB,
    /// median 750 B, p90 50 KB, p99 ≈ 2.9 MB, max 10 MB; mean ≈ 100 KB, with
    /// about 3/4 of the bytes in the 2 % of flows above 1 MB.
    pub const DATACENTER: FlowSizeCdf = FlowSizeCdf {
        points: &[
            (64.0, 0.0),
            (150.0, 0.10),
            (400.0, 0.30),
            (750.0, 0.50),
            (2_000.0, 0.65),
            (10_000.0, 0.80),
            (50_000.0, 0.90),
            (200_000.0, 0.95),
            (1_000_000.0, 0.98),
            (10_000_000.0, 1.0),
        ],
    };

    /// The points `(bytes, cumulative probability)` defining the CDF.
    pub fn points(&self) -> &'static [(f64, f64)] {
        self.points
    }

    /// The flow size (bytes) at cumulative probability `p` (clamped to
    /// `[0, 1]`): feed it a uniform draw to sample the distribution.
    pub fn quantile(&self, p: f64) -> u64 {
        let pts = self.points;
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        let mut k = 1;
        while k < pts.len() - 1 && pts[k].1 <= p {
            k += 1;
        }
        let (a, pa) = pts[k - 1];
        let (b, pb) = pts[k];
        let f = ((p - pa) / (pb - pa)).clamp(0.0, 1.0);
        let x = (a.ln() + f * (b.ln() - a.ln())).exp();
        (x.round() as u64).clamp(a as u64, b as u64)
    }

    /// Mean flow size in bytes (exact for the piecewise log-linear CDF).
    pub fn mean_bytes(&self) -> f64 {
        self.segments()
            .map(|(a, b, mass)| mass * (b - a) / (b / a).ln())
            .sum()
    }

    /// A size drawn from the size-biased distribution (density ∝ x·f(x)): the
    /// size of the flow a random *byte* belongs to. Log-uniform segments become
    /// uniform ones, weighted by their share of the bytes.
    fn size_biased(&self, u_seg: f64, u_in: f64) -> f64 {
        let total = self.mean_bytes();
        let mut acc = 0.0;
        let mut last = (self.points[0].0, self.points[0].0);
        for (a, b, mass) in self.segments() {
            acc += mass * (b - a) / (b / a).ln() / total;
            last = (a, b);
            if u_seg < acc {
                break;
            }
        }
        last.0 + u_in * (last.1 - last.0)
    }

    fn segments(&self) -> impl Iterator<Item = (f64, f64, f64)> + '_ {
        self.points
            .windows(2)
            .map(|w| (w[0].0, w[1].0, w[1].1 - w[0].1))
    }
}

/// Frames needed for a flow of `bytes` bytes.
fn frames_for(bytes: u64) -> u64 {
    bytes.div_ceil(MAX_FRAME_LEN as u64).max(1)
}

#[derive(Debug, Clone, Copy)]
struct Flow {
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
    udp: bool,
    /// Bytes still to send (frame bytes).
    remaining: u64,
    seq: u32,
    ack: u32,
    /// Whether the first frame (SYN) has been sent.
    started: bool,
}

#[derive(Debug)]
struct Tenant {
    /// Time of the tenant's pending event (f64 ns, so rates need no rounding).
    next_ns: f64,
    /// Whether the pending event is an epoch boundary (else a packet or a flow
    /// arrival, decided when it fires).
    next_is_epoch: bool,
    epoch_end_ns: f64,
    level: f64,
    cycle_pos: u32,
    peak_pos: u32,
    /// Per-flow packet rate at level 1, per ns.
    flow_rate: f64,
    /// Flow arrival rate at level 1, per ns.
    arrival_rate: f64,
    mean_pps: f64,
    /// `10.x.y.0` as u32.
    dst_base: u32,
    flows: Vec<Flow>,
}

/// The synthetic traffic generator: a deterministic [`PacketSource`].
/// See the [module docs](self) for the traffic model and address plan.
pub struct Generator {
    cfg: GenConfig,
    rng: ChaCha8Rng,
    tenants: Vec<Tenant>,
    /// Min-heap of (next event time in whole ns, tenant index).
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    buf: Box<[u8; MAX_FRAME_LEN]>,
    payload: Box<[u8; MAX_FRAME_LEN]>,
    epoch_ns: f64,
    base_level: f64,
    off_jitter: f64,
    mean_frames_per_flow: f64,
    emitted: u64,
    last_ts: u64,
    last_tenant: u32,
    done: bool,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("cfg", &self.cfg)
            .field("emitted", &self.emitted)
            .field("last_ts", &self.last_ts)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Generator {
    /// Validates `cfg` and sets up the tenants in steady state.
    pub fn new(cfg: GenConfig) -> Result<Self, GenError> {
        cfg.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let cdf = FlowSizeCdf::DATACENTER;

        let mut payload = Box::new([0u8; MAX_FRAME_LEN]);
        rng.fill(&mut payload[..]);

        // E[frames per flow], by midpoint integration over the quantile function.
        const STEPS: u32 = 1 << 16;
        let mean_frames_per_flow = (0..STEPS)
            .map(|k| frames_for(cdf.quantile((f64::from(k) + 0.5) / f64::from(STEPS))) as f64)
            .sum::<f64>()
            / f64::from(STEPS);

        let k = f64::from(PEAK_CYCLE_EPOCHS);
        let peak = cfg.peak_factor;
        let base_level = (k - peak) / (k - 1.0);
        let off_jitter = (peak / (2.0 * base_level) - 1.0).clamp(0.0, MAX_OFF_JITTER);
        let epoch_ns = cfg.on_off_period_ns as f64;

        // Tenant weights: log-normal via Box–Muller.
        let weights: Vec<f64> = (0..cfg.tenants)
            .map(|_| {
                let u1: f64 = 1.0 - rng.random::<f64>();
                let u2: f64 = rng.random();
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (WEIGHT_SIGMA * z).exp()
            })
            .collect();
        let wsum: f64 = weights.iter().sum();

        let n = f64::from(cfg.flows_per_tenant);
        let initial_flows =
            ((n * (mean_frames_per_flow - 1.0) / mean_frames_per_flow).round() as usize).max(1);

        let mut this = Self {
            rng,
            tenants: Vec::with_capacity(cfg.tenants as usize),
            heap: BinaryHeap::with_capacity(cfg.tenants as usize),
            buf: Box::new([0u8; MAX_FRAME_LEN]),
            payload,
            epoch_ns,
            base_level,
            off_jitter,
            mean_frames_per_flow,
            emitted: 0,
            last_ts: 0,
            last_tenant: 0,
            done: false,
            cfg,
        };

        for (i, w) in weights.iter().enumerate() {
            let mean_pps = this.cfg.mean_rate_pps * w / wsum;
            let (prefix, _) = tenant_dst_prefix(i as u32);
            let cycle_pos = this.rng.random_range(0..PEAK_CYCLE_EPOCHS);
            let peak_pos = this.rng.random_range(0..PEAK_CYCLE_EPOCHS);
            let phase = 1.0 - this.rng.random::<f64>(); // (0, 1]
            let mut t = Tenant {
                next_ns: 0.0,
                next_is_epoch: false,
                epoch_end_ns: phase * epoch_ns,
                level: 1.0,
                cycle_pos,
                peak_pos,
                flow_rate: mean_pps / n / 1e9,
                arrival_rate: mean_pps / mean_frames_per_flow / 1e9,
                mean_pps,
                dst_base: u32::from(prefix),
                flows: Vec::with_capacity(2 * initial_flows + 8),
            };
            t.level = this.level_for(&t);
            for _ in 0..initial_flows {
                let size = cdf.size_biased(this.rng.random(), this.rng.random());
                let remaining = ((size * this.rng.random::<f64>()).ceil() as u64).max(1);
                let flow = this.new_flow(t.dst_base, remaining);
                t.flows.push(flow);
            }
            this.tenants.push(t);
            let key = this.schedule(i, 0.0);
            this.heap.push(Reverse((key, i as u32)));
        }
        Ok(this)
    }

    /// The configuration this generator runs.
    pub fn config(&self) -> &GenConfig {
        &self.cfg
    }

    /// Index (0-based) of the tenant whose packet was returned last: the ground
    /// truth a classifier should reproduce. 0 before the first packet.
    pub fn tenant_of_last(&self) -> u32 {
        self.last_tenant
    }

    /// Tenant `i`'s long-run mean rate in packets/s, `None` if there is no such
    /// tenant. These sum to `mean_rate_pps`.
    pub fn tenant_mean_pps(&self, i: u32) -> Option<f64> {
        self.tenants.get(i as usize).map(|t| t.mean_pps)
    }

    /// Number of packets returned so far.
    pub fn packets_emitted(&self) -> u64 {
        self.emitted
    }

    /// Expected packets per flow under [`FlowSizeCdf::DATACENTER`].
    pub fn mean_frames_per_flow(&self) -> f64 {
        self.mean_frames_per_flow
    }

    /// The level of the epoch `t` is in, from its cycle position.
    fn level_for(&mut self, t: &Tenant) -> f64 {
        if t.cycle_pos == t.peak_pos {
            self.cfg.peak_factor
        } else {
            let u: f64 = self.rng.random();
            self.base_level * (1.0 + self.off_jitter * (2.0 * u - 1.0))
        }
    }

    fn new_flow(&mut self, dst_base: u32, bytes: u64) -> Flow {
        let rng = &mut self.rng;
        let udp = rng.random::<f64>() < self.cfg.udp_share;
        let dport = if udp {
            UDP_PORTS[rng.random_range(0..UDP_PORTS.len())]
        } else {
            TCP_PORTS[rng.random_range(0..TCP_PORTS.len())]
        };
        Flow {
            src: 0xAC10_0000 | (rng.random::<u32>() & 0x000F_FFFF),
            dst: dst_base | rng.random_range(1..=254u32),
            sport: rng.random_range(1024..=65535u16),
            dport,
            udp,
            remaining: bytes,
            seq: rng.random(),
            ack: rng.random(),
            started: false,
        }
    }

    /// Draws tenant `i`'s next event after `now` and returns its heap key.
    fn schedule(&mut self, i: usize, now: f64) -> u64 {
        let t = &self.tenants[i];
        let rate = t.level * (t.flows.len() as f64 * t.flow_rate + t.arrival_rate);
        let u: f64 = self.rng.random();
        let next = now + -(1.0 - u).ln() / rate;
        let t = &mut self.tenants[i];
        if next >= t.epoch_end_ns {
            t.next_ns = t.epoch_end_ns;
            t.next_is_epoch = true;
        } else {
            t.next_ns = next;
            t.next_is_epoch = false;
        }
        // Saturating float-to-int cast: far-future events sort last.
        t.next_ns as u64
    }

    /// Moves tenant `i` into its next epoch.
    fn advance_epoch(&mut self, i: usize) {
        let t = &mut self.tenants[i];
        t.cycle_pos += 1;
        t.epoch_end_ns += self.epoch_ns;
        if t.cycle_pos == PEAK_CYCLE_EPOCHS {
            t.cycle_pos = 0;
            t.peak_pos = self.rng.random_range(0..PEAK_CYCLE_EPOCHS);
        }
        let t = &self.tenants[i];
        let (pos, peak) = (t.cycle_pos, t.peak_pos);
        let level = if pos == peak {
            self.cfg.peak_factor
        } else {
            let u: f64 = self.rng.random();
            self.base_level * (1.0 + self.off_jitter * (2.0 * u - 1.0))
        };
        self.tenants[i].level = level;
    }

    /// Writes the next frame of `flow` into `self.buf`; returns its length and
    /// whether it was the flow's last.
    fn build_frame(&mut self, flow: &mut Flow) -> Result<(usize, bool), GenError> {
        let len = if flow.remaining > MAX_FRAME_LEN as u64 {
            MAX_FRAME_LEN
        } else {
            (flow.remaining as usize).max(MIN_FRAME_LEN)
        };
        flow.remaining = flow.remaining.saturating_sub(len as u64);
        let last = flow.remaining == 0;
        let first = !flow.started;
        flow.started = true;
        let ip = PacketBuilder::ethernet2(SRC_MAC, DST_MAC).ipv4(
            flow.src.to_be_bytes(),
            flow.dst.to_be_bytes(),
            64,
        );
        let written = if flow.udp {
            let plen = len - ETH_IPV4_LEN - UDP_HDR_LEN;
            ip.udp(flow.sport, flow.dport)
                .write_to_slice(&mut self.buf[..], &self.payload[..plen])
        } else {
            let plen = len - ETH_IPV4_LEN - TCP_HDR_LEN;
            let mut tcp = ip.tcp(flow.sport, flow.dport, flow.seq, 65_535);
            tcp = if first { tcp.syn() } else { tcp.ack(flow.ack) };
            if last {
                tcp = tcp.fin();
            }
            flow.seq = flow
                .seq
                .wrapping_add(plen as u32)
                .wrapping_add(u32::from(first))
                .wrapping_add(u32::from(last));
            tcp.write_to_slice(&mut self.buf[..], &self.payload[..plen])
        };
        match written {
            Ok(n) if n == len => Ok((len, last)),
            Ok(n) => Err(GenError::Build {
                reason: format!("built {n} bytes for a {len}-byte frame"),
            }),
            Err(e) => Err(GenError::Build {
                reason: e.to_string(),
            }),
        }
    }

    /// Next packet, with the error narrowed to [`GenError`].
    pub fn generate(&mut self) -> Result<Option<RawPacket<'_>>, GenError> {
        if self.done {
            return Ok(None);
        }
        if self.cfg.max_packets.is_some_and(|m| self.emitted >= m) {
            self.done = true;
            return Ok(None);
        }
        loop {
            let Some(&Reverse((key, ti))) = self.heap.peek() else {
                self.done = true;
                return Ok(None);
            };
            if key >= self.cfg.duration_ns {
                self.done = true;
                return Ok(None);
            }
            let i = ti as usize;
            let now = self.tenants[i].next_ns;
            let emitted_len = if self.tenants[i].next_is_epoch {
                self.advance_epoch(i);
                None
            } else {
                let t = &self.tenants[i];
                let active = t.flows.len() as f64 * t.flow_rate;
                let pick: f64 = self.rng.random::<f64>() * (active + t.arrival_rate);
                if pick < active {
                    let n = self.tenants[i].flows.len();
                    let idx = self.rng.random_range(0..n);
                    let mut flow = self.tenants[i].flows[idx];
                    let (len, last) = match self.build_frame(&mut flow) {
                        Ok(v) => v,
                        Err(e) => {
                            self.done = true;
                            return Err(e);
                        }
                    };
                    if last {
                        self.tenants[i].flows.swap_remove(idx);
                    } else {
                        self.tenants[i].flows[idx] = flow;
                    }
                    Some(len)
                } else {
                    let q: f64 = self.rng.random();
                    let bytes = FlowSizeCdf::DATACENTER.quantile(q);
                    let dst_base = self.tenants[i].dst_base;
                    let mut flow = self.new_flow(dst_base, bytes);
                    let (len, last) = match self.build_frame(&mut flow) {
                        Ok(v) => v,
                        Err(e) => {
                            self.done = true;
                            return Err(e);
                        }
                    };
                    if !last {
                        self.tenants[i].flows.push(flow);
                    }
                    Some(len)
                }
            };
            let new_key = self.schedule(i, now);
            if let Some(mut top) = self.heap.peek_mut() {
                *top = Reverse((new_key, ti));
            }
            if let Some(len) = emitted_len {
                self.emitted += 1;
                self.last_ts = key;
                self.last_tenant = ti;
                return Ok(Some(RawPacket {
                    ts_ns: key,
                    data: &self.buf[..len],
                }));
            }
        }
    }
}

impl PacketSource for Generator {
    fn next_packet(&mut self) -> Result<Option<RawPacket<'_>>, SourceError> {
        self.generate().map_err(SourceError::from)
    }

    /// Expected packets left: the mean rate over the remaining virtual time,
    /// capped by `max_packets`.
    fn size_hint(&self) -> Option<u64> {
        if self.done {
            return Some(0);
        }
        let left_ns = self.cfg.duration_ns.saturating_sub(self.last_ts) as f64;
        let expected = (self.cfg.mean_rate_pps * left_ns / 1e9) as u64;
        Some(match self.cfg.max_packets {
            Some(m) => expected.min(m.saturating_sub(self.emitted)),
            None => expected,
        })
    }
}
