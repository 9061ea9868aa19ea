//! End to end: the purge across instances (PROTOCOL.md §14.1 "Purge across instances"), against
//! real service processes on one real change DB, with a fake change source and a fake
//! litestream: a standby's subscriber holds the owner's purge back (`purge.blockedBy`
//! `"subscriber"`) until it acks past, and counts as connected; a standby killed with `kill -9`
//! holds it back while it runs and stops once its session ended; a frozen standby (SIGSTOP:
//! session alive, record ageing) holds it back until its record is 10 s old, never before;
//! resumed after the owner purged past its subscribers (its record lapsed), a standby gives them
//! no gap and no broken transaction (it may close them 1011). A late joiner racing the purge:
//! `tests/standby_late_joiner.rs`.

#[allow(dead_code)] // shared with tests/takeover.rs and tests/instances.rs
mod takeover_support;

#[allow(dead_code)] // shared with tests/standby_serving.rs and tests/standby_late_joiner.rs
mod standby_support;

mod changes_support; // only its `read_txns` here

mod purge_support;

use std::process::Command;
use std::time::{Duration, Instant};

use change_streamer_actors::instance::GONE_AFTER;
use change_streamer_test_support::client::{commit_of, Seen, WsClient};
use change_streamer_test_support::litestream::{Answer, FakeLitestream};
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::POLL;
use changes_support::read_txns;
use purge_support::*;
use serde_json::{json, Value};
use standby_support::*;
use takeover_support::*;

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
    // And it serves again: a new subscription at the newest stored commit gets the next one.
    ingest(&up, 141..=141, 2).await;
    serves_again(&b_addr, 140, 141).await;
}
