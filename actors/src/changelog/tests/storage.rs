//! Storing, reading back, reopening, purging, and the segments underneath.
use super::*;

on_both_engines!(
    stores_reads_and_survives_reopen,
    purge_keeps_the_newest_transaction,
    segments_roll_over_read_across_and_purge_whole,
    queued_appends_commit_in_order,
    a_large_transaction_is_several_rows_read_from_any_position,
);

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
        assert_eq!(&*all[1].json, r#"{"tag":"insert","n":101,"i":0}"#);
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

/// The rows of the change log's transaction tables (segment 1 of SQLite; every partition of
/// PostgreSQL's `txn_log`).
async fn transaction_rows(store: &Store) -> i64 {
    match store {
        Store::Sqlite(dir) => rusqlite::Connection::open(dir.path().join(DB_FILE))
            .unwrap()
            .query_row("SELECT COUNT(*) FROM change_log_1", [], |r| r.get(0))
            .unwrap(),
        Store::Postgres(db) => db
            .connect()
            .await
            .query_one("SELECT count(*) FROM change_streamer.txn_log", &[])
            .await
            .unwrap()
            .get(0),
    }
}

/// A transaction over `txn_value::CHUNK_BYTES` is several rows, each of about that size, read
/// back from any position inside it.
async fn a_large_transaction_is_several_rows_read_from_any_position(store: Store) {
    let log = store.open_with(100_000, Clock::System).await;
    // ~40 changes of 8 KiB of text that does not compress: several rows of about 64 KiB.
    let mut big = txn(2, 40);
    for (i, (_, json)) in big.changes.iter_mut().enumerate().skip(1).take(40) {
        let noise: String = (0..8 * 1024)
            .map(|k| char::from(b'a' + ((k * 7919 + i * 104_729) % 26) as u8))
            .collect();
        json.push_str(&noise);
    }
    log.append(txn(1, 1)).await.unwrap();
    log.append(big.clone()).await.unwrap();
    log.append(txn(3, 1)).await.unwrap();
    let rows = transaction_rows(&store).await;
    assert!(rows >= 6, "{rows} rows for 3 transactions");
    let positions = |rows: &[StoredChange]| -> Vec<(u64, i64)> {
        rows.iter()
            .map(|r| (r.watermark.to_u64().unwrap(), r.pos))
            .collect()
    };
    for from in [-1, 0, 7, 8, 9, 20, 40, 41] {
        let got = log.read((w(2), from), w(3), 100).await.unwrap();
        let want: Vec<_> = (from + 1..42)
            .map(|p| (2, p))
            .chain((0..3).map(|p| (3, p)))
            .collect();
        assert_eq!(positions(&got), want, "after (2, {from})");
        if let Some((_, json)) = big.changes.get((from + 1) as usize) {
            assert_eq!(got[0].json, json.as_str().into());
        }
    }
    let cut = log.read((w(2), 3), w(3), 5).await.unwrap();
    assert_eq!(positions(&cut), (4..9).map(|p| (2, p)).collect::<Vec<_>>());
    assert!(log.has_commit(w(2)).await.unwrap());
    assert_eq!(
        log.purge_scheduled(w(3), i64::MAX).await.unwrap().rows,
        3 + 42
    );
}
