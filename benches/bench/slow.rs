//! `slow`: slow subscribers against the real binary (PROTOCOL.md §10.1, §10.2): the service's
//! peak RSS with one never-reading subscriber and two healthy ones over 1,000,000 changes
//! (`SLOW_CHANGES`), and the healthy ones' throughput with one of three stalled at the default
//! padding and grace against the same run without it (`SLOW_RUNS` runs each, default 3).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::upstream;
use serde_json::json;

use crate::report::{median, report};
use crate::rig::w;
use crate::service::{rss_kib, Service};

/// Healthy websocket subscribers that read and ack everything, counting the changes (not the
/// status frame) they receive.
fn healthy_subscribers(
    port: u16,
    ids: &[&str],
    received: &Arc<AtomicU64>,
) -> Vec<actix_rt::task::JoinHandle<()>> {
    ids.iter()
        .map(|id| {
            let url = format!(
                "ws://127.0.0.1:{port}/replication/v6/changes?id={id}&replicaVersion={}&watermark={}",
                w(1),
                w(1)
            );
            let received = received.clone();
            actix_rt::spawn(async move {
                let mut c = WsClient::connect(&url).await;
                while let Some(Seen::Msg { id, msg }) = c.next(Duration::from_secs(30)).await {
                    if msg[0] != "status" {
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                    c.ack(id).await;
                }
            })
        })
        .collect()
}

/// Sends transactions of 100 inserts from watermark `first` on, keeping at most 200
/// unacknowledged by the service, until `stop` says so; returns the changes sent and the
/// next watermark.
async fn feed_upstream(
    up: &upstream::FakeUpstream,
    first: u64,
    mut stop: impl FnMut(u64) -> bool,
) -> (u64, u64) {
    let (mut n, mut sent) = (first, 0u64);
    let acked_before = up.acks().len() as u64;
    while !stop(sent) {
        let acked = up.acks().len() as u64 - acked_before;
        if n - first > acked + 200 {
            actix_rt::time::sleep(Duration::from_micros(500)).await;
            continue;
        }
        let frames: Vec<String> = (n..n + 10).flat_map(|t| upstream::txn(t, 100)).collect();
        sent += frames.len() as u64;
        n += 10;
        up.send(frames);
    }
    (sent, n)
}

/// A service with an upstream, initialized at watermark 1, and one subscriber (`never`) that
/// connects and then never reads its socket.
async fn slow_rig(args: &[&str]) -> (upstream::FakeUpstream, Service) {
    let up = upstream::FakeUpstream::start().await;
    let url = up.url();
    let mut all = vec!["--upstream", url.as_str()];
    all.extend_from_slice(args);
    let svc = Service::start(&all);
    up.wait_connections(1).await;
    up.send(upstream::txn(1, 1));
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    (up, svc)
}

pub async fn slow() {
    let runs: usize = std::env::var("SLOW_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // (a) One subscriber that never reads and two healthy ones, 1,000,000 changes, padding 0 and
    // no eviction (the hardest case for memory): the service's peak RSS.
    let total: u64 = std::env::var("SLOW_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let mut peaks = Vec::new();
    let mut complete = true;
    for _ in 0..runs {
        let (up, svc) = slow_rig(&[
            "--flow-control-consensus-padding-seconds",
            "0",
            "--slow-subscriber-grace-ms",
            "0",
        ])
        .await;
        let url = format!(
            "ws://127.0.0.1:{}/replication/v6/changes?id=never&replicaVersion={}&watermark={}",
            svc.port,
            w(1),
            w(1)
        );
        let never = WsClient::connect(&url).await;
        let received = Arc::new(AtomicU64::new(0));
        let healthy = healthy_subscribers(svc.port, &["h1", "h2"], &received);
        actix_rt::time::sleep(Duration::from_millis(300)).await;
        let (sent, _) = feed_upstream(&up, 2, |sent| sent >= total).await;
        let deadline = Instant::now() + Duration::from_secs(120);
        while received.load(Ordering::Relaxed) < 2 * sent && Instant::now() < deadline {
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        let got = received.load(Ordering::Relaxed);
        complete &= got == 2 * sent;
        let peak = rss_kib(svc.pid(), "VmHWM:") as f64 / 1024.0;
        println!(
            "  run: {sent} changes, healthy received {got} of {}, service peak RSS {peak:.0} MiB",
            2 * sent
        );
        peaks.push(peak);
        drop(never);
        drop(svc);
        for h in healthy {
            h.abort();
        }
        up.stop().await;
    }
    let peak = median(&mut peaks.clone());
    report(
        json!({"bench": "slow_memory", "changes": total, "subscribers": 3, "neverReading": 1, "paddingSeconds": 0, "graceMs": 0,
               "service_peak_rss_mib_median": peak.round(), "runs_peak_rss_mib": peaks.iter().map(|p| p.round()).collect::<Vec<_>>(),
               "healthy_received_everything": complete}),
        format!("one never-reading subscriber and two healthy ones, {total} changes: service peak RSS {peak:.0} MiB (median of {runs}); healthy ones received everything: {complete}"),
    );

    // (b) Healthy subscribers' throughput over 20 s with one stalled subscriber of three, at the
    // default padding (1 s) and grace (30 s), against the same run without it.
    let window = Duration::from_secs(20);
    let mut ratios = Vec::new();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        for stalled in [false, true] {
            let (up, svc) = slow_rig(&[]).await;
            let never = if stalled {
                Some(
                    WsClient::connect(&format!(
                        "ws://127.0.0.1:{}/replication/v6/changes?id=stalled&replicaVersion={}&watermark={}",
                        svc.port,
                        w(1),
                        w(1)
                    ))
                    .await,
                )
            } else {
                None
            };
            let received = Arc::new(AtomicU64::new(0));
            let healthy = healthy_subscribers(svc.port, &["h1", "h2"], &received);
            actix_rt::time::sleep(Duration::from_millis(300)).await;
            let t0 = Instant::now();
            feed_upstream(&up, 2, |_| t0.elapsed() >= window).await;
            let per_s = received.load(Ordering::Relaxed) as f64 / 2.0 / t0.elapsed().as_secs_f64();
            if stalled {
                with.push(per_s)
            } else {
                without.push(per_s)
            }
            drop(never);
            drop(svc);
            for h in healthy {
                h.abort();
            }
            up.stop().await;
        }
        if let (Some(a), Some(b)) = (with.last(), without.last()) {
            ratios.push(a / b);
            println!(
                "  run: {a:.0} vs {b:.0} changes/s per healthy subscriber ({:.0} %)",
                a / b * 100.0
            );
        }
    }
    let (a, b, r) = (median(&mut with), median(&mut without), median(&mut ratios));
    report(
        json!({"bench": "slow_throughput", "seconds": window.as_secs(), "subscribers": 3, "stalled": 1, "paddingSeconds": 1, "graceMs": 30000,
               "with_stalled_changes_per_s": a.round(), "without_changes_per_s": b.round(), "ratio_median": (r * 1000.0).round() / 1000.0,
               "runs_ratio": ratios.iter().map(|r| (r * 1000.0).round() / 1000.0).collect::<Vec<_>>()}),
        format!("one stalled subscriber of three, default padding and grace, over {} s: healthy ones at {a:.0} changes/s each vs {b:.0} without it: {:.0} % (median of {runs})", window.as_secs(), r * 100.0),
    );
}
