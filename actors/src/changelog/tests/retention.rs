//! Purges bounded by store times (PROTOCOL.md §9), and store times kept by an older build.
use super::*;
use rusqlite::Connection;

on_both_engines!(
    retention_keeps_rows_stored_too_recently,
    store_times_never_go_back_with_the_clock,
    a_complete_purge_takes_its_watermark_off_the_schedule,
);

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
            held_by_retention: true,
            held: None,
        }
    );
    assert_eq!(log.stats().await.unwrap().min_watermark, Some(w(5)));
    // Later, everything below 7 is old enough.
    let out = log.purge_scheduled(w(7), 1_060_000).await.unwrap();
    assert_eq!(
        out,
        PurgeOutcome {
            rows: 10,
            held_by_retention: false,
            held: None,
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
