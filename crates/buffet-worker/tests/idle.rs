//! An idle pipeline blocks, and is woken at once by what arrives: a frame on a port that
//! announces its frames on a descriptor, a command. The idle wait is set to seconds here,
//! so a thread that missed its wake-up (a worker blocked on the port's descriptor, which
//! the data plane drains first; a data plane that missed a worker's hand-back or a
//! command) would show as a frame or an answer seconds late.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use buffet_io::{
    HeapPool, PacketBuf, PacketSource, Port, PortError, PortStats, RawPacket, Rx, SourceError,
    SourcePort,
};
use buffet_nfs::monitor::Monitor;
use buffet_testkit::cores_used_over;
use buffet_worker::{build, Control, Dataplane, PipelineConfig};

mod common;
use common::{seq_frame, seq_of, spec};

/// Far longer than any wake-up may take: a frame or answer this late missed one.
const IDLE_WAIT: Duration = Duration::from_secs(3);
/// What a frame's or answer's way through an idle pipeline may take on a loaded machine.
const PROMPT: Duration = Duration::from_millis(800);

/// A live port whose frames arrive as datagrams on a socket (readable while one waits,
/// as a packet socket is) and whose sent frames are reported with the instant they
/// left.
struct SocketPort {
    socket: UnixDatagram,
    sent: mpsc::Sender<(u32, Instant)>,
    stats: PortStats,
}

impl Port for SocketPort {
    fn name(&self) -> String {
        "socket".into()
    }
    fn rx_burst(
        &mut self,
        pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError> {
        let mut n = 0;
        let mut buf = [0u8; 2048];
        while n < max {
            let Ok(len) = self.socket.recv(&mut buf) else {
                break;
            };
            let Some(mut b) = pool.take() else { break };
            assert!(b.fill(&buf[..len]));
            b.in_port = 0;
            out.push(b);
            self.stats.rx += 1;
            n += 1;
        }
        Ok(if n == 0 { Rx::Idle } else { Rx::Packets(n) })
    }
    fn tx_burst(
        &mut self,
        pkts: &mut Vec<PacketBuf>,
        pool: &mut HeapPool,
    ) -> Result<(), PortError> {
        let now = Instant::now();
        for b in pkts.drain(..) {
            let _ = self.sent.send((seq_of(b.data()), now));
            self.stats.tx += 1;
            pool.give(b);
        }
        Ok(())
    }
    fn is_live(&self) -> bool {
        true
    }
    fn stats(&self) -> PortStats {
        self.stats
    }
    fn readiness_fds(&self) -> Option<Vec<RawFd>> {
        Some(vec![self.socket.as_raw_fd()])
    }
}

/// What [`socket_pipeline`] returns.
type SocketPipeline = (
    Control<Monitor>,
    Dataplane<Monitor>,
    UnixDatagram,
    mpsc::Receiver<(u32, Instant)>,
);

/// A Monitor pipeline of `workers` workers and an idle wait of [`IDLE_WAIT`], with a
/// [`SocketPort`] as port 0: returns its control, its data plane, the socket's other end
/// (frames sent on it arrive on the port) and the port's record of what it sent.
fn socket_pipeline(workers: u16) -> SocketPipeline {
    let cfg = PipelineConfig {
        workers,
        pin: false,
        ..PipelineConfig::default()
    };
    let (control, mut dataplane) = build(Monitor::default(), cfg).unwrap();
    dataplane.set_idle_wait(IDLE_WAIT);
    let (ours, theirs) = UnixDatagram::pair().unwrap();
    theirs.set_nonblocking(true).unwrap();
    let (sent_tx, sent) = mpsc::channel();
    dataplane.add_port(Box::new(SocketPort {
        socket: theirs,
        sent: sent_tx,
        stats: PortStats::default(),
    }));
    (control, dataplane, ours, sent)
}

#[test]
fn an_idle_pipeline_is_woken_at_once_by_a_frame_and_by_a_command() {
    let (control, mut dataplane, ours, sent) = socket_pipeline(2);
    let runner = std::thread::spawn(move || {
        dataplane.run(|_| {}).unwrap();
        dataplane.finish()
    });
    // Admissions while the data plane sleeps: each answer comes at once.
    for t in 1..=4 {
        std::thread::sleep(Duration::from_millis(50));
        let t0 = Instant::now();
        control.admit(spec(t)).unwrap();
        assert!(
            t0.elapsed() < PROMPT,
            "admitting tenant {t} to an idle data plane took {:?}",
            t0.elapsed()
        );
    }
    // One frame at a time into the idle pipeline, each after every thread has had time
    // to block: each comes back at once, whichever worker its tenant is on.
    let mut slowest = Duration::ZERO;
    for seq in 0..24u32 {
        std::thread::sleep(Duration::from_millis(20));
        let tenant = 1 + seq % 4;
        let t0 = Instant::now();
        ours.send(&seq_frame(tenant, seq)).unwrap();
        let (got, at) = sent
            .recv_timeout(IDLE_WAIT * 2)
            .expect("the frame came back");
        assert_eq!(got, seq);
        slowest = slowest.max(at - t0);
    }
    assert!(
        slowest < PROMPT,
        "a frame into an idle pipeline took {slowest:?} to come back (idle wait {IDLE_WAIT:?})"
    );
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    control.stop();
    let report = runner.join().unwrap();
    assert!(
        t0.elapsed() < PROMPT,
        "an idle data plane took {:?} to stop",
        t0.elapsed()
    );
    assert_eq!(report.global.input_packets, 24, "{:?}", report.global);
}

/// A file-like source of `frames` (ts 0, 1, ...): ends when they are read.
struct Frames(Vec<Vec<u8>>, usize);

impl PacketSource for Frames {
    fn next_packet(&mut self) -> Result<Option<RawPacket<'_>>, SourceError> {
        let i = self.1;
        self.1 += 1;
        Ok(self.0.get(i).map(|f| RawPacket {
            ts_ns: i as u64,
            data: f,
        }))
    }
}

/// `Dataplane::serve` (a daemon's loop) with a file port that has ended beside a live
/// one: once the file has ended it is no longer polled for, so the idle data plane
/// blocks on the live port's descriptor (using almost no CPU) and still takes its next
/// frame at once; a command stops it at once.
#[test]
fn a_serving_data_plane_blocks_on_its_live_ports_once_a_file_port_ended() {
    let (control, mut dataplane, ours, sent) = socket_pipeline(1);
    let file: Vec<Vec<u8>> = (0..10).map(|i| seq_frame(1, 1000 + i)).collect();
    dataplane.add_port(Box::new(SourcePort::new(1, "file", Frames(file, 0))));
    let runner = std::thread::spawn(move || {
        let mut errors = 0;
        dataplane.serve(|_| errors += 1);
        (dataplane.finish(), errors)
    });
    // The file's frames are read (matched or not: they race the admission) and the file
    // port ends.
    control.admit(spec(1)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let cores = cores_used_over(std::process::id(), Duration::from_secs(2));
    assert!(
        cores < 0.03,
        "an idle serving data plane used {cores:.3} cores with its file port ended"
    );
    let t0 = Instant::now();
    ours.send(&seq_frame(1, 7)).unwrap();
    let (got, at) = sent
        .recv_timeout(IDLE_WAIT * 2)
        .expect("the frame came back");
    assert_eq!(got, 7);
    assert!(
        at - t0 < PROMPT,
        "a frame into the idle data plane took {:?} to come back",
        at - t0
    );
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    control.stop();
    let (report, errors) = runner.join().unwrap();
    assert!(t0.elapsed() < PROMPT, "stopping took {:?}", t0.elapsed());
    assert_eq!(errors, 0);
    assert_eq!(report.global.input_packets, 11, "{:?}", report.global);
}
