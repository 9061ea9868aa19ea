//! A snapshot reservation whose change-log state cannot be read (PROTOCOL.md §6.3): the
//! reservation's session is failed with the read's own failure, which the `/snapshot` socket
//! sends as its 1011 close reason, while a change log that is merely not initialized keeps the
//! documented text. Every failure here is real: the production streamer answers the
//! reservation from a real change log, a PostgreSQL change DB whose connection is terminated
//! (`pg_terminate_backend`) and cannot be made again, or whose owner was deposed, and a fresh
//! SQLite change log with nothing stored.

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::{
    ChangeKind, ChangeLog, ChangeLogError, LogStats, PgOptions, Transaction,
};
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::ownership::OWNER_LOCK_KEY;
use change_streamer_actors::reservation::{ReservationActor, ReservationEvent};
use change_streamer_actors::session_end::{truncate_reason, SessionEnd};
use change_streamer_actors::streamer::{Streamer, StreamerConfig};
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::pg::TestDb;
use common::recording_purge::RecordingPurge;
use common::reservation_session::{self, Events};

const START: i64 = 1_745_452_800_000; // 2025-04-24T00:00:00Z
const NOT_INITIALIZED: &str = "change log is not initialized yet (no replicaVersion)";

/// The owner's reservation actor, its status answered by a streamer over `log`.
fn reservations(log: ChangeLog, stats: &LogStats) -> Addr<ReservationActor> {
    let clock = Clock::manual(START);
    let streamer = Streamer::new(StreamerConfig::default(), log, stats).start();
    let delay = Duration::from_secs(100);
    let purge = RecordingPurge::default().start();
    let cleanup = CleanupActor::new(clock.clone(), delay, delay, purge.recipient()).start();
    ReservationActor::new(clock, "s3://foo/bar".into(), streamer.recipient(), cleanup).start()
}

/// Reserves `task` and waits for the first thing its session is told.
async fn reserve(reservations: &Addr<ReservationActor>, task: &str, n: u64) -> ReservationEvent {
    let session = reservation_session::reserve(reservations, task, n).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(e) = session.send(Events).await.unwrap().into_iter().next() {
            return e;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reservation of {task} was told nothing within 10 s"
        );
        tokio::task::yield_now().await;
    }
}

/// The close frame a failed reservation's `/snapshot` socket sends (as
/// `src/websocket/snapshot_socket.rs` closes it); panics on anything but a failure.
fn close_frame(event: ReservationEvent) -> (u16, String) {
    match event {
        ReservationEvent::Failed(e) => SessionEnd::Unavailable(e.to_string()).close_frame(),
        other => panic!("expected the reservation to fail, got {other:?}"),
    }
}

fn txn(n: u64) -> Transaction {
    Transaction {
        watermark: Watermark::from_u64(n),
        pending: 0,
        changes: vec![
            (ChangeKind::Begin, r#"{"tag":"begin"}"#.into()),
            (ChangeKind::Data, r#"{"tag":"insert"}"#.into()),
            (ChangeKind::Commit, r#"{"tag":"commit"}"#.into()),
        ],
    }
}

fn pg_options(db: &TestDb) -> PgOptions {
    PgOptions::new(&db.url, Duration::from_millis(100))
}

/// Waits until no backend of this process whose `application_name` is `name` is left on the
/// server: a terminated one is gone.
async fn gone(admin: &tokio_postgres::Client, name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        if n == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "backend {name} still there after 10 s"
        );
        tokio::task::yield_now().await;
    }
}

#[actix_rt::test]
async fn a_reservation_whose_change_log_read_fails_is_closed_with_that_failures_own_message() {
    let db = TestDb::create("res_read_fails").await;
    // An owner stores one transaction; a standby's handle reads the change DB it owns.
    let owner = ChangeLog::open_postgres(pg_options(&db)).await.unwrap();
    owner.append(txn(1)).await.unwrap();
    let log = ChangeLog::open_standby(&db.url).unwrap();
    let stats = log.stats().await.unwrap();
    let reservations = reservations(log.clone(), &stats);
    match reserve(&reservations, "before", 1).await {
        ReservationEvent::Status(s) => {
            assert_eq!(s.replica_version, Watermark::from_u64(1).to_string())
        }
        other => panic!("expected a status while the change DB answers, got {other:?}"),
    }

    // The standby's connection is terminated, and no new one is let in.
    let (server, db_name) = db.url.rsplit_once('/').expect("a database URL");
    let admin = change_streamer_test_support::pg::connect(&format!("{server}/postgres")).await;
    let name = format!("change-streamer standby pid {}", std::process::id());
    admin
        .batch_execute(&format!("ALTER DATABASE {db_name} ALLOW_CONNECTIONS false"))
        .await
        .unwrap();
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap();
    gone(&admin, &name).await;
    // The first read after the loss meets the dead connection; every later one is refused a
    // new one, with the same error.
    assert!(
        log.stats().await.is_err(),
        "a read on a terminated connection"
    );
    let failure = log.stats().await.expect_err("a new connection is refused");
    assert!(
        matches!(failure, ChangeLogError::Postgres(_)),
        "{failure:?}"
    );
    let expected = failure.to_string();
    assert!(
        expected.contains("not currently accepting connections"),
        "{expected}"
    );

    let (code, reason) = close_frame(reserve(&reservations, "after", 2).await);
    assert_eq!((code, reason.as_str()), (1011, truncate_reason(&expected)));
    assert_ne!(reason, NOT_INITIALIZED);
    drop(admin); // the test database is dropped with whatever is still connected
}

#[actix_rt::test]
async fn a_reservation_at_a_deposed_owner_is_closed_with_the_refusal() {
    let db = TestDb::create("res_deposed").await;
    let log = ChangeLog::open_postgres(pg_options(&db)).await.unwrap();
    log.append(txn(1)).await.unwrap();
    let stats = log.stats().await.unwrap();
    let reservations = reservations(log.clone(), &stats);
    // The server ends the session holding the ownership lock: the owner finds itself deposed.
    let admin = db.connect().await;
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND objid::int8 = $1 AND objsubid = 1",
            &[&OWNER_LOCK_KEY],
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), log.deposed())
        .await
        .expect("the owner notices it was deposed within 10 s");

    let (code, reason) = close_frame(reserve(&reservations, "t", 1).await);
    assert_eq!(
        (code, reason.as_str()),
        (1011, ChangeLogError::NotOwner.to_string().as_str())
    );
}

#[actix_rt::test]
async fn a_reservation_on_an_uninitialized_change_log_is_closed_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    let stats = log.stats().await.unwrap();
    assert_eq!(stats.replica_version, None, "a fresh change log");
    let reservations = reservations(log, &stats);
    let frame = close_frame(reserve(&reservations, "t", 1).await);
    assert_eq!(frame, (1011, NOT_INITIALIZED.to_string()));
}
