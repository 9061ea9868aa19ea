//! End to end on the real binary as a process: what a subscriber that never reads its socket
//! costs the service, measured as the process's anonymous resident memory (`RssAnon` of
//! `/proc/PID/status`, PROTOCOL.md §10.2), not as a counter of the service's own.

use std::path::Path;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::load::{large_txn, rss_anon};
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use serde_json::json;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

#[actix_rt::test]
async fn rss_anon_stays_bounded_while_96_mb_of_64_kib_changes_pass_a_never_reading_subscriber() {
    let up = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = up.url();
    let svc = ServiceProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_change-streamer")),
        0,
        dir.path(),
        &[
            "--upstream",
            &url,
            "--max-subscriber-queue-bytes",
            "4194304",
            "--flow-control-consensus-padding-seconds",
            "0",
            "--slow-subscriber-grace-ms",
            "0",
            "--ping-interval-ms",
            "600000",
        ],
    );
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    svc.wait_status("initial sync", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    let changes_url = |id: &str| {
        svc.ws(&format!(
            "/replication/v6/changes?id={id}&replicaVersion={}&watermark={}",
            w(100),
            w(100)
        ))
    };
    // One connects, then never reads its socket again; two read and ack everything (with
    // two subscribers the majority is both, and the stalled one would hold the first tracked
    // send for good: eviction is off).
    let never = WsClient::connect(&changes_url("never")).await;
    let mut healthy = Vec::new();
    for id in ["h1", "h2"] {
        healthy.push(WsClient::connect(&changes_url(id)).await);
    }
    svc.wait_status("all live", |s| {
        s["subscribers"]
            .as_array()
            .is_some_and(|a| a.len() == 3 && a.iter().all(|s| s["phase"] == "live"))
    })
    .await;
    let last = 100 + 1500;
    let pid = svc.pid();
    let readers: Vec<_> = healthy
        .into_iter()
        .map(|mut c| {
            actix_rt::spawn(async move {
                let mut peak = 0;
                loop {
                    peak = peak.max(rss_anon(pid));
                    match c.next(Duration::from_secs(30)).await {
                        Some(Seen::Msg { id, msg }) => {
                            c.ack(id).await;
                            if msg[0] == "commit" && msg[2]["watermark"] == json!(w(last)) {
                                return peak;
                            }
                        }
                        other => panic!("healthy subscriber: {other:?}"),
                    }
                }
            })
        })
        .collect();
    // 1,500 changes of 64 KiB: 96 MB, ten transactions to a frame batch.
    let started = Instant::now();
    for first in (101..=last).step_by(10) {
        up.send(
            (first..first + 10)
                .flat_map(|n| large_txn(n, 64 * 1024))
                .collect(),
        );
    }
    let mut peak = 0;
    for r in readers {
        peak = peak.max(r.await.expect("reader"));
    }
    let mib = peak as f64 / (1 << 20) as f64;
    println!("RssAnon peak {mib:.0} MiB over {:?}", started.elapsed());
    // Without the byte bound the never-reading subscriber alone would hold all 96 MB.
    assert!(mib < 150.0, "RssAnon reached {mib:.0} MiB");
    drop(never);
    svc.terminate().await;
}
