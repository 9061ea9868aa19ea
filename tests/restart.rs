//! End to end: restarts while a replica restores (PROTOCOL.md §3, §13), against the real binary run as
//! a child process, stopped by SIGTERM or by SIGKILL (`kill -9`) and started again on the same
//! data directory. The reservation open at the stop comes back orphaned, keeps cleanup paused
//! (so the backup's watermark is not purged although litestream reports newer backups long
//! due), and the task's `initial=true` subscription from its backup's watermark is served and
//! ends the orphan with delay growth measured from the original start; the grown delay
//! survives the next restart too.

use std::path::Path;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use serde_json::json;

/// The cleanup delay floor: long enough for a restart and a subscription, short for a test.
const FLOOR_MS: u64 = 1500;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// How the service is stopped.
#[derive(Clone, Copy, Debug)]
enum Stop {
    Sigterm,
    Kill9,
}

async fn stop(p: ServiceProcess, how: Stop) {
    match how {
        Stop::Sigterm => p.terminate().await,
        Stop::Kill9 => p.kill9(),
    }
}

fn start(dir: &Path, up: &FakeUpstream, lite: &FakeLitestream) -> ServiceProcess {
    let mut flags = vec!["--upstream".to_string(), up.url()];
    flags.extend(lite.service_flags(FLOOR_MS));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    ServiceProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_change-streamer")),
        0,
        dir,
        &flags,
    )
}

/// The whole story of a replica restoring across two restarts stopped by `how`.
async fn a_restoring_replica_is_served_across_restarts(how: Stop) {
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");

    let first = start(dir.path(), &up, &lite);
    up.wait_connections(1).await;
    for n in 100..=104 {
        up.send(txn(n, 2));
    }
    first
        .wait_status("stored up to 104", |s| {
            s["changeLog"]["maxWatermark"] == json!(w(104))
        })
        .await;
    // The replica reserves, then restores a backup at 102. Its reservation is durable once
    // the status is sent.
    let mut res = WsClient::connect(&first.ws("/replication/v6/snapshot?taskID=t1")).await;
    let reserved_at = Instant::now();
    let (id, status) = res.msg().await;
    assert_eq!(status[1]["minWatermark"], json!(w(100)));
    res.ack(id).await;
    // litestream backed 104 up long ago: without the reservation it would be due at once.
    lite.set_body(render_page(
        "/db",
        &[(Some(w(104).as_str()), "s3", "1.0".into())],
    ));
    // Restoring takes longer than the delay floor, across the restart.
    actix_rt::time::sleep(Duration::from_millis(FLOOR_MS)).await;
    stop(first, how).await;
    up.drop_connection();

    let second = start(dir.path(), &up, &lite);
    let seen = lite.requests();
    lite.wait_for_request(seen + 5, Duration::from_secs(5))
        .await;
    let st = second.status().await;
    assert_eq!(st["reservations"].as_array().map(Vec::len), Some(1), "{st}");
    let r = &st["reservations"][0];
    assert_eq!(r["taskID"], "t1", "{st}");
    assert_eq!(r["orphaned"], true, "{st}");
    assert!(
        r["heldMs"].as_u64() >= Some(FLOOR_MS),
        "held from its original start: {st}"
    );
    assert_eq!(st["backup"]["paused"], true, "{st}");
    assert_eq!(st["backup"]["lastScheduledWatermark"], json!(null), "{st}");
    assert_eq!(st["changeLog"]["minWatermark"], json!(w(100)), "{st}");
    assert_eq!(st["role"], "owner");

    // The restore finishes: the task subscribes from its backup's watermark.
    let mut sub = WsClient::connect(&second.ws(&format!(
        "/replication/v6/changes?id=r1&taskID=t1&initial=true&mode=backup&replicaVersion={}&watermark={}",
        w(100),
        w(102)
    )))
    .await;
    assert_eq!(sub.msg().await.1, json!(["status", {"tag": "status"}]));
    let held_ms = reserved_at.elapsed().as_millis() as i64;
    // The ReservationActor ends the orphan and then tells the CleanupActor, so a `/status`
    // between the two shows no reservation and the delay not grown yet: wait for both.
    let st = second
        .wait_status("the orphan ended and the delay grew", |s| {
            s["reservations"] == json!([])
                && s["backup"]["cleanupDelayMs"].as_i64() > Some(FLOOR_MS as i64)
        })
        .await;
    let grown = st["backup"]["cleanupDelayMs"].as_i64().expect("delay");
    assert!(
        grown > FLOOR_MS as i64 && grown < held_ms + 500,
        "the delay grows to the time held since the original start ({held_ms} ms): {st}"
    );
    // Once the state shows it, the growth is queued on the change log before this request's
    // own read of the log: durable by the time it answers.
    second.status().await;
    stop(second, how).await;

    let third = start(dir.path(), &up, &lite);
    let st = third.status().await;
    assert_eq!(
        st["backup"]["cleanupDelayMs"].as_i64(),
        Some(grown),
        "the learned delay survives: {st}"
    );
    assert_eq!(st["reservations"], json!([]), "{st}");
    third.terminate().await;
    up.stop().await;
}

#[actix_rt::test]
async fn a_restart_by_sigterm_keeps_a_restoring_replica_served() {
    a_restoring_replica_is_served_across_restarts(Stop::Sigterm).await;
}

#[actix_rt::test]
async fn a_restart_by_kill_9_keeps_a_restoring_replica_served() {
    a_restoring_replica_is_served_across_restarts(Stop::Kill9).await;
}
