//! The measured window's figures: two snapshots of the counters and CPU clocks, turned into one
//! JSON line and one human line; with several service addresses or processes, also each one's
//! (`services`, `processes`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::churn::Churn;
use crate::cpu;
use crate::memory;
use crate::sched;
use crate::shared::Run;
use crate::tally::{Counters, Counts, Received};
use crate::upstream::SourceStats;

/// Counters and CPU clocks at one instant.
pub struct Snapshot {
    at: Duration,
    /// CPU seconds of the process trees each `--service-pid-file` lists, in its order.
    service_cpu_s: Vec<HashMap<u32, f64>>,
    own_cpu_s: f64,
    /// Run and run-queue wait ns of the first `--service-pid-file`'s processes, and of this one.
    service_sched: (u64, u64),
    own_sched: (u64, u64),
    txns_sent: u64,
    acked: u64,
    /// What the subscribers received, summed over the threads.
    got: Counts,
}

impl Snapshot {
    pub fn take(
        run: &Run,
        source: &SourceStats,
        counters: &[Arc<Counters>],
        pid_files: &[String],
    ) -> Self {
        Snapshot {
            at: run.since_t0(),
            service_cpu_s: pid_files.iter().map(|f| cpu::listed_cpu_s(f)).collect(),
            own_cpu_s: cpu::own_cpu_s(),
            service_sched: pid_files
                .first()
                .map_or((0, 0), |f| sched::listed_run_wait_ns(f)),
            own_sched: sched::run_wait_ns(std::process::id()),
            txns_sent: source.txns_sent.get(),
            acked: source.acked.get(),
            got: Counts::sum(counters),
        }
    }
}

pub struct Report<'a> {
    pub label: &'a str,
    pub subs: usize,
    /// Subscribers (of `subs`) that checked every message and measured latency
    /// (`--check-subs`); the others read light.
    pub checked_subs: usize,
    pub never_reading: usize,
    pub batched: bool,
    pub changes_per_txn: usize,
    pub rate: f64,
    pub window: u64,
    pub join_late: bool,
    pub services: &'a [String],
    pub pid_files: &'a [String],
    pub a: Snapshot,
    pub b: Snapshot,
    pub run: &'a Run,
    pub source: &'a SourceStats,
    /// The window's latencies and longest gap, merged over the subscriber threads.
    pub received: &'a Received,
    pub service_rss_anon_peak_kib: u64,
    /// The service's RssAnon (KiB) before the subscribers subscribed and once they were all
    /// connected and idle (`--idle-s`).
    pub service_rss_anon_idle_kib: Option<(u64, u64)>,
    pub churn: Option<&'a Churn>,
}

/// The `q` quantile of sorted values (nearest rank).
fn quantile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `{"n", "p50", "p99", "p999", "max"}` of latencies in µs, in ms.
fn latency_json(lat: &[u32]) -> serde_json::Value {
    let mut lat = lat.to_vec();
    lat.sort_unstable();
    json!({"n": lat.len(), "p50": quantile(&lat, 0.5), "p99": quantile(&lat, 0.99),
           "p999": quantile(&lat, 0.999), "max": quantile(&lat, 1.0)})
}

/// The measured window's totals, from the two snapshots.
struct Window {
    secs: f64,
    /// Changes the steady subscribers received in the window.
    deliveries: f64,
    /// CPU seconds of each `--service-pid-file`'s processes, and their sum.
    cpu_of: Vec<f64>,
    service_cpu: f64,
    own_cpu: f64,
    /// The checked subscribers' commit→receipt latencies (µs), sorted.
    lat: Vec<u32>,
}

impl Window {
    /// CPU µs per delivery of `cpu` seconds.
    fn per_delivery_us(&self, cpu: f64) -> f64 {
        if self.deliveries > 0.0 {
            cpu * 1e6 / self.deliveries
        } else {
            f64::NAN
        }
    }
}

impl Report<'_> {
    /// Prints the JSON line, then the human line and its detail lines.
    pub fn print(&self) {
        let w = self.window();
        let j = self.json(&w);
        println!("{j}");
        self.print_human(&w);
        self.print_details(&w, &j);
    }

    fn window(&self) -> Window {
        let (a, b) = (&self.a, &self.b);
        let cpu_of: Vec<f64> = (a.service_cpu_s.iter().zip(&b.service_cpu_s))
            .map(|(a, b)| cpu::spent_s(a, b))
            .collect();
        let mut lat = self.received.latencies_us.clone();
        lat.sort_unstable();
        Window {
            secs: (b.at - a.at).as_secs_f64(),
            deliveries: (b.got.changes - a.got.changes) as f64,
            service_cpu: cpu_of.iter().sum(),
            cpu_of,
            own_cpu: b.own_cpu_s - a.own_cpu_s,
            lat,
        }
    }

    /// The JSON line.
    fn json(&self, w: &Window) -> serde_json::Value {
        let (a, b) = (&self.a, &self.b);
        let (secs, deliveries, lat) = (w.secs, w.deliveries, &w.lat);
        json!({
            "service": self.label,
            "subs": self.subs,
            "checkedSubs": self.checked_subs,
            "neverReading": self.never_reading,
            "framing": if self.batched { "batched" } else { "per-frame" },
            "changesPerTxn": self.changes_per_txn,
            "mode": if self.rate > 0.0 { "rate" } else { "saturate" },
            "targetTxnsPerS": self.rate,
            "window": self.window,
            "joinLate": self.join_late,
            "seconds": r2(secs),
            "upstreamTxnsPerS": r2((b.txns_sent - a.txns_sent) as f64 / secs),
            "storedTxnsPerS": r2(b.acked.saturating_sub(a.acked) as f64 / secs),
            "deliveriesPerS": r2(deliveries / secs),
            "txnDeliveriesPerS": r2((b.got.commits - a.got.commits) as f64 / secs),
            "msgsPerS": r2((b.got.msgs - a.got.msgs) as f64 / secs),
            "framesPerS": r2((b.got.frames - a.got.frames) as f64 / secs),
            "changesReceived": b.got.changes,
            "serviceRssAnonPeakMiB": r2(self.service_rss_anon_peak_kib as f64 / 1024.0),
            "serviceCpuS": r2(w.service_cpu),
            "serviceCores": r2(w.service_cpu / secs),
            "serviceCpuUsPerDelivery": r2(w.per_delivery_us(w.service_cpu)),
            "deliveriesPerServiceCpuS": r2(deliveries / w.service_cpu),
            "loadgenCpuS": r2(w.own_cpu),
            "loadgenCpuUsPerDelivery": r2(w.per_delivery_us(w.own_cpu)),
            "latencyMs": {"n": lat.len(), "p50": quantile(lat, 0.5), "p99": quantile(lat, 0.99),
                          "p999": quantile(lat, 0.999), "max": quantile(lat, 1.0)},
            "longestCommitGapMs": self.received.longest_gap_us as f64 / 1000.0,
            "lightNewestCommitLatencyMs": self.light_latency_json(),
            "ackLatencyMs": latency_json(&self.source.ack_latencies_us.borrow()),
            "errors": self.run.error_count(),
            "firstErrors": self.run.first_errors(),
            "services": self.services_json(secs),
            "processes": self.processes_json(w),
            "loadgenRssAnonMiB": r2(memory::rss_anon_kib(std::process::id()).unwrap_or(0) as f64 / 1024.0),
            "idle": self.idle_json(),
            "serviceSched": sched::json(a.service_sched, b.service_sched, secs),
            "loadgenSched": sched::json(a.own_sched, b.own_sched, secs),
            "churn": self.churn_json(secs),
        })
    }

    /// Each service address's subscribers, deliveries and latencies (`services`).
    fn services_json(&self, secs: f64) -> Vec<serde_json::Value> {
        let (a, b) = (&self.a, &self.b);
        let n = self.services.len().max(1);
        (self.services.iter().enumerate())
            .map(|(i, url)| {
                let got = |s: &Snapshot| s.got.service_changes.get(i).copied().unwrap_or(0);
                let lat = (self.received.service_latencies_us.get(i))
                    .map_or_else(|| latency_json(&[]), |l| latency_json(l));
                json!({
                    "url": url,
                    "subs": self.subs / n + usize::from(i < self.subs % n),
                    "deliveriesPerS": r2((got(b) - got(a)) as f64 / secs),
                    "latencyMs": lat,
                })
            })
            .collect()
    }

    /// Each `--service-pid-file`'s processes and their CPU (`processes`).
    fn processes_json(&self, w: &Window) -> Vec<serde_json::Value> {
        (self
            .pid_files
            .iter()
            .zip(&self.b.service_cpu_s)
            .zip(&w.cpu_of))
        .map(|((file, listed), &cpu)| {
            let mut pids: Vec<u32> = listed.keys().copied().collect();
            pids.sort_unstable();
            json!({
                "pidFile": file,
                "pids": pids,
                "cpuS": r2(cpu),
                "cores": r2(cpu / w.secs),
                "cpuUsPerDelivery": r2(w.per_delivery_us(cpu)),
            })
        })
        .collect()
    }

    /// The human line.
    fn print_human(&self, w: &Window) {
        let (a, b, secs) = (&self.a, &self.b, w.secs);
        let (p50, p99, p999) = (
            quantile(&w.lat, 0.5),
            quantile(&w.lat, 0.99),
            quantile(&w.lat, 0.999),
        );
        let gap_ms = self.received.longest_gap_us as f64 / 1000.0;
        println!(
            "{} {} subs{} {}{}: {:.0} deliveries/s ({:.0} txns/s upstream), service {:.2} µs CPU/delivery ({:.2} cores), loadgen {:.2} µs/delivery; commit→receipt{} p50 {p50:.2} ms p99 {p99:.2} ms p99.9 {p999:.2} ms, longest gap {gap_ms:.1} ms; service RssAnon peak {:.0} MiB; {} errors",
            self.label,
            self.subs,
            if self.never_reading > 0 { format!(" (+{} never reading)", self.never_reading) } else { String::new() },
            if self.batched { "batched " } else { "" },
            if self.rate > 0.0 { format!("at {} txns/s", self.rate) } else { "saturated".into() },
            w.deliveries / secs,
            (b.txns_sent - a.txns_sent) as f64 / secs,
            w.per_delivery_us(w.service_cpu),
            w.service_cpu / secs,
            w.per_delivery_us(w.own_cpu),
            self.sample_words(),
            self.service_rss_anon_peak_kib as f64 / 1024.0,
            self.run.error_count()
        );
    }

    /// The lines under the human line: light subscribers, scheduling, idle memory, churn.
    fn print_details(&self, w: &Window, j: &serde_json::Value) {
        if self.checked_subs < self.subs {
            let l = &j["lightNewestCommitLatencyMs"];
            println!(
                "  light subscribers ({} of {}: ids, acks and counts only): newest commit of each frame p50 {} ms p99 {} ms ({} frames; a floor on a frame's delay, not per-commit)",
                self.subs - self.checked_subs,
                self.subs,
                l["p50"],
                l["p99"],
                l["n"]
            );
        }
        println!(
            "  threads waiting runnable (CPUs held by other work): service {} ms/s beside {} ms/s run, loadgen {} ms/s beside {} ms/s run",
            j["serviceSched"]["waitMsPerS"], j["serviceSched"]["runMsPerS"],
            j["loadgenSched"]["waitMsPerS"], j["loadgenSched"]["runMsPerS"]
        );
        if let Some((before, after)) = self.service_rss_anon_idle_kib.filter(|i| i.1 > 0) {
            println!(
                "  idle: service RssAnon {:.1} MiB before subscribing, {:.1} MiB with {} idle subscribers: {:.1} KiB each",
                before as f64 / 1024.0,
                after as f64 / 1024.0,
                self.subs + self.never_reading,
                self.idle_json()["kibPerSub"].as_f64().unwrap_or(f64::NAN)
            );
        }
        if let Some(c) = self.churn {
            let (a, b) = (&self.a.got, &self.b.got);
            println!(
                "  churn: {} joiners at {}/s: {} joined, {} left in the window, {} left with no transaction; joiners received {:.0} txns/s in all; gaps are errors ({} in all)",
                c.subs,
                c.rate,
                b.churn_joins - a.churn_joins,
                b.churn_leaves - a.churn_leaves,
                b.churn_empty,
                (b.churn_commits - a.churn_commits) as f64 / w.secs,
                self.run.error_count()
            );
        }
        if self.services.len() > 1 || self.pid_files.len() > 1 {
            self.print_by_service(w, j);
        }
    }

    /// With several addresses or processes: each one's figures on one line.
    fn print_by_service(&self, w: &Window, j: &serde_json::Value) {
        let by_service: Vec<String> = (j["services"].as_array().into_iter().flatten())
            .map(|s| {
                format!(
                    "{} ({} subs) {:.0} deliveries/s p50 {} p99 {} ms",
                    s["url"].as_str().unwrap_or("?"),
                    s["subs"],
                    s["deliveriesPerS"].as_f64().unwrap_or(f64::NAN),
                    s["latencyMs"]["p50"],
                    s["latencyMs"]["p99"]
                )
            })
            .collect();
        let by_process: Vec<String> = (self.pid_files.iter().zip(&w.cpu_of))
            .map(|(f, cpu)| format!("{f} {:.2} cores", cpu / w.secs))
            .collect();
        println!(
            "  by service: {}; by process: {}",
            by_service.join(", "),
            by_process.join(", ")
        );
    }
}

impl Report<'_> {
    /// What the human line's percentiles are over: empty when every subscriber was checked.
    fn sample_words(&self) -> String {
        if self.checked_subs < self.subs {
            format!(" over the {} checked subscribers", self.checked_subs)
        } else {
            String::new()
        }
    }

    /// The light subscribers' newest commit per frame (`--check-subs`), or null without any.
    fn light_latency_json(&self) -> serde_json::Value {
        if self.checked_subs < self.subs {
            latency_json(&self.received.light_latencies_us)
        } else {
            serde_json::Value::Null
        }
    }

    /// `{"beforeKiB", "afterKiB", "kibPerSub"}` of `--idle-s`, or null.
    fn idle_json(&self) -> serde_json::Value {
        match self.service_rss_anon_idle_kib {
            Some((before, after)) if after > 0 => {
                let subs = (self.subs + self.never_reading).max(1) as f64;
                json!({"beforeKiB": before, "afterKiB": after,
                       "kibPerSub": r2((after as f64 - before as f64) / subs)})
            }
            _ => serde_json::Value::Null,
        }
    }

    /// The churning joiners' figures: in the measured window, and over the run so far; or null.
    fn churn_json(&self, secs: f64) -> serde_json::Value {
        let Some(c) = self.churn else {
            return serde_json::Value::Null;
        };
        let (a, b) = (&self.a.got, &self.b.got);
        json!({
            "subs": c.subs,
            "rate": c.rate,
            "joins": b.churn_joins - a.churn_joins,
            "leaves": b.churn_leaves - a.churn_leaves,
            "joinsTotal": b.churn_joins,
            "leftEmptyTotal": b.churn_empty,
            "txnsPerS": r2((b.churn_commits - a.churn_commits) as f64 / secs),
            "deliveriesPerS": r2((b.churn_changes - a.churn_changes) as f64 / secs),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of `subs` subscribers of which `checked` were checked, light latencies `light`.
    fn check_report(subs: usize, checked: usize, light: Vec<u32>) {
        let (run, source) = (Run::new(), SourceStats::new());
        let received = Received {
            light_latencies_us: light,
            ..Received::default()
        };
        let snap = || Snapshot::take(&run, &source, &[], &[]);
        let report = Report {
            label: "t",
            subs,
            checked_subs: checked,
            never_reading: 0,
            batched: true,
            changes_per_txn: 10,
            rate: 2000.0,
            window: 256,
            join_late: false,
            services: &[],
            pid_files: &[],
            a: snap(),
            b: snap(),
            run: &run,
            source: &source,
            received: &received,
            service_rss_anon_peak_kib: 0,
            service_rss_anon_idle_kib: None,
            churn: None,
        };
        if checked < subs {
            assert_eq!(
                report.sample_words(),
                format!(" over the {checked} checked subscribers")
            );
            let light = report.light_latency_json();
            assert_eq!(light["n"], 2);
            assert_eq!(light["max"], 0.5);
        } else {
            assert_eq!(report.sample_words(), "");
            assert!(report.light_latency_json().is_null());
        }
    }

    #[test]
    fn percentiles_say_when_they_are_over_the_checked_sample_only() {
        check_report(256, 32, vec![250, 500]);
        check_report(256, 256, Vec::new());
    }
}
