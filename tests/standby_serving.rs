//! End to end: standbys serve `/replication/v{N}/changes` from the shared PostgreSQL change DB
//! (PROTOCOL.md §14, §14.1), against real service processes on one real change DB, with a fake
//! change source:
//! - a standby serves catch-up from the change DB, then the owner's commits live, whole, with
//!   no gap and no duplicate, and is then ready (`/readyz`);
//! - it checks subscriptions and answers errors as the owner does (type 1, type 2, 1002, 1011
//!   before the change log is initialised, protocol v1, a watermark beyond the log), and frames
//!   as the owner does (`wsBatched=true`, cumulative acks);
//! - its `/status` lists its own subscribers, shaped as the owner's;
//! - with `--standby-serves=false` it closes `/changes` and `/snapshot` with 1011;
//! - the owner's flow control never waits for a standby's subscriber;
//! - subscribers spread over the owner and a standby each get every transaction after their
//!   watermark once, in order.
//!
//! The purge across instances: tests/standby_purge.rs and tests/standby_late_joiner.rs.

#[allow(dead_code)] // shared with tests/takeover.rs and tests/instances.rs
mod takeover_support;

#[allow(dead_code)] // shared with tests/standby_purge.rs and tests/standby_late_joiner.rs
mod standby_support;

mod changes_support; // only its `read_txns` here

use std::time::Instant;

use change_streamer_test_support::client::{commit_of, frame, payloads, Seen, WsClient};
use change_streamer_test_support::litestream::{Answer, FakeLitestream};
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::wait_until;
use changes_support::read_txns;
use serde_json::{json, Value};
use standby_support::*;
use takeover_support::*;

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
            json!(["error", {"type": 1, "message": format!("watermark {} is not a commit of this change log (it holds {rv} to {})", wm(101), wm(103))}]),
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
