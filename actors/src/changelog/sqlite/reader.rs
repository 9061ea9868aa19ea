//! The SQLite engine's reader thread: catch-up reads on a connection of their own, so that a
//! subscriber reading far behind never holds up ingest (WAL mode lets the two run at once),
//! and the size of the database on disk.

use std::ffi::OsString;
use std::path::Path;
use std::sync::{mpsc, Arc};

use rusqlite::{params, Connection};

use super::commands::{RangeQuery, ReadCommand, ReadQueue, ReadRows};
use super::segments::{load_segments, segment_table};
use super::txn_rows::Layout;
use super::txn_value::{append_row, unpack, TxnRow};
use super::types::{ChangeKind, ChangeLogError, StoredChange};
use crate::watermark::Watermark;

/// Serves `rx` on `conn`, the connection to the database file `db`, until every handle is gone.
pub(super) fn run(mut conn: Connection, db: &Path, rx: mpsc::Receiver<ReadCommand>) {
    conn.set_prepared_statement_cache_capacity(64);
    let mut rx = ReadQueue::new(rx);
    while let Some(cmd) = rx.recv() {
        match cmd {
            ReadCommand::ReportStalls(_) => {} // taken by the queue
            ReadCommand::Range(query, reply) => {
                let _ = reply.send(read_range(&mut conn, &query));
            }
            ReadCommand::Size(reply) => {
                let _ = reply.send(Ok(disk_bytes(db)));
            }
        }
    }
}

/// The size of the database file and of its write-ahead log: everything the rows take on disk
/// between checkpoints (a file not there counts 0, like a WAL just checkpointed away).
fn disk_bytes(db: &Path) -> u64 {
    let mut wal = OsString::from(db);
    wal.push("-wal");
    [OsString::from(db), wal]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// Reads in one read transaction, so the segment list and the rows are one snapshot.
fn read_range(
    conn: &mut Connection,
    query: &RangeQuery,
) -> Result<Vec<StoredChange>, ChangeLogError> {
    let RangeQuery { after, up_to, .. } = query;
    let tx = conn.transaction()?;
    let segments = load_segments(&tx)?;
    let mut out = ReadRows::new(query);
    for (seg, layout) in segments
        .iter()
        .filter(|(s, _)| s.max >= after.0 && s.min <= *up_to)
    {
        if out.full() {
            break;
        }
        if *layout != Layout::RowPerChange {
            read_transactions(&tx, &segment_table(seg.id), *layout, query, &mut out)?;
            continue;
        }
        let mut stmt = tx.prepare_cached(&format!(
            "SELECT watermark, pos, kind, change FROM {}
             WHERE (watermark, pos) > (?1, ?2) AND watermark <= ?3
             ORDER BY watermark, pos LIMIT ?4",
            segment_table(seg.id)
        ))?;
        let rows = stmt.query_map(
            params![after.0.as_str(), after.1, up_to.as_str(), out.left() as i64],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Arc<str>>(3)?,
                ))
            },
        )?;
        for row in rows {
            if out.full() {
                break;
            }
            let (w, pos, kind, json) = row?;
            let watermark = Watermark::parse(&w).map_err(|_| ChangeLogError::Corrupt(w.clone()))?;
            let kind = ChangeKind::parse(&kind).ok_or(ChangeLogError::Corrupt(kind))?;
            out.push(StoredChange {
                watermark,
                pos,
                kind,
                json,
            });
        }
    }
    tx.commit()?;
    Ok(out.rows)
}

/// Appends to `out`, from the segment table `table` of a row per transaction (`layout`, its
/// values packed or not), the changes after `query.after` of the transactions up to
/// `query.up_to`, until `out` is full: the transaction `after` names is read too,
/// from the change after its `pos`. The rows are stepped one at a time, so a read stops inside
/// the transaction that fills it.
fn read_transactions(
    tx: &rusqlite::Transaction<'_>,
    table: &str,
    layout: Layout,
    query: &RangeQuery,
    out: &mut ReadRows,
) -> Result<(), ChangeLogError> {
    let RangeQuery { after, up_to, .. } = query;
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT watermark, first_pos, changes, body FROM {table}
         WHERE watermark >= ?1 AND watermark <= ?2 ORDER BY watermark, first_pos"
    ))?;
    let mut rows = stmt.query(params![after.0.as_str(), up_to.as_str()])?;
    let mut scratch = Vec::new();
    while !out.full() {
        let Some(row) = rows.next()? else {
            break;
        };
        let w = row.get_ref(0)?.as_str().map_err(rusqlite::Error::from)?;
        let first_pos: i64 = row.get(1)?;
        let count: i64 = row.get(2)?;
        if w == after.0.as_str() && first_pos.saturating_add(count - 1) <= after.1 {
            // A run wholly at or before `after`: skipped by its columns, its value not loaded.
            continue;
        }
        let watermark = Watermark::parse(w).map_err(|_| ChangeLogError::Corrupt(w.to_string()))?;
        let value = row.get_ref(3)?.as_blob().map_err(rusqlite::Error::from)?;
        let body = match layout {
            Layout::RowPerTransactionLz4 => unpack(value, &mut scratch, w)?,
            _ => value,
        };
        let row = TxnRow {
            watermark: &watermark,
            w,
            first_pos,
            count,
            body,
        };
        append_row(row, after, out)?;
    }
    Ok(())
}
