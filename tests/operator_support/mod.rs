//! What an operator looks at, set up once for the tests that look at it (issue 45): the real
//! binary with a change source that keeps sending, a backup source (litestream's metrics)
//! reporting a backup, a snapshot reservation reporting its restore, and three subscribers, two
//! acking everything and one stalled (it never reads, so it lags and, with eviction off, stays).
//! `tests/deploy_metrics.rs` scrapes it; `tests/live_page.rs` points a browser at it.

#![allow(dead_code)]

pub mod chromium;

use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::upstream::{txn, FakeUpstream};

/// The subscribers that ack everything: two, a majority of the three, so that flow control
/// releases by consensus and the stalled one is lagging (PROTOCOL.md §10, §10.1).
pub const LIVE: &str = "replica-live";
pub const LIVE_2: &str = "replica-live-2";
/// The subscriber that never reads.
pub const STALLED: &str = "replica-stalled";
/// The reserving task.
pub const TASK: &str = "restore-1";
/// The bytes its progress message reports.
pub const RESTORED: u64 = 229_376;

/// The running scene; dropping it stops the feeders with the runtime, the binary by
/// [`Scene::stop`].
pub struct Scene {
    pub svc: ServiceProcess,
    pub up: FakeUpstream,
    pub lite: FakeLitestream,
    pub dir: tempfile::TempDir,
    pub reservation: WsClient,
    pub stalled: WsClient,
    pub replica_version: String,
}

fn wm(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// Starts the scene with `extra` flags; returns once the stalled subscriber lags (its oldest
/// unacked change is over a second old, and it is lagging on a tracked send) and the
/// reservation's progress shows in `/status`.
pub async fn scene(extra: &[&str]) -> Scene {
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    // Backed up just now (the sample's value is the time of replication, in seconds).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    lite.set_body(render_page(
        "/db",
        &[(Some(wm(100).as_str()), "s3", format!("{now}"))],
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let url = up.url();
    let mut args: Vec<String> = lite.service_flags(600_000);
    // Poll the fake litestream 10 times a second, not 50: the machine is shared.
    let poll = args
        .iter()
        .position(|a| a == "--backup-check-interval-ms")
        .unwrap()
        + 1;
    args[poll] = "100".into();
    args.extend(
        [
            "--upstream",
            url.as_str(),
            "--slow-subscriber-grace-ms",
            "0",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let svc = ServiceProcess::spawn(
        std::path::Path::new(env!("CARGO_BIN_EXE_change-streamer")),
        0,
        dir.path(),
        &args,
    );
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    let rv = wm(100);
    svc.wait_status("the initial sync", |s| {
        s["replicaVersion"] == serde_json::json!(rv)
    })
    .await;

    let mut reservation =
        WsClient::connect(&svc.ws(&format!("/replication/v6/snapshot?taskID={TASK}"))).await;
    let (id, _) = reservation.msg().await;
    reservation.ack(id).await;
    reservation
        .send_text(format!(r#"["progress",{{"bytes":{RESTORED}}}]"#))
        .await;

    let changes = |id: &str| {
        svc.ws(&format!(
            "/replication/v6/changes?id={id}&replicaVersion={rv}&watermark={rv}"
        ))
    };
    for id in [LIVE, LIVE_2] {
        let mut live = WsClient::connect(&changes(id)).await;
        // A live replica acks whatever it is sent, until its socket closes.
        actix_rt::spawn(async move {
            while let Some(change_streamer_test_support::client::Seen::Msg { id, .. }) =
                live.next(Duration::from_secs(3600)).await
            {
                live.ack(id).await;
            }
        });
    }
    let stalled = WsClient::connect(&changes(STALLED)).await;
    // The change source sends a transaction of 40 rows (about 5 KiB) every 200 ms: an ingest
    // rate to draw, and a tracked commit every few seconds (one per 64 KiB, PROTOCOL.md §10),
    // which the live replicas ack and the stalled one does not.
    let feeder = up.clone();
    actix_rt::spawn(async move {
        let mut n = 101;
        loop {
            feeder.send(txn(n, 40));
            n += 1;
            actix_rt::time::sleep(Duration::from_millis(200)).await;
        }
    });
    svc.wait_status("the stalled subscriber lags and the backup is seen", |s| {
        let lagging = s["subscribers"].as_array().is_some_and(|subs| {
            subs.iter().any(|x| {
                x["id"] == STALLED
                    && x["lagSeconds"].as_f64().unwrap_or(0.0) > 1.0
                    && x["lagging"].is_object()
            })
        });
        lagging && s["reservations"][0]["restoredBytes"] == RESTORED
    })
    .await;
    Scene {
        svc,
        up,
        lite,
        dir,
        reservation,
        stalled,
        replica_version: rv,
    }
}

impl Scene {
    /// `/metrics` as the service answers it.
    pub async fn metrics(&self) -> String {
        let (code, body) = self.svc.get("/metrics").await;
        assert_eq!(code, 200, "{body}");
        body
    }

    pub async fn stop(self) {
        self.up.stop().await;
        self.svc.terminate().await;
    }
}
