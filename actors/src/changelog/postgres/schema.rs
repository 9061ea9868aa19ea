//! The PostgreSQL engine's tables, in schema `change_streamer` (PROTOCOL.md §14): the change
//! log's partitions and their catalogue, the replication state, and the safety state's tables
//! (its statements: [`super::state`]).
//!
//! ### Layout: one table, a partition per segment
//! `txn_log` is partitioned by LIST on a `segment` number; each partition (`txn_log_<n>`)
//! holds about `segment_rows` changes, a row per transaction of ordinary size (its changes in
//! one value, packed: `changelog/txn_value.rs`; PostgreSQL's cost was ~4 µs per row and the
//! rows were a transaction's changes), listed with their watermark range, count of changes,
//! newest store time and [`Layout`] in `segments` (the same catalogue as the SQLite engine's).
//! Segments written by builds before transaction rows are partitions of `change_log`, a row
//! per change, read as they are until purged; the first append of this build opens a new
//! segment. A
//! purge deletes nothing row by row where it can help it: every partition wholly below the purge watermark is
//! dropped (`DROP TABLE` frees its files at once, no dead tuples left for VACUUM), and rows
//! are deleted only in the one partition the watermark cuts through, so a purge of 1 M rows
//! costs a few table drops plus at most one segment's `DELETE`. Readers read the partitions
//! the catalogue lists for their range, in one snapshot with it ([`super::reader`]), not the
//! parent: a statement on the parent is planned over every partition, and waits for the
//! writer's transaction that creates or drops one (each takes a short exclusive lock on the
//! parent). Dropping a partition also waits for the reads of it in flight, each bounded by its
//! row limit. The primary key `(watermark, first_pos, segment)` orders each partition's index
//! (`(watermark, pos, segment)` in `change_log`).
//! `pending_txn` holds the chunks of the open transaction, stored as they arrive and read by
//! no reader; its commit moves them into `txn_log` (PROTOCOL.md §3.0, `writer/pending.rs`).
//! Watermarks use the `"C"` collation: they are ordered by their bytes, as in SQLite, whatever
//! the database's default collation is.

use tokio_postgres::GenericClient;

use super::catalogue::{refresh_range, Segment};
use super::types::{ChangeLogError, LogStats};
use crate::watermark::Watermark;

/// Runs `tables` (the `CREATE … IF NOT EXISTS` of [`SCHEMA`] or [`INSTANCES_SCHEMA`]), and the
/// creation of the schema itself, in one transaction under the transaction advisory lock
/// 0x6373_0002 ("cs" + 2): the owner and the standbys' record connections create what is
/// missing at the same moment at a first start, and two concurrent `CREATE … IF NOT EXISTS` of
/// one name can both miss it and one then fails; the lock makes the second wait and then see
/// the first's. (Its notices that a table already exists are not logged.)
pub(super) async fn create_missing(
    c: &impl GenericClient,
    tables: &str,
) -> Result<(), ChangeLogError> {
    c.batch_execute(&format!(
        "BEGIN;
         SET LOCAL client_min_messages = warning;
         SELECT pg_advisory_xact_lock(1668481026);
         CREATE SCHEMA IF NOT EXISTS change_streamer;
         {tables}
         COMMIT;"
    ))
    .await?;
    Ok(())
}

/// Every table of the change log and the safety state (see [`create_missing`]).
pub(super) const SCHEMA: &str = r#"
    CREATE TABLE IF NOT EXISTS change_streamer.segments (
        id BIGINT PRIMARY KEY,
        min_watermark TEXT COLLATE "C" NOT NULL,
        max_watermark TEXT COLLATE "C" NOT NULL,
        rows BIGINT NOT NULL,
        max_stored_ms BIGINT NOT NULL,
        layout SMALLINT NOT NULL DEFAULT 0
    );
    ALTER TABLE change_streamer.segments ADD COLUMN IF NOT EXISTS layout SMALLINT NOT NULL DEFAULT 0;
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
    CREATE TABLE IF NOT EXISTS change_streamer.txn_log (
        segment BIGINT NOT NULL,
        watermark TEXT COLLATE "C" NOT NULL,
        first_pos BIGINT NOT NULL,
        changes BIGINT NOT NULL,
        body BYTEA NOT NULL,
        stored_ms BIGINT NOT NULL,
        PRIMARY KEY (watermark, first_pos, segment)
    ) PARTITION BY LIST (segment);
    CREATE TABLE IF NOT EXISTS change_streamer.pending_txn (
        watermark TEXT COLLATE "C" NOT NULL,
        first_pos BIGINT NOT NULL,
        changes BIGINT NOT NULL,
        body BYTEA NOT NULL,
        PRIMARY KEY (watermark, first_pos)
    );
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

/// Creates the instance records' tables if missing (PROTOCOL.md §14.1). Run by every instance
/// on its own record connection (`records.rs`), standbys included, so not part of [`SCHEMA`],
/// which only the owner runs. It also gives a catalogue written by a build before segment
/// layouts its `layout` column, so that a standby of this build reads the catalogue of an
/// owner of that build. `refreshed_at` is the change DB's clock, so the age of a record
/// never depends on two machines' clocks agreeing; `backend_pid` is the record connection's
/// session, which PostgreSQL shows ended once the instance dies. A subscriber row is one
/// connected subscriber and the watermark it acked (what the owner's purge will read). A
/// reservation row is one held by a serving standby's socket; it does not go with its
/// instance's record, because the owner must still find it once that instance is gone, to
/// write it down as an orphan (PROTOCOL.md §14.1); an end row is an end by subscription at any
/// instance (`reservation/records.rs`).
pub(super) const INSTANCES_SCHEMA: &str = r#"
    ALTER TABLE IF EXISTS change_streamer.segments
        ADD COLUMN IF NOT EXISTS layout SMALLINT NOT NULL DEFAULT 0;
    CREATE TABLE IF NOT EXISTS change_streamer.instances (
        id TEXT PRIMARY KEY,
        role TEXT NOT NULL,
        backend_pid INTEGER NOT NULL,
        refreshed_at TIMESTAMPTZ NOT NULL,
        reservations INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS change_streamer.instance_subscribers (
        instance TEXT NOT NULL REFERENCES change_streamer.instances (id) ON DELETE CASCADE,
        subscriber TEXT NOT NULL,
        acked TEXT COLLATE "C" NOT NULL
    );
    CREATE INDEX IF NOT EXISTS instance_subscribers_instance
        ON change_streamer.instance_subscribers (instance);
    CREATE TABLE IF NOT EXISTS change_streamer.instance_reservations (
        instance TEXT NOT NULL,
        task_id TEXT NOT NULL,
        started_ms BIGINT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS instance_reservations_instance
        ON change_streamer.instance_reservations (instance);
    CREATE TABLE IF NOT EXISTS change_streamer.reservation_ends (
        task_id TEXT NOT NULL,
        ended_ms BIGINT NOT NULL,
        started_ms BIGINT,
        PRIMARY KEY (task_id, ended_ms)
    );"#;

/// The replicaVersion and the catalogue's range and row count, as read from the tables (the
/// owner's writer at start, a standby's `/status`).
pub(super) async fn read_stats(
    c: &impl GenericClient,
) -> Result<(LogStats, Vec<(Segment, Layout)>), ChangeLogError> {
    let rv: Option<String> = c
        .query_one(
            "SELECT replica_version FROM change_streamer.replication_state WHERE id = 0",
            &[],
        )
        .await?
        .get(0);
    let segments = load_segments(c).await?;
    let mut stats = LogStats {
        replica_version: rv.map(parse_watermark).transpose()?,
        ..LogStats::default()
    };
    let plain: Vec<Segment> = segments.iter().map(|(s, _)| s.clone()).collect();
    refresh_range(&mut stats, &plain);
    Ok((stats, segments))
}

/// How a segment's partition holds its changes (`segments.layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// A partition of `change_log`, `(segment, watermark, pos, kind, change, stored_ms)`: builds
    /// before transaction rows.
    RowPerChange = 0,
    /// A partition of `txn_log`, `(segment, watermark, first_pos, changes, body, stored_ms)`, a
    /// row per transaction of ordinary size, its value packed (`changelog/txn_value.rs`).
    RowPerTransaction = 1,
}

/// The layout of every segment this build opens.
pub(super) const CURRENT: Layout = Layout::RowPerTransaction;

impl Layout {
    pub(super) fn from_column(n: i16) -> Result<Layout, ChangeLogError> {
        match n {
            0 => Ok(Layout::RowPerChange),
            1 => Ok(Layout::RowPerTransaction),
            n => Err(ChangeLogError::Corrupt(format!("segment layout {n}"))),
        }
    }

    /// The partitioned table a segment of this layout is a partition of.
    pub(super) fn parent(self) -> &'static str {
        match self {
            Layout::RowPerChange => "change_streamer.change_log",
            Layout::RowPerTransaction => "change_streamer.txn_log",
        }
    }

    /// Segment `id`'s partition.
    pub(super) fn partition(self, id: i64) -> String {
        format!("{}_{id}", self.parent())
    }
}

/// The statement that creates segment `id`'s partition, of this build's layout.
pub(super) fn create_partition_sql(id: i64) -> String {
    format!(
        "CREATE TABLE {} PARTITION OF {} FOR VALUES IN ({id})",
        CURRENT.partition(id),
        CURRENT.parent()
    )
}

pub(super) fn parse_watermark(s: String) -> Result<Watermark, ChangeLogError> {
    Watermark::parse(&s).map_err(|_| ChangeLogError::Corrupt(s))
}

/// The catalogue, oldest segment first, each with its partition's layout.
pub(super) async fn load_segments(
    c: &impl GenericClient,
) -> Result<Vec<(Segment, Layout)>, ChangeLogError> {
    let rows = c
        .query(
            "SELECT id, min_watermark, max_watermark, rows, max_stored_ms, layout
             FROM change_streamer.segments ORDER BY id",
            &[],
        )
        .await?;
    rows.into_iter()
        .map(|r| {
            let segment = Segment {
                id: r.get(0),
                min: parse_watermark(r.get(1))?,
                max: parse_watermark(r.get(2))?,
                rows: r.get::<_, i64>(3) as u64,
                max_stored_ms: r.get(4),
            };
            Ok((segment, Layout::from_column(r.get(5))?))
        })
        .collect()
}
