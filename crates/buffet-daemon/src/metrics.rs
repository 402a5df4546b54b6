//! `/metrics`: the data plane's counters in the Prometheus text format, encoded by
//! prometheus-client.
//!
//! - Per tenant (label `tenant`, the tenant id): packets, bytes, drops by reason (label
//!   `reason`), CPU cycles, migrations, quarantined; with chains, per stage of the
//!   tenant's chain (labels `stage`, the index, and `nf`): packets in, passed, drops by
//!   cause.
//! - Per worker (label `worker`): packets, busy cycles, live.
//! - Server-wide: scheduler events seen (migrations, overload reports, faults), events
//!   dropped, unmatched packets, malformed frames by parse error and the other
//!   server-wide drops by reason (the `global` counts of `/v1/stats`), admitted tenants,
//!   and the admission latency histogram.
//!
//! Counters of the report are encoded at scrape time from one snapshot ([`Snapshot`], a
//! prometheus-client `Collector`); the daemon's own counters and the histogram live here.
//! Nothing is hand-formatted.

use std::sync::atomic::{AtomicU64, Ordering};

use buffet_config::chain::{stage_rows, StageRow};
use buffet_sdk::ParseError;
use buffet_worker::{GlobalReport, Report};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The daemon's own metrics (the report's are read at scrape time).
pub struct Metrics {
    /// Seconds from an admission request's arrival to its acknowledgement.
    pub admission_latency: Histogram,
    /// Migrations the scheduler made.
    pub migrations: Counter,
    /// Overload reports the scheduler raised.
    pub overload_reports: Counter,
    /// Tenants quarantined after a fault.
    pub quarantines: Counter,
    /// Workers the Agent launched after overload reports.
    pub agent_launches: Counter,
    /// Requests refused because the server is flagged overloaded.
    pub refused_admissions: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            admission_latency: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            migrations: Counter::default(),
            overload_reports: Counter::default(),
            quarantines: Counter::default(),
            agent_launches: Counter::default(),
            refused_admissions: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// The text exposition of these metrics and of `report`.
    pub fn encode(&self, report: Report) -> Result<String, std::fmt::Error> {
        let mut reg = Registry::default();
        reg.register(
            "buffet_admission_latency_seconds",
            "Time from an admission request to its acknowledgement",
            self.admission_latency.clone(),
        );
        reg.register(
            "buffet_migrations",
            "Tenants the scheduler moved off an overloaded worker",
            self.migrations.clone(),
        );
        reg.register(
            "buffet_overload_reports",
            "Overload reports the scheduler raised to the Agent",
            self.overload_reports.clone(),
        );
        reg.register(
            "buffet_quarantines",
            "Tenants quarantined after a fault of their NF code",
            self.quarantines.clone(),
        );
        reg.register(
            "buffet_agent_worker_launches",
            "Workers the Agent launched in answer to overload reports",
            self.agent_launches.clone(),
        );
        reg.register_collector(Box::new(Snapshot {
            report,
            refused: self.refused_admissions.load(Ordering::Relaxed),
        }));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg)?;
        Ok(out)
    }
}

/// One report, encoded as const metrics at scrape time.
#[derive(Debug)]
pub struct Snapshot {
    report: Report,
    refused: u64,
}

type Labels = Vec<(&'static str, String)>;

fn counters(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = enc.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (labels, v) in rows {
        ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauges(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, i64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = enc.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for (labels, v) in rows {
        ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One unlabelled counter.
fn counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    let m = enc.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    ConstCounter::new(v).encode(m)
}

/// The report's server-wide drop counts that belong to no tenant's row, by the name
/// `/v1/stats` gives them under `global`; every reason always, zero or not, so a
/// dashboard finds each series from the first scrape.
fn global_drops(g: &GlobalReport) -> [(&'static str, u64); 10] {
    [
        ("oversize", g.oversize),
        ("no_live_worker", g.no_live_worker),
        ("ring_full", g.ring_full),
        ("no_port", g.no_port),
        ("tx_no_buffer", g.tx_no_buffer),
        ("removed_tenant", g.removed_tenant),
        ("stuck_in_worker", g.stuck_in_worker),
        ("untagged", g.untagged),
        ("no_socket", g.no_socket),
        ("socket_dropped", g.socket_dropped),
    ]
}

fn tenant(id: buffet_sdk::TenantId) -> Labels {
    vec![("tenant", id.0.to_string())]
}

fn worker(id: u16) -> Labels {
    vec![("worker", id.to_string())]
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let r = &self.report;
        let t = &r.tenants;
        counters(
            &mut enc,
            "buffet_tenant_packets",
            "Packets of the tenant that reached its worker",
            t.iter().map(|x| (tenant(x.id), x.packets)),
        )?;
        counters(
            &mut enc,
            "buffet_tenant_bytes",
            "Bytes of the tenant that reached its worker",
            t.iter().map(|x| (tenant(x.id), x.bytes)),
        )?;
        counters(
            &mut enc,
            "buffet_tenant_passed_packets",
            "Packets the tenant's NF passed",
            t.iter().map(|x| (tenant(x.id), x.passed)),
        )?;
        counters(
            &mut enc,
            "buffet_tenant_drops",
            "Packets of the tenant dropped, by reason",
            t.iter().flat_map(|x| {
                x.drops.iter().map(move |(reason, n)| {
                    let mut l = tenant(x.id);
                    l.push(("reason", (*reason).to_owned()));
                    (l, *n)
                })
            }),
        )?;
        counters(
            &mut enc,
            "buffet_tenant_cycles",
            "CPU cycles spent in the tenant's NF (groups under 8 packets sampled, one burst in 8)",
            t.iter().map(|x| (tenant(x.id), x.cycles)),
        )?;
        counters(
            &mut enc,
            "buffet_tenant_migrations",
            "Times the scheduler moved the tenant",
            t.iter().map(|x| (tenant(x.id), x.migrations)),
        )?;
        let staged: Vec<(buffet_sdk::TenantId, StageRow)> = t
            .iter()
            .flat_map(|x| stage_rows(&x.nf).into_iter().map(move |s| (x.id, s)))
            .collect();
        let stage = |id: buffet_sdk::TenantId, s: &StageRow| {
            let mut l = tenant(id);
            l.push(("stage", s.stage.to_string()));
            l.push(("nf", s.nf.clone()));
            l
        };
        counters(
            &mut enc,
            "buffet_tenant_stage_packets",
            "Packets a stage of the tenant's chain handled",
            staged.iter().map(|(id, s)| (stage(*id, s), s.packets)),
        )?;
        counters(
            &mut enc,
            "buffet_tenant_stage_passed_packets",
            "Packets a stage of the tenant's chain passed on",
            staged.iter().map(|(id, s)| (stage(*id, s), s.passed)),
        )?;
        counters(
            &mut enc,
            "buffet_tenant_stage_drops",
            "Packets a stage of the tenant's chain dropped, by cause",
            staged.iter().flat_map(|(id, s)| {
                s.drops.iter().map(move |(cause, n)| {
                    let mut l = stage(*id, s);
                    l.push(("reason", cause.clone()));
                    (l, *n)
                })
            }),
        )?;
        gauges(
            &mut enc,
            "buffet_tenant_quarantined",
            "1 while the tenant is quarantined",
            t.iter().map(|x| (tenant(x.id), i64::from(x.quarantined))),
        )?;
        gauges(
            &mut enc,
            "buffet_tenant_worker",
            "The worker the tenant runs on",
            t.iter().map(|x| (tenant(x.id), i64::from(x.worker))),
        )?;
        let m = enc.encode_descriptor(
            "buffet_tenants",
            "Tenants admitted",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(t.len() as i64).encode(m)?;
        let w = &r.workers;
        counters(
            &mut enc,
            "buffet_worker_packets",
            "Packets the worker processed",
            w.iter().map(|x| (worker(x.id), x.packets)),
        )?;
        counters(
            &mut enc,
            "buffet_worker_busy_cycles",
            "CPU cycles the worker spent processing",
            w.iter().map(|x| (worker(x.id), x.busy_cycles)),
        )?;
        gauges(
            &mut enc,
            "buffet_worker_queued",
            "Packets dispatched to the worker and not yet processed (ring occupancy)",
            w.iter().map(|x| {
                (
                    worker(x.id),
                    i64::try_from(x.dispatched.saturating_sub(x.packets)).unwrap_or(i64::MAX),
                )
            }),
        )?;
        gauges(
            &mut enc,
            "buffet_worker_live",
            "1 while the worker runs",
            w.iter().map(|x| (worker(x.id), i64::from(x.live))),
        )?;
        let g = &r.global;
        counter(
            &mut enc,
            "buffet_input_packets",
            "Packets the ports delivered",
            g.input_packets,
        )?;
        counter(
            &mut enc,
            "buffet_unmatched_packets",
            "Packets no tenant's rule matched",
            g.unmatched,
        )?;
        counters(
            &mut enc,
            "buffet_malformed_packets",
            "Frames the Packet Dispatcher could not parse, by reason (dropped)",
            ParseError::ALL.iter().map(|e| {
                let n = g.malformed.get(e.name()).copied().unwrap_or(0);
                (vec![("reason", e.name().to_owned())], n)
            }),
        )?;
        counters(
            &mut enc,
            "buffet_dropped_packets",
            "Frames dropped outside any tenant's NF, by reason (ring_full ones also count \
             in their tenant's drops; malformed and unmatched frames have families of their own)",
            global_drops(g)
                .into_iter()
                .map(|(reason, n)| (vec![("reason", reason.to_owned())], n)),
        )?;
        counter(
            &mut enc,
            "buffet_events_dropped",
            "Scheduler events dropped because nobody drained them in time",
            g.events_dropped,
        )?;
        counter(
            &mut enc,
            "buffet_refused_admissions",
            "Admissions refused because the server is flagged overloaded",
            self.refused,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample `name{reason="reason"}` in `text`.
    fn sample(text: &str, name: &str, reason: &str) -> Option<f64> {
        let scrape =
            prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && s.labels.get("reason") == Some(reason))
            .map(|s| match s.value {
                // The parser types a sample by its exact name, and a counter family's
                // samples carry the `_total` suffix: they parse as untyped.
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
    }

    #[test]
    fn every_global_drop_count_is_exported_by_reason() {
        let mut report = Report::default();
        let g = &mut report.global;
        g.malformed.insert(ParseError::TruncatedIp.name(), 3);
        // Distinct values, so a count exported under another reason's name shows.
        for (i, c) in [
            &mut g.oversize,
            &mut g.no_live_worker,
            &mut g.ring_full,
            &mut g.no_port,
            &mut g.tx_no_buffer,
            &mut g.removed_tenant,
            &mut g.stuck_in_worker,
            &mut g.untagged,
            &mut g.no_socket,
            &mut g.socket_dropped,
        ]
        .into_iter()
        .enumerate()
        {
            *c = 10 + i as u64;
        }
        let text = Metrics::default().encode(report).unwrap();
        for (i, reason) in [
            "oversize",
            "no_live_worker",
            "ring_full",
            "no_port",
            "tx_no_buffer",
            "removed_tenant",
            "stuck_in_worker",
            "untagged",
            "no_socket",
            "socket_dropped",
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(
                sample(&text, "buffet_dropped_packets_total", reason),
                Some(10.0 + i as f64),
                "{reason} in\n{text}"
            );
        }
        // Every parse error is a series from the first scrape, zero or not.
        for e in ParseError::ALL {
            let want = if e == ParseError::TruncatedIp {
                3.0
            } else {
                0.0
            };
            assert_eq!(
                sample(&text, "buffet_malformed_packets_total", e.name()),
                Some(want),
                "{}",
                e.name()
            );
        }
    }
}
