//! `e2e`: end to end over loopback, the fake upstream → the real binary → websocket subscribers
//! acking each message (`E2E_SUBS`, default 8; `E2E_TXNS` transactions of 1–20 rows, default
//! 20,000; `E2E_STALL=1`: one subscriber stops reading): saturated changes/s per subscriber, then
//! commit-to-receipt latency at a steady 200 transactions/s, and the service's peak RSS.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::upstream;
use serde_json::{json, Value};

use crate::report::{percentile, report};
use crate::rig::w;
use crate::service::{cpu_seconds, rss_kib, Service};

/// The frames of transaction `n`: 1–20 inserts of ~80 bytes, each stamped with when it was
/// built (µs since `epoch`) so that subscribers can measure latency.
fn stamped_txn(n: u64, epoch: Instant) -> Vec<String> {
    let wm = w(n);
    let now = epoch.elapsed().as_secs_f64() * 1e6;
    let pad = "x".repeat(80);
    let mut frames = vec![format!(
        r#"["begin",{{"tag":"begin"}},{{"commitWatermark":"{wm}"}}]"#
    )];
    for r in 0..1 + (n * 7919) % 20 {
        frames.push(format!(
            r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"items","keyColumns":["id"]}},"new":{{"id":{},"sent":{now:.0},"v":"{pad}"}}}}]"#,
            n * 100 + r
        ));
    }
    frames.push(format!(
        r#"["commit",{{"tag":"commit"}},{{"watermark":"{wm}"}}]"#
    ));
    frames
}

pub async fn e2e() {
    let up = upstream::FakeUpstream::start().await;
    let url = up.url();
    // E2E_STALL=1: subscriber 0 stops reading after 2,000 messages (liveness drops it).
    let stall = std::env::var("E2E_STALL").is_ok_and(|v| v == "1");
    let svc = Service::start(&[
        "--upstream",
        &url,
        "--ping-interval-ms",
        if stall { "2000" } else { "30000" },
    ]);
    up.wait_connections(1).await;
    let epoch = Instant::now();
    up.send(upstream::txn(1, 1));
    actix_rt::time::sleep(Duration::from_millis(200)).await;
    let subs: usize = std::env::var("E2E_SUBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let received = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let mut handles = Vec::new();
    for i in 0..subs {
        let url = format!(
            "ws://127.0.0.1:{}/replication/v6/changes?id=b{i}&replicaVersion={}&watermark={}",
            svc.port,
            w(1),
            w(1)
        );
        let (received, latencies) = (received.clone(), latencies.clone());
        handles.push(actix_rt::spawn(async move {
            let mut c = WsClient::connect(&url).await;
            let mut seen = 0u64;
            while let Some(Seen::Msg { id, msg }) = c.next(Duration::from_secs(5)).await {
                seen += 1;
                if stall && i == 0 && seen == 2000 {
                    std::future::pending::<()>().await;
                }
                if msg[0] == "data" {
                    if let Some(sent) = msg[1]["new"]["sent"].as_f64() {
                        let now = epoch.elapsed().as_secs_f64() * 1e6;
                        latencies.lock().unwrap().push((now - sent) / 1000.0);
                    }
                }
                received.fetch_add(1, Ordering::Relaxed);
                c.ack(id).await;
            }
        }));
    }
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    // Transactions of 1–20 rows, paced by the service's acks (at most `window` in flight).
    let txns: u64 = std::env::var("E2E_TXNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let window = 500u64;
    let mut sent_changes = 0u64;
    let svc_pid = svc.pid().to_string();
    let (svc_cpu0, own_cpu0) = (cpu_seconds(&svc_pid), cpu_seconds("self"));
    let t0 = Instant::now();
    let mut peak = 0;
    let mut n = 2u64;
    while n < 2 + txns {
        let acked = up.acks().len() as u64;
        if n - 1 > acked + window {
            actix_rt::time::sleep(Duration::from_micros(500)).await;
            continue;
        }
        let mut frames = Vec::new();
        for _ in 0..50 {
            if n >= 2 + txns {
                break;
            }
            let txn = stamped_txn(n, epoch);
            sent_changes += txn.len() as u64;
            frames.extend(txn);
            n += 1;
        }
        up.send(frames);
        peak = peak.max(rss_kib(svc.pid(), "VmRSS:"));
    }
    let target = sent_changes * (subs as u64 - u64::from(stall));
    let deadline = Instant::now() + Duration::from_secs(120);
    // Each subscriber also got the initial status frame.
    while received.load(Ordering::Relaxed) < target + subs as u64 && Instant::now() < deadline {
        actix_rt::time::sleep(Duration::from_millis(5)).await;
        peak = peak.max(rss_kib(svc.pid(), "VmRSS:"));
    }
    let secs = t0.elapsed().as_secs_f64();
    let (svc_cpu, own_cpu) = (
        cpu_seconds(&svc_pid) - svc_cpu0,
        cpu_seconds("self") - own_cpu0,
    );
    let flow = match awc::Client::new()
        .get(format!("http://127.0.0.1:{}/status", svc.port))
        .send()
        .await
    {
        Ok(mut r) => r
            .json::<Value>()
            .limit(1 << 24)
            .await
            .map(|v| v["flowControl"].clone())
            .unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    let hwm = rss_kib(svc.pid(), "VmHWM:");
    // Latency at a steady 200 transactions/s (well below saturation), one every 5 ms.
    latencies.lock().unwrap().clear();
    let (lat_txns, before) = (1000u64, received.load(Ordering::Relaxed));
    let mut lat_changes = 0;
    let mut tick = actix_rt::time::interval(Duration::from_millis(5));
    for _ in 0..lat_txns {
        tick.tick().await;
        let frames = stamped_txn(n, epoch);
        lat_changes += frames.len() as u64;
        n += 1;
        up.send(frames);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) < before + lat_changes * subs as u64
        && Instant::now() < deadline
    {
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    let mut lat = latencies.lock().unwrap().clone();
    let (p50, p99) = (percentile(&mut lat, 0.5), percentile(&mut lat, 0.99));
    let per_sub = received.load(Ordering::Relaxed) as f64 / subs as f64 / secs;
    report(
        json!({"bench": "e2e", "subscribers": subs, "stalledSubscriber": stall, "txns": txns, "changes": sent_changes, "seconds": (secs * 100.0).round() / 100.0,
               "changes_per_s_per_subscriber": per_sub.round(), "deliveries_per_s": (per_sub * subs as f64).round(),
               "latency_at_txns_per_s": 200, "latency_ms_p50": (p50 * 100.0).round() / 100.0, "latency_ms_p99": (p99 * 100.0).round() / 100.0,
               "service_peak_rss_mib": (hwm.max(peak) as f64 / 1024.0).round(),
               "flowControl": flow, "service_cpu_s": (svc_cpu * 10.0).round() / 10.0, "clients_cpu_s": (own_cpu * 10.0).round() / 10.0}),
        format!(
            "end to end over loopback, {subs} websocket subscribers: {per_sub:.0} changes/s each ({:.0} deliveries/s) saturated; at 200 txns/s latency p50 {p50:.2} ms / p99 {p99:.2} ms; service peak RSS {:.0} MiB",
            per_sub * subs as f64,
            hwm.max(peak) as f64 / 1024.0
        ),
    );
    drop(svc);
    for h in handles {
        h.abort();
    }
}
