//! End to end: `/snapshot` at a standby (PROTOCOL.md §14.1). Real service processes on one
//! PostgreSQL change DB, a fake change source and a fake litestream page: the standby's
//! reservation gets the status and pauses the owner's cleanup; ended by `initial=true` at the
//! owner, its socket at the standby closes with 1000 within a second and the owner's delay
//! grows; a standby killed with `kill -9` leaves its reservation orphaned at the owner; a
//! standby that takes over from an owner killed with `kill -9` keeps its reservation as its
//! own, on the same socket.

#[allow(dead_code)] // shared with tests/takeover.rs, which uses the rest
mod takeover_support;

use std::time::{Duration, Instant};

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream::{Answer, FakeLitestream};
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::wait_until;
use serde_json::{json, Value};
use takeover_support::*;

const START: Duration = Duration::from_secs(20);
const BACKUP: &str = "s3://bucket/replica";

/// The backup monitor's flags: polls every 100 ms, a cleanup delay of `delay_ms` to start with.
fn backup_flags(lite: &FakeLitestream, delay_ms: u64) -> Vec<String> {
    [
        "--litestream-backup-url",
        BACKUP,
        "--litestream-metrics-url",
        &lite.url(),
        "--backup-check-interval-ms",
        "100",
        "--initial-cleanup-delay-ms",
        &delay_ms.to_string(),
        "--min-cleanup-delay-ms",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

/// An owner whose change log holds watermark 100, and a standby: their addresses.
async fn owner_and_standby(
    db: &TestDb,
    up: &FakeUpstream,
    lite: &FakeLitestream,
    delay_ms: u64,
) -> (Instance, String, Instance, String) {
    let flags = backup_flags(lite, delay_ms);
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let a = Instance::start_with(db, &up.url(), INTERVAL_MS, &args);
    let (a_addr, _) = a.listening_within(START).expect("the first instance owns");
    up.wait_connections(1).await;
    up.send(txn(100, 2));
    wait_until("the first commit acked", START, || !acked(up).is_empty()).await;
    let b = Instance::start_with(db, &up.url(), INTERVAL_MS, &args);
    let b_addr = b.standby.recv_timeout(START).expect("the second stands by");
    let deadline = Instant::now() + START;
    while get(&b_addr, "/readyz").await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the standby not ready within {START:?}"
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    (a, a_addr, b, b_addr)
}

async fn status_until(addr: &str, what: &str, mut cond: impl FnMut(&Value) -> bool) -> Value {
    let deadline = Instant::now() + START;
    loop {
        let (code, body) = get(addr, "/status").await;
        let status: Value = serde_json::from_str(&body).unwrap_or_default();
        if code == 200 && cond(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {START:?}; last /status: {body}"
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reserves `task` at `addr` and reads its status message.
async fn reserve(addr: &str, task: &str) -> (WsClient, Value) {
    let mut c = WsClient::connect(&format!(
        "ws://{addr}/replication/v6/snapshot?taskID={task}"
    ))
    .await;
    let (id, msg) = c.msg().await;
    c.ack(id).await;
    (c, msg)
}

#[actix_rt::test]
async fn a_snapshot_at_a_standby_gets_the_status_and_pauses_the_owners_cleanup() {
    let db = TestDb::create("standby_snap_status").await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let (_a, a_addr, _b, b_addr) = owner_and_standby(&db, &up, &lite, 0).await;
    let owner = status_until(&a_addr, "not paused before", |s| {
        s["backup"]["paused"] == false
    })
    .await;

    let (_c, msg) = reserve(&b_addr, "t1").await;
    assert_eq!(
        msg,
        json!(["status", {
            "tag": "status",
            "backupURL": BACKUP,
            "replicaVersion": owner["replicaVersion"],
            "minWatermark": owner["changeLog"]["minWatermark"],
        }])
    );
    let standby = status_until(&b_addr, "the standby lists it", |s| {
        s["reservations"].as_array().map(Vec::len) == Some(1)
    })
    .await;
    assert_eq!(standby["reservations"][0]["taskID"], "t1", "{standby}");
    // Recorded before the status was sent: the owner's next poll pauses.
    let owner = status_until(&a_addr, "the owner's cleanup paused", |s| {
        s["backup"]["paused"] == true
    })
    .await;
    assert_eq!(
        owner["reservations"],
        json!([]),
        "not the owner's own: {owner}"
    );
    status_until(&a_addr, "the standby's record counts it", |s| {
        s["instances"].as_array().is_some_and(|l| {
            l.iter()
                .any(|i| i["role"] == "standby" && i["reservations"] == 1)
        })
    })
    .await;
}

#[actix_rt::test]
async fn ended_by_initial_subscription_at_the_owner_the_standbys_socket_closes_1000_within_a_second_and_the_delay_grows(
) {
    let db = TestDb::create("standby_snap_end").await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let (_a, a_addr, _b, b_addr) = owner_and_standby(&db, &up, &lite, 0).await;
    let reserved = Instant::now();
    let (mut c, msg) = reserve(&b_addr, "t1").await;
    status_until(&a_addr, "the owner's cleanup paused", |s| {
        s["backup"]["paused"] == true
    })
    .await;

    let mut sub = WsClient::connect(&format!(
        "ws://{a_addr}/replication/v6/changes?id=r1&taskID=t1&initial=true&replicaVersion={}&watermark={}",
        msg[1]["replicaVersion"].as_str().unwrap(),
        msg[1]["minWatermark"].as_str().unwrap(),
    ))
    .await;
    let (id, status) = sub.msg().await;
    assert_eq!(status[0], "status", "{status}");
    sub.ack(id).await;
    let subscribed = Instant::now();
    let (code, reason) = close_within(&mut c, Duration::from_secs(1)).await;
    assert_eq!(
        (code, reason.as_str()),
        (1000, "reservation ended: the task subscribed")
    );
    assert!(subscribed.elapsed() < Duration::from_secs(1));

    let held_at_most = reserved.elapsed().as_millis() as u64;
    let owner = status_until(&a_addr, "the owner's delay grown", |s| {
        s["backup"]["cleanupDelayMs"].as_u64().unwrap_or(0) > 0
    })
    .await;
    let delay = owner["backup"]["cleanupDelayMs"].as_u64().unwrap();
    assert!(
        delay <= held_at_most,
        "grown by the held time ({delay} ms, at most {held_at_most} ms)"
    );
    status_until(&a_addr, "no longer paused", |s| {
        s["backup"]["paused"] == false
    })
    .await;
}

#[actix_rt::test]
async fn a_killed_standbys_reservation_is_orphaned_at_the_owner() {
    let db = TestDb::create("standby_snap_orphan").await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    // Orphans end one cleanup delay after they were orphaned (PROTOCOL.md §13 (b)).
    let (_a, a_addr, mut b, b_addr) = owner_and_standby(&db, &up, &lite, 60_000).await;
    let (_c, _) = reserve(&b_addr, "t1").await;
    status_until(&a_addr, "the owner's cleanup paused", |s| {
        s["backup"]["paused"] == true
    })
    .await;

    b.child.kill().unwrap(); // SIGKILL
    b.child.wait().unwrap();
    let owner = status_until(&a_addr, "the reservation orphaned at the owner", |s| {
        s["reservations"].as_array().is_some_and(|l| {
            l.iter()
                .any(|r| r["taskID"] == "t1" && r["orphaned"] == true)
        })
    })
    .await;
    assert_eq!(owner["backup"]["paused"], true, "{owner}");
    let held = owner["reservations"][0]["heldMs"].as_i64().unwrap();
    assert!(held > 0, "its original start kept: {owner}");
}

#[actix_rt::test]
async fn ended_by_initial_subscription_at_a_standby_the_owners_socket_closes_1000_within_a_second()
{
    let db = TestDb::create("standby_snap_end_at_standby").await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let (_a, a_addr, _b, b_addr) = owner_and_standby(&db, &up, &lite, 0).await;
    let reserved = Instant::now();
    let (mut c, msg) = reserve(&a_addr, "t2").await;
    let mut sub = WsClient::connect(&format!(
        "ws://{b_addr}/replication/v6/changes?id=r2&taskID=t2&initial=true&replicaVersion={}&watermark={}",
        msg[1]["replicaVersion"].as_str().unwrap(),
        msg[1]["minWatermark"].as_str().unwrap(),
    ))
    .await;
    let (id, status) = sub.msg().await;
    assert_eq!(status[0], "status", "{status}");
    sub.ack(id).await;
    let (code, reason) = close_within(&mut c, Duration::from_secs(1)).await;
    assert_eq!(
        (code, reason.as_str()),
        (1000, "reservation ended: the task subscribed")
    );
    let held_at_most = reserved.elapsed().as_millis() as u64;
    let owner = status_until(&a_addr, "the owner's delay grown", |s| {
        s["backup"]["cleanupDelayMs"].as_u64().unwrap_or(0) > 0
    })
    .await;
    assert!(owner["backup"]["cleanupDelayMs"].as_u64().unwrap() <= held_at_most);
    assert_eq!(owner["reservations"], json!([]), "{owner}");
}

#[actix_rt::test]
async fn a_standby_that_takes_over_keeps_its_reservation_on_the_same_socket() {
    let db = TestDb::create("standby_snap_takeover").await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let (mut a, a_addr, b, b_addr) = owner_and_standby(&db, &up, &lite, 0).await;
    let reserving = Instant::now();
    let (mut c, msg) = reserve(&b_addr, "t1").await;
    let got_status = Instant::now();
    status_until(&a_addr, "the owner's cleanup paused", |s| {
        s["backup"]["paused"] == true
    })
    .await;

    a.child.kill().unwrap(); // SIGKILL
    a.child.wait().unwrap();
    b.listening_within(START).expect("the standby takes over");
    let owner = status_until(&b_addr, "the reservation the new owner's own", |s| {
        s["role"] == "owner"
            && s["reservations"]
                .as_array()
                .is_some_and(|l| l.iter().any(|r| r["taskID"] == "t1"))
    })
    .await;
    let asked = Instant::now();
    let listed = &owner["reservations"][0];
    assert_eq!(listed["orphaned"], false, "not an orphan: {owner}");
    // Its original start: held at least since its status came, before the takeover.
    let held = listed["heldMs"].as_u64().unwrap();
    let since_status = asked.duration_since(got_status).as_millis() as u64;
    assert!(
        held + 2 >= since_status,
        "held {held} ms, since the status {since_status} ms"
    );
    assert_eq!(owner["backup"]["paused"], true, "{owner}");

    // The same socket, never closed: the task's initial subscription at the new owner ends it.
    let subscribing = Instant::now();
    let mut sub = WsClient::connect(&format!(
        "ws://{b_addr}/replication/v6/changes?id=r1&taskID=t1&initial=true&replicaVersion={}&watermark={}",
        msg[1]["replicaVersion"].as_str().unwrap(),
        msg[1]["minWatermark"].as_str().unwrap(),
    ))
    .await;
    let (id, status) = sub.msg().await;
    assert_eq!(status[0], "status", "{status}");
    sub.ack(id).await;
    let (code, reason) = close_within(&mut c, Duration::from_secs(5)).await;
    assert_eq!(
        (code, reason.as_str()),
        (1000, "reservation ended: the task subscribed"),
        "the reservation's first and only close"
    );
    // Grown by the time held from the original start.
    let at_least = subscribing.duration_since(got_status).as_millis() as u64;
    let owner = status_until(&b_addr, "the new owner's delay grown", |s| {
        s["backup"]["cleanupDelayMs"].as_u64().unwrap_or(0) > 0
    })
    .await;
    let delay = owner["backup"]["cleanupDelayMs"].as_u64().unwrap();
    let at_most = reserving.elapsed().as_millis() as u64;
    assert!(
        delay + 2 >= at_least && delay <= at_most,
        "grown from the original start: {delay} ms, between {at_least} and {at_most} ms"
    );
    status_until(&b_addr, "no longer paused", |s| {
        s["backup"]["paused"] == false
    })
    .await;
}
