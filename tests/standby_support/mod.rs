//! What the end-to-end tests of serving standbys share (tests/standby_serving.rs,
//! tests/standby_purge.rs, tests/standby_late_joiner.rs, and tests/purge_support for the last
//! two): an owner and a serving standby on one change DB, subscriptions to
//! either, ingest through the fake change source, and reading their `/status`.

use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::{wait_until, POLL};
use serde_json::{json, Value};

use super::takeover_support::*;

/// Safety nets only: how long an instance may take to start, and a state to show.
pub const START: Duration = Duration::from_secs(20);
pub const LIMIT: Duration = Duration::from_secs(30);

/// The owner of `db` with `flags`, and its address.
pub fn owner_with(db: &TestDb, up: &FakeUpstream, flags: &[&str]) -> (Instance, String) {
    let a = Instance::start_with(db, &up.url(), INTERVAL_MS, flags);
    let (addr, _) = a
        .listening_within(START)
        .expect("the first instance owns the change DB and listens");
    (a, addr)
}

/// A standby on `db` with `flags` (started once the owner owns), and its address.
pub fn standby_with(db: &TestDb, up: &FakeUpstream, flags: &[&str]) -> (Instance, String) {
    let b = Instance::start_with(db, &up.url(), INTERVAL_MS, flags);
    let addr = b
        .standby
        .recv_timeout(START)
        .expect("the second instance answers as a standby");
    (b, addr)
}

/// [`standby_with`], on a change DB the owner initialised, once it serves `/changes`: its
/// `/readyz` says `ready`. (It answers before: its first phase, until its streamer has started,
/// closes `/changes` with 1011 `standby: not the owner`, though it will serve.)
pub async fn serving_standby(db: &TestDb, up: &FakeUpstream, flags: &[&str]) -> (Instance, String) {
    let (b, addr) = standby_with(db, up, flags);
    readyz_until(&addr, (200, "ready\n")).await;
    (b, addr)
}

/// The subscription of `id` at `addr` from `from` (replicaVersion 100, the initial sync).
pub fn sub_url(addr: &str, id: &str, from: u64, extra: &str) -> String {
    format!(
        "ws://{addr}/replication/v6/changes?id={id}&replicaVersion={}&watermark={}{extra}",
        wm(100),
        wm(from)
    )
}

/// Subscribes at `addr` from `from` and reads (and acks) the `status` frame.
pub async fn subscribe(addr: &str, id: &str, from: u64) -> WsClient {
    let mut c = WsClient::connect(&sub_url(addr, id, from, "")).await;
    let (n, msg) = c.msg().await;
    assert_eq!(msg, json!(["status", {"tag": "status"}]), "{id} at {addr}");
    c.ack(n).await;
    c
}

/// Sends the transactions `range` (`rows` rows each) and waits until the change source was
/// acked the last one: it is durable in the change DB.
pub async fn ingest(up: &FakeUpstream, range: RangeInclusive<u64>, rows: u64) {
    let last = *range.end();
    for n in range {
        up.send(txn(n, rows));
    }
    wait_until(&format!("commit {last} acked upstream"), LIMIT, || {
        acked(up).last() == Some(&last)
    })
    .await;
}

pub fn upto(from: u64, last: u64) -> Vec<u64> {
    (from..=last).collect()
}

/// Polls `GET {addr}/readyz` until it answers `want`.
pub async fn readyz_until(addr: &str, want: (u16, &str)) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let (code, body) = get(addr, "/readyz").await;
        if (code, body.as_str()) == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz at {addr} answers {code} {body:?}, not {want:?}, after {LIMIT:?}"
        );
        actix_rt::time::sleep(POLL).await;
    }
}

/// The entry of subscriber `id` in a `/status`.
pub fn subscriber<'a>(status: &'a Value, id: &str) -> Option<&'a Value> {
    status["subscribers"]
        .as_array()?
        .iter()
        .find(|s| s["id"] == id)
}

/// The owner's `instances` entry of instance `id`.
pub fn instance<'a>(status: &'a Value, id: &str) -> Option<&'a Value> {
    status["instances"]
        .as_array()?
        .iter()
        .find(|i| i["id"] == id)
}
