//! End to end: instances and their records (PROTOCOL.md §14.1) and `/readyz` (§11). Real service
//! processes on one PostgreSQL change DB: the owner's `/status` lists every instance not gone,
//! the owner's record counts its subscribers, a standby killed with `kill -9` leaves that list once gone, a standby's `/status` shows the
//! change DB's state; `/readyz` on an owner before and after its first transaction, on a
//! serving standby before and after, and on one with `--standby-serves=false`; on SQLite, `/status` names the instance too.

#[allow(dead_code)] // shared with tests/takeover.rs and tests/standby_serving.rs
mod takeover_support;

use std::time::Duration;

use change_streamer_actors::instance::GONE_AFTER;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::wait_until;
use takeover_support::*;

const START: Duration = Duration::from_secs(20);

/// An owner on `db`, and its address.
fn owner(db: &TestDb, up: &FakeUpstream) -> (Instance, String) {
    let a = Instance::start(db, &up.url());
    let (addr, _) = a.listening_within(START).expect("the first instance owns");
    (a, addr)
}

/// An owner and a standby on `db`: their addresses.
fn owner_and_standby(db: &TestDb, up: &FakeUpstream) -> (Instance, String, Instance, String) {
    let (a, a_addr) = owner(db, up);
    let b = Instance::start(db, &up.url());
    let b_addr = b.standby.recv_timeout(START).expect("the second stands by");
    (a, a_addr, b, b_addr)
}

#[actix_rt::test]
async fn the_owners_instances_list_every_instance_on_the_change_db() {
    let db = TestDb::create("instances_list").await;
    let up = FakeUpstream::start().await;
    let (_a, a_addr, _b, b_addr) = owner_and_standby(&db, &up);
    let a_id = instance_id(&a_addr).await;
    let b_id = instance_id(&b_addr).await;
    assert_ne!(a_id, b_id);
    let mut expected = vec![(a_id, "owner".to_string()), (b_id, "standby".to_string())];
    expected.sort();
    // The owner's first record may say standby: it was one until it owned the change DB.
    let status = status_until(
        &a_addr,
        "both instances listed, in their roles",
        START,
        |s| instances(s) == expected,
    )
    .await;
    for i in status["instances"].as_array().unwrap() {
        assert_eq!(i["subscribers"], 0, "{i}");
        assert_eq!(i["reservations"], 0, "{i}");
        let age = i["lastSeenMs"].as_u64().expect("lastSeenMs");
        assert!(age < GONE_AFTER.as_millis() as u64, "{i}");
    }
}

#[actix_rt::test]
async fn the_owners_record_counts_its_connected_subscribers() {
    let db = TestDb::create("instances_subscribers").await;
    let up = FakeUpstream::start().await;
    let (_a, addr) = owner(&db, &up);
    up.wait_connections(1).await;
    up.send(txn(100, 2));
    wait_until("the first commit acked", START, || !acked(&up).is_empty()).await;
    let sub = WsClient::connect(&format!(
        "ws://{addr}/replication/v6/changes?id=r1&replicaVersion={}&watermark={}",
        wm(100),
        wm(100)
    ))
    .await;
    let status = status_until(&addr, "its subscriber recorded", START, |s| {
        s["instances"][0]["subscribers"] == 1
    })
    .await;
    assert_eq!(status["instances"].as_array().unwrap().len(), 1, "{status}");
    sub.close().await;
    status_until(&addr, "no subscriber recorded", START, |s| {
        s["instances"][0]["subscribers"] == 0
    })
    .await;
}

#[actix_rt::test]
async fn a_standby_killed_with_kill_9_leaves_the_owners_instances_once_gone() {
    let db = TestDb::create("instances_gone").await;
    let up = FakeUpstream::start().await;
    let (_a, a_addr, mut b, b_addr) = owner_and_standby(&db, &up);
    let b_id = instance_id(&b_addr).await;
    status_until(&a_addr, "the standby listed", START, |s| {
        instances(s).iter().any(|(id, _)| *id == b_id)
    })
    .await;
    b.child.kill().unwrap(); // SIGKILL: no goodbye, its record stays
    b.child.wait().unwrap();
    // Gone once PostgreSQL shows its session ended, at the latest once its record is 10 s old.
    let status = status_until(
        &a_addr,
        "the killed standby gone",
        GONE_AFTER + START,
        |s| instances(s).iter().all(|(id, _)| *id != b_id),
    )
    .await;
    assert_eq!(instances(&status).len(), 1, "{status}");
}

#[actix_rt::test]
async fn readyz_on_an_owner_is_not_initialised_until_its_first_transaction_then_ready() {
    let db = TestDb::create("instances_readyz_owner").await;
    let up = FakeUpstream::start().await;
    let (_a, addr) = owner(&db, &up);
    assert_eq!(
        get(&addr, "/readyz").await,
        (503, "not initialised\n".to_string())
    );
    up.wait_connections(1).await;
    up.send(txn(100, 2));
    wait_until("the first commit acked", START, || !acked(&up).is_empty()).await;
    assert_eq!(get(&addr, "/readyz").await, (200, "ready\n".to_string()));
}

#[actix_rt::test]
async fn readyz_on_a_serving_standby_is_ready_once_the_change_db_is_initialised() {
    let db = TestDb::create("instances_readyz_standby").await;
    let up = FakeUpstream::start().await;
    let (_a, _, _b, b_addr) = owner_and_standby(&db, &up);
    assert_eq!(
        get(&b_addr, "/readyz").await,
        (503, "not initialised\n".to_string())
    );
    up.wait_connections(1).await;
    up.send(txn(100, 2));
    status_until(&b_addr, "the change DB initialised", START, |s| {
        s["replicaVersion"].is_string()
    })
    .await;
    assert_eq!(get(&b_addr, "/readyz").await, (200, "ready\n".to_string()));
}

#[actix_rt::test]
async fn readyz_on_a_standby_that_does_not_serve_says_standby() {
    let db = TestDb::create("instances_readyz_not_serving").await;
    let up = FakeUpstream::start().await;
    let (_a, _) = owner(&db, &up);
    let b = Instance::start_with(&db, &up.url(), INTERVAL_MS, &["--standby-serves=false"]);
    let b_addr = b.standby.recv_timeout(START).expect("the second stands by");
    up.wait_connections(1).await;
    up.send(txn(100, 2));
    status_until(&b_addr, "the change DB initialised", START, |s| {
        s["replicaVersion"].is_string()
    })
    .await;
    assert_eq!(
        get(&b_addr, "/readyz").await,
        (503, "standby\n".to_string())
    );
}

#[actix_rt::test]
async fn a_standbys_status_shows_the_change_db_as_the_owner_stored_it() {
    let db = TestDb::create("instances_standby_status").await;
    let up = FakeUpstream::start().await;
    let (_a, a_addr, _b, b_addr) = owner_and_standby(&db, &up);
    up.wait_connections(1).await;
    for n in 100..105 {
        up.send(txn(n, 2));
    }
    wait_until("the commits acked", START, || {
        acked(&up).last() == Some(&104)
    })
    .await;
    let (_, owner) = get(&a_addr, "/status").await;
    let owner: serde_json::Value = serde_json::from_str(&owner).unwrap();
    let standby = status_until(&b_addr, "the stored rows", START, |s| {
        s["changeLog"] == owner["changeLog"]
    })
    .await;
    assert_eq!(standby["role"], "standby");
    assert!(standby["instance"].is_string(), "{standby}");
    assert_ne!(standby["instance"], owner["instance"]);
    assert_eq!(standby["replicaVersion"], owner["replicaVersion"]);
    assert_eq!(standby["changeLog"]["rows"], 20, "{standby}");
    assert_eq!(
        standby["backup"]["cleanupDelayMs"],
        owner["backup"]["cleanupDelayMs"]
    );
    assert_eq!(standby["backup"]["paused"], false);
    assert_eq!(standby["upstream"], serde_json::Value::Null);
    assert_eq!(standby["purge"], serde_json::Value::Null);
    assert_eq!(standby["subscribers"], serde_json::json!([]));
}

#[actix_rt::test]
async fn status_names_the_instance_on_sqlite_too() {
    let svc = TestService::start(&[]).await;
    let status = svc.status().await;
    let id = status["instance"].as_str().expect("an instance id");
    assert!(
        id.contains(&format!(":{}-", svc.base().rsplit(':').next().unwrap())),
        "{id}"
    );
    assert_eq!(svc.status().await["instance"], id, "stable");
    assert!(status.get("instances").is_none(), "{status}");
    assert_eq!(
        svc.get("/readyz").await,
        (503, "not initialised\n".to_string())
    );
    svc.stop().await;
}

/// The ids in the `instances` of `status` (an owner's), with their roles.
pub fn instances(status: &serde_json::Value) -> Vec<(String, String)> {
    status["instances"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|i| {
                    let s = |k: &str| i[k].as_str().unwrap_or_default().to_string();
                    (s("id"), s("role"))
                })
                .collect()
        })
        .unwrap_or_default()
}
