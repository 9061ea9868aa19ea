//! The SQLite engine's segment tables and their catalogue, shared by the writer and the
//! reader thread.
//!
//! Changes live in tables `change_log_<n>` of about `segment_rows` changes each, listed with
//! their watermark range, count of changes, newest store time and layout (`txn_rows.rs`) in
//! `segments` (the decisions made from it: `changelog/catalogue.rs`).

use rusqlite::Connection;

use super::catalogue::Segment;
use super::txn_rows::Layout;
use super::types::ChangeLogError;
use crate::watermark::Watermark;

/// The catalogue, the replication state and the pending rows of an open transaction
/// (`pending_txn`, PROTOCOL.md §3.0: no reader reads it; its commit moves them into a segment,
/// `writer/pending.rs`), created if missing.
pub(super) const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS segments (
        id INTEGER PRIMARY KEY,
        min_watermark TEXT NOT NULL,
        max_watermark TEXT NOT NULL,
        rows INTEGER NOT NULL,
        max_stored_ms INTEGER NOT NULL DEFAULT 0,
        layout INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS replication_state (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        replica_version TEXT,
        last_watermark TEXT
    );
    INSERT OR IGNORE INTO replication_state (id) VALUES (0);
    CREATE TABLE IF NOT EXISTS pending_txn (
        watermark TEXT NOT NULL,
        first_pos INTEGER NOT NULL,
        changes INTEGER NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (watermark, first_pos)
    );";

pub(super) fn segment_table(id: i64) -> String {
    format!("change_log_{id}")
}

/// The `CREATE TABLE` of a new segment `id`: a row per transaction, its value packed
/// ([`Layout::RowPerTransactionLz4`]; why: `txn_rows.rs`).
pub(super) fn create_segment_sql(id: i64) -> String {
    format!(
        "CREATE TABLE {} (
             watermark TEXT NOT NULL,
             first_pos INTEGER NOT NULL,
             changes INTEGER NOT NULL,
             body BLOB NOT NULL,
             stored_ms INTEGER NOT NULL,
             UNIQUE (watermark, first_pos)
         );",
        segment_table(id)
    )
}

pub(super) fn watermark_col(s: Option<String>) -> Result<Option<Watermark>, ChangeLogError> {
    s.map(|s| Watermark::parse(&s).map_err(|_| ChangeLogError::Corrupt(s)))
        .transpose()
}

/// Brings a change log written by an older build up to date: segment tables and the catalogue
/// gain their store-time columns. Rows stored before store times were kept count as stored at
/// time 0, i.e. long ago: the retention floor then does not hold them, exactly as that build
/// did not.
pub(super) fn migrate(conn: &Connection) -> Result<(), ChangeLogError> {
    let has_column = |table: &str, column: &str| -> Result<bool, ChangeLogError> {
        let mut stmt = conn.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
        let names = stmt.query_map([], |r| r.get::<_, String>(0))?;
        for name in names {
            if name? == column {
                return Ok(true);
            }
        }
        Ok(false)
    };
    if !has_column("segments", "max_stored_ms")? {
        conn.execute_batch(
            "ALTER TABLE segments ADD COLUMN max_stored_ms INTEGER NOT NULL DEFAULT 0",
        )?;
    }
    // Segments of the builds before transaction rows keep their row per change.
    if !has_column("segments", "layout")? {
        conn.execute_batch("ALTER TABLE segments ADD COLUMN layout INTEGER NOT NULL DEFAULT 0")?;
    }
    let ids: Vec<i64> = {
        let mut stmt = conn.prepare("SELECT id FROM segments")?;
        let ids = stmt.query_map([], |r| r.get(0))?;
        ids.collect::<Result<_, _>>()?
    };
    for id in ids {
        let table = segment_table(id);
        if !has_column(&table, "stored_ms")? {
            conn.execute_batch(&format!(
                "ALTER TABLE {table} ADD COLUMN stored_ms INTEGER NOT NULL DEFAULT 0"
            ))?;
        }
    }
    Ok(())
}

/// The catalogue, oldest segment first, each with its table's layout.
pub(super) fn load_segments(conn: &Connection) -> Result<Vec<(Segment, Layout)>, ChangeLogError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, min_watermark, max_watermark, rows, max_stored_ms, layout FROM segments ORDER BY id",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, i64>(4)?,
            r.get::<_, i64>(5)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, min, max, n, max_stored_ms, layout) = row?;
        let parse = |w: String| Watermark::parse(&w).map_err(|_| ChangeLogError::Corrupt(w));
        let segment = Segment {
            id,
            min: parse(min)?,
            max: parse(max)?,
            rows: n as u64,
            max_stored_ms,
        };
        out.push((segment, Layout::from_column(layout)?));
    }
    Ok(out)
}
