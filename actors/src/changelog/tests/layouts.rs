//! The SQLite engine's segment layouts (`sqlite/txn_rows.rs`): a change log written by a build
//! that stored a row per change, or a row per transaction with plain values, opens, reads on
//! into the packed transaction rows written after it, answers `has_commit` and purges across
//! them; a large transaction is several rows, read from any position; a transaction row that
//! does not decode or unpack is a corrupt change log.
use super::*;
use rusqlite::{params, Connection};

/// A change log as the builds before transaction rows wrote it: transactions 1 and 3, each a
/// begin, one insert and a commit, in segment 1 of the row-per-change layout.
fn write_row_per_change_log(dir: &std::path::Path) {
    let conn = Connection::open(dir.join(DB_FILE)).unwrap();
    let mut sql = String::from(
        "CREATE TABLE segments (id INTEGER PRIMARY KEY, min_watermark TEXT NOT NULL,
             max_watermark TEXT NOT NULL, rows INTEGER NOT NULL,
             max_stored_ms INTEGER NOT NULL DEFAULT 0);
         CREATE TABLE replication_state (id INTEGER PRIMARY KEY CHECK (id = 0),
             replica_version TEXT, last_watermark TEXT);
         CREATE TABLE change_log_1 (watermark TEXT NOT NULL, pos INTEGER NOT NULL,
             kind TEXT NOT NULL, change TEXT NOT NULL, stored_ms INTEGER NOT NULL DEFAULT 0,
             PRIMARY KEY (watermark, pos)) WITHOUT ROWID;",
    );
    for n in [1u64, 3] {
        for (pos, (kind, json)) in txn(n, 1).changes.iter().enumerate() {
            sql.push_str(&format!(
                "INSERT INTO change_log_1 VALUES ('{}', {pos}, '{}', '{json}', 0);",
                Watermark::from_u64(n),
                kind.as_str()
            ));
        }
    }
    let (w1, w3) = (Watermark::from_u64(1), Watermark::from_u64(3));
    sql.push_str(&format!(
        "INSERT INTO replication_state VALUES (0, '{w1}', '{w3}');
         INSERT INTO segments VALUES (1, '{w1}', '{w3}', 6, 0);"
    ));
    conn.execute_batch(&sql).unwrap();
}

/// `(id, layout)` of each segment in the catalogue, oldest first.
fn segment_layouts(conn: &Connection) -> Vec<(i64, i64)> {
    conn.prepare("SELECT id, layout FROM segments ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

/// `(watermark, pos)` of each row read.
fn positions(rows: &[StoredChange]) -> Vec<(u64, i64)> {
    rows.iter()
        .map(|r| (r.watermark.to_u64().unwrap(), r.pos))
        .collect()
}

/// Every position of transactions `txns`, three changes each.
fn all_of(txns: &[u64]) -> Vec<(u64, i64)> {
    txns.iter()
        .flat_map(|&n| (0..3).map(move |p| (n, p)))
        .collect()
}

#[actix_rt::test]
async fn a_row_per_change_log_reads_on_into_transaction_rows_and_purges_across() {
    let dir = tempfile::tempdir().unwrap();
    write_row_per_change_log(dir.path());
    // Segments of 100 changes: room in the old one, yet appends go to a new one.
    let log = ChangeLog::open_with(dir.path(), 100, Clock::System).unwrap();
    for n in [4, 5, 7] {
        log.append(txn(n, 1)).await.unwrap();
    }
    let s = log.stats().await.unwrap();
    assert_eq!(s.rows, 15);
    let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let layouts = segment_layouts(&conn);
    assert_eq!(
        layouts,
        [(1, 0), (2, 2)],
        "the old segment is never appended to"
    );
    let w = Watermark::from_u64;
    let all = log.read((w(0), i64::MAX), w(7), 100).await.unwrap();
    assert_eq!(positions(&all), all_of(&[1, 3, 4, 5, 7]));
    assert_eq!(all[4].json, txn(3, 1).changes[1].1.as_str().into());
    assert_eq!(all[7].json, txn(4, 1).changes[1].1.as_str().into());
    // From the very start, from inside a transaction of either layout, across the layouts,
    // and cut by the limit inside a transaction.
    let start = log.read((w(1), -1), w(7), 100).await.unwrap();
    assert_eq!(positions(&start), all_of(&[1, 3, 4, 5, 7]));
    let mid_old = log.read((w(3), 0), w(7), 4).await.unwrap();
    assert_eq!(positions(&mid_old), [(3, 1), (3, 2), (4, 0), (4, 1)]);
    let across = log.read((w(3), i64::MAX), w(7), 100).await.unwrap();
    assert_eq!(positions(&across), all_of(&[4, 5, 7]));
    let mid_new = log.read((w(4), 1), w(7), 3).await.unwrap();
    assert_eq!(positions(&mid_new), [(4, 2), (5, 0), (5, 1)]);
    let up_to = log.read((w(4), i64::MAX), w(6), 100).await.unwrap();
    assert_eq!(positions(&up_to), all_of(&[5]));
    reads_stop_at_their_byte_limit(&log, &all).await;
    for n in [1, 3, 4, 5, 7] {
        assert!(log.has_commit(w(n)).await.unwrap(), "commit {n}");
    }
    for n in [2, 6, 8] {
        assert!(!log.has_commit(w(n)).await.unwrap(), "no commit {n}");
    }
    // A purge below 3 cuts through the old segment, counting its changes.
    assert_eq!(log.purge_scheduled(w(3), i64::MAX).await.unwrap().rows, 3);
    let left = log.read((w(0), i64::MAX), w(7), 100).await.unwrap();
    assert_eq!(positions(&left), all_of(&[3, 4, 5, 7]));
    // One below 5 drops the old segment and cuts through the new one.
    assert_eq!(log.purge_scheduled(w(5), i64::MAX).await.unwrap().rows, 6);
    let left = log.read((w(0), i64::MAX), w(7), 100).await.unwrap();
    assert_eq!(positions(&left), all_of(&[5, 7]));
    assert_eq!(log.stats().await.unwrap().rows, 6);
    // Reopened: the new layout only now.
    drop(log);
    let log = ChangeLog::open_with(dir.path(), 100, Clock::System).unwrap();
    log.append(txn(8, 1)).await.unwrap();
    let after = log.read((w(7), 1), w(8), 100).await.unwrap();
    assert_eq!(positions(&after), [(7, 2), (8, 0), (8, 1), (8, 2)]);
}

#[actix_rt::test]
async fn a_purge_cutting_through_transaction_rows_counts_their_changes() {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open_with(dir.path(), 1000, Clock::System).unwrap();
    for n in 1..=4 {
        log.append(txn(n, 2)).await.unwrap();
    }
    let out = log
        .purge_scheduled(Watermark::from_u64(3), i64::MAX)
        .await
        .unwrap();
    assert_eq!(out.rows, 8, "two transactions of four changes");
    assert_eq!(log.stats().await.unwrap().rows, 8);
}

#[actix_rt::test]
async fn a_transaction_row_that_does_not_decode_is_a_corrupt_change_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open_with(dir.path(), 1000, Clock::System).unwrap();
    log.append(txn(1, 2)).await.unwrap();
    log.append(txn(2, 2)).await.unwrap();
    let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let table: i64 = conn
        .query_row("SELECT id FROM segments", [], |r| r.get(0))
        .unwrap();
    let read_2 = || {
        log.read(
            (Watermark::from_u64(1), i64::MAX),
            Watermark::from_u64(2),
            100,
        )
    };
    // Stored as it is but only its begin: only its count says what is missing.
    let begin_only = [&[0u8][..], &plain_value(&txn(2, 2).changes[..1])].concat();
    let set_body = |body: &[u8]| {
        conn.execute(
            &format!("UPDATE change_log_{table} SET body = ?2 WHERE watermark = ?1"),
            params![Watermark::from_u64(2).as_str(), body],
        )
        .unwrap()
    };
    set_body(&begin_only);
    let read = read_2().await;
    assert!(matches!(read, Err(ChangeLogError::Corrupt(_))), "{read:?}");
    // Packed, with a block that does not unpack.
    set_body(&[1, 200, 0, 0, 0, 0xff, 0xff, 0xff]);
    let read = read_2().await;
    assert!(matches!(read, Err(ChangeLogError::Corrupt(_))), "{read:?}");
}

/// A transaction's changes as a value of the plain transaction rows (layout 1): each change's
/// kind byte, its length (4 bytes, little-endian) and its text.
fn plain_value(changes: &[(ChangeKind, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, json) in changes {
        out.push(match kind {
            ChangeKind::Begin => 0,
            ChangeKind::Data => 1,
            ChangeKind::Commit => 2,
        });
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(json.as_bytes());
    }
    out
}

/// A change log as the builds of plain transaction rows wrote it: transactions 1 and 3 of
/// `rows` inserts each, in segment 1 of layout 1.
fn write_plain_rows_log(dir: &std::path::Path, rows: usize) {
    let conn = Connection::open(dir.join(DB_FILE)).unwrap();
    let (w1, w3) = (Watermark::from_u64(1), Watermark::from_u64(3));
    conn.execute_batch(&format!(
        "CREATE TABLE segments (id INTEGER PRIMARY KEY, min_watermark TEXT NOT NULL,
             max_watermark TEXT NOT NULL, rows INTEGER NOT NULL,
             max_stored_ms INTEGER NOT NULL DEFAULT 0, layout INTEGER NOT NULL DEFAULT 0);
         CREATE TABLE replication_state (id INTEGER PRIMARY KEY CHECK (id = 0),
             replica_version TEXT, last_watermark TEXT);
         CREATE TABLE change_log_1 (watermark TEXT NOT NULL, first_pos INTEGER NOT NULL,
             changes INTEGER NOT NULL, body BLOB NOT NULL, stored_ms INTEGER NOT NULL,
             UNIQUE (watermark, first_pos));
         INSERT INTO replication_state VALUES (0, '{w1}', '{w3}');
         INSERT INTO segments VALUES (1, '{w1}', '{w3}', {}, 0, 1);",
        2 * (rows + 2)
    ))
    .unwrap();
    for n in [1u64, 3] {
        let t = txn(n, rows);
        conn.execute(
            "INSERT INTO change_log_1 VALUES (?1, 0, ?2, ?3, 0)",
            params![
                t.watermark.as_str(),
                t.changes.len() as i64,
                plain_value(&t.changes)
            ],
        )
        .unwrap();
    }
}

#[actix_rt::test]
async fn a_log_of_plain_transaction_rows_reads_on_into_packed_rows_and_purges_across() {
    let dir = tempfile::tempdir().unwrap();
    // Ten inserts a transaction: values that pack.
    write_plain_rows_log(dir.path(), 10);
    let log = ChangeLog::open_with(dir.path(), 1000, Clock::System).unwrap();
    for n in [4, 5] {
        log.append(txn(n, 10)).await.unwrap();
    }
    let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let segments = segment_layouts(&conn);
    assert_eq!(
        segments,
        [(1, 1), (2, 2)],
        "the old segment is never appended to"
    );
    let packing: Vec<i64> = conn
        .prepare("SELECT unicode(body) FROM change_log_2 ORDER BY watermark")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(packing, [1, 1], "both new rows are stored compressed");
    let w = Watermark::from_u64;
    let all = log.read((w(0), i64::MAX), w(5), 100).await.unwrap();
    let want: Vec<(u64, i64)> = [1u64, 3, 4, 5]
        .iter()
        .flat_map(|&n| (0..12).map(move |p| (n, p)))
        .collect();
    assert_eq!(positions(&all), want);
    for (got, n) in all.chunks(12).zip([1u64, 3, 4, 5]) {
        let texts: Vec<&str> = got.iter().map(|c| &*c.json).collect();
        let t = txn(n, 10);
        let want: Vec<&str> = t.changes.iter().map(|(_, j)| j.as_str()).collect();
        assert_eq!(texts, want, "transaction {n}");
    }
    // From inside a transaction of either layout.
    let mid_old = log.read((w(3), 10), w(5), 3).await.unwrap();
    assert_eq!(positions(&mid_old), [(3, 11), (4, 0), (4, 1)]);
    let mid_new = log.read((w(4), 5), w(5), 100).await.unwrap();
    assert_eq!(positions(&mid_new)[0], (4, 6));
    assert_eq!(mid_new.len(), 6 + 12);
    // A purge below 4 drops the old segment, counting its changes.
    assert_eq!(log.purge_scheduled(w(4), i64::MAX).await.unwrap().rows, 24);
    assert_eq!(log.stats().await.unwrap().rows, 24);
}

#[actix_rt::test]
async fn a_log_of_a_layout_this_build_does_not_know_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    write_plain_rows_log(dir.path(), 1);
    let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
    conn.execute("UPDATE segments SET layout = 3", []).unwrap();
    match ChangeLog::open_with(dir.path(), 1000, Clock::System) {
        Err(e) => assert!(e.to_string().contains("layout 3"), "{e}"),
        Ok(_) => panic!("a change log of layout 3 opened"),
    }
}
