//! Packet sources compared in one group: the synthetic generator against
//! replaying the very same packets from a pcap file (the baseline).
//!
//! `cargo bench -p buffet-io --bench sources`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use buffet_io::gen::{GenConfig, Generator};
use buffet_io::pcap::{PcapReader, PcapWriter};
use buffet_io::PacketSource;

const PACKETS: u64 = 200_000;

fn cfg(tenants: u32) -> GenConfig {
    GenConfig {
        tenants,
        mean_rate_pps: 10_000_000.0,
        duration_ns: u64::MAX,
        max_packets: Some(PACKETS),
        ..GenConfig::default()
    }
}

fn drain(src: &mut impl PacketSource) -> u64 {
    let mut bytes = 0;
    while let Some(p) = src.next_packet().expect("source failed") {
        bytes += p.data.len() as u64;
    }
    bytes
}

fn sources(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bench.pcap");
    let mut w = PcapWriter::create(&path).expect("create");
    w.write_all_from(&mut Generator::new(cfg(1_000)).expect("config"))
        .expect("write");
    w.finish().expect("finish");

    let mut g = c.benchmark_group("sources");
    g.throughput(Throughput::Elements(PACKETS));
    g.sample_size(10);
    g.bench_function("pcap_replay_1000_tenants", |b| {
        b.iter(|| drain(&mut PcapReader::open(&path).expect("open")))
    });
    g.bench_function("generator_1000_tenants", |b| {
        b.iter(|| drain(&mut Generator::new(cfg(1_000)).expect("config")))
    });
    g.bench_function("generator_8_tenants", |b| {
        b.iter(|| drain(&mut Generator::new(cfg(8)).expect("config")))
    });
    g.finish();
}

criterion_group!(benches, sources);
criterion_main!(benches);
