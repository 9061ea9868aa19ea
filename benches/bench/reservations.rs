//! `reservations`: 10,000 concurrent `/snapshot` websockets held against the real binary,
//! opened `RES_WAVE` at a time (default 500): time from connect to the status frame, time to
//! open them all, and the service's RSS while they are held.

use std::time::{Duration, Instant};

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::upstream;
use serde_json::json;

use crate::report::{percentile, report};
use crate::service::{rss_kib, Service};

pub async fn reservations() {
    let up = upstream::FakeUpstream::start().await;
    let url = up.url();
    let svc = Service::start(&[
        "--upstream",
        &url,
        "--litestream-backup-url",
        "s3://b/r",
        "--ping-interval-ms",
        "60000",
    ]);
    up.wait_connections(1).await;
    up.send(upstream::txn(1, 1));
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    let total = 10_000usize;
    let before = rss_kib(svc.pid(), "VmRSS:");
    let mut held = Vec::with_capacity(total);
    let mut lat = Vec::with_capacity(total);
    let t0 = Instant::now();
    // RES_WAVE: how many are opened at once (default 50; 500 shows the load generator queueing).
    let wave_size: usize = std::env::var("RES_WAVE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
        .max(1);
    for wave in 0..total.div_ceil(wave_size) {
        let mut conns = Vec::new();
        for i in 0..wave_size.min(total - wave * wave_size) {
            let url = format!(
                "ws://127.0.0.1:{}/replication/v6/snapshot?taskID=t{}",
                svc.port,
                wave * wave_size + i
            );
            conns.push(actix_rt::spawn(async move {
                let start = Instant::now();
                let mut c = WsClient::connect(&url).await;
                let (id, _) = c.msg().await;
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                c.ack(id).await;
                (c, ms)
            }));
        }
        for c in conns {
            let (c, ms) = c.await.unwrap();
            held.push(c);
            lat.push(ms);
        }
    }
    let all_ms = t0.elapsed().as_secs_f64() * 1000.0;
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    let rss = rss_kib(svc.pid(), "VmRSS:");
    let hwm = rss_kib(svc.pid(), "VmHWM:");
    let (p50, p99) = (
        percentile(&mut lat.clone(), 0.5),
        percentile(&mut lat, 0.99),
    );
    report(
        json!({"bench": "reservations", "held": held.len(), "opened_at_once": wave_size, "status_ms_p50": (p50 * 100.0).round() / 100.0, "status_ms_p99": (p99 * 100.0).round() / 100.0,
               "open_all_ms": all_ms.round(), "rss_mib_before": (before as f64 / 1024.0).round(), "rss_mib_held": (rss as f64 / 1024.0).round(),
               "peak_rss_mib": (hwm as f64 / 1024.0).round()}),
        format!(
            "{} concurrent snapshot reservations (opened {wave_size} at a time): status after {p50:.2} ms (p50) / {p99:.2} ms (p99); service RSS {:.0} MiB held (peak {:.0} MiB)",
            held.len(),
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0
        ),
    );
    drop(held);
    drop(svc);
}
