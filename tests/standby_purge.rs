//! End to end: the purge across instances (PROTOCOL.md §14.1 "Purge across instances"), against
//! real service processes on one real change DB, with a fake change source and a fake
//! litestream: a standby's subscriber holds the owner's purge back (`purge.blockedBy`
//! `"subscriber"`) until it acks past, and counts as connected; a standby killed with `kill -9`
//! holds it back while it runs and stops once its session ended; a frozen standby (SIGSTOP:
//! session alive, record ageing) holds it back until its record is 10 s old, never before;
//! resumed after the owner purged past its subscribers (its record lapsed), a standby gives them
//! no gap and no broken transaction (it may close them 1011); a late joiner at a standby racing
//! a purge past its watermark is either refused with error type 2 or holds the purge back, never
//! accepted and then short of rows.

#[allow(dead_code)] // shared with tests/takeover.rs and tests/instances.rs
mod takeover_support;

#[allow(dead_code)] // shared with tests/standby_serving.rs
mod standby_support;

mod changes_support; // only its `read_txns` here

use std::cell::Cell;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use change_streamer_actors::instance::GONE_AFTER;
use change_streamer_test_support::client::{commit_of, Seen, WsClient};
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::{wait_until, POLL};
use changes_support::read_txns;
use serde_json::{json, Value};
use standby_support::*;
use takeover_support::*;

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
