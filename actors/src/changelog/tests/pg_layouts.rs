//! The PostgreSQL engine's segment layouts (`postgres/schema.rs`): a change DB written by a
//! build that stored a row per change (`change_log`, a catalogue without `layout`) opens, reads
//! on into the transaction rows (`txn_log`) written after it, answers `has_commit` and purges
//! across both; a large transaction is several rows, read from any position.
use std::time::Duration;

use super::*;

/// `(watermark, pos)` of each row read.
fn positions(rows: &[StoredChange]) -> Vec<(u64, i64)> {
    rows.iter()
        .map(|r| (r.watermark.to_u64().unwrap(), r.pos))
        .collect()
}

/// Every position of transactions `txns`, `changes` changes each.
fn all_of(txns: &[u64], changes: i64) -> Vec<(u64, i64)> {
    txns.iter()
        .flat_map(|&n| (0..changes).map(move |p| (n, p)))
        .collect()
}

async fn open(db: &TestDb) -> ChangeLog {
    ChangeLog::open_postgres(PgOptions {
        url: db.url.clone(),
        takeover_interval: Duration::from_millis(50),
        segment_rows: 100,
        clock: Clock::System,
        instance: None,
    })
    .await
    .unwrap()
}

/// A change DB as the builds before transaction rows wrote it: transactions 1 and 3, each a
/// begin, one insert and a commit, in segment 1, a partition of `change_log`.
async fn write_row_per_change_log(db: &TestDb) {
    let c = db.connect().await;
    let (w1, w3) = (Watermark::from_u64(1), Watermark::from_u64(3));
    let mut sql = format!(
        r#"CREATE SCHEMA change_streamer;
        CREATE TABLE change_streamer.segments (id BIGINT PRIMARY KEY,
            min_watermark TEXT COLLATE "C" NOT NULL, max_watermark TEXT COLLATE "C" NOT NULL,
            rows BIGINT NOT NULL, max_stored_ms BIGINT NOT NULL);
        CREATE TABLE change_streamer.replication_state (id INTEGER PRIMARY KEY CHECK (id = 0),
            replica_version TEXT COLLATE "C", last_watermark TEXT COLLATE "C");
        CREATE TABLE change_streamer.change_log (segment BIGINT NOT NULL,
            watermark TEXT COLLATE "C" NOT NULL, pos BIGINT NOT NULL, kind TEXT NOT NULL,
            change TEXT NOT NULL, stored_ms BIGINT NOT NULL,
            PRIMARY KEY (watermark, pos, segment)) PARTITION BY LIST (segment);
        CREATE TABLE change_streamer.change_log_1 PARTITION OF change_streamer.change_log
            FOR VALUES IN (1);
        INSERT INTO change_streamer.replication_state VALUES (0, '{w1}', '{w3}');
        INSERT INTO change_streamer.segments VALUES (1, '{w1}', '{w3}', 6, 0);"#
    );
    for n in [1u64, 3] {
        for (pos, (kind, json)) in txn(n, 1).changes.iter().enumerate() {
            sql.push_str(&format!(
                "INSERT INTO change_streamer.change_log VALUES (1, '{}', {pos}, '{}', '{json}', 0);",
                Watermark::from_u64(n),
                kind.as_str()
            ));
        }
    }
    c.batch_execute(&sql).await.unwrap();
}

#[actix_rt::test]
async fn a_row_per_change_db_reads_on_into_transaction_rows_and_purges_across() {
    let db = TestDb::create("pg_layouts_upgrade").await;
    write_row_per_change_log(&db).await;
    let log = open(&db).await;
    for n in [4, 5, 7] {
        log.append(txn(n, 1)).await.unwrap();
    }
    assert_eq!(log.stats().await.unwrap().rows, 15);
    let c = db.connect().await;
    let layouts: Vec<(i64, i16)> = c
        .query(
            "SELECT id, layout FROM change_streamer.segments ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        layouts,
        [(1, 0), (2, 1)],
        "the old segment is never appended to"
    );
    let stored: i64 = c
        .query_one("SELECT count(*) FROM change_streamer.txn_log_2", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 3, "a row per transaction");
    let w = Watermark::from_u64;
    let all = log.read((w(0), i64::MAX), w(7), 100).await.unwrap();
    assert_eq!(positions(&all), all_of(&[1, 3, 4, 5, 7], 3));
    assert_eq!(all[4].json, txn(3, 1).changes[1].1.as_str().into());
    assert_eq!(all[7].json, txn(4, 1).changes[1].1.as_str().into());
    // From inside a transaction of either layout, across them, and cut by the limit.
    let mid_old = log.read((w(3), 0), w(7), 4).await.unwrap();
    assert_eq!(positions(&mid_old), [(3, 1), (3, 2), (4, 0), (4, 1)]);
    let mid_new = log.read((w(4), 1), w(7), 3).await.unwrap();
    assert_eq!(positions(&mid_new), [(4, 2), (5, 0), (5, 1)]);
    let up_to = log.read((w(4), i64::MAX), w(6), 100).await.unwrap();
    assert_eq!(positions(&up_to), all_of(&[5], 3));
    reads_stop_at_their_byte_limit(&log, &all).await;
    for n in [1, 3, 4, 5, 7] {
        assert!(log.has_commit(w(n)).await.unwrap(), "commit {n}");
    }
    for n in [2, 6, 8] {
        assert!(!log.has_commit(w(n)).await.unwrap(), "no commit {n}");
    }
    // A standby's view answers the same.
    let view = ChangeLog::open_standby(&db.url).unwrap();
    assert!(view.has_commit(w(3)).await.unwrap() && view.has_commit(w(5)).await.unwrap());
    assert!(!view.has_commit(w(6)).await.unwrap());
    // A purge below 3 cuts through the old segment, one below 5 drops it and cuts through the
    // new one, counting changes in both.
    assert_eq!(log.purge_scheduled(w(3), i64::MAX).await.unwrap().rows, 3);
    assert_eq!(log.purge_scheduled(w(5), i64::MAX).await.unwrap().rows, 6);
    // (From another position than the first read's: the reader keeps its reads, and a kept
    // read may still hold rows purged since, as none a protected subscriber needs.)
    let left = log.read((w(2), i64::MAX), w(7), 100).await.unwrap();
    assert_eq!(positions(&left), all_of(&[5, 7], 3));
    assert_eq!(log.stats().await.unwrap().rows, 6);
}

#[actix_rt::test]
async fn a_read_fetches_rows_in_steps_until_its_limit_of_changes_with_no_gap() {
    let db = TestDb::create("pg_layouts_steps").await;
    let log = open(&db).await;
    // 20 transactions of 12 changes, then 60 of 3: the first reads teach the reader a dozen
    // changes a row, which asks too few rows of the small ones and must step on.
    for n in 1..=20 {
        log.append(txn(n, 10)).await.unwrap();
    }
    for n in 21..=80 {
        log.append(txn(n, 1)).await.unwrap();
    }
    let w = Watermark::from_u64;
    let mut want: Vec<(u64, i64)> = all_of(&(1..=20).collect::<Vec<_>>(), 12);
    want.extend(all_of(&(21..=80).collect::<Vec<_>>(), 3));
    let mut got = Vec::new();
    let mut after = (w(0), i64::MAX);
    loop {
        let rows = log.read(after.clone(), w(80), 50).await.unwrap();
        let Some(last) = rows.last() else { break };
        assert!(rows.len() == 50 || got.len() + rows.len() == want.len());
        after = (last.watermark.clone(), last.pos);
        got.extend(positions(&rows));
    }
    assert_eq!(got, want);
}
