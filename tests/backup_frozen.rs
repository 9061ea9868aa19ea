//! End to end, the real binary and REAL stock litestream 0.5.17 frozen by SIGSTOP (PROTOCOL.md
//! §8.1c, §8.3; issue 41, item 4): a frozen litestream never delays the scheduling step. A commit
//! confirmed through the control socket before the freeze becomes due while litestream is
//! stopped: it is scheduled (and purged below) on the monitor's period, while the request in
//! flight still waits for its 10 s timeout (no poll has failed yet when the cleanup is
//! scheduled); litestream continued, the monitor confirms again.

use std::path::Path;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_files::BackupFiles;
use change_streamer_test_support::backup_replica::BackupReplica;
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::stock_litestream;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use serde_json::Value;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The cleanup delay: long enough that the commit confirmed before the freeze is not yet due
/// when litestream stops, far below the control request's 10 s timeout.
const DELAY_MS: &str = "4000";

#[actix_rt::test]
async fn a_frozen_litestream_never_delays_the_scheduling_step() {
    let litestream = stock_litestream::install();
    let dir = tempfile::tempdir().expect("tempdir");
    let files = BackupFiles::in_dir(&dir.path().join("backup"));
    let up = FakeUpstream::start().await;
    let mut flags = files.control_flags();
    flags.extend(
        [
            "--upstream",
            &up.url(),
            "--backup-check-interval-ms",
            "100",
            "--min-cleanup-delay-ms",
            DELAY_MS,
            "--purge-delay-ms",
            "100",
            "--change-log-retention-ms",
            "0",
        ]
        .map(String::from),
    );
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let data = dir.path().join("data");
    let svc = ServiceProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_change-streamer")),
        0,
        &data,
        &flags,
    );
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    svc.wait_status("the initial sync", |s| s["replicaVersion"].is_string())
        .await;
    let replication = files.replicate_controlled(&litestream).await;
    let rv = w(100);
    let replica = BackupReplica::start(&svc.addr, "backup", &rv, &rv, &files.db()).await;
    for n in 101..=103 {
        up.send(txn(n, 2));
    }
    replica.wait_applied(&w(103)).await;
    svc.wait_status("103 confirmed through the control socket", |s| {
        s["backup"]["monitor"]["backupWatermark"] == w(103)
    })
    .await;

    replication.signal("-STOP");
    let st = svc.status().await;
    assert_eq!(
        st["backup"]["lastScheduledWatermark"],
        Value::Null,
        "103 was due before litestream stopped: the test proves nothing ({st})"
    );
    let errors = st["backup"]["monitor"]["pollErrorsTotal"].clone();
    let st = svc
        .wait_status("103 scheduled while litestream is stopped", |s| {
            s["backup"]["lastScheduledWatermark"] == w(103)
        })
        .await;
    assert_eq!(
        st["backup"]["monitor"]["pollErrorsTotal"], errors,
        "scheduled only once the frozen request failed: {st}"
    );
    svc.wait_status("a purge below 103 while litestream is stopped", |s| {
        s["purge"]["lastPurgedBefore"] == w(103)
    })
    .await;

    // The request in flight keeps its timeout: it fails, and the monitor says why.
    let st = svc
        .wait_status("the frozen request times out", |s| {
            s["backup"]["monitor"]["lastError"].is_string()
        })
        .await;
    let error = st["backup"]["monitor"]["lastError"].as_str().unwrap_or("");
    assert!(error.contains("no answer"), "{st}");

    replication.signal("-CONT");
    up.send(txn(104, 2));
    replica.wait_applied(&w(104)).await;
    let st = svc
        .wait_status("104 confirmed once litestream goes on", |s| {
            s["backup"]["monitor"]["backupWatermark"] == w(104)
        })
        .await;
    assert_eq!(st["backup"]["monitor"]["lastError"], Value::Null, "{st}");
    svc.terminate().await;
}
