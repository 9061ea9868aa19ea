//! The PostgreSQL engine's tables, in schema `change_streamer` (PROTOCOL.md §14): the change
//! log's partitions and their catalogue, the replication state, and the safety state's tables
//! (its statements: [`super::state`]).
//!
//! ### Layout: one table, a partition per segment
//! `change_log` is partitioned by LIST on a `segment` number; each partition
//! (`change_log_<n>`) holds about `segment_rows` rows, listed with their watermark range, row
//! count and newest store time in `segments` (the same catalogue as the SQLite engine's). A
//! purge deletes nothing row by row where it can help it: every partition wholly below the purge watermark is
//! dropped (`DROP TABLE` frees its files at once, no dead tuples left for VACUUM), and rows
//! are deleted only in the one partition the watermark cuts through, so a purge of 1 M rows
//! costs a few table drops plus at most one segment's `DELETE`. Readers query the parent
//! table, so one statement sees one consistent set of partitions, and the primary key
//! `(watermark, pos, segment)` lets the planner merge the partitions' indexes in
//! `(watermark, pos)` order. Creating or dropping a partition takes a short exclusive lock on
//! the parent: catch-up reads wait for the writer's transaction that does it (a group commit
//! that starts a segment, or a purge), and that transaction waits for the read statements in
//! flight, each one bounded by its row limit. Watermarks use the `"C"` collation: they are
//! ordered by their bytes, as in SQLite, whatever the database's default collation is.

use tokio_postgres::GenericClient;

use super::catalogue::Segment;
use super::types::ChangeLogError;
use crate::watermark::Watermark;

/// Creates every table that is missing.
pub(super) const SCHEMA: &str = r#"
    CREATE SCHEMA IF NOT EXISTS change_streamer;
    CREATE TABLE IF NOT EXISTS change_streamer.segments (
        id BIGINT PRIMARY KEY,
        min_watermark TEXT COLLATE "C" NOT NULL,
        max_watermark TEXT COLLATE "C" NOT NULL,
        rows BIGINT NOT NULL,
        max_stored_ms BIGINT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS change_streamer.replication_state (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        replica_version TEXT COLLATE "C",
        last_watermark TEXT COLLATE "C"
    );
    INSERT INTO change_streamer.replication_state (id) VALUES (0) ON CONFLICT DO NOTHING;
    CREATE TABLE IF NOT EXISTS change_streamer.change_log (
        segment BIGINT NOT NULL,
        watermark TEXT COLLATE "C" NOT NULL,
        pos BIGINT NOT NULL,
        kind TEXT NOT NULL,
        change TEXT NOT NULL,
        stored_ms BIGINT NOT NULL,
        PRIMARY KEY (watermark, pos, segment)
    ) PARTITION BY LIST (segment);
    CREATE TABLE IF NOT EXISTS change_streamer.service_state (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS change_streamer.backup_watermarks (
        watermark TEXT COLLATE "C" PRIMARY KEY,
        replica TEXT NOT NULL,
        backed_up_ms BIGINT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS change_streamer.scheduled_purges (
        watermark TEXT COLLATE "C" PRIMARY KEY
    );
    CREATE TABLE IF NOT EXISTS change_streamer.reservations (
        task_id TEXT PRIMARY KEY,
        started_ms BIGINT NOT NULL
    );"#;

pub(super) fn partition(id: i64) -> String {
    format!("change_streamer.change_log_{id}")
}

/// The statement that creates segment `id`'s partition.
pub(super) fn create_partition_sql(id: i64) -> String {
    format!(
        "CREATE TABLE {} PARTITION OF change_streamer.change_log FOR VALUES IN ({id})",
        partition(id)
    )
}

pub(super) fn parse_watermark(s: String) -> Result<Watermark, ChangeLogError> {
    Watermark::parse(&s).map_err(|_| ChangeLogError::Corrupt(s))
}

pub(super) async fn load_segments(c: &impl GenericClient) -> Result<Vec<Segment>, ChangeLogError> {
    let rows = c
        .query(
            "SELECT id, min_watermark, max_watermark, rows, max_stored_ms
             FROM change_streamer.segments ORDER BY id",
            &[],
        )
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok(Segment {
                id: r.get(0),
                min: parse_watermark(r.get(1))?,
                max: parse_watermark(r.get(2))?,
                rows: r.get::<_, i64>(3) as u64,
                max_stored_ms: r.get(4),
            })
        })
        .collect()
}
