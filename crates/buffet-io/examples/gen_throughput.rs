//! Measures how fast the generator produces packets on one core.
//!
//! `cargo run --release -p buffet-io --example gen_throughput [packets] [tenants]`

use std::time::Instant;

use buffet_io::gen::{GenConfig, Generator};
use buffet_io::PacketSource;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let packets: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(5_000_000);
    let tenants: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1_000);
    let cfg = GenConfig {
        tenants,
        mean_rate_pps: 10_000_000.0,
        duration_ns: u64::MAX,
        max_packets: Some(packets),
        ..GenConfig::default()
    };
    let mut gen = Generator::new(cfg)?;
    let start = Instant::now();
    let (mut n, mut bytes) = (0u64, 0u64);
    while let Some(p) = gen.next_packet()? {
        n += 1;
        bytes += p.data.len() as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{n} packets ({bytes} bytes, {tenants} tenants) in {secs:.3} s: {:.2} Mpps, {:.2} Gbit/s",
        n as f64 / secs / 1e6,
        bytes as f64 * 8.0 / secs / 1e9
    );
    Ok(())
}
