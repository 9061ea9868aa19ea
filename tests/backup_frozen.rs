//! End to end, the real binary and REAL stock litestream 0.5.17 frozen by SIGSTOP (PROTOCOL.md
//! §8.1c, §8.3; issue 41, item 4): a frozen litestream never delays the scheduling step. A commit
//! confirmed through the control socket before the freeze becomes due while litestream is
//! stopped: it is scheduled (and purged below) on the monitor's period, while the request in
//! flight still waits for its 10 s timeout (no poll has failed yet when the cleanup is
//! scheduled); litestream continued, the monitor confirms again.

use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::litestream_world::{LitestreamWorld, Source};
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::upstream::txn;
use serde_json::Value;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The cleanup delay: long enough that the commit confirmed before the freeze is not yet due
/// when litestream stops, far below the control request's 10 s timeout.
const DELAY_MS: &str = "4000";

/// The single backup's monitor, as §11.1 names it.
const STAGE: &str = "backup:backup";

/// A safety net against a test that would hang, not what a test waits for.
const LIMIT: Duration = Duration::from_secs(60);

/// The binary asking real litestream's control socket, fed by a fake change source, with
/// the backup replica following it and 101..=103 confirmed.
type Controlled = LitestreamWorld<ServiceProcess>;

async fn start(extra: &[&str]) -> Controlled {
    let mut c = LitestreamWorld::builder(env!("CARGO_BIN_EXE_change-streamer"))
        .source(Source::Control)
        .flags(&[
            "--backup-check-interval-ms",
            "100",
            "--min-cleanup-delay-ms",
            DELAY_MS,
            "--purge-delay-ms",
            "100",
            "--change-log-retention-ms",
            "0",
        ])
        .flags(extra)
        .spawn()
        .await;
    c.replicate().await;
    c.follow().await;
    c.send(101, 103).await;
    c.svc
        .wait_status("103 confirmed through the control socket", |s| {
            s["backup"]["monitor"]["backupWatermark"] == w(103)
        })
        .await;
    c
}

#[actix_rt::test]
async fn a_frozen_litestream_never_delays_the_scheduling_step() {
    let (c, svc) = start(&[]).await.into_parts();
    let (up, replica) = (&c.up, c.replica());

    c.freeze("backup");
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

    c.thaw("backup");
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

/// PROTOCOL.md §11.1 (issue 41, item 5), end to end: litestream stopped while a commit the
/// backup replicator acked waits for its confirmation; past `--stall-alarm-ms` the backup's
/// monitor is named in `/readyz` (503 `stalled: backup:backup for N ms`), its gauge is 1 and an
/// ERROR line says so; litestream continued, the commit is confirmed and all three clear.
#[actix_rt::test]
async fn a_stalled_backup_monitor_is_named_in_readyz_the_gauge_and_the_log() {
    let c = start(&["--stall-alarm-ms", "1000"]).await;
    c.svc
        .wait_readyz("ready before the freeze", |code, _| code == 200)
        .await;
    assert_eq!(c.svc.stalled_gauge(STAGE).await.as_deref(), Some("0"));

    c.freeze("backup");
    c.up.send(txn(104, 2));
    c.replica().wait_applied(&w(104)).await;
    let line = c
        .svc
        .wait_readyz("stalled in /readyz", |code, line| {
            code == 503 && line.starts_with("stalled: ")
        })
        .await;
    let ms: u64 = line
        .strip_prefix("stalled: backup:backup for ")
        .and_then(|rest| rest.strip_suffix(" ms"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not `stalled: backup:backup for N ms`: {line}"));
    assert!(ms >= 1000, "{line}");
    assert_eq!(c.svc.stalled_gauge(STAGE).await.as_deref(), Some("1"));
    let stalled = "stage backup:backup stalled: work pending and no progress for";
    let start = Instant::now();
    while c.svc.logged(stalled).is_empty() {
        assert!(start.elapsed() < LIMIT, "no ERROR line within {LIMIT:?}");
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    let errors = c.svc.logged(stalled);
    assert!(
        errors.len() == 1 && errors[0].contains("ERROR"),
        "one ERROR line within the minute: {errors:?}"
    );

    c.thaw("backup");
    c.svc
        .wait_status("104 confirmed once litestream goes on", |s| {
            s["backup"]["monitor"]["backupWatermark"] == w(104)
        })
        .await;
    c.svc
        .wait_readyz("ready again", |code, _| code == 200)
        .await;
    assert_eq!(c.svc.stalled_gauge(STAGE).await.as_deref(), Some("0"));
    assert_eq!(
        c.svc
            .logged("stage backup:backup is no longer stalled")
            .len(),
        1
    );
    c.svc.terminate().await;
}
