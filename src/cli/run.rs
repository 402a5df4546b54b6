//! What `demo` and `replay` share: admission from a tenants list, driving a packet
//! source through a pipeline with a progress bar, and printing the report.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use buffet_io::Port;
use buffet_memory::ArenaConfig;
use buffet_sdk::NetworkFunction;
use buffet_worker::{Pipeline, PipelineConfig, PipelineError, Report, TenantSpec, WorkerEvent};
use indicatif::{ProgressBar, ProgressStyle};

use buffet_config::TenantConfig;
use clap::Args;

use super::limits;

/// Capacity flags of a run that starts a pipeline (`demo`, `replay`, `run`): what it may
/// cost in threads and memory, and how long a packet may wait in a worker's Packet
/// Buffers. docs/cli.md lists what each limit admits.
#[derive(Args, Debug, Clone)]
pub struct Capacity {
    /// Worker threads (at most the cores available, unless --allow-oversubscribe).
    #[arg(long, default_value_t = 2)]
    pub workers: u16,
    /// Allow more workers than cores (up to 256).
    #[arg(long)]
    pub allow_oversubscribe: bool,
    /// Address space of the Memory Manager's arena, in MiB: every tenant's region and
    /// its guard page come from it.
    #[arg(long, value_name = "MIB", default_value_t = 256 << 10,
          value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub arena_mib: u64,
    /// Tenant Table slots: the most tenants admitted at once.
    #[arg(long, value_name = "N", default_value_t = 16_384,
          value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub tenant_slots: u32,
    /// Packets that make a tenant's Packet Buffer a full group, run at once (Packet
    /// Buffers persist across bursts, e.g. 32); 0 (the default) runs each burst's groups
    /// as they arrive.
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub flush_packets: u32,
    /// Latency bound in microseconds: a Packet Buffer whose oldest packet waited this
    /// long runs even when not full.
    #[arg(long, value_name = "US", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub flush_us: u64,
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity {
            workers: 2,
            allow_oversubscribe: false,
            arena_mib: 256 << 10,
            tenant_slots: 16_384,
            flush_packets: 0,
            flush_us: 50,
        }
    }
}

impl Capacity {
    /// The Memory Manager's arena `--arena-mib` asks for.
    pub fn arena(&self) -> ArenaConfig {
        ArenaConfig::mib(self.arena_mib)
    }

    /// Checks the flags and applies them to `cfg`.
    pub fn apply(&self, cfg: &mut PipelineConfig) -> Result<(), limits::WorkersError> {
        cfg.workers =
            limits::check_workers(self.workers, limits::cores(), self.allow_oversubscribe)?;
        cfg.arena = self.arena();
        cfg.tenant_capacity = self.tenant_slots;
        cfg.flush_packets = self.flush_packets as usize;
        cfg.flush_ns = self.flush_us * 1_000;
        Ok(())
    }
}

/// Admits every tenant; the first error stops and names the file and tenant.
pub fn admit_all<N: NetworkFunction>(
    p: &mut Pipeline<N>,
    tenants: &[TenantConfig],
    file: &Path,
) -> anyhow::Result<()> {
    for t in tenants {
        let policy: N::Policy = t.policy_as(file)?;
        p.admit(TenantSpec {
            id: t.id,
            name: t.name.clone(),
            rules: t.rules.clone(),
            max_nb: t.max_nb,
            policy,
        })
        .and_then(|_| p.set_weight(t.id, t.weight))
        .map_err(admission_cause)
        .with_context(|| {
            format!(
                "{}: cannot admit tenant {} ({:?})",
                file.display(),
                t.id,
                t.name
            )
        })?;
    }
    Ok(())
}

/// Why a tenant was refused, without the tenant: [`admit_all`]'s context names it (the
/// pipeline's error names it too, and said twice it reads `tenant 1 ("a"): tenant 1: …`).
fn admission_cause(e: PipelineError) -> anyhow::Error {
    match e {
        PipelineError::Policy { source, .. } => source.into(),
        PipelineError::Memory { source, .. } => source.into(),
        PipelineError::Dispatch { source, .. } => source.into(),
        other => other.into(),
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal): a bar of `len`
/// packets when the source knows how many it holds, else a spinner with the count so far.
pub fn progress(len: Option<u64>, what: &str) -> ProgressBar {
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let style = ProgressStyle::with_template(progress_template(len.is_some()))
        .map(|s| {
            s.with_key(
                "rate",
                |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&rate_text(state.per_sec()));
                },
            )
        })
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(what.to_owned());
    bar
}

/// The progress line's template: with a known length a bar and `pos/len`; without one
/// no bar (it would stay empty) and no length (it would read `pos/pos`).
fn progress_template(known_len: bool) -> &'static str {
    if known_len {
        "{spinner} {msg} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} packets ({rate})"
    } else {
        "{spinner} {msg} [{elapsed_precise}] {human_pos} packets ({rate})"
    }
}

/// Packets per second as the progress line shows it: a whole number with thousands
/// separators (`1,310,627/s`).
fn rate_text(per_sec: f64) -> String {
    let n = if per_sec.is_finite() && per_sec > 0.0 {
        per_sec.round() as u64
    } else {
        0
    };
    format!("{}/s", indicatif::HumanCount(n))
}

/// Adds `port` as port 0 and runs the pipeline until the port ends; returns how many
/// frames it delivered and how long it took.
pub fn drive<N: NetworkFunction>(
    p: &mut Pipeline<N>,
    port: Box<dyn Port>,
    bar: &ProgressBar,
) -> anyhow::Result<(u64, Duration)> {
    let start = Instant::now();
    p.add_port(port);
    let n = p.run(|n| bar.set_position(n))?;
    bar.set_position(n);
    bar.finish_and_clear();
    Ok((n, start.elapsed()))
}

/// Prints the per-tenant table.
/// Drops by reason as the tables print them: `reason=n` separated by spaces, `-` for none.
pub(crate) fn drops_text<K: std::fmt::Display, V: std::fmt::Display>(
    drops: &std::collections::BTreeMap<K, V>,
) -> String {
    if drops.is_empty() {
        return "-".to_owned();
    }
    drops
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn print_tenants(out: &mut dyn Write, r: &Report) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>6} {:<12} {:>6} {:>10} {:>12} {:>10} {:>8} {:>5}  drops by reason",
        "tenant", "name", "worker", "packets", "bytes", "passed", "dropped", "migr"
    )?;
    for t in &r.tenants {
        let drops = drops_text(&t.drops);
        writeln!(
            out,
            "{:>6} {:<12} {:>6} {:>10} {:>12} {:>10} {:>8} {:>5}  {}{}",
            t.id.0,
            t.name,
            t.worker,
            t.packets,
            t.bytes,
            t.passed,
            t.dropped(),
            t.migrations,
            drops,
            if t.quarantined { " QUARANTINED" } else { "" }
        )?;
        super::chain::print_stages(out, &t.nf)?;
    }
    let g = &r.global;
    writeln!(
        out,
        "input {} packets; not attributed to a tenant: unmatched {}, malformed {}, oversize {}",
        g.input_packets,
        g.unmatched,
        g.malformed_total(),
        g.oversize
    )?;
    if g.socket_dropped > 0 {
        writeln!(
            out,
            "  dropped by the kernel at the workers' AF_XDP sockets (socket_dropped): {}",
            g.socket_dropped
        )?;
    }
    for (why, n) in &g.malformed {
        writeln!(out, "  malformed {why}: {n}")?;
    }
    Ok(())
}

/// Prints scheduler events: the first `limit` of them, then counts.
pub fn print_events(out: &mut dyn Write, r: &Report, limit: usize) -> std::io::Result<()> {
    let migrations = r
        .events
        .iter()
        .filter(|e| matches!(e, WorkerEvent::Migration { .. }))
        .count();
    let overloads = r
        .events
        .iter()
        .filter(|e| matches!(e, WorkerEvent::Overload { .. }))
        .count();
    let (late_m, late_o) = (r.global.migrations_not_kept, r.global.overloads_not_kept);
    writeln!(
        out,
        "scheduler events: {} migrations, {} overload reports",
        migrations as u64 + late_m,
        overloads as u64 + late_o
    )?;
    if late_m + late_o > 0 {
        writeln!(
            out,
            "  ({late_m} migrations and {late_o} overload reports after the first {} scheduler events were counted, not kept)",
            migrations + overloads
        )?;
    }
    for e in r.events.iter().take(limit) {
        match e {
            WorkerEvent::Migration { seq, tenant, from, to, slot } => writeln!(
                out,
                "  slot {slot:>4}  packet {seq:>8}  migrate tenant {tenant} from worker {from} to worker {to}"
            )?,
            WorkerEvent::Overload { seq, worker, slot } => writeln!(
                out,
                "  slot {slot:>4}  packet {seq:>8}  overload report: worker {worker} overloaded beyond the threshold"
            )?,
            WorkerEvent::Fault { tenant, worker, message } => {
                writeln!(out, "  fault: tenant {tenant} on worker {worker} quarantined: {message}")?
            }
            WorkerEvent::WorkerLaunched { worker } => writeln!(out, "  worker {worker} launched")?,
            WorkerEvent::WorkerTerminated { worker, reassigned } => writeln!(
                out,
                "  worker {worker} terminated, {reassigned} tenants reassigned"
            )?,
            WorkerEvent::WorkerDied { worker, message, reassigned, requeued, dropped } => writeln!(
                out,
                "  worker {worker} died ({message}): {reassigned} tenants reassigned, {requeued} queued packets moved, {dropped} dropped"
            )?,
            WorkerEvent::WorkerStuck { worker, tenants, reassigned, requeued, stuck } => writeln!(
                out,
                "  worker {worker} stuck in tenant(s) {tenants:?} (quarantined): {reassigned} tenants reassigned, {requeued} queued packets moved, {stuck} caught"
            )?,
            WorkerEvent::PortDown { port, message } => {
                writeln!(out, "  port {port}: {message}")?
            }
            WorkerEvent::Released { tenant, faults } => {
                writeln!(out, "  tenant {tenant} released from quarantine after {faults} faults")?
            }
        }
    }
    if r.events.len() > limit {
        writeln!(out, "  … {} more events", r.events.len() - limit)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_line_without_a_length_has_no_bar_and_a_whole_rate() {
        let unknown = progress_template(false);
        for absent in ["bar", "len"] {
            assert!(!unknown.contains(absent), "{unknown}");
        }
        assert!(
            unknown.contains("{human_pos} packets ({rate})"),
            "{unknown}"
        );
        let known = progress_template(true);
        assert!(
            known.contains("{wide_bar} {human_pos}/{human_len}"),
            "{known}"
        );
        assert_eq!(rate_text(1_310_626.853_9), "1,310,627/s");
        assert_eq!(rate_text(0.4), "0/s");
        assert_eq!(rate_text(f64::NAN), "0/s");
        // Both templates parse, with the `rate` key.
        for t in [unknown, known] {
            ProgressStyle::with_template(t).unwrap();
        }
    }

    #[test]
    fn scheduler_events_counted_but_not_kept_are_in_the_totals() {
        let mut r = Report {
            events: vec![
                WorkerEvent::Overload {
                    seq: 7,
                    worker: 1,
                    slot: 3,
                };
                2
            ],
            ..Report::default()
        };
        let mut out = Vec::new();
        print_events(&mut out, &r, 20).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("scheduler events: 0 migrations, 2 overload reports\n"),
            "{text}"
        );
        assert!(!text.contains("not kept"), "{text}");

        r.global.migrations_not_kept = 5;
        r.global.overloads_not_kept = 9;
        let mut out = Vec::new();
        print_events(&mut out, &r, 20).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(
                "scheduler events: 5 migrations, 11 overload reports\n  (5 migrations and 9 \
                 overload reports after the first 2 scheduler events were counted, not kept)\n"
            ),
            "{text}"
        );
    }
}
