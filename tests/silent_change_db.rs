//! End to end: a silent change DB (PROTOCOL.md §14.2). The owner reaches PostgreSQL through a
//! proxy the test freezes (its connections stay open, no byte crosses: a partition, a hung
//! peer), the serving standby reaches it directly, the change source writes throughout, and a
//! replica follows each instance (the owner's goes, after a close, to whichever instance says
//! ready, as behind a load balancer that follows `/readyz`).
//!
//! Checks the rule: the owner notices within its lease-derived bound (the change DB lease L is
//! 10 × `--takeover-interval-ms`, at least 5 s: here 5 s; the owner steps down by 7L/10) and
//! says why (one ERROR line `change DB silent: …`, `/readyz` 503 `change DB unreachable`);
//! the server ends its silent writer's session after L and the standby takes over; nothing
//! exits; each replica sees every commit once, in order, closed (if at all) with a documented
//! 1011; every commit acked upstream is stored; and once thawed the old owner is a ready
//! standby.

#[allow(dead_code)] // shared with tests/takeover.rs and others
mod takeover_support;

#[allow(dead_code)] // shared with tests/standby_serving.rs and others
mod standby_support;

#[allow(dead_code)] // shared with tests/change_db_outage.rs
mod outage_support;

use std::time::{Duration, Instant};

use change_streamer_test_support::freeze::FreezeProxy;
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::upstream::FakeUpstream;
use change_streamer_test_support::wait::POLL;
use outage_support::*;
use standby_support::*;
use takeover_support::*;

/// The change DB lease at `--takeover-interval-ms` [`INTERVAL_MS`] (200): its 5 s floor.
const LEASE: Duration = Duration::from_secs(5);

/// How the reason of a 1011 close may begin while the change DB is out of reach (§14.2).
const DOCUMENTED: [&str; 3] = ["standby:", "catch-up failed:", "change log unavailable:"];

#[actix_rt::test]
async fn a_silent_change_db_deposes_the_owner_within_its_lease_and_the_standby_takes_over_losing_nothing(
) {
    let _ = env_logger::builder().is_test(true).try_init();
    let db = TestDb::create("silent").await;
    let proxy = FreezeProxy::start_on_own_thread(db.server_addr());
    let up = FakeUpstream::start().await;
    let a = Instance::start_on(&db.url_via(proxy.addr), &up.url(), INTERVAL_MS, &[]);
    let (a_addr, _) = a
        .listening_within(START)
        .expect("the instance behind the proxy owns the change DB and listens");
    up.wait_connections(1).await;
    let source = Source::start(&up);
    wait_for("the initial sync acked", || !acked(&up).is_empty(), &[]).await;
    let (mut b, b_addr) = serving_standby(&db, &up, &[]).await;
    let replicas = [
        Replica::follow_any(&[&a_addr, &b_addr], "ra"),
        Replica::follow(&b_addr, "rb"),
    ];
    wait_for(
        "both replicas live",
        || replicas.iter().all(|r| r.last() > 120),
        &replicas,
    )
    .await;

    while a.log.try_recv().is_ok() {}
    let before = max_acked(&up);
    proxy.freeze();
    let frozen = Instant::now();
    eprintln!("froze the owner's change DB at commit {before}");

    // The owner notices, says why, and steps down, within its bound.
    let said = line_within(&a, "change DB silent: no answer from the change DB within").await;
    let noticed = frozen.elapsed();
    eprintln!("the owner noticed after {noticed:?}: {said}");
    assert!(
        noticed <= LEASE * 2,
        "the owner noticed {noticed:?} after the freeze, past 2L"
    );
    line_within(&a, "deposed: stopped writing to change DB").await;
    readyz_until(&a_addr, (503, "change DB unreachable\n")).await;
    assert_eq!(get(&a_addr, "/healthz").await.0, 200, "the old owner lives");
    assert_eq!(role(&a_addr).await, "standby");

    // The server ends the silent writer's session after L: the standby takes over.
    let (_, owned_at) = recv_within(&b.listening, PATIENCE)
        .await
        .expect("the standby owns the change DB");
    let took_over = owned_at.duration_since(frozen);
    eprintln!("the standby owned after {took_over:?}");
    assert!(
        took_over <= LEASE * 3,
        "the standby took over {took_over:?} after the freeze, past 3L"
    );
    assert!(proxy.is_frozen(), "nothing was closed: the silence did it");
    assert_eq!(role(&b_addr).await, "owner");
    // The old owner forwarded to its replica what it could not store; the source sends it
    // again to the new owner, which stores it: ingest goes on past all of it.
    let forwarded = replicas.iter().map(Replica::last).max().unwrap_or(before);
    wait_for(
        "ingest resumed past what the old owner forwarded",
        || max_acked(&up) > forwarded.max(before) + 20,
        &replicas,
    )
    .await;

    // Thawed, the old owner is a ready standby; one owner throughout.
    proxy.thaw();
    readyz_until(&a_addr, (200, "ready\n")).await;
    assert_eq!(role(&a_addr).await, "standby");
    assert_eq!(role(&b_addr).await, "owner");

    let last = source.stop().await;
    eprintln!("the change source's last commit: {last}");
    all_acked_and_applied(&up, last, &replicas).await;
    assert!(
        b.child.try_wait().unwrap().is_none(),
        "the new owner exited"
    );

    end_all_gapless(replicas, &DOCUMENTED);
    // Every commit acked upstream (up to `last`, the last one sent) is stored, once: a fresh
    // subscription at the new owner reads them all back.
    let mut fresh = subscribe(&b_addr, "fresh", 100).await;
    let stored = commits_until(&mut fresh, last).await;
    if let Err(e) = gapless(&stored) {
        panic!("stored: {e}");
    }
    drop(a);
}

/// What `rx` says within `limit`, waiting without blocking the test's thread (its replicas
/// and change source go on meanwhile).
async fn recv_within<T>(rx: &std::sync::mpsc::Receiver<T>, limit: Duration) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(t) = rx.try_recv() {
            return Some(t);
        }
        if Instant::now() >= deadline {
            return None;
        }
        actix_rt::time::sleep(POLL).await;
    }
}

/// The first line of `i`'s log that contains `text`, within [`PATIENCE`].
async fn line_within(i: &Instance, text: &str) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        while let Ok(line) = i.log.try_recv() {
            if line.contains(text) {
                return line;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no line with {text:?} within {PATIENCE:?}"
        );
        actix_rt::time::sleep(POLL).await;
    }
}
