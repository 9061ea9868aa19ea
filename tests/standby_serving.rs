//! End to end: standbys serve `/replication/v{N}/changes` from the shared PostgreSQL change DB
//! (SPEC §14, §14.1; issue 17 items 2 and 3), against real service processes on one real
//! change DB, with a fake change source and a fake litestream:
//! - a standby serves catch-up from the change DB, then the owner's commits live, whole, with
//!   no gap and no duplicate, and is then ready (`/readyz`);
//! - it checks subscriptions and answers errors as the owner does (type 1, type 2, 1002, 1011
//!   before the change log is initialised, protocol v1, a watermark beyond the log), and frames
//!   as the owner does (`wsBatched=true`, cumulative acks);
//! - its `/status` lists its own subscribers, shaped as the owner's;
//! - with `--standby-serves=false` it closes `/changes` and `/snapshot` with 1011;
//! - the owner's flow control never waits for a standby's subscriber;
//! - subscribers spread over the owner and a standby each get every transaction after their
//!   watermark once, in order;
//! - purge across instances (§14.1 "Purge"): a standby's subscriber holds the owner's purge
//!   back (`purge.blockedBy` `"subscriber"`) until it acks past, and counts as connected; a
//!   standby killed with `kill -9` holds it back while it runs and stops once its session ended;
//!   a frozen standby (SIGSTOP: session alive, record ageing) holds it back until its record is
//!   10 s old, never before; resumed after the owner purged past its subscribers (its record
//!   lapsed), a standby gives them no gap and no broken transaction (it may close them 1011); a
//!   late joiner at a standby racing a purge past its watermark is either refused with error
//!   type 2 or holds the purge back, never accepted and then short of rows.

#[allow(dead_code)] // shared with tests/takeover.rs and tests/instances.rs
mod takeover_support;

mod changes_support; // only its `read_txns` here

use std::cell::Cell;
use std::ops::RangeInclusive;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use change_streamer_actors::instance::GONE_AFTER;
use change_streamer_test_support::client::{commit_of, frame, payloads, Seen, WsClient};
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::{wait_until, POLL};
use changes_support::read_txns;
use serde_json::{json, Value};
use takeover_support::*;

/// Safety nets only: how long an instance may take to start, and a state to show.
const START: Duration = Duration::from_secs(20);
const LIMIT: Duration = Duration::from_secs(30);

/// The owner of `db` with `flags`, and its address.
fn owner_with(db: &TestDb, up: &FakeUpstream, flags: &[&str]) -> (Instance, String) {
    let a = Instance::start_with(db, &up.url(), INTERVAL_MS, flags);
    let (addr, _) = a
        .listening_within(START)
        .expect("the first instance owns the change DB and listens");
    (a, addr)
}

/// A standby on `db` with `flags` (started once the owner owns), and its address.
fn standby_with(db: &TestDb, up: &FakeUpstream, flags: &[&str]) -> (Instance, String) {
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
async fn serving_standby(db: &TestDb, up: &FakeUpstream, flags: &[&str]) -> (Instance, String) {
    let (b, addr) = standby_with(db, up, flags);
    readyz_until(&addr, (200, "ready\n")).await;
    (b, addr)
}

/// The subscription of `id` at `addr` from `from` (replicaVersion 100, the initial sync).
fn sub_url(addr: &str, id: &str, from: u64, extra: &str) -> String {
    format!(
        "ws://{addr}/replication/v6/changes?id={id}&replicaVersion={}&watermark={}{extra}",
        wm(100),
        wm(from)
    )
}

/// Subscribes at `addr` from `from` and reads (and acks) the `status` frame.
async fn subscribe(addr: &str, id: &str, from: u64) -> WsClient {
    let mut c = WsClient::connect(&sub_url(addr, id, from, "")).await;
    let (n, msg) = c.msg().await;
    assert_eq!(msg, json!(["status", {"tag": "status"}]), "{id} at {addr}");
    c.ack(n).await;
    c
}

/// Sends the transactions `range` (`rows` rows each) and waits until the change source was
/// acked the last one: it is durable in the change DB.
async fn ingest(up: &FakeUpstream, range: RangeInclusive<u64>, rows: u64) {
    let last = *range.end();
    for n in range {
        up.send(txn(n, rows));
    }
    wait_until(&format!("commit {last} acked upstream"), LIMIT, || {
        acked(up).last() == Some(&last)
    })
    .await;
}

fn upto(from: u64, last: u64) -> Vec<u64> {
    (from..=last).collect()
}

/// Polls `GET {addr}/readyz` until it answers `want`.
async fn readyz_until(addr: &str, want: (u16, &str)) {
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
fn subscriber<'a>(status: &'a Value, id: &str) -> Option<&'a Value> {
    status["subscribers"]
        .as_array()?
        .iter()
        .find(|s| s["id"] == id)
}

/// The owner's `instances` entry of instance `id`.
fn instance<'a>(status: &'a Value, id: &str) -> Option<&'a Value> {
    status["instances"]
        .as_array()?
        .iter()
        .find(|i| i["id"] == id)
}

/// litestream reports `n` backed up long ago: with a 0 ms delay floor, the owner schedules a
/// cleanup to `n` at its next poll.
fn report_backup_of(lite: &FakeLitestream, n: u64) {
    lite.set_body(render_page(
        "/db",
        &[(Some(wm(n).as_str()), "s3", "1.0".into())],
    ));
}

/// An owner whose backup monitor and purge react within tens of ms (cleanup floor 0, purge
/// delay 20 ms, no retention), transactions 100..=104 of 2 rows stored, and a standby: the
/// owner, its address, the standby, its address and id, the change source and litestream.
struct PurgeSetup {
    up: FakeUpstream,
    lite: FakeLitestream,
    _a: Instance,
    a_addr: String,
    b: Instance,
    b_addr: String,
    b_id: String,
    /// Last: dropped once the instances are.
    _db: TestDb,
}

async fn purge_setup(tag: &str) -> PurgeSetup {
    purge_setup_with(tag, "20").await
}

/// [`purge_setup`] with `--purge-delay-ms` `purge_delay_ms`.
async fn purge_setup_with(tag: &str, purge_delay_ms: &str) -> PurgeSetup {
    let db = TestDb::create(tag).await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let mut flags = lite.service_flags(0);
    let delay = flags.iter().position(|f| f == "--purge-delay-ms").unwrap() + 1;
    flags[delay] = purge_delay_ms.to_string();
    let (a, a_addr) = owner_with(&db, &up, &strs(&flags));
    up.wait_connections(1).await;
    ingest(&up, 100..=104, 2).await;
    let (b, b_addr) = serving_standby(&db, &up, &strs(&flags)).await;
    let b_id = instance_id(&b_addr).await;
    PurgeSetup {
        up,
        lite,
        _a: a,
        a_addr,
        b,
        b_addr,
        b_id,
        _db: db,
    }
}

/// Samples the owner's `/status` until it has seen the record of instance `b_id` refreshed
/// `refreshes` times (its `lastSeenMs` drop), asserting at every sample that the purge is held
/// back by a subscriber and nothing below 104 was purged.
async fn purge_held_while_refreshed(a_addr: &str, b_id: &str, refreshes: usize) {
    let deadline = Instant::now() + LIMIT;
    let (mut seen, mut last_age) = (0, None);
    while seen < refreshes {
        let (code, body) = get(a_addr, "/status").await;
        assert_eq!(code, 200, "{body}");
        let st: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(st["purge"]["blockedBy"], "subscriber", "{st}");
        assert_eq!(st["changeLog"]["minWatermark"], json!(wm(100)), "{st}");
        assert_eq!(st["purge"]["rowsPurged"], 0, "{st}");
        let age = instance(&st, b_id)
            .and_then(|i| i["lastSeenMs"].as_u64())
            .unwrap_or_else(|| panic!("the standby not listed: {st}"));
        if last_age.is_some_and(|l| age < l) {
            seen += 1;
        }
        last_age = Some(age);
        assert!(
            Instant::now() < deadline,
            "the standby's record not refreshed {refreshes} times within {LIMIT:?}"
        );
        actix_rt::time::sleep(POLL).await;
    }
}

#[actix_rt::test]
async fn a_standby_serves_changes_from_the_change_db() {
    let db = TestDb::create("serve_changes").await;
    let up = FakeUpstream::start().await;
    let (_a, _a_addr) = owner_with(&db, &up, &[]);
    up.wait_connections(1).await;
    ingest(&up, 100..=110, 2).await;
    // (Its /readyz says ready: a serving standby following an initialised change DB.)
    let (_b, b_addr) = serving_standby(&db, &up, &[]).await;
    assert_eq!(role(&b_addr).await, "standby");
    assert_eq!(owner_gauge(&b_addr).await, "0");

    // Catch-up: what the owner stored before the subscription, read from the change DB.
    let mut s = subscribe(&b_addr, "rb", 100).await;
    assert_eq!(read_txns(&mut s, 110).await, upto(101, 110));
    status_until(&b_addr, "the standby's subscriber live", LIMIT, |st| {
        subscriber(st, "rb").is_some_and(|s| s["phase"] == "live")
    })
    .await;

    // Live: each commit of the owner reaches the standby's subscriber, alone and whole.
    let mut latencies = Vec::new();
    for n in 111..=120 {
        let sent = Instant::now();
        up.send(txn(n, 2));
        assert_eq!(read_txns(&mut s, n).await, vec![n], "live commit {n}");
        latencies.push(sent.elapsed());
    }
    latencies.sort();
    eprintln!(
        "owner ingest to standby subscriber: median {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies.last().unwrap()
    );
    // Then a burst, still in order and whole.
    for n in 121..=160 {
        up.send(txn(n, 3));
    }
    assert_eq!(read_txns(&mut s, 160).await, upto(121, 160));
    let st = status_until(&b_addr, "the standby's subscriber acked 160", LIMIT, |st| {
        subscriber(st, "rb").is_some_and(|s| s["acked"] == json!(wm(160)))
    })
    .await;
    assert_eq!(st["role"], "standby", "{st}");
}

#[actix_rt::test]
async fn a_standby_checks_subscriptions_as_the_owner_does() {
    let db = TestDb::create("serve_checks").await;
    let up = FakeUpstream::start().await;
    let ping = ["--ping-interval-ms", "300"];
    let (_a, a_addr) = owner_with(&db, &up, &ping);
    up.wait_connections(1).await;
    // 101 is not a stored commit: a hole inside the stored range.
    ingest(&up, 100..=100, 1).await;
    ingest(&up, 102..=103, 1).await;
    let (_b, b_addr) = serving_standby(&db, &up, &ping).await;

    let rv = wm(100);
    // (request, whether the client acks the first message, the expected first message or close)
    let cases: Vec<(String, bool, Value)> = vec![
        (
            "v6/changes?id=r&replicaVersion=999&watermark=00".into(),
            true,
            json!(["error", {"type": 1, "message": format!("current replica version is {rv} (requested 999)")}]),
        ),
        (
            format!("v6/changes?id=r&replicaVersion={rv}&watermark={}", wm(101)),
            false, // closed after one ping interval without the ack
            json!(["error", {"type": 2, "message": format!("earliest supported watermark is {rv} (requested {})", wm(101))}]),
        ),
        (
            format!("v6/changes?id=r&replicaVersion={rv}&watermark={}", wm(99)),
            true,
            json!(["error", {"type": 2, "message": format!("earliest supported watermark is {rv} (requested {})", wm(99))}]),
        ),
        (
            "v6/changes?replicaVersion=1&watermark=00".into(),
            false,
            json!(1002),
        ),
        ("v6/changes?id=a&watermark=00".into(), false, json!(1002)),
        (
            "v6/changes?id=a&replicaVersion=1".into(),
            false,
            json!(1002),
        ),
        (
            "v6/changes?id=a&replicaVersion=1&watermark=ZZ".into(),
            false,
            json!(1002),
        ),
        (
            format!("v6/changes?id=a&id=b&replicaVersion={rv}&watermark={rv}"),
            false,
            json!(1002),
        ),
        (
            format!("v6/changes?id=a&replicaVersion={rv}&watermark={rv}&wsBatched=yes"),
            false,
            json!(1002),
        ),
        (
            format!("v7/changes?id=a&replicaVersion={rv}&watermark={rv}"),
            false,
            json!(1002),
        ),
    ];
    for (path, ack, want) in cases {
        let at_owner = outcome(&format!("ws://{a_addr}/replication/{path}"), ack).await;
        let at_standby = outcome(&format!("ws://{b_addr}/replication/{path}"), ack).await;
        assert_eq!(
            at_standby, at_owner,
            "{path}: the standby answers otherwise"
        );
        match at_standby {
            (Some(msg), closed) => {
                assert_eq!(msg, want, "{path}");
                assert_eq!(closed.0, 1000, "{path}: {closed:?}");
            }
            (None, (code, reason)) => {
                assert_eq!(json!(code), want, "{path}: {reason}");
                assert!(reason.len() <= 123, "{path}: {reason}");
            }
        }
    }

    // Protocol v1 knows no `status`: the first message is the transaction after the watermark.
    for addr in [&a_addr, &b_addr] {
        let mut c = WsClient::connect(&format!(
            "ws://{addr}/replication/v1/changes?id=v1&replicaVersion={rv}&watermark={}",
            wm(102)
        ))
        .await;
        let mut got = Vec::new();
        loop {
            let (id, msg) = c.msg().await;
            c.ack(id).await;
            got.push(msg[0].as_str().unwrap_or_default().to_string());
            if msg[0] == "commit" {
                assert_eq!(msg[2]["watermark"], json!(wm(103)), "v1 at {addr}");
                break;
            }
        }
        assert_eq!(got, ["begin", "data", "commit"], "v1 at {addr}");
    }

    // A watermark beyond the newest stored one is served from live changes, and only what is
    // newer than it is sent.
    // (Sent without waiting: with a 300 ms ping interval the client must keep reading.)
    let mut c = subscribe(&b_addr, "ahead", 110).await;
    for n in 104..=111 {
        up.send(txn(n, 1));
    }
    assert_eq!(read_txns(&mut c, 111).await, vec![111]);
}

/// Reads frames of either shape (acking each, cumulatively) until the commit of `last`,
/// checking that the transactions from `next` on come whole, in order, each once: the last
/// frame's id, and how many frames were batched.
async fn read_acking(c: &mut WsClient, mut next: u64, last: u64) -> (u64, usize) {
    let (mut open, mut batches) = (false, 0);
    loop {
        let f = frame(c).await;
        batches += usize::from(f["batch"].is_array());
        let (id, ps) = payloads(&f);
        for p in ps {
            match p[0].as_str() {
                Some("begin") => {
                    assert!(!open, "begin inside a transaction: {p}");
                    assert_eq!(p[2]["commitWatermark"], json!(wm(next)), "{p}");
                    open = true;
                }
                Some("data") => assert!(open, "data outside a transaction: {p}"),
                Some("commit") => {
                    assert!(open, "commit without its begin: {p}");
                    open = false;
                    assert_eq!(commit_of(&p), Some(next), "out of order: {p}");
                    next += 1;
                }
                _ => panic!("unexpected {p}"),
            }
        }
        c.ack(id).await;
        if next > last {
            assert!(!open);
            return (id, batches);
        }
    }
}

/// What a subscription request gets: its first message, if one comes, and its close; the
/// message is acked when `ack`.
async fn outcome(url: &str, ack: bool) -> (Option<Value>, (u16, String)) {
    let mut c = WsClient::connect(url).await;
    match c.next(LIMIT).await {
        Some(Seen::Msg { id, msg }) => {
            if ack {
                c.ack(id).await;
            }
            (Some(msg), c.closed().await)
        }
        Some(Seen::Closed { code, reason }) => (None, (code, reason)),
        None => panic!("{url}: neither a message nor a close within {LIMIT:?}"),
    }
}

#[actix_rt::test]
async fn a_standby_closes_1011_before_the_change_log_is_initialised_as_the_owner_does() {
    let db = TestDb::create("serve_uninitialised").await;
    let up = FakeUpstream::start().await;
    let (_a, a_addr) = owner_with(&db, &up, &[]);
    let (_b, b_addr) = standby_with(&db, &up, &[]);
    // Serving, not ready: the change DB holds no replicaVersion yet.
    readyz_until(&b_addr, (503, "not initialised\n")).await;
    let path = format!(
        "changes?id=r&replicaVersion={}&watermark={}",
        wm(100),
        wm(100)
    );
    let mut c = WsClient::connect(&format!("ws://{a_addr}/replication/v6/{path}")).await;
    let at_owner = c.closed().await;
    assert_eq!(at_owner.0, 1011, "{at_owner:?}");
    let mut c = WsClient::connect(&format!("ws://{b_addr}/replication/v6/{path}")).await;
    assert_eq!(c.closed().await, at_owner);
}

#[actix_rt::test]
async fn a_standbys_batched_subscriber_gets_batched_frames_and_acks_cumulatively() {
    let db = TestDb::create("serve_batched").await;
    let up = FakeUpstream::start().await;
    let (_a, _a_addr) = owner_with(&db, &up, &[]);
    up.wait_connections(1).await;
    ingest(&up, 100..=130, 3).await;
    let (_b, b_addr) = serving_standby(&db, &up, &[]).await;
    let mut c = WsClient::connect(&sub_url(&b_addr, "bb", 100, "&wsBatched=true")).await;
    // The status frame alone: a plain `msg` frame.
    assert_eq!(
        frame(&mut c).await,
        json!({"msg": ["status", {"tag": "status"}], "id": 1})
    );
    c.ack(1).await;
    // Catch-up: whole transactions in order, in frames of either shape, batched ones among
    // them; each frame acked (cumulatively).
    let (id, batches) = read_acking(&mut c, 101, 130).await;
    assert!(
        batches > 0,
        "catch-up of 155 payloads came in no batched frame"
    );
    status_until(
        &b_addr,
        "the batched subscriber acked 130, live",
        LIMIT,
        |st| {
            subscriber(st, "bb")
                .is_some_and(|s| s["acked"] == json!(wm(130)) && s["phase"] == "live")
        },
    )
    .await;
    // One transaction the owner commits: it reaches the standby whole and ready at once, so in
    // one batched frame, the payloads in order, as the owner's own subscriber gets it.
    up.send(txn(131, 3));
    let f = frame(&mut c).await;
    assert_eq!(f["id"], id + 1, "{f}");
    let batch = f["batch"].as_array().unwrap_or_else(|| panic!("{f}"));
    let sent = txn(131, 3);
    assert_eq!(batch.len(), sent.len(), "{f}");
    for (got, want) in batch.iter().zip(&sent) {
        assert_eq!(got, &serde_json::from_str::<Value>(want).unwrap());
    }
    c.ack(id + 1).await;
    status_until(&b_addr, "the batched subscriber acked 131", LIMIT, |st| {
        subscriber(st, "bb").is_some_and(|s| s["acked"] == json!(wm(131)))
    })
    .await;
    // An ack beyond the last id sent breaks the rule there too.
    c.ack(id + 5).await;
    let (code, reason) = c.closed().await;
    assert_eq!(code, 1002, "{reason}");
}

#[actix_rt::test]
async fn a_standbys_status_lists_its_own_subscribers_as_the_owner_does() {
    let db = TestDb::create("serve_status").await;
    let up = FakeUpstream::start().await;
    let (_a, a_addr) = owner_with(&db, &up, &[]);
    up.wait_connections(1).await;
    ingest(&up, 100..=103, 2).await;
    let (_b, b_addr) = serving_standby(&db, &up, &[]).await;
    let b_id = instance_id(&b_addr).await;
    let mut ra = subscribe(&a_addr, "ra", 100).await;
    let mut rb = subscribe(&b_addr, "rb", 100).await;
    assert_eq!(read_txns(&mut ra, 103).await, upto(101, 103));
    assert_eq!(read_txns(&mut rb, 103).await, upto(101, 103));
    let backup = WsClient::connect(&sub_url(&b_addr, "rb-backup", 102, "&mode=backup")).await;

    let owner = status_until(&a_addr, "the owner's subscriber acked 103", LIMIT, |st| {
        subscriber(st, "ra").is_some_and(|s| s["acked"] == json!(wm(103)))
    })
    .await;
    // (Its catch-up done, it turns live a moment after the last catch-up ack, maybe.)
    let standby = status_until(&b_addr, "the standby's subscribers listed", LIMIT, |st| {
        subscriber(st, "rb").is_some_and(|s| s["acked"] == json!(wm(103)) && s["phase"] == "live")
            && subscriber(st, "rb-backup").is_some()
    })
    .await;
    // Each lists its own subscribers only.
    assert_eq!(owner["subscribers"].as_array().unwrap().len(), 1, "{owner}");
    assert_eq!(
        standby["subscribers"].as_array().unwrap().len(),
        2,
        "{standby}"
    );
    let (a_entry, b_entry) = (
        subscriber(&owner, "ra").unwrap(),
        subscriber(&standby, "rb").unwrap(),
    );
    // The same fields as the owner's entries.
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(b_entry), keys(a_entry), "{b_entry} vs {a_entry}");
    assert_eq!(b_entry["mode"], "serving", "{b_entry}");
    assert_eq!(b_entry["watermark"], json!(wm(103)), "{b_entry}");
    assert_eq!(
        subscriber(&standby, "rb-backup").unwrap()["mode"],
        "backup",
        "{standby}"
    );
    // The owner's record of the standby counts them.
    status_until(
        &a_addr,
        "the standby's record counts its subscribers",
        LIMIT,
        |st| instance(st, &b_id).is_some_and(|i| i["subscribers"] == 2),
    )
    .await;
    rb.close().await;
    backup.close().await;
    status_until(&b_addr, "the standby's subscribers gone", LIMIT, |st| {
        st["subscribers"] == json!([])
    })
    .await;
    status_until(&a_addr, "the standby's record counts none", LIMIT, |st| {
        instance(st, &b_id).is_some_and(|i| i["subscribers"] == 0)
    })
    .await;
}

#[actix_rt::test]
async fn standby_serves_false_closes_with_1011() {
    let db = TestDb::create("serve_false").await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let flags = lite.service_flags(60_000);
    let (_a, _a_addr) = owner_with(&db, &up, &strs(&flags));
    up.wait_connections(1).await;
    ingest(&up, 100..=101, 1).await;
    let mut off = strs(&flags);
    off.push("--standby-serves=false");
    let (_b, b_addr) = standby_with(&db, &up, &off);
    for path in [
        "snapshot?taskID=t1".to_string(),
        format!(
            "changes?id=r0&replicaVersion={}&watermark={}",
            wm(100),
            wm(100)
        ),
    ] {
        let mut c = WsClient::connect(&format!("ws://{b_addr}/replication/v6/{path}")).await;
        assert_eq!(
            c.closed().await,
            (1011, "standby: not the owner".to_string()),
            "{path}"
        );
    }
    assert_eq!(
        get(&b_addr, "/readyz").await,
        (503, "standby\n".to_string())
    );
    // Said explicitly, the default: it serves.
    let mut on = strs(&flags);
    on.push("--standby-serves=true");
    let (_c, c_addr) = serving_standby(&db, &up, &on).await;
    let mut s = subscribe(&c_addr, "r1", 100).await;
    assert_eq!(read_txns(&mut s, 101).await, vec![101]);
}

#[actix_rt::test]
async fn the_owner_never_waits_for_a_standbys_subscriber() {
    let db = TestDb::create("serve_no_wait").await;
    let up = FakeUpstream::start().await;
    // A negative padding: each tracked send waits for every subscriber the owner counts.
    let (_a, a_addr) = owner_with(
        &db,
        &up,
        &["--flow-control-consensus-padding-seconds", "-1"],
    );
    up.wait_connections(1).await;
    ingest(&up, 100..=100, 1).await;
    let (_b, b_addr) = serving_standby(&db, &up, &[]).await;
    let mut ra = subscribe(&a_addr, "ra", 100).await;
    // The standby's subscriber reads nothing after its status.
    let mut stalled = subscribe(&b_addr, "stalled", 100).await;
    status_until(&b_addr, "the stalled subscriber live", LIMIT, |st| {
        subscriber(st, "stalled").is_some_and(|s| s["phase"] == "live")
    })
    .await;
    let reader = actix_rt::spawn(async move { read_txns(&mut ra, 140).await });
    // 40 transactions of 100 rows, ~400 KiB: several tracked sends.
    ingest(&up, 101..=140, 100).await;
    assert_eq!(reader.await.unwrap(), upto(101, 140));
    // The stalled one, reading at last, gets everything too.
    assert_eq!(read_txns(&mut stalled, 140).await, upto(101, 140));
}

#[actix_rt::test]
async fn subscribers_spread_over_the_owner_and_a_standby_get_every_transaction_once_in_order() {
    let db = TestDb::create("serve_spread").await;
    let up = FakeUpstream::start().await;
    let (_a, a_addr) = owner_with(&db, &up, &[]);
    up.wait_connections(1).await;
    ingest(&up, 100..=120, 2).await;
    let (_b, b_addr) = serving_standby(&db, &up, &[]).await;
    const LAST: u64 = 400;
    let mut readers = Vec::new();
    let mut join = |addr: &str, id: String, from: u64| {
        let addr = addr.to_string();
        readers.push(actix_rt::spawn(async move {
            let mut c = subscribe(&addr, &id, from).await;
            let got = read_txns(&mut c, LAST).await;
            (id, from, got)
        }));
    };
    join(&a_addr, "a-0".into(), 100);
    join(&b_addr, "b-0".into(), 100);
    // Ingest in chunks; after sending each chunk, and while it is being stored, one more
    // subscriber joins (alternately at the owner and the standby) at the last durable commit.
    let mut next = 121;
    let mut k = 1;
    while next <= LAST {
        let end = (next + 19).min(LAST);
        for n in next..=end {
            up.send(txn(n, 2));
        }
        let from = *acked(&up).last().unwrap();
        let (addr, side) = if k % 2 == 0 {
            (&a_addr, "a")
        } else {
            (&b_addr, "b")
        };
        join(addr, format!("{side}-{k}"), from);
        wait_until(&format!("commit {end} acked upstream"), LIMIT, || {
            acked(&up).last() == Some(&end)
        })
        .await;
        next = end + 1;
        k += 1;
    }
    for r in readers {
        let (id, from, got) = r.await.expect("reader");
        assert_eq!(got, upto(from + 1, LAST), "subscriber {id} from {from}");
    }
}

#[actix_rt::test]
async fn a_standbys_subscriber_holds_back_the_owners_purge() {
    let t = purge_setup("serve_purge_held").await;
    report_backup_of(&t.lite, 104);
    // No subscriber anywhere yet.
    status_until(&t.a_addr, "blocked by no subscriber", LIMIT, |st| {
        st["purge"]["blockedBy"] == "no-subscriber"
    })
    .await;
    // A subscriber at the standby, acked up to 101: it counts as connected, and holds 104 back.
    let mut rb = subscribe(&t.b_addr, "rb", 100).await;
    assert_eq!(read_txns(&mut rb, 101).await, vec![101]);
    let st = status_until(
        &t.a_addr,
        "blocked by the standby's subscriber",
        LIMIT,
        |st| st["purge"]["blockedBy"] == "subscriber",
    )
    .await;
    assert_eq!(st["purge"]["scheduled"], json!([wm(104)]), "{st}");
    assert_eq!(
        metric(
            &t.a_addr,
            "change_streamer_purge_blocked{reason=\"subscriber\"}"
        )
        .await,
        "1"
    );
    status_until(
        &t.b_addr,
        "the standby shows its subscriber's ack",
        LIMIT,
        |st| subscriber(st, "rb").is_some_and(|s| s["acked"] == json!(wm(101))),
    )
    .await;
    purge_held_while_refreshed(&t.a_addr, &t.b_id, 3).await;
    // Acked past: the purge proceeds.
    assert_eq!(read_txns(&mut rb, 104).await, upto(102, 104));
    let st = status_until(&t.a_addr, "purged to 104", LIMIT, |st| {
        st["purge"]["scheduled"] == json!([])
    })
    .await;
    assert_eq!(st["changeLog"]["minWatermark"], json!(wm(104)), "{st}");
    assert_eq!(st["purge"]["rowsPurged"], 16, "{st}");
    assert_eq!(st["purge"]["blockedBy"], Value::Null, "{st}");
    assert_eq!(
        metric(
            &t.a_addr,
            "change_streamer_purge_blocked{reason=\"subscriber\"}"
        )
        .await,
        "0"
    );
    // The standby serves from what is left, and refuses what is gone.
    let mut c = WsClient::connect(&sub_url(&t.b_addr, "old", 101, "")).await;
    let (id, msg) = c.msg().await;
    assert_eq!(
        msg,
        json!(["error", {"type": 2, "message": format!("earliest supported watermark is {} (requested {})", wm(104), wm(101))}])
    );
    c.ack(id).await;
    assert_eq!(c.closed().await.0, 1000);
    let mut c = subscribe(&t.b_addr, "new", 104).await;
    ingest(&t.up, 105..=105, 1).await;
    assert_eq!(read_txns(&mut c, 105).await, vec![105]);
}

/// A message in short: its tag and watermark.
fn tag_of(msg: &Value) -> String {
    let w = msg[2]["commitWatermark"]
        .as_str()
        .or(msg[2]["watermark"].as_str())
        .and_then(|w| {
            change_streamer_actors::watermark::Watermark::parse(w)
                .ok()?
                .to_u64()
        });
    format!(
        "{} {}",
        msg[0].as_str().unwrap_or("?"),
        w.map(|w| w.to_string()).unwrap_or_default()
    )
}

fn freeze(b: &Instance) {
    signal(b, "-STOP");
}

fn resume(b: &Instance) {
    signal(b, "-CONT");
}

fn signal(b: &Instance, signal: &str) {
    let sent = Command::new("kill")
        .args([signal, &b.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success(), "kill {signal}");
}

/// Reads (and acks) `c` until the commit of `last` or a close, which must be 1011: the commit
/// watermarks, and the close if one came.
async fn commits_or_close(c: &mut WsClient, last: u64) -> (Vec<u64>, Option<(u16, String)>) {
    let mut commits = Vec::new();
    loop {
        match c.next(LIMIT).await {
            Some(Seen::Msg { id, msg }) => {
                eprintln!("  {id} {}", tag_of(&msg));
                c.ack(id).await;
                if msg[0] == "commit" {
                    commits.push(commit_of(&msg).unwrap());
                    if commits.last() == Some(&last) {
                        return (commits, None);
                    }
                }
            }
            Some(Seen::Closed { code, reason }) => {
                assert_eq!(code, 1011, "{reason}");
                return (commits, Some((code, reason)));
            }
            None => panic!("neither commit {last} nor a close within {LIMIT:?}"),
        }
    }
}

/// A new subscription at `addr` from `from` gets `last` (stored): tried again after a 1011
/// (a standby that found its record lapsed closes every subscriber it has, maybe a new one).
async fn serves_again(addr: &str, from: u64, last: u64) {
    for attempt in 0..3 {
        let mut c = WsClient::connect(&sub_url(addr, &format!("again-{attempt}"), from, "")).await;
        let (commits, closed) = commits_or_close(&mut c, last).await;
        if closed.is_none() {
            assert_eq!(commits, upto(from + 1, last));
            return;
        }
        eprintln!("a new subscriber closed: {closed:?}");
    }
    panic!("closed three times");
}

/// The purge to 104 done, as the purger shows it (the change log's stats and the purger's
/// state are read side by side: the rows may show gone a moment before the purger's counts).
fn purged_to_104(st: &Value) -> bool {
    st["purge"]["scheduled"] == json!([]) && st["changeLog"]["minWatermark"] == json!(wm(104))
}

/// The owner's own subscriber, acked through 104, so that only the standby's can hold the
/// purge to 104 back; and the standby's, acked up to 101, holding it back.
async fn held_by_the_standby(t: &PurgeSetup) -> (WsClient, WsClient) {
    let mut ra = subscribe(&t.a_addr, "ra", 100).await;
    assert_eq!(read_txns(&mut ra, 104).await, upto(101, 104));
    let mut rb = subscribe(&t.b_addr, "rb", 100).await;
    assert_eq!(read_txns(&mut rb, 101).await, vec![101]);
    report_backup_of(&t.lite, 104);
    status_until(
        &t.a_addr,
        "blocked by the standby's subscriber",
        LIMIT,
        |st| {
            st["purge"]["blockedBy"] == "subscriber" && st["purge"]["scheduled"] == json!([wm(104)])
        },
    )
    .await;
    status_until(
        &t.a_addr,
        "the standby's record counts its subscriber",
        LIMIT,
        |st| instance(st, &t.b_id).is_some_and(|i| i["subscribers"] == 1),
    )
    .await;
    (ra, rb)
}

#[actix_rt::test]
async fn a_killed_standby_holds_back_the_purge_until_it_is_gone() {
    let mut t = purge_setup("serve_purge_killed").await;
    let _subs = held_by_the_standby(&t).await;
    // While it runs, it holds the purge back.
    purge_held_while_refreshed(&t.a_addr, &t.b_id, 3).await;
    t.b.child.kill().unwrap(); // SIGKILL: no goodbye, its record stays
    let killed = Instant::now();
    t.b.child.wait().unwrap();
    // Once gone (its session ended: at once; at the latest its record 10 s old), no more.
    let st = status_until(
        &t.a_addr,
        "purged once the killed standby is gone",
        GONE_AFTER + LIMIT,
        purged_to_104,
    )
    .await;
    eprintln!("purged {:?} after the kill", killed.elapsed());
    assert_eq!(st["purge"]["rowsPurged"], 16, "{st}");
    assert!(
        instance(&st, &t.b_id).is_none(),
        "the killed standby still listed: {st}"
    );
}

#[actix_rt::test]
async fn a_frozen_standby_holds_back_the_purge_until_its_record_is_10_s_old() {
    let t = purge_setup("serve_purge_frozen").await;
    let (_ra, mut rb) = held_by_the_standby(&t).await;
    // The age of the standby's record, then SIGSTOP: its PostgreSQL session stays, its record
    // ages. It cannot be gone before the record it last wrote is 10 s old.
    let sampled = Instant::now();
    let (_, body) = get(&t.a_addr, "/status").await;
    let st: Value = serde_json::from_str(&body).unwrap();
    let age = instance(&st, &t.b_id)
        .and_then(|i| i["lastSeenMs"].as_u64())
        .unwrap_or_else(|| panic!("the standby not listed: {st}"));
    freeze(&t.b);
    let frozen = Instant::now();
    // Margin for the clocks' resolution (the change DB's clock and ours, one machine).
    let earliest = sampled + GONE_AFTER - Duration::from_millis(age) - Duration::from_millis(300);
    while Instant::now() < earliest {
        let (_, body) = get(&t.a_addr, "/status").await;
        let st: Value = serde_json::from_str(&body).unwrap();
        let at = Instant::now();
        if at >= earliest {
            break; // answered after the standby may have become gone
        }
        assert_eq!(
            st["changeLog"]["minWatermark"],
            json!(wm(100)),
            "purged {:?} after the standby froze, its record {age} ms old then: {st}",
            frozen.elapsed()
        );
        assert_eq!(st["purge"]["blockedBy"], "subscriber", "{st}");
        actix_rt::time::sleep(POLL).await;
    }
    // Then gone: the purge proceeds.
    let st = status_until(
        &t.a_addr,
        "purged once the frozen standby's record is 10 s old",
        LIMIT,
        purged_to_104,
    )
    .await;
    eprintln!(
        "purged {:?} after the standby froze (its record {age} ms old then)",
        frozen.elapsed()
    );
    assert_eq!(st["purge"]["rowsPurged"], 16, "{st}");

    // Resumed, its subscriber (acked at 101 while the owner purged past) goes on with no gap,
    // or is closed (1011) to reconnect elsewhere; and the standby serves again.
    resume(&t.b);
    t.up.send(txn(105, 1));
    let (commits, closed) = commits_or_close(&mut rb, 105).await;
    eprintln!("the resumed standby's subscriber: commits {commits:?}, then {closed:?}");
    assert_eq!(commits, upto(102, 101 + commits.len() as u64), "a gap");
    serves_again(&t.b_addr, 104, 105).await;
}

#[actix_rt::test]
async fn a_standby_whose_record_lapsed_leaves_its_catching_up_subscriber_no_gap() {
    let db = TestDb::create("serve_lapsed").await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let flags = lite.service_flags(0);
    let (_a, a_addr) = owner_with(&db, &up, &strs(&flags));
    up.wait_connections(1).await;
    ingest(&up, 100..=140, 2).await;
    // The standby reads a catch-up only as far as its subscriber has room: 8 changes.
    let mut small = strs(&flags);
    small.extend(["--max-subscriber-queue-changes", "8"]);
    let (b, b_addr) = serving_standby(&db, &up, &small).await;
    let mut ra = subscribe(&a_addr, "ra", 100).await;
    assert_eq!(read_txns(&mut ra, 140).await, upto(101, 140));
    // Acked at 101, the rest of its catch-up not yet read from the change DB.
    let mut rb = subscribe(&b_addr, "rb", 100).await;
    assert_eq!(read_txns(&mut rb, 101).await, vec![101]);
    report_backup_of(&lite, 140);
    status_until(
        &a_addr,
        "blocked by the standby's subscriber",
        LIMIT,
        |st| st["purge"]["blockedBy"] == "subscriber",
    )
    .await;
    // Frozen past 10 s: gone for the owner, which purges below 140.
    freeze(&b);
    status_until(&a_addr, "purged below 140", GONE_AFTER + LIMIT, |st| {
        st["purge"]["scheduled"] == json!([]) && st["changeLog"]["minWatermark"] == json!(wm(140))
    })
    .await;
    // Its subscriber acks what it got while the standby is still frozen: the acks wait in the
    // standby's socket, to meet its first turn after it resumes (the more catch-up to read).
    let mut commits = Vec::new();
    while let Some(Seen::Msg { id, msg }) = rb.next(Duration::from_millis(200)).await {
        eprintln!("while frozen: {id} {}", tag_of(&msg));
        rb.ack(id).await;
        if msg[0] == "commit" {
            commits.push(commit_of(&msg).unwrap());
        }
    }
    resume(&b);
    let (more, closed) = commits_or_close(&mut rb, 140).await;
    commits.extend(more);
    eprintln!("the lapsed standby's subscriber: commits {commits:?}, then {closed:?}");
    assert_eq!(
        commits,
        upto(102, 101 + commits.len() as u64),
        "a gap after the owner purged past the lapsed standby's subscriber"
    );
    serves_again(&b_addr, 140, 140).await;
}

#[actix_rt::test]
async fn a_late_joiner_at_a_standby_is_refused_or_holds_the_purge() {
    const ROUNDS: u64 = 6;
    const PER_ROUND: u64 = 5;
    const JOINERS: u64 = 3;
    const FINAL: u64 = 104 + ROUNDS * PER_ROUND;
    // The purge is retried every 2 ms: it runs within a few ms of the moment no joiner holds
    // the floor back, while the next joiners come.
    let t = purge_setup_with("serve_purge_late", "2").await;
    // The owner's subscriber reads and acks everything as it comes, so that only the joiners
    // can hold a purge back.
    let mut ra = subscribe(&t.a_addr, "ra", 100).await;
    let owners = actix_rt::spawn(async move { read_txns(&mut ra, FINAL).await });
    let (mut floor, mut last) = (100, 104);
    let mut closest_of_all = Duration::MAX;
    for round in 0..ROUNDS {
        // Joiners at the floor (the oldest stored commit), in loops, while the owner is about
        // to purge everything below `last`; each loop ends once it was refused.
        let tallies: Vec<_> = (0..JOINERS).map(|_| Rc::new(Tally::default())).collect();
        let joiners: Vec<_> = tallies
            .iter()
            .enumerate()
            .map(|(k, tally)| {
                let seed = round * JOINERS + k as u64;
                let (addr, tally) = (t.b_addr.clone(), tally.clone());
                actix_rt::spawn(join_until_refused(addr, floor, last, seed, tally))
            })
            .collect();
        wait_until("a joiner accepted", LIMIT, || {
            tallies.iter().any(|t| t.accepted.get() > 0)
        })
        .await;
        // Subscriptions at `last` (which the purge keeps) come and go meanwhile: each makes
        // the standby record its subscribers at once, so its record follows the joiners
        // within milliseconds (not only every refresh period).
        let stop = Rc::new(Cell::new(false));
        let refresher = actix_rt::spawn(refresh_in_a_loop(t.b_addr.clone(), last, stop.clone()));
        // The purge comes due; it runs the moment no joiner holds the floor back, and every
        // joiner after it is refused.
        report_backup_of(&t.lite, last);
        for j in joiners {
            j.await.expect("a joiner failed");
        }
        stop.set(true);
        refresher
            .await
            .expect("a subscription at the new floor failed");
        let st = status_until(&t.a_addr, "the purge shown", LIMIT, |st| {
            st["changeLog"]["minWatermark"] == json!(wm(last))
        })
        .await;
        let accepted: u32 = tallies.iter().map(|t| t.accepted.get()).sum();
        // How close the race was: from the moment the last accepted joiner had closed to the
        // start of the first refused one (the purge committed in between).
        let last_accepted = tallies.iter().filter_map(|t| t.last_accepted.get()).max();
        let first_refused = tallies.iter().filter_map(|t| t.refused.get()).min();
        let closest = last_accepted
            .zip(first_refused)
            .map(|(a, r)| r.saturating_duration_since(a));
        closest_of_all = closest_of_all.min(closest.unwrap_or(Duration::MAX));
        eprintln!(
            "round {round}: {accepted} joiners at {floor} accepted before the purge, then {JOINERS} refused; the purge fell within {closest:?} between joiners ({} purges)",
            st["purge"]["purges"]
        );
        // The next round: new transactions above the new floor.
        floor = last;
        ingest(&t.up, last + 1..=last + PER_ROUND, 2).await;
        last += PER_ROUND;
    }
    eprintln!("closest race: a purge within {closest_of_all:?} between two joiners");
    assert_eq!(owners.await.unwrap(), upto(101, FINAL));
}

/// Subscribes at `addr` from `at` and closes, again and again (pausing up to 5 ms) until `stop`:
/// each is accepted.
async fn refresh_in_a_loop(addr: String, at: u64, stop: Rc<Cell<bool>>) {
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
    for n in 0.. {
        if stop.get() {
            return;
        }
        subscribe(&addr, &format!("refresher-{n}"), at)
            .await
            .close()
            .await;
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        // Pacing, not waiting for anything.
        actix_rt::time::sleep(Duration::from_millis((rng >> 33) % 6)).await;
    }
}

/// What one loop of joiners saw: how many were accepted, when the last accepted one had
/// closed, and when the refused one started to connect.
#[derive(Default)]
struct Tally {
    accepted: Cell<u32>,
    last_accepted: Cell<Option<Instant>>,
    refused: Cell<Option<Instant>>,
}

/// Joins the standby at `addr` from `floor`, again and again, pausing a random part of 20 ms
/// (so that moments come when no joiner holds the floor back, and the purge runs while the
/// next joiners come; the pause grows by a quarter every 10 joiners, should those moments be
/// too rare), until refused.
/// Each joiner is either refused with error type 2 (`earliest supported watermark is last`:
/// the purge left only `last`), or accepted and then receives every transaction after `floor`
/// up to `last`, none missing.
async fn join_until_refused(addr: String, floor: u64, last: u64, seed: u64, tally: Rc<Tally>) {
    let mut pause_ms: f64 = 20.0;
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    for n in 0.. {
        assert!(
            Instant::now() < deadline,
            "joiners at {floor}, pausing up to 2 s, never refused within 60 s: no purge"
        );
        let id = format!("late-{seed}-{n}");
        let started = Instant::now();
        let mut c = WsClient::connect(&sub_url(&addr, &id, floor, "")).await;
        let (first, msg) = c.msg().await;
        c.ack(first).await;
        match msg[0].as_str() {
            Some("status") => {
                let got = read_txns(&mut c, last).await;
                assert_eq!(
                    got,
                    upto(floor + 1, last),
                    "joiner {id} at {floor} accepted, then short of rows"
                );
                tally.accepted.set(tally.accepted.get() + 1);
                c.close().await;
                tally.last_accepted.set(Some(Instant::now()));
            }
            Some("error") => {
                assert_eq!(
                    msg,
                    json!(["error", {"type": 2, "message": format!("earliest supported watermark is {} (requested {})", wm(last), wm(floor))}]),
                    "joiner {id}"
                );
                assert_eq!(c.closed().await.0, 1000, "joiner {id}");
                tally.refused.set(Some(started));
                return;
            }
            _ => panic!("joiner {id}: {msg}"),
        }
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let jitter = (rng >> 33) % (pause_ms as u64 + 1);
        // Pacing the joiners, not waiting for anything.
        actix_rt::time::sleep(Duration::from_millis(jitter)).await;
        if n % 10 == 9 {
            pause_ms = (pause_ms * 1.25).min(2000.0);
        }
    }
}
