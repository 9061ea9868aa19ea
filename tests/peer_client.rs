//! The real JavaScript client against our server: zero's `ChangeStreamerHttpClient`, driven by
//! `../shared/peer/http-client-probe.mjs`, reserves a snapshot, then subscribes with
//! `initial=true` as a restoring replica does; its reservation must end (close 1000) and it
//! must receive the status and the transactions after its watermark, all accepted by its own
//! message validation. Skipped, with one line saying what is missing, where node or the peer
//! harness is not there (a failure instead with `CHANGE_STREAMER_REQUIRE_PEER=1`).

use std::process::{Command, Stdio};
use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::installed_peer;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use serde_json::{json, Value};

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

fn lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[actix_rt::test]
async fn the_original_client_reserves_subscribes_and_follows() {
    let Some((_tmp, peer)) = installed_peer() else {
        return;
    };
    let up = FakeUpstream::start().await;
    let url = up.url();
    let svc = TestService::start(&[
        "--upstream",
        &url,
        "--litestream-backup-url",
        "s3://b/r",
        "--min-cleanup-delay-ms",
        "10",
    ])
    .await;
    up.wait_connections(1).await;
    for n in 100..103 {
        up.send(txn(n, 2));
    }
    svc.wait_status("three transactions stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(102))
    })
    .await;
    let uri = format!("ws://{}", svc.base());

    // The restoring replica holds its reservation...
    let snapshot = Command::new("node")
        .args([
            "http-client-probe.mjs",
            "--uri",
            &uri,
            "--snapshot",
            "task-1",
            "--timeout-ms",
            "15000",
        ])
        .current_dir(&peer)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node");
    svc.wait_status("the JS client's reservation shown in /status", |s| {
        s["reservations"].as_array().is_some_and(|r| r.len() == 1)
    })
    .await;
    actix_rt::time::sleep(Duration::from_millis(300)).await;

    // ...then subscribes with initial=true from the backup's watermark.
    let ctx = json!({"id": "js-1", "taskID": "task-1", "mode": "backup", "replicaVersion": w(100), "watermark": w(100), "initial": true});
    let sub = Command::new("node")
        .args([
            "http-client-probe.mjs",
            "--uri",
            &uri,
            "--subscribe",
            &ctx.to_string(),
            "--max",
            "9",
            "--timeout-ms",
            "10000",
        ])
        .current_dir(&peer)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node");
    let sub = actix_rt::task::spawn_blocking(move || sub.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let snapshot = actix_rt::task::spawn_blocking(move || snapshot.wait_with_output())
        .await
        .unwrap()
        .unwrap();

    let snap = lines(&snapshot.stdout);
    let changes = lines(&sub.stdout);
    let msgs: Vec<&Value> = snap
        .iter()
        .filter(|l| l["stream"] == "snapshot" && l.get("msg").is_some())
        .collect();
    assert_eq!(
        msgs.first().map(|m| m["msg"].clone()),
        Some(
            json!(["status", {"tag": "status", "backupURL": "s3://b/r", "replicaVersion": w(100), "minWatermark": w(100)}])
        ),
        "snapshot stream: {snap:#?}\n{}",
        String::from_utf8_lossy(&snapshot.stderr)
    );
    let done = snap
        .iter()
        .find(|l| l["event"] == "done")
        .expect("snapshot probe finished");
    assert_eq!(
        done["closes"][0]["code"], 1000,
        "reservation closed by the subscription: {done}"
    );

    let kinds: Vec<String> = changes
        .iter()
        .filter(|l| l["stream"] == "changes" && l.get("msg").is_some())
        .map(|l| l["msg"][0].as_str().unwrap_or("?").to_string())
        .collect();
    assert_eq!(
        kinds,
        vec!["status", "begin", "data", "data", "commit", "begin", "data", "data", "commit"],
        "changes stream: {changes:#?}\n{}",
        String::from_utf8_lossy(&sub.stderr)
    );
    let done = changes
        .iter()
        .find(|l| l["event"] == "done")
        .expect("subscribe probe finished");
    assert_eq!(
        done["problems"],
        json!([]),
        "the JS client reported problems: {done}"
    );
    svc.wait_status("the reservation ended", |s| s["reservations"] == json!([]))
        .await;
    // The ReservationActor tells the CleanupActor after ending a reservation; a `/status` asked
    // after one that showed it ended reads the CleanupActor after that message.
    let st = svc.status().await;
    assert!(
        st["backup"]["cleanupDelayMs"].as_i64().unwrap() >= 300,
        "{st}"
    );
    svc.stop().await;
}
