//! Unit tests of the change log: storage, segments, purges, store times and the safety state.
//! Each runs against both engines: SQLite in a temporary directory, and PostgreSQL in a
//! database of its own (see `test-support/src/pg.rs`).

use std::time::Duration;

use change_streamer_test_support::pg::TestDb;

use super::*;

/// Where a test's change log lives.
enum Store {
    Sqlite(tempfile::TempDir),
    Postgres(TestDb),
}

impl Store {
    async fn open_with(&self, segment_rows: u64, clock: Clock) -> ChangeLog {
        match self {
            Store::Sqlite(dir) => ChangeLog::open_with(dir.path(), segment_rows, clock).unwrap(),
            Store::Postgres(db) => ChangeLog::open_postgres(PgOptions {
                url: db.url.clone(),
                takeover_interval: Duration::from_millis(50),
                segment_rows,
                clock,
            })
            .await
            .unwrap(),
        }
    }

    async fn open(&self) -> ChangeLog {
        self.open_with(SEGMENT_ROWS, Clock::System).await
    }
}

/// Runs each named test once on SQLite and once on PostgreSQL.
macro_rules! on_both_engines {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[actix_rt::test]
            async fn sqlite() {
                super::$name(super::Store::Sqlite(tempfile::tempdir().unwrap())).await
            }
            #[actix_rt::test]
            async fn postgres() {
                let db = super::TestDb::create(stringify!($name)).await;
                super::$name(super::Store::Postgres(db)).await
            }
        }
    )*};
}

on_both_engines!(
    stores_reads_and_survives_reopen,
    purge_keeps_the_newest_transaction,
    segments_roll_over_read_across_and_purge_whole,
    queued_appends_commit_in_order,
    retention_keeps_rows_stored_too_recently,
    store_times_never_go_back_with_the_clock,
    safety_state_survives_reopen,
    a_complete_purge_takes_its_watermark_off_the_schedule,
);

fn txn(n: u64, rows: usize) -> Transaction {
    let mut changes = vec![(ChangeKind::Begin, r#"{"tag":"begin"}"#.to_string())];
    for i in 0..rows {
        changes.push((
            ChangeKind::Data,
            format!(r#"{{"tag":"insert","n":{n},"i":{i}}}"#),
        ));
    }
    changes.push((ChangeKind::Commit, r#"{"tag":"commit"}"#.to_string()));
    Transaction {
        watermark: Watermark::from_u64(n),
        changes,
    }
}

async fn stores_reads_and_survives_reopen(store: Store) {
    {
        let log = store.open().await;
        assert_eq!(log.stats().await.unwrap().replica_version, None);
        log.append(txn(100, 2)).await.unwrap();
        log.append(txn(101, 1)).await.unwrap();
        let s = log.stats().await.unwrap();
        assert_eq!(s.replica_version, Some(Watermark::from_u64(100)));
        assert_eq!(s.rows, 7);
        let all = log
            .read(
                (Watermark::from_u64(100), i64::MAX),
                Watermark::from_u64(101),
                100,
            )
            .await
            .unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].kind, ChangeKind::Begin);
        assert_eq!(all[1].json, r#"{"tag":"insert","n":101,"i":0}"#);
    }
    let log = store.open().await;
    let s = log.stats().await.unwrap();
    assert_eq!(s.replica_version, Some(Watermark::from_u64(100)));
    assert_eq!(s.max_watermark, Some(Watermark::from_u64(101)));
    assert_eq!(s.rows, 7);
    assert!(log.has_commit(Watermark::from_u64(101)).await.unwrap());
    assert!(!log.has_commit(Watermark::from_u64(102)).await.unwrap());
}

async fn purge_keeps_the_newest_transaction(store: Store) {
    let log = store.open().await;
    for n in 1..=5 {
        log.append(txn(n, 1)).await.unwrap();
    }
    assert_eq!(log.purge(Watermark::from_u64(3)).await.unwrap(), 6);
    let s = log.stats().await.unwrap();
    assert_eq!(s.min_watermark, Some(Watermark::from_u64(3)));
    assert_eq!(log.purge(Watermark::from_u64(99)).await.unwrap(), 6);
    let s = log.stats().await.unwrap();
    assert_eq!((s.min_watermark, s.rows), (Some(Watermark::from_u64(5)), 3));
    assert_eq!(s.changes_purged_total, 12);
}

async fn segments_roll_over_read_across_and_purge_whole(store: Store) {
    {
        // 5 rows a transaction, a new segment every 10 rows: two transactions a segment.
        let log = store.open_with(10, Clock::System).await;
        for n in 1..=9 {
            log.append(txn(n, 3)).await.unwrap();
        }
        let all = log
            .read(
                (Watermark::from_u64(1), i64::MAX),
                Watermark::from_u64(9),
                1000,
            )
            .await
            .unwrap();
        assert_eq!(all.len(), 40);
        let ws: Vec<u64> = all
            .iter()
            .filter(|c| c.kind == ChangeKind::Commit)
            .map(|c| c.watermark.to_u64().unwrap())
            .collect();
        assert_eq!(ws, (2..=9).collect::<Vec<_>>());
        // A limited read stops mid-segment and resumes where it stopped.
        let part = log
            .read((Watermark::from_u64(2), 2), Watermark::from_u64(9), 7)
            .await
            .unwrap();
        assert_eq!((part[0].watermark.to_u64(), part[0].pos), (Some(2), 3));
        assert_eq!(part.len(), 7);
        // Purge below 6: segments {1,2} and {3,4} dropped, 5 deleted from {5,6}.
        assert_eq!(log.purge(Watermark::from_u64(6)).await.unwrap(), 25);
        let s = log.stats().await.unwrap();
        assert_eq!(
            (s.min_watermark, s.rows),
            (Some(Watermark::from_u64(6)), 20)
        );
        assert!(log.has_commit(Watermark::from_u64(6)).await.unwrap());
        assert!(!log.has_commit(Watermark::from_u64(5)).await.unwrap());
        let rest = log
            .read(
                (Watermark::from_u64(0), i64::MAX),
                Watermark::from_u64(9),
                1000,
            )
            .await
            .unwrap();
        assert_eq!(rest.len(), 20);
        assert_eq!(rest[0].watermark, Watermark::from_u64(6));
    }
    let log = store.open_with(10, Clock::System).await;
    let s = log.stats().await.unwrap();
    assert_eq!(
        (s.min_watermark, s.max_watermark, s.rows),
        (
            Some(Watermark::from_u64(6)),
            Some(Watermark::from_u64(9)),
            20
        )
    );
    log.append(txn(10, 3)).await.unwrap();
    assert_eq!(log.purge(Watermark::from_u64(100)).await.unwrap(), 20);
    let s = log.stats().await.unwrap();
    assert_eq!(
        (s.min_watermark, s.rows),
        (Some(Watermark::from_u64(10)), 5)
    );
}

async fn queued_appends_commit_in_order(store: Store) {
    let log = store.open().await;
    let rx: Vec<_> = (1..=1000).map(|n| log.append(txn(n, 3))).collect();
    for r in rx {
        r.await.unwrap();
    }
    let s = log.stats().await.unwrap();
    assert_eq!(s.rows, 5000);
    assert_eq!(s.max_watermark, Some(Watermark::from_u64(1000)));
}

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

async fn retention_keeps_rows_stored_too_recently(store: Store) {
    let clock = Clock::manual(1_000_000);
    let log = store.open_with(10, clock.clone()).await;
    for n in 1..=4 {
        log.append(txn(n, 3)).await.unwrap(); // stored at 1_000_000
    }
    clock.advance_ms(60_000);
    for n in 5..=8 {
        log.append(txn(n, 3)).await.unwrap(); // stored at 1_060_000
    }
    // Scheduled to 7, but only what was stored by 1_030_000 may go: transactions 1..=4.
    let out = log.purge_scheduled(w(7), 1_030_000).await.unwrap();
    assert_eq!(
        out,
        PurgeOutcome {
            rows: 20,
            held_by_retention: true
        }
    );
    assert_eq!(log.stats().await.unwrap().min_watermark, Some(w(5)));
    // Later, everything below 7 is old enough.
    let out = log.purge_scheduled(w(7), 1_060_000).await.unwrap();
    assert_eq!(
        out,
        PurgeOutcome {
            rows: 10,
            held_by_retention: false
        }
    );
    assert_eq!(log.stats().await.unwrap().min_watermark, Some(w(7)));
}

async fn store_times_never_go_back_with_the_clock(store: Store) {
    let clock = Clock::manual(2_000_000);
    let log = store.open_with(10, clock.clone()).await;
    log.append(txn(1, 1)).await.unwrap();
    clock.set_ms(1_000); // the wall clock jumps back
    log.append(txn(2, 1)).await.unwrap();
    // Transaction 2 counts as stored at 2_000_000, not 1_000: a purge by 1_500_000 keeps it.
    let out = log.purge_scheduled(w(3), 1_500_000).await.unwrap();
    assert_eq!(out.rows, 0);
    assert!(out.held_by_retention);
}

async fn safety_state_survives_reopen(store: Store) {
    let rec = |n: u64, at: i64| RecordedWatermark {
        watermark: w(n),
        replica: "s3".into(),
        backed_up_ms: at,
    };
    {
        let log = store.open().await;
        assert_eq!(log.load_state().await.unwrap(), SafetyState::default());
        log.save_state(StateChange::CleanupDelay(45_000))
            .await
            .unwrap();
        log.save_state(StateChange::Recorded(vec![
            rec(10, 1),
            rec(20, 2),
            rec(30, 3),
        ]))
        .await
        .unwrap();
        // A second sighting keeps the first backup time.
        log.save_state(StateChange::Recorded(vec![rec(30, 99)]))
            .await
            .unwrap();
        log.save_state(StateChange::Scheduled(w(20))).await.unwrap();
        log.save_state(StateChange::ReservationOpened(StoredReservation {
            task_id: "t1".into(),
            started_ms: 5,
        }))
        .await
        .unwrap();
        log.save_state(StateChange::ReservationOpened(StoredReservation {
            task_id: "t2".into(),
            started_ms: 6,
        }))
        .await
        .unwrap();
        log.save_state(StateChange::ReservationEnded("t2".into()))
            .await
            .unwrap();
    }
    let log = store.open().await;
    assert_eq!(
        log.load_state().await.unwrap(),
        SafetyState {
            cleanup_delay_ms: Some(45_000),
            last_scheduled: Some(w(20)),
            recorded: vec![rec(30, 3)],
            scheduled: vec![w(20)],
            reservations: vec![StoredReservation {
                task_id: "t1".into(),
                started_ms: 5
            }],
        }
    );
}

async fn a_complete_purge_takes_its_watermark_off_the_schedule(store: Store) {
    let log = store.open().await;
    for n in 1..=5 {
        log.append(txn(n, 1)).await.unwrap();
    }
    log.save_state(StateChange::Scheduled(w(2))).await.unwrap();
    log.save_state(StateChange::Scheduled(w(4))).await.unwrap();
    let now = Clock::System.now_ms();
    assert!(
        !log.purge_scheduled(w(2), now)
            .await
            .unwrap()
            .held_by_retention
    );
    assert_eq!(log.load_state().await.unwrap().scheduled, vec![w(4)]);
    // Held by retention: the watermark stays scheduled.
    let out = log.purge_scheduled(w(4), 0).await.unwrap();
    assert_eq!((out.rows, out.held_by_retention), (0, true));
    assert_eq!(log.load_state().await.unwrap().scheduled, vec![w(4)]);
}

#[actix_rt::test]
async fn a_change_log_written_before_store_times_opens_and_purges() {
    let dir = tempfile::tempdir().unwrap();
    {
        // The layout of the build before store times were kept.
        let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        conn.execute_batch(
            "CREATE TABLE segments (id INTEGER PRIMARY KEY, min_watermark TEXT NOT NULL,
                 max_watermark TEXT NOT NULL, rows INTEGER NOT NULL);
             CREATE TABLE replication_state (id INTEGER PRIMARY KEY CHECK (id = 0),
                 replica_version TEXT, last_watermark TEXT);
             INSERT INTO replication_state VALUES (0, '01', '02');
             CREATE TABLE change_log_1 (watermark TEXT NOT NULL, pos INTEGER NOT NULL,
                 kind TEXT NOT NULL, change TEXT NOT NULL, PRIMARY KEY (watermark, pos))
                 WITHOUT ROWID;
             INSERT INTO change_log_1 VALUES ('01',0,'begin','{}'),('01',1,'commit','{}'),
                 ('02',0,'begin','{}'),('02',1,'commit','{}');
             INSERT INTO segments VALUES (1, '01', '02', 4);",
        )
        .unwrap();
    }
    let log = ChangeLog::open(dir.path()).unwrap();
    let s = log.stats().await.unwrap();
    assert_eq!((s.rows, s.max_watermark), (4, Some(w(2))));
    log.append(txn(3, 1)).await.unwrap();
    // Old rows count as stored long ago; the new transaction is young.
    let out = log.purge_scheduled(w(3), 1).await.unwrap();
    assert_eq!(out.rows, 4);
}

/// A client that waits for each ack before sending more never shows load: its appends are
/// committed at once, not held for the commit window (it would be slowed to one per window).
#[actix_rt::test]
async fn an_append_awaited_before_the_next_is_not_held_for_the_commit_window() {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    let n = 20u32;
    let t0 = std::time::Instant::now();
    for i in 1..=u64::from(n) {
        log.append(txn(i, 3)).await.unwrap();
    }
    let took = t0.elapsed();
    let held = log.stats().await.unwrap().commits_held_total;
    assert_eq!(
        held, 0,
        "{n} awaited appends took {took:?}, {held} held for the window"
    );
}

/// Under load appends are held for the commit window, but a barrier (or any command other
/// than an append) ends it at once: the held appends commit and the barrier is answered
/// after them, without waiting out the window.
#[actix_rt::test]
async fn a_barrier_ends_the_commit_window_after_committing_what_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    log.append(txn(1, 1)).await.unwrap();
    // Two appends queued together: load, so the window is held for more.
    let a = log.append(txn(2, 1));
    let b = log.append(txn(3, 1));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let t0 = std::time::Instant::now();
    log.barrier().await.unwrap();
    let took = t0.elapsed();
    use futures_util::FutureExt;
    assert!(
        matches!(a.now_or_never(), Some(Ok(()))),
        "held append not durable"
    );
    assert!(
        matches!(b.now_or_never(), Some(Ok(()))),
        "held append not durable"
    );
    assert!(
        took < writer::COMMIT_WINDOW * 7 / 10,
        "the barrier waited {took:?}, as if for the window"
    );
    let stats = log.stats().await.unwrap();
    assert_eq!(stats.max_watermark, Some(Watermark::from_u64(3)));
    assert_eq!(
        stats.commits_held_total, 1,
        "the two queued appends were not held"
    );
}
