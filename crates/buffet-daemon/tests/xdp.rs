//! The daemon with `[dispatch] mode = "xdp"` in-process, on one end of a veth pair,
//! driven by a real HTTP client while frames are sent into the other end through an
//! AF_PACKET socket: tenants admitted, refused (a rule the XDP classifier cannot
//! express), updated and removed at run time, workers launched and terminated, a
//! restart that puts the stored tenants back into the program's maps, and a worker stuck
//! in a safe Rust handler whose other tenants move to live workers; and on a veth with
//! four queues, every worker with a socket on each (a worker launched at run time too),
//! frames spread over all of them (sent through one AF_XDP socket per queue) counted
//! exactly, and the stuck worker found again; a worker that reads nothing for a second
//! under a flood, whose socket's drops `/v1/stats` and `/metrics` count as
//! `socket_dropped`; and native mode on a veth of MTU 9000 refused with what to do. The NF is this file's own (`Stallable`:
//! counts, and never returns for a tenant whose policy says so when a frame asks), run
//! through `Daemon::start_with` and `plane::start_nf`.
//!
//! Needs root (BPF, XDP, veth) and `ip`; skipped otherwise, a failure under
//! `BUFFET_REQUIRE_PRIVILEGED=1` or CI.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use buffet_config::registry::RegisteredNf;
use buffet_daemon::{Daemon, DaemonConfig};
use buffet_io::afpacket::{AfPacketConfig, AfPacketPort};
use buffet_io::{HeapPool, Port};
use buffet_sdk::{InitError, MemorySpec, NetworkFunction, Packet, Verdict};
use buffet_testkit::gate;
use etherparse::PacketBuilder;
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-for-the-xdp-daemon-tests";

/// Counts its packets and passes them; with `stall` in its policy, never returns from a
/// frame whose payload is `STALL` (a safe Rust handler that cannot be interrupted) —
/// with `until_released` too, it returns once [`RELEASED`] is set; with `hold_ms`, sleeps
/// that long on a frame whose payload is `HOLD` (its worker reads nothing meanwhile).
struct Stallable;

/// Ends the stalls of tenants whose policy says `until_released`.
static RELEASED: AtomicBool = AtomicBool::new(false);

#[derive(Default)]
struct StallState {
    stall: bool,
    until_released: bool,
    hold_ms: u64,
    seen: u64,
}

#[derive(serde::Deserialize, Default)]
struct StallPolicy {
    #[serde(default)]
    stall: bool,
    #[serde(default)]
    until_released: bool,
    #[serde(default)]
    hold_ms: u64,
}

impl NetworkFunction for Stallable {
    type State = StallState;
    type Policy = StallPolicy;
    fn name(&self) -> &'static str {
        "stallable"
    }
    fn register(&self) -> MemorySpec {
        MemorySpec::of::<StallState>()
    }
    fn init(&self, p: &StallPolicy, state: &mut StallState) -> Result<(), InitError> {
        state.stall = p.stall;
        state.until_released = p.until_released;
        state.hold_ms = p.hold_ms;
        Ok(())
    }
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut StallState) -> Verdict {
        state.seen += 1;
        if state.stall && pkt.payload() == b"STALL" {
            while !(state.until_released && RELEASED.load(Ordering::Acquire)) {
                std::hint::spin_loop();
            }
        }
        if state.hold_ms > 0 && pkt.payload() == b"HOLD" {
            std::thread::sleep(Duration::from_millis(state.hold_ms));
        }
        Verdict::Pass
    }
}

impl RegisteredNf for Stallable {}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ready(test: &str) -> bool {
    if let Some(why) = buffet_xdp::UNAVAILABLE {
        return gate::skip_privileged(test, format_args!("xdp engine unavailable: {why}"));
    }
    gate::require_root(test)
        && gate::require_tool(
            test,
            "ip (iproute2)",
            Command::new("ip").arg("-V"),
            "install iproute2",
        )
}

/// A veth pair in this namespace (`a` gets the program, frames are sent into `b`);
/// deleted on drop.
struct Veth {
    a: String,
    b: String,
}

impl Veth {
    fn new() -> Veth {
        Veth::with_queues(1)
    }

    /// The pair with `queues` receive and transmit queues on each end.
    fn with_queues(queues: u32) -> Veth {
        static N: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "{}{}",
            std::process::id() % 100_000,
            N.fetch_add(1, Ordering::Relaxed)
        );
        let v = Veth {
            a: format!("bxd{tag}"),
            b: format!("bxe{tag}"),
        };
        let _ = Command::new("ip").args(["link", "del", &v.a]).output();
        let n = queues.to_string();
        ip(&[
            "link",
            "add",
            &v.a,
            "numtxqueues",
            &n,
            "numrxqueues",
            &n,
            "type",
            "veth",
            "peer",
            "name",
            &v.b,
            "numtxqueues",
            &n,
            "numrxqueues",
            &n,
        ]);
        for i in [&v.a, &v.b] {
            // No IPv6 on the link: no router solicitations or MLD reports to count.
            let _ = Command::new("sysctl")
                .args(["-qw", &format!("net.ipv6.conf.{i}.disable_ipv6=1")])
                .output();
            ip(&["link", "set", i, "up"]);
        }
        v
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.a]).output();
    }
}

fn config(dir: &Path, iface: &str, extra: &str) -> DaemonConfig {
    config_with(dir, iface, extra, "xdp_mode = \"generic\"\n")
}

/// As [`config`], with `port` as the `[[port]]` table's settings after its interface.
fn config_with(dir: &Path, iface: &str, extra: &str, port: &str) -> DaemonConfig {
    std::fs::write(dir.join("admin.token"), format!("{ADMIN}\n")).unwrap();
    let text = format!(
        r#"
data_dir = "{d}/data"
[api]
listen = "127.0.0.1:0"
admin_token_file = "{d}/admin.token"
[nf]
name = "monitor"
[dataplane]
workers = 2
max_workers = 3
tenant_slots = 32
arena_mib = 64
{extra}
[dispatch]
mode = "xdp"
[[port]]
kind = "af_xdp"
iface = "{iface}"
{port}"#,
        d = dir.display()
    );
    DaemonConfig::parse(Path::new("xdp.toml"), &text).unwrap()
}

/// As [`config`], in native mode reading `queues` (a TOML array, e.g. `"[0, 1]"`).
fn config_native(dir: &Path, iface: &str, extra: &str, queues: &str) -> DaemonConfig {
    config_with(
        dir,
        iface,
        extra,
        &format!("xdp_mode = \"native\"\nqueues = {queues}\n"),
    )
}

fn start(cfg: DaemonConfig) -> Daemon {
    Daemon::start_with(
        cfg,
        Path::new("xdp.toml"),
        Box::new(|cfg, _| buffet_daemon::plane::start_nf(cfg, Stallable)),
    )
    .unwrap()
}

fn call(d: &Daemon, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let timeout = Duration::from_secs(20);
    buffet_testkit::http::api(d.addr(), method, path, Some(ADMIN), body, timeout)
}

fn tenant(id: u32, prefix: &str, policy: Value) -> Value {
    json!({ "id": id, "rules": [ { "dst_ip": prefix } ], "policy": policy })
}

/// Admits tenant `id`, owning 10.`id`.0.0/16, with `policy`; the API must accept it.
fn admit(d: &Daemon, id: u32, policy: Value) {
    let (s, v) = call(
        d,
        "POST",
        "/v1/tenants",
        Some(&tenant(id, &format!("10.{id}.0.0/16"), policy)),
    );
    assert_eq!(s, 201, "{v}");
}

/// One UDP frame to `dst` carrying `payload`.
fn frame(dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([172, 16, 0, 1], dst, 64)
        .udp(4000, 80);
    let mut out = Vec::new();
    b.write(&mut out, payload).unwrap();
    out
}

/// Sends frames into the veth's other end, paced (the receiving sockets are never the
/// limit).
struct Sender {
    port: AfPacketPort,
    pool: HeapPool,
}

impl Sender {
    fn new(iface: &str) -> Sender {
        Sender {
            port: AfPacketPort::open(AfPacketConfig {
                rx: false,
                ..AfPacketConfig::new(iface, 0)
            })
            .unwrap(),
            pool: HeapPool::new(256),
        }
    }

    fn send(&mut self, frames: &[Vec<u8>]) {
        for chunk in frames.chunks(8) {
            let mut burst = Vec::new();
            for f in chunk {
                let mut b = self.pool.take().unwrap();
                assert!(b.fill(f));
                burst.push(b);
            }
            self.port.tx_burst(&mut burst, &mut self.pool).unwrap();
            std::thread::sleep(Duration::from_micros(400));
        }
    }

    /// `n` frames to each of `dsts`, interleaved.
    fn each(&mut self, dsts: &[[u8; 4]], n: usize) {
        let frames: Vec<Vec<u8>> = (0..n)
            .flat_map(|_| dsts.iter().map(|d| frame(*d, b"data")))
            .collect();
        self.send(&frames);
    }
}

fn stats(d: &Daemon) -> Value {
    let (s, v) = call(d, "GET", "/v1/stats", None);
    assert_eq!(s, 200, "{v}");
    v
}

fn row(v: &Value, id: u64) -> Option<Value> {
    v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"].as_u64() == Some(id))
        .cloned()
}

/// Everything the program sent tenant `id`'s way: the packets its worker ran (whatever
/// their verdict or drop reason there) plus the frames the program policed (which never
/// reach a worker).
fn seen(v: &Value, id: u64) -> u64 {
    let Some(t) = row(v, id) else { return 0 };
    t["packets"].as_u64().unwrap() + t["drops"]["policed"].as_u64().unwrap_or(0)
}

/// Waits until `check` holds on the stats, or fails with the last stats.
fn wait_stats(d: &Daemon, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let t0 = Instant::now();
    loop {
        let v = stats(d);
        if check(&v) {
            return v;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "{what}: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn unmatched(v: &Value) -> u64 {
    v["global"]["unmatched"].as_u64().unwrap()
}

#[test]
fn tenants_and_workers_change_at_run_time_and_every_frame_is_counted() {
    let test = "xdp::tenants_and_workers_change_at_run_time_and_every_frame_is_counted";
    if !ready(test) {
        return;
    }
    let veth = Veth::new();
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path(), &veth.a, ""));
    let mut tx = Sender::new(&veth.b);

    // A rule the XDP classifier cannot express: 422 naming it, nothing changed.
    let wide = json!({ "id": 99, "rules": [
        { "dst_ip": "10.99.0.0/16" },
        { "protocol": "udp", "src_port": "1-65534", "dst_port": "1-65534" } ], "policy": {} });
    let (s, v) = call(&d, "POST", "/v1/tenants", Some(&wide));
    assert_eq!(s, 422, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("tenant 99") && msg.contains("rules[1]") && msg.contains("cannot express"),
        "{msg}"
    );
    assert_eq!(call(&d, "GET", "/v1/tenants", None).1["tenant"], json!([]));

    // Four tenants, spread over the two workers.
    for id in 1..=4u32 {
        admit(&d, id, json!({}));
    }
    let v = stats(&d);
    let workers: Vec<u64> = (1..=4)
        .map(|id| row(&v, id).unwrap()["worker"].as_u64().unwrap())
        .collect();
    assert_eq!(
        workers,
        vec![0, 1, 0, 1],
        "the live worker with the fewest tenants"
    );
    let dst = |id: u8| [10, id, 0, 1];
    let u0 = unmatched(&v);
    tx.each(&[dst(1), dst(2), dst(3), dst(4), [10, 50, 0, 1]], 100);
    let v = wait_stats(&d, "100 frames each", |v| {
        (1..=4).all(|id| seen(v, id) == 100) && unmatched(v) >= u0 + 100
    });
    for id in 1..=4 {
        assert_eq!(row(&v, id).unwrap()["packets"].as_u64(), Some(100), "{v}");
    }

    // Update tenant 2's rules: 10.2/16 -> 10.22/16. Its old prefix is unmatched from the
    // answer on, the new one is its own.
    let (s, v) = call(
        &d,
        "PUT",
        "/v1/tenants/2",
        Some(&tenant(2, "10.22.0.0/16", json!({}))),
    );
    assert_eq!(s, 200, "{v}");
    let u1 = unmatched(&stats(&d));
    tx.each(&[dst(2), dst(22)], 50);
    let v = wait_stats(&d, "tenant 2 under its new rule", |v| seen(v, 2) == 150);
    assert_eq!(unmatched(&v), u1 + 50, "the old prefix is unmatched: {v}");

    // Remove tenant 3: out of the maps, its later frames unmatched, its row gone.
    let (s, _) = call(&d, "DELETE", "/v1/tenants/3", None);
    assert_eq!(s, 204);
    let u2 = unmatched(&stats(&d));
    tx.each(&[dst(3), dst(1)], 40);
    let v = wait_stats(&d, "tenant 1 after the removal", |v| seen(v, 1) == 140);
    assert_eq!(unmatched(&v), u2 + 40, "{v}");
    assert!(row(&v, 3).is_none(), "{v}");

    // Launch worker 2, then terminate worker 0: its tenants go to live workers.
    let (s, v) = call(&d, "POST", "/v1/workers", None);
    assert_eq!((s, v["id"].as_u64()), (201, Some(2)), "{v}");
    let (s, v) = call(&d, "DELETE", "/v1/workers/0", None);
    assert_eq!(s, 204, "{v}");
    let v = stats(&d);
    for id in [1u64, 2, 4] {
        assert_ne!(row(&v, id).unwrap()["worker"].as_u64(), Some(0), "{v}");
    }
    // The launched worker took tenant 1 (it had none): it runs frames.
    assert_eq!(row(&v, 1).unwrap()["worker"].as_u64(), Some(2), "{v}");
    tx.each(&[dst(1), dst(22), dst(4)], 60);
    let v = wait_stats(&d, "after the worker changes", |v| {
        seen(v, 1) == 200 && seen(v, 2) == 210 && seen(v, 4) == 160
    });
    let w = &v["workers"];
    assert_eq!(w[0]["live"], json!(false), "{v}");
    assert!(w[2]["packets"].as_u64().unwrap() >= 60, "{v}");
    // Nothing went to a dead worker's socket or was lost on the way.
    assert_eq!(v["global"]["no_live_worker"].as_u64(), Some(0), "{v}");

    // A second worker launch reuses worker 0's socket (back when its thread ended).
    let (s, v) = call(&d, "POST", "/v1/workers", None);
    assert_eq!((s, v["id"].as_u64()), (201, Some(3)), "{v}");
    let (s, v) = call(&d, "DELETE", "/v1/workers/1", None);
    assert_eq!(s, 204, "{v}");

    // Restart: the stored tenants go back into the maps.
    d.stop().unwrap();
    let d = start(config(dir.path(), &veth.a, ""));
    let ids: Vec<u64> = call(&d, "GET", "/v1/tenants", None).1["tenant"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1, 2, 4]);
    tx.each(&[dst(1), dst(22), dst(4), dst(3)], 30);
    let v = wait_stats(&d, "after the restart", |v| {
        [1, 2, 4].iter().all(|&id| seen(v, id) == 30) && unmatched(v) >= 30
    });
    assert!(row(&v, 3).is_none());
    d.stop().unwrap();
}

#[test]
fn a_stuck_worker_loses_its_other_tenants_to_live_workers_within_a_timeslot() {
    let test = "xdp::a_stuck_worker_loses_its_other_tenants_to_live_workers_within_a_timeslot";
    if !ready(test) {
        return;
    }
    let veth = Veth::new();
    let dir = tempfile::tempdir().unwrap();
    // Timeslots of 2^30 ns (1.07 s): a worker is stuck after half of one.
    let d = start(config(dir.path(), &veth.a, "shift = 30"));
    stuck_worker_case(d, AnySender::One(Sender::new(&veth.b)));
}

/// The same with every worker polling a socket on each of four queues (native mode),
/// each destination's frames spread over all of them: a worker stuck in a handler is
/// still found stuck, and its other tenants move to live workers within a timeslot.
#[test]
fn a_stuck_worker_on_four_queues_loses_its_other_tenants_within_a_timeslot() {
    let test = "xdp::a_stuck_worker_on_four_queues_loses_its_other_tenants_within_a_timeslot";
    if !ready(test) {
        return;
    }
    let veth = Veth::with_queues(4);
    let dir = tempfile::tempdir().unwrap();
    let d = start(config_native(
        dir.path(),
        &veth.a,
        "shift = 30",
        "[0, 1, 2, 3]",
    ));
    stuck_worker_case(d, AnySender::Queues(QueueSender::new(&veth.b, 4)));
}

/// Frames into the veth's other end, through one socket or one per queue.
enum AnySender {
    One(Sender),
    Queues(QueueSender),
}

impl AnySender {
    fn each(&mut self, dsts: &[[u8; 4]], n: usize) {
        match self {
            AnySender::One(s) => s.each(dsts, n),
            AnySender::Queues(s) => s.each(dsts, n),
        }
    }

    fn send(&mut self, frames: &[Vec<u8>]) {
        match self {
            AnySender::One(s) => s.send(frames),
            AnySender::Queues(s) => {
                let on: Vec<(usize, Vec<u8>)> = frames
                    .iter()
                    .enumerate()
                    .map(|(i, f)| (i % s.ports.len(), f.clone()))
                    .collect();
                s.send(&on)
            }
        }
    }
}

/// Tenant 1 stalls its worker on a STALL frame; tenants 2, 3 and 4 are its victims (3 on
/// its worker): the worker is found stuck within a timeslot, 3 moves to a live worker,
/// and no victim frame is lost.
fn stuck_worker_case(d: Daemon, mut tx: AnySender) {
    // Tenant 1 stalls on a STALL frame; 2, 3, 4 are its victims (3 on its worker).
    for id in 1..=4u32 {
        let policy = json!({ "stall": id == 1 });
        admit(&d, id, policy);
    }
    let v = stats(&d);
    let worker_of = |v: &Value, id: u64| row(v, id).unwrap()["worker"].as_u64().unwrap();
    assert_eq!(worker_of(&v, 1), worker_of(&v, 3), "{v}");
    let stuck = worker_of(&v, 1);
    let dst = |id: u8| [10, id, 0, 1];
    tx.each(&[dst(1), dst(2), dst(3), dst(4)], 20);
    wait_stats(&d, "before the stall", |v| {
        (1..=4).all(|id| seen(v, id) == 20)
    });

    // The stall, then the victims' frames every 10 ms until tenant 3 (on the stuck
    // worker) counts again.
    tx.send(&[frame(dst(1), b"STALL")]);
    let t0 = Instant::now();
    let mut sent_after = 0u64;
    let moved_after = loop {
        tx.each(&[dst(2), dst(3), dst(4)], 1);
        sent_after += 1;
        std::thread::sleep(Duration::from_millis(10));
        let v = stats(&d);
        if seen(&v, 3) > 20 {
            break t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never moved: {v}");
    };
    let timeslot = Duration::from_nanos(1 << 30);
    assert!(
        moved_after < timeslot,
        "tenant 3 reached a live worker again {moved_after:?} after the stall"
    );
    let v = stats(&d);
    assert_eq!(v["workers"][stuck as usize]["live"], json!(false), "{v}");
    assert_eq!(row(&v, 1).unwrap()["quarantined"], json!(true), "{v}");
    assert_ne!(worker_of(&v, 3), stuck);
    // Tenant 2 or 4, on the live worker, lost nothing meanwhile.
    let other = if worker_of(&v, 2) != stuck { 2 } else { 4 };
    wait_stats(&d, "the live worker's victim", |v| {
        seen(v, other) == 20 + sent_after
    });
    // From now on every victim frame is counted, on live workers.
    let before: Vec<u64> = (2..=4).map(|id| seen(&v, id)).collect();
    tx.each(&[dst(2), dst(3), dst(4)], 50);
    wait_stats(&d, "the victims after the move", |v| {
        (2..=4u64).zip(&before).all(|(id, b)| seen(v, id) >= b + 50)
    });
    let v = stats(&d);
    for (id, b) in (2..=4u64).zip(&before) {
        assert_eq!(seen(&v, id), b + 50, "tenant {id}: {v}");
    }
    // The stuck thread never returns: the daemon is stopped without waiting for it.
    d.stop().unwrap();
}

/// A worker stuck in a handler may still hold frames of a tenant removed meanwhile (in
/// its burst and its socket). Should it come back, those frames must not run on the
/// state of a tenant admitted after the removal: the removed tenant's slot stays retired
/// while the stuck worker may still hold it.
#[test]
fn a_removed_tenants_frames_in_a_stuck_worker_never_reach_the_next_tenant() {
    let test = "xdp::a_removed_tenants_frames_in_a_stuck_worker_never_reach_the_next_tenant";
    if !ready(test) {
        return;
    }
    let veth = Veth::new();
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path(), &veth.a, "shift = 30"));
    let mut tx = Sender::new(&veth.b);
    // Tenant 1 stalls (until released) on a STALL frame; tenant 3 shares its worker.
    for id in 1..=4u32 {
        let policy = json!({ "stall": id == 1, "until_released": true });
        admit(&d, id, policy);
    }
    let v = stats(&d);
    let worker_of = |v: &Value, id: u64| row(v, id).unwrap()["worker"].as_u64().unwrap();
    assert_eq!(worker_of(&v, 1), worker_of(&v, 3), "{v}");
    let stuck = worker_of(&v, 1);
    let dst = |id: u8| [10, id, 0, 1];
    // The stall, and right behind it frames of tenant 3 that its stuck worker takes
    // into its socket before anyone notices.
    tx.send(&[frame(dst(1), b"STALL")]);
    tx.each(&[dst(3)], 40);
    wait_stats(&d, "the worker found stuck", |v| {
        v["workers"][stuck as usize]["live"] == json!(false)
    });
    // Tenant 3 leaves; tenant 5 comes (the lowest free slot would be 3's).
    let (s, v) = call(&d, "DELETE", "/v1/tenants/3", None);
    assert!(s == 200 || s == 204, "{s} {v}");
    admit(&d, 5, json!({}));
    // The stuck handler comes back: the worker runs what it held.
    RELEASED.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(500));
    let v = stats(&d);
    assert_eq!(seen(&v, 5), 0, "tenant 5 ran frames no one sent it: {v}");
    // Tenant 5 is served as usual.
    tx.each(&[dst(5)], 10);
    let v = wait_stats(&d, "tenant 5's own frames", |v| seen(v, 5) >= 10);
    assert_eq!(seen(&v, 5), 10, "{v}");
    d.stop().unwrap();
}

/// Sends frames into a veth end on chosen transmit queues: one AF_XDP socket per queue
/// in copy mode, so the kernel transmits each frame on its socket's queue and the veth
/// hands it to the peer's receive queue of that number (native mode; docs/ports.md).
struct QueueSender {
    ports: Vec<buffet_io::afxdp::AfXdpPort>,
    pool: HeapPool,
}

impl QueueSender {
    fn new(iface: &str, queues: u32) -> QueueSender {
        use buffet_io::afxdp::{AfXdpConfig, AfXdpPort, CopyMode};
        let ports = (0..queues)
            .map(|q| {
                AfXdpPort::open(AfXdpConfig {
                    queue: q,
                    redirect: None,
                    copy: CopyMode::Copy,
                    frames: 512,
                    ring_size: 256,
                    ..AfXdpConfig::new(iface, q as u16)
                })
                .unwrap()
            })
            .collect();
        QueueSender {
            ports,
            pool: HeapPool::new(256),
        }
    }

    /// Sends each `(queue, frame)`, paced (the receiving sockets are never the limit).
    fn send(&mut self, frames: &[(usize, Vec<u8>)]) {
        let mut rx = Vec::new();
        for chunk in frames.chunks(16) {
            let mut bursts: Vec<Vec<_>> = self.ports.iter().map(|_| Vec::new()).collect();
            for (q, f) in chunk {
                let mut b = self.pool.take().unwrap();
                assert!(b.fill(f));
                bursts[*q].push(b);
            }
            for (port, burst) in self.ports.iter_mut().zip(&mut bursts) {
                port.tx_burst(burst, &mut self.pool).unwrap();
                // Completions back to the port's free frames.
                port.rx_burst(&mut self.pool, &mut rx, 64).unwrap();
                for b in rx.drain(..) {
                    port.recycle(b);
                }
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        for p in &self.ports {
            assert_eq!(p.stats().tx_dropped, 0, "{:?}", p.stats());
        }
    }

    /// `n` frames to each of `dsts`, interleaved, each destination's frames spread
    /// round robin over every queue.
    fn each(&mut self, dsts: &[[u8; 4]], n: usize) {
        let queues = self.ports.len();
        let frames: Vec<(usize, Vec<u8>)> = (0..n)
            .flat_map(|j| {
                dsts.iter()
                    .enumerate()
                    .map(move |(k, d)| ((j + k) % queues, frame(*d, b"data")))
            })
            .collect();
        self.send(&frames);
    }
}

/// Whether `iface` has an XDP program attached (`ip link show` lists it).
fn xdp_attached(iface: &str) -> bool {
    let out = Command::new("ip")
        .args(["link", "show", "dev", iface])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

/// buffetd's XDP Packet Dispatcher on four queues of a veth (native mode: a frame sent
/// on the peer's queue q arrives on queue q): every worker has a socket on each queue,
/// eight tenants' frames spread over all four queues are each counted exactly; a worker
/// launched at run time gets a socket on every queue into the XSKMAP, and the tenant it
/// takes receives every frame sent to it on any of the four queues (a frame on a queue
/// where its worker had no socket would reach no worker); terminated, its tenant moves on
/// and no frame is lost. A queue the interface lacks is refused first, leaving nothing
/// attached.
#[test]
fn the_xdp_dispatcher_serves_every_queue_including_a_worker_launched_at_run_time() {
    let test = "xdp::the_xdp_dispatcher_serves_every_queue_including_a_worker_launched_at_run_time";
    if !ready(test) {
        return;
    }
    let veth = Veth::with_queues(4);
    let dir = tempfile::tempdir().unwrap();

    // Queue 4 of a four-queue interface: refused at start, nothing attached.
    let bad = config_native(dir.path(), &veth.a, "", "[0, 4]");
    let e = Daemon::start_with(
        bad,
        Path::new("xdp.toml"),
        Box::new(|cfg, _| buffet_daemon::plane::start_nf(cfg, Stallable)),
    )
    .err()
    .expect("queue 4 is refused");
    let e = format!("{e:#}");
    assert!(
        e.contains(&format!(
            "af_xdp on {}: queue 4 does not exist: the interface has 4 receive queue(s)",
            veth.a
        )),
        "{e}"
    );
    assert!(!xdp_attached(&veth.a), "nothing left attached");

    let d = start(config_native(dir.path(), &veth.a, "", "[0, 1, 2, 3]"));
    assert!(xdp_attached(&veth.a));
    let mut tx = QueueSender::new(&veth.b, 4);
    for id in 1..=8u32 {
        admit(&d, id, json!({}));
    }
    let dst = |id: u8| [10, id, 0, 1];
    let all: Vec<[u8; 4]> = (1..=8).map(dst).collect();
    tx.each(&all, 40);
    let v = wait_stats(&d, "40 frames each, over four queues", |v| {
        (1..=8).all(|id| seen(v, id) == 40)
    });
    for id in 1..=8 {
        assert_eq!(row(&v, id).unwrap()["packets"].as_u64(), Some(40), "{v}");
    }

    // Worker 2 at run time: tenant 9 goes to it (it has none) and its frames come on
    // every queue, ten on each.
    let (s, v) = call(&d, "POST", "/v1/workers", None);
    assert_eq!((s, v["id"].as_u64()), (201, Some(2)), "{v}");
    admit(&d, 9, json!({}));
    assert_eq!(row(&stats(&d), 9).unwrap()["worker"].as_u64(), Some(2));
    tx.each(&[dst(9)], 40);
    let v = wait_stats(&d, "tenant 9 on the launched worker", |v| seen(v, 9) == 40);
    assert_eq!(
        v["workers"][2]["packets"].as_u64(),
        Some(40),
        "worker 2 ran tenant 9's 40 frames, ten from each queue: {v}"
    );

    // Terminated: its sockets leave the XSKMAP on every queue, tenant 9 moves on.
    let (s, v) = call(&d, "DELETE", "/v1/workers/2", None);
    assert_eq!(s, 204, "{v}");
    let v = stats(&d);
    assert_ne!(row(&v, 9).unwrap()["worker"].as_u64(), Some(2), "{v}");
    tx.each(&[dst(9), dst(1)], 20);
    let v = wait_stats(&d, "after the termination", |v| {
        seen(v, 9) == 60 && seen(v, 1) == 60
    });
    assert_eq!(v["workers"][2]["packets"].as_u64(), Some(40), "{v}");
    assert_eq!(v["global"]["no_live_worker"].as_u64(), Some(0), "{v}");
    d.stop().unwrap();
    assert!(!xdp_attached(&veth.a), "detached at the end");
}

/// buffetd reading two of a four-queue veth's queues (native mode: a frame sent on the
/// peer's queue q arrives on queue q): the frames that arrive on queues 2 and 3 find no
/// worker socket there, so the XDP Packet Dispatcher drops them, and `/v1/stats` counts
/// them as `global.no_socket`; the tenants' rows hold only the frames of the queues read,
/// so every frame the program saw is accounted for.
#[test]
fn frames_on_queues_buffetd_does_not_read_are_counted_as_no_socket() {
    let test = "xdp::frames_on_queues_buffetd_does_not_read_are_counted_as_no_socket";
    if !ready(test) {
        return;
    }
    let veth = Veth::with_queues(4);
    let dir = tempfile::tempdir().unwrap();
    let d = start(config_native(dir.path(), &veth.a, "", "[0, 1]"));
    let mut tx = QueueSender::new(&veth.b, 4);
    for id in 1..=2u32 {
        admit(&d, id, json!({}));
    }
    // 40 frames to each tenant, spread round robin over the four queues: ten of each
    // tenant's on every queue.
    tx.each(&[[10, 1, 0, 1], [10, 2, 0, 1]], 40);
    let v = wait_stats(
        &d,
        "the frames of queues 0 and 1 run, 2 and 3 dropped",
        |v| seen(v, 1) == 20 && seen(v, 2) == 20 && v["global"]["no_socket"].as_u64() == Some(40),
    );
    let g = &v["global"];
    assert_eq!(g["input_packets"].as_u64(), Some(80), "{v}");
    assert_eq!(g["unmatched"].as_u64(), Some(0), "{v}");
    assert_eq!(g["no_live_worker"].as_u64(), Some(0), "{v}");
    for id in 1..=2 {
        assert_eq!(row(&v, id).unwrap()["packets"].as_u64(), Some(20), "{v}");
    }
    d.stop().unwrap();
}

/// buffetd's XDP Packet Dispatcher in native mode on a veth whose MTU is 9000: the
/// kernel refuses the program with a bare ERANGE; buffetd says what it means (the
/// driver's native XDP cannot take frames of that MTU) and what to do (the veth's
/// limit, or `xdp_mode = "generic"` in the port's table), as `buffet run` does, and
/// leaves nothing attached.
#[test]
fn native_xdp_on_a_jumbo_mtu_veth_says_what_to_do() {
    let test = "xdp::native_xdp_on_a_jumbo_mtu_veth_says_what_to_do";
    if !ready(test) {
        return;
    }
    let veth = Veth::new();
    ip(&["link", "set", &veth.a, "mtu", "9000"]);
    ip(&["link", "set", &veth.b, "mtu", "9000"]);
    let dir = tempfile::tempdir().unwrap();
    let e = Daemon::start_with(
        config_native(dir.path(), &veth.a, "", "[0]"),
        Path::new("xdp.toml"),
        Box::new(|cfg, _| buffet_daemon::plane::start_nf(cfg, Stallable)),
    )
    .err()
    .expect("native XDP on MTU 9000 is refused");
    let e = format!("{e:#}");
    assert!(
        e.starts_with(&format!(
            "dispatch.mode = \"xdp\": attaching the XDP dispatcher to {}: native XDP cannot \
             take frames of this interface's MTU (9000 bytes)",
            veth.a
        )) && e.contains("at most 3506")
            && e.ends_with("or use xdp_mode = \"generic\" in port[0]"),
        "{e}"
    );
    assert_eq!(
        e.matches(veth.a.as_str()).count(),
        2,
        "the interface, and the ip command: {e}"
    );
    assert!(!e.contains("Numerical result out of range"), "{e}");
    assert!(
        !e.contains("--xdp-mode"),
        "buffet run's flag is no buffetd setting: {e}"
    );
    assert!(!xdp_attached(&veth.a), "nothing left attached");
}

/// The sample `name{reason="reason"}` of buffetd's `/metrics`.
fn metric(d: &Daemon, name: &str, reason: &str) -> Option<f64> {
    let text = ureq::get(&format!("http://{}/metrics", d.addr()))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && s.labels.get("reason") == Some(reason))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

/// Every frame the program saw, accounted for: what the tenants' workers ran and the
/// program policed, and the global counts.
fn accounted(v: &Value) -> u64 {
    let g = &v["global"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let tenants: u64 = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| n(&t["packets"]) + n(&t["drops"]["policed"]))
        .sum();
    let malformed: u64 = g["malformed"].as_object().unwrap().values().map(n).sum();
    tenants
        + malformed
        + [
            "unmatched",
            "no_live_worker",
            "no_socket",
            "untagged",
            "socket_dropped",
            "oversize",
        ]
        .iter()
        .map(|k| n(&g[k]))
        .sum::<u64>()
}

/// A worker that reads nothing for a second (its handler sleeps on a HOLD frame) while
/// 6000 frames come for its tenant: the kernel drops at the worker's AF_XDP socket what
/// its receive ring (and the fill ring) cannot hold. While buffetd runs, `/v1/stats`
/// counts them as `global.socket_dropped` (none as oversize: they fitted a frame),
/// every frame the program saw is accounted for, `/metrics` exports the same count as
/// `buffet_dropped_packets_total{reason="socket_dropped"}`, and the final report
/// `Daemon::stop` returns has the same counts.
#[test]
fn frames_the_kernel_dropped_at_a_workers_socket_are_counted_and_exported() {
    let test = "xdp::frames_the_kernel_dropped_at_a_workers_socket_are_counted_and_exported";
    if !ready(test) {
        return;
    }
    let veth = Veth::new();
    let dir = tempfile::tempdir().unwrap();
    // A timeslot of 17 s: a worker asleep in a handler for a second is not stuck.
    let d = start(config(dir.path(), &veth.a, "shift = 34\n"));
    admit(&d, 1, json!({ "hold_ms": 1000 }));
    let mut tx = Sender::new(&veth.b);
    let dst = [10, 1, 0, 1];
    tx.send(&[frame(dst, b"HOLD")]);
    std::thread::sleep(Duration::from_millis(50));
    tx.each(&[dst], 6000);
    let v = wait_stats(&d, "every frame accounted for", |v| {
        v["global"]["input_packets"].as_u64() == Some(6001) && accounted(v) == 6001
    });
    let g = &v["global"];
    let dropped = g["socket_dropped"].as_u64().unwrap_or(0);
    assert!(dropped > 0, "the flood overran the worker's socket: {v}");
    assert_eq!(g["oversize"].as_u64(), Some(0), "{v}");
    assert_eq!(seen(&v, 1) + dropped, 6001, "{v}");
    assert_eq!(
        metric(&d, "buffet_dropped_packets_total", "socket_dropped"),
        Some(dropped as f64),
        "/metrics: {v}"
    );
    // The final report has the program's counts and the kernel's drops too.
    let r = d.stop().unwrap();
    let g = &r.global;
    assert_eq!(g.input_packets, 6001, "{g:?}");
    assert_eq!(g.socket_dropped, dropped, "{g:?}");
    let tenant = r.tenants.iter().find(|t| t.id.0 == 1).expect("tenant 1");
    assert_eq!(tenant.packets + g.socket_dropped, 6001, "{g:?}");
}
