//! End to end on a shared PostgreSQL change DB (PROTOCOL.md §14): two real service processes on one
//! database, exactly one of them the owner (the standby answers `/healthz`, `/status` and
//! `/metrics` with its role, and closes sessions with 1011); kill -9 of the owner mid-ingest,
//! the standby owns within --takeover-interval-ms + 1 s, asks the change source for the last
//! durable watermark, and no commit acked upstream is lost or stored twice; an open
//! reservation and a grown cleanup delay carried over the kill -9; an owner whose PostgreSQL
//! session ends closes its sessions with 1011, becomes a standby and owns again later; a
//! standby stops gracefully on SIGTERM and SIGINT; the change log's size on disk reported from
//! the change DB's tables.

#[allow(dead_code)] // shared with tests/instances.rs and tests/standby_serving.rs
mod takeover_support;

use std::process::Command;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::wait_until;
use serde_json::json;
use takeover_support::*;

#[actix_rt::test]
async fn kill_9_of_the_owner_mid_ingest_the_standby_owns_and_no_acked_commit_is_lost() {
    let db = TestDb::create("takeover_e2e").await;
    let up = FakeUpstream::start().await;
    let mut a = Instance::start(&db, &up.url());
    let (a_addr, _) = a
        .listening_within(Duration::from_secs(20))
        .expect("the first instance owns the change DB and listens");
    up.wait_connections(1).await;
    let b = Instance::start(&db, &up.url());
    let b_addr = b
        .standby
        .recv_timeout(Duration::from_secs(20))
        .expect("the second instance answers as a standby");
    // Exactly one owner: the second instance stands by while the first lives.
    assert!(
        b.listening_within(Duration::from_millis(5 * INTERVAL_MS))
            .is_none(),
        "two owners of one change DB"
    );
    assert_eq!(up.queries().len(), 1, "a standby connected upstream");
    assert_eq!(role(&a_addr).await, "owner");
    assert_eq!(owner_gauge(&a_addr).await, "1");
    assert_eq!(role(&b_addr).await, "standby");
    assert_eq!(owner_gauge(&b_addr).await, "0");
    assert_eq!(get(&b_addr, "/healthz").await.0, 200);
    // A serving standby checks /snapshot as the owner does: without a backup URL, refused
    // (its reservations: tests/standby_snapshot.rs; its /changes: tests/standby_serving.rs).
    let mut c =
        WsClient::connect(&format!("ws://{b_addr}/replication/v6/snapshot?taskID=t1")).await;
    assert_eq!(
        c.closed().await,
        (
            1002,
            "replication-manager is not configured with a ZERO_LITESTREAM_BACKUP_URL".to_string()
        )
    );

    for n in 100..140 {
        up.send(txn(n, 3));
    }
    wait_until("acks from the owner", Duration::from_secs(20), || {
        acked(&up).len() >= 10
    })
    .await;
    a.child.kill().unwrap(); // SIGKILL, mid-ingest
    let killed = Instant::now();
    a.child.wait().unwrap();
    let acked_by_a = acked(&up);

    let (addr, owned_at) = b
        .listening_within(Duration::from_millis(INTERVAL_MS) + Duration::from_secs(1))
        .expect("the standby owns within --takeover-interval-ms + 1 s");
    eprintln!("takeover in {:?}", owned_at - killed);
    assert_eq!(addr, b_addr, "the owner serves where the standby answered");
    assert_eq!(role(&addr).await, "owner");
    assert_eq!(owner_gauge(&addr).await, "1");
    // The new owner resumes from the last durable watermark.
    up.wait_connections(2).await;
    let query = up.queries()[1].clone();
    let resumed_at = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("lastWatermark="))
        .and_then(|w| Watermark::parse(w).ok()?.to_u64())
        .unwrap_or_else(|| panic!("no lastWatermark in {query}"));
    let last_acked = *acked_by_a.last().unwrap();
    assert!(
        resumed_at >= last_acked,
        "resumed at {resumed_at}, but {last_acked} was acked"
    );
    for n in 200..210 {
        up.send(txn(n, 3));
    }

    // Everything from the replicaVersion on: each acked commit once, in order.
    let mut sub = WsClient::connect(&format!(
        "ws://{addr}/replication/v6/changes?id=r1&replicaVersion={}&watermark={}",
        wm(100),
        wm(100)
    ))
    .await;
    let commits = commits_until(&mut sub, 209).await;
    assert!(
        commits.windows(2).all(|p| p[0] < p[1]),
        "a commit twice or out of order: {commits:?}"
    );
    for n in acked_by_a.iter().filter(|n| **n > 100) {
        assert!(commits.contains(n), "acked commit {n} lost: {commits:?}");
    }
    assert_eq!(
        commits.iter().filter(|n| **n >= 200).count(),
        10,
        "{commits:?}"
    );
    assert_eq!(
        *commits.iter().filter(|n| **n < 200).max().unwrap(),
        resumed_at
    );
}

/// PROTOCOL.md §14.1: the standby that takes over keeps the subscribers it served: no close,
/// no gap, no duplicate; they go on with what the new owner ingests.
#[actix_rt::test]
async fn a_takeover_keeps_the_standbys_subscribers_with_no_gap_and_no_duplicate() {
    let db = TestDb::create("takeover_keeps_subscribers").await;
    let up = FakeUpstream::start().await;
    let mut a = Instance::start(&db, &up.url());
    a.listening_within(Duration::from_secs(20))
        .expect("the first instance owns the change DB and listens");
    up.wait_connections(1).await;
    let b = Instance::start(&db, &up.url());
    let b_addr = b
        .standby
        .recv_timeout(Duration::from_secs(20))
        .expect("the second instance answers as a standby");
    // Subscribed at the standby, from the replicaVersion.
    let mut sub = initial_sync_then_subscribe(&up, 3, &b_addr, "kept").await;
    for n in 101..140 {
        up.send(txn(n, 3));
    }
    wait_until("acks from the owner", Duration::from_secs(20), || {
        acked(&up).len() >= 10
    })
    .await;
    a.child.kill().unwrap(); // SIGKILL, mid-ingest
    a.child.wait().unwrap();
    let acked_by_a = acked(&up);
    let (addr, _) = b
        .listening_within(Duration::from_millis(INTERVAL_MS) + Duration::from_secs(1))
        .expect("the standby owns within --takeover-interval-ms + 1 s");
    assert_eq!(addr, b_addr);
    up.wait_connections(2).await;
    for n in 200..210 {
        up.send(txn(n, 3));
    }
    // The same socket, never closed (WsClient::msg fails on a close): every commit the old
    // owner acked, then what the new owner ingests, each once and in order.
    let commits = commits_until(&mut sub, 209).await;
    assert!(
        commits.windows(2).all(|p| p[0] < p[1]),
        "a commit twice or out of order: {commits:?}"
    );
    for n in acked_by_a.iter().filter(|n| **n > 100) {
        assert!(commits.contains(n), "acked commit {n} missing: {commits:?}");
    }
    assert_eq!(
        commits.iter().filter(|n| **n >= 200).count(),
        10,
        "{commits:?}"
    );
    let (code, body) = get(&b_addr, "/status").await;
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["role"], "owner");
    let ids: Vec<&str> = status["subscribers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, ["kept"], "{status}");
}

/// `change_streamer_change_log_bytes` on PostgreSQL is the size of the change DB's tables, not
/// the size of a file named like its URL (which was always 0).
#[actix_rt::test]
async fn the_change_log_bytes_gauge_counts_the_change_db_tables() {
    let db = TestDb::create("takeover_log_bytes").await;
    let up = FakeUpstream::start().await;
    let a = Instance::start(&db, &up.url());
    let (addr, _) = a
        .listening_within(Duration::from_secs(20))
        .expect("the instance owns the change DB and listens");
    up.wait_connections(1).await;
    for n in 100..120 {
        up.send(txn(n, 3));
    }
    wait_until("acks from the owner", Duration::from_secs(20), || {
        acked(&up).last() == Some(&119)
    })
    .await;
    let bytes: f64 = metric(&addr, "change_streamer_change_log_bytes")
        .await
        .parse()
        .unwrap();
    assert!(bytes > 0.0, "change_streamer_change_log_bytes is {bytes}");
    let (_, status) = get(&addr, "/status").await;
    assert!(status.contains("\"rows\":100"), "{status}");
}

#[actix_rt::test]
async fn an_owner_that_loses_its_session_closes_its_sessions_with_1011_and_becomes_a_standby() {
    let db = TestDb::create("deposed_e2e").await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let flags = lite.service_flags(60_000);
    let mut a = Instance::start_with(&db, &up.url(), INTERVAL_MS, &strs(&flags));
    let (a_addr, _) = a
        .listening_within(Duration::from_secs(20))
        .expect("the first instance owns the change DB and listens");
    assert_eq!(a.standby.try_recv().ok(), Some(a_addr.clone()));
    up.wait_connections(1).await;
    // A subscriber and a reservation, both live on the owner.
    let mut sub = initial_sync_then_subscribe(&up, 1, &a_addr, "r1").await;
    assert_eq!(sub.msg().await.1, json!(["status", {"tag": "status"}]));
    let mut res =
        WsClient::connect(&format!("ws://{a_addr}/replication/v6/snapshot?taskID=t1")).await;
    let (id, _) = res.msg().await;
    res.ack(id).await;
    // The other instance tries more often, so that it is the one to take over.
    let b = Instance::start_with(&db, &up.url(), INTERVAL_MS / 4, &strs(&flags));
    let b_addr = b
        .standby
        .recv_timeout(Duration::from_secs(20))
        .expect("the second instance answers as a standby");

    terminate_owner_session(&db).await;
    let bound = Duration::from_millis(2 * INTERVAL_MS) + Duration::from_secs(1);
    let closed = (1011, "standby: not the owner".to_string());
    assert_eq!(close_within(&mut sub, bound).await, closed, "subscriber");
    assert_eq!(close_within(&mut res, bound).await, closed, "reservation");
    let standby_at = a
        .standby
        .recv_timeout(bound)
        .expect("the deposed owner answers as a standby");
    assert_eq!(standby_at, a_addr, "on the same socket");
    a.writer_gone
        .recv_timeout(Duration::from_secs(5))
        .expect("every actor and handle on the deposed change log is gone");
    let (owner_at, _) = b
        .listening_within(Duration::from_millis(INTERVAL_MS) + Duration::from_secs(1))
        .expect("the other instance owns within --takeover-interval-ms + 1 s");
    assert_eq!(owner_at, b_addr);
    assert!(
        a.child.try_wait().unwrap().is_none(),
        "the deposed owner exited"
    );
    assert_eq!(role(&a_addr).await, "standby");
    assert_eq!(owner_gauge(&a_addr).await, "0");
    assert_eq!(get(&a_addr, "/healthz").await.0, 200);
    // A new reservation on the deposed owner is a serving standby's (PROTOCOL.md §14.1).
    let mut c =
        WsClient::connect(&format!("ws://{a_addr}/replication/v6/snapshot?taskID=t2")).await;
    assert_eq!(
        c.msg().await.1[0],
        "status",
        "a new session on the deposed owner"
    );
    assert_eq!(role(&b_addr).await, "owner");
    // The new owner resumed where the deposed one stopped storing.
    up.wait_connections(2).await;
    assert!(
        up.queries()[1].contains(&format!("lastWatermark={}", wm(100))),
        "{:?}",
        up.queries()
    );
    // The reservation the deposed owner held is the new owner's orphan.
    let (_, st) = get(&b_addr, "/status").await;
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["reservations"][0]["taskID"], "t1", "{st}");
    assert_eq!(st["reservations"][0]["orphaned"], true, "{st}");

    // Once the other instance is gone, the deposed one owns again, on the same socket.
    drop(b);
    let (again, _) = a
        .listening_within(Duration::from_millis(INTERVAL_MS) + Duration::from_secs(1))
        .expect("the deposed owner owns again within --takeover-interval-ms + 1 s");
    assert_eq!(again, a_addr);
    assert_eq!(role(&a_addr).await, "owner");
    assert_eq!(owner_gauge(&a_addr).await, "1");
    up.wait_connections(3).await;
    let mut sub = WsClient::connect(&format!(
        "ws://{a_addr}/replication/v6/changes?id=r1&replicaVersion={}&watermark={}",
        wm(100),
        wm(100)
    ))
    .await;
    assert_eq!(sub.msg().await.1, json!(["status", {"tag": "status"}]));
    up.send(txn(101, 1));
    assert_eq!(commits_until(&mut sub, 101).await, vec![101]);
}

#[actix_rt::test]
async fn an_open_reservation_and_the_grown_cleanup_delay_survive_a_kill_9_takeover() {
    const FLOOR_MS: u64 = 1500;
    let db = TestDb::create("carried_e2e").await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let flags = lite.service_flags(FLOOR_MS);
    let mut a = Instance::start_with(&db, &up.url(), INTERVAL_MS, &strs(&flags));
    let (a_addr, _) = a
        .listening_within(Duration::from_secs(20))
        .expect("the first instance owns the change DB and listens");
    up.wait_connections(1).await;
    for n in 100..=104 {
        up.send(txn(n, 2));
    }
    wait_until("acks up to 104", Duration::from_secs(20), || {
        acked(&up).contains(&104)
    })
    .await;
    // Task t0 holds its reservation longer than the floor, then subscribes: the delay grows.
    let mut t0 =
        WsClient::connect(&format!("ws://{a_addr}/replication/v6/snapshot?taskID=t0")).await;
    let (id, _) = t0.msg().await;
    t0.ack(id).await;
    actix_rt::time::sleep(Duration::from_millis(FLOOR_MS + 500)).await;
    let mut sub = WsClient::connect(&format!(
        "ws://{a_addr}/replication/v6/changes?id=r0&taskID=t0&initial=true&mode=backup&replicaVersion={}&watermark={}",
        wm(100),
        wm(102)
    ))
    .await;
    assert_eq!(sub.msg().await.1, json!(["status", {"tag": "status"}]));
    let grown = loop {
        let (_, st) = get(&a_addr, "/status").await;
        let st: serde_json::Value = serde_json::from_str(&st).unwrap();
        let delay = st["backup"]["cleanupDelayMs"].as_i64().unwrap();
        if delay > FLOOR_MS as i64 {
            break delay;
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    };
    // Task t1 reserves (durable once its status is sent) and is restoring at the kill.
    let mut t1 =
        WsClient::connect(&format!("ws://{a_addr}/replication/v6/snapshot?taskID=t1")).await;
    let (id, status) = t1.msg().await;
    assert_eq!(status[1]["minWatermark"], json!(wm(100)));
    t1.ack(id).await;
    // One more read of the state after the growth showed: it is durable by now.
    get(&a_addr, "/status").await;
    // litestream backed 104 up long ago: without the reservation it would be purged at once.
    lite.set_body(render_page(
        "/db",
        &[(Some(wm(104).as_str()), "s3", "1.0".into())],
    ));
    let b = Instance::start_with(&db, &up.url(), INTERVAL_MS, &strs(&flags));
    b.standby
        .recv_timeout(Duration::from_secs(20))
        .expect("the second instance answers as a standby");
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    up.drop_connection();

    let (b_addr, _) = b
        .listening_within(Duration::from_millis(INTERVAL_MS) + Duration::from_secs(1))
        .expect("the standby owns within --takeover-interval-ms + 1 s");
    let seen = lite.requests();
    lite.wait_for_request(seen + 5, Duration::from_secs(5))
        .await;
    let (_, st) = get(&b_addr, "/status").await;
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["role"], "owner", "{st}");
    assert_eq!(st["backup"]["cleanupDelayMs"], json!(grown), "{st}");
    let reservations = st["reservations"].as_array().expect("reservations");
    assert_eq!(reservations.len(), 1, "{st}");
    assert_eq!(reservations[0]["taskID"], "t1", "{st}");
    assert_eq!(reservations[0]["orphaned"], true, "{st}");
    assert_eq!(st["backup"]["paused"], true, "{st}");
    assert_eq!(st["backup"]["lastScheduledWatermark"], json!(null), "{st}");
    assert_eq!(st["changeLog"]["minWatermark"], json!(wm(100)), "{st}");
    assert_eq!(st["purge"]["rowsPurged"], json!(0), "{st}");
}

/// SIGTERM or SIGINT to a standby: it stops answering and exits with status 0.
async fn a_standby_stops_gracefully_on(signal: &str) {
    let db = TestDb::create("standby_stop").await;
    let up = FakeUpstream::start().await;
    let a = Instance::start(&db, &up.url());
    let (a_addr, _) = a
        .listening_within(Duration::from_secs(20))
        .expect("the first instance owns the change DB and listens");
    let mut b = Instance::start(&db, &up.url());
    let b_addr = b
        .standby
        .recv_timeout(Duration::from_secs(20))
        .expect("the second instance answers as a standby");
    assert_eq!(role(&b_addr).await, "standby");
    let sent = Command::new("kill")
        .args([signal, &b.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = b.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the standby still runs 5 s after {signal}"
        );
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(status.code(), Some(0), "{signal}");
    assert!(
        std::net::TcpStream::connect(&b_addr).is_err(),
        "the standby's socket still accepts"
    );
    assert!(
        b.listening_within(Duration::from_millis(3 * INTERVAL_MS))
            .is_none(),
        "it owned the change DB on its way out"
    );
    assert_eq!(role(&a_addr).await, "owner");
}

#[actix_rt::test]
async fn a_standby_stops_gracefully_on_sigterm() {
    a_standby_stops_gracefully_on("-TERM").await;
}

#[actix_rt::test]
async fn a_standby_stops_gracefully_on_sigint() {
    a_standby_stops_gracefully_on("-INT").await;
}
