//! End to end on the real binary as a process: what a subscriber that never reads its socket
//! costs the service, measured as the process's anonymous resident memory (`RssAnon` of
//! `/proc/PID/status`, PROTOCOL.md §10.2), not as a counter of the service's own.

use std::path::Path;
use std::time::Instant;

use change_streamer_test_support::load::{
    large_txn, on_fake_upstream, read_through, rss_anon, subscribers,
};

#[actix_rt::test]
async fn rss_anon_stays_bounded_while_96_mb_of_64_kib_changes_pass_a_never_reading_subscriber() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = Path::new(env!("CARGO_BIN_EXE_change-streamer"));
    let (svc, up) = on_fake_upstream(
        bin,
        dir.path(),
        &["--max-subscriber-queue-bytes", "4194304"],
    )
    .await;
    // One connects, then never reads its socket again; two read and ack everything (with
    // two subscribers the majority is both, and the stalled one would hold the first tracked
    // send for good: eviction is off).
    let mut clients = subscribers(&svc, &["never", "h1", "h2"]).await;
    let healthy = clients.split_off(1);
    let never = clients;
    let last = 100 + 1500;
    let pid = svc.pid();
    let readers: Vec<_> = healthy
        .into_iter()
        .map(|mut c| {
            actix_rt::spawn(async move {
                let mut peak = 0;
                read_through(&mut c, last, || peak = peak.max(rss_anon(pid))).await;
                peak
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
