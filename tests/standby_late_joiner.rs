//! End to end: a late joiner at a standby racing the owner's purge (PROTOCOL.md §14.1 "Purge
//! across instances"), against real service processes on one real change DB: a standby records
//! a joining subscriber before it sends its `status`, so a joiner at the floor while the owner is
//! about to purge past it is either refused with error type 2 or holds the purge back, never
//! accepted and then short of rows.

#[allow(dead_code)] // shared with tests/takeover.rs and tests/instances.rs
mod takeover_support;

#[allow(dead_code)] // shared with tests/standby_serving.rs and tests/standby_purge.rs
mod standby_support;

mod changes_support; // only its `read_txns` here

#[allow(dead_code)] // shared with tests/standby_purge.rs
mod purge_support;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::wait::wait_until;
use changes_support::read_txns;
use purge_support::*;
use serde_json::json;
use standby_support::*;
use takeover_support::*;

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
