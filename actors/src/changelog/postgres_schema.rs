//! The PostgreSQL engine's tables, in schema `change_streamer` (PROTOCOL.md §14), and the safety
//! state kept in them with the same semantics as the SQLite engine's ([`super::state`]).
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

use tokio_postgres::{GenericClient, Transaction as PgTransaction};

use super::catalogue::Segment;
use super::state::{RecordedWatermark, SafetyState, StateChange, StoredReservation};
use super::ChangeLogError;
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

const CLEANUP_DELAY: &str = "cleanup_delay_ms";
const LAST_SCHEDULED: &str = "last_scheduled_watermark";

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

/// Applies `change` inside the writer's transaction (see [`StateChange`] for what each does).
pub(super) async fn apply(
    tx: &PgTransaction<'_>,
    change: &StateChange,
) -> Result<(), ChangeLogError> {
    const SET: &str = "INSERT INTO change_streamer.service_state (key, value) VALUES ($1, $2)
                       ON CONFLICT (key) DO UPDATE SET value = excluded.value";
    match change {
        StateChange::CleanupDelay(ms) => {
            tx.execute(SET, &[&CLEANUP_DELAY, &ms.to_string()]).await?;
        }
        StateChange::Recorded(list) => {
            let ws: Vec<&str> = list.iter().map(|r| r.watermark.as_str()).collect();
            let replicas: Vec<&str> = list.iter().map(|r| r.replica.as_str()).collect();
            let ats: Vec<i64> = list.iter().map(|r| r.backed_up_ms).collect();
            tx.execute(
                "INSERT INTO change_streamer.backup_watermarks (watermark, replica, backed_up_ms)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::int8[])
                 ON CONFLICT (watermark) DO NOTHING",
                &[&ws, &replicas, &ats],
            )
            .await?;
        }
        StateChange::Scheduled(w) => {
            tx.execute(SET, &[&LAST_SCHEDULED, &w.as_str()]).await?;
            tx.execute(
                "INSERT INTO change_streamer.scheduled_purges (watermark) VALUES ($1)
                 ON CONFLICT DO NOTHING",
                &[&w.as_str()],
            )
            .await?;
            tx.execute(
                "DELETE FROM change_streamer.backup_watermarks WHERE watermark <= $1",
                &[&w.as_str()],
            )
            .await?;
        }
        StateChange::Purged(w) => {
            tx.execute(
                "DELETE FROM change_streamer.scheduled_purges WHERE watermark = $1",
                &[&w.as_str()],
            )
            .await?;
        }
        StateChange::ReservationOpened(r) => {
            tx.execute(
                "INSERT INTO change_streamer.reservations (task_id, started_ms) VALUES ($1, $2)
                 ON CONFLICT (task_id) DO UPDATE SET started_ms = excluded.started_ms",
                &[&r.task_id, &r.started_ms],
            )
            .await?;
        }
        StateChange::ReservationEnded(task) => {
            tx.execute(
                "DELETE FROM change_streamer.reservations WHERE task_id = $1",
                &[task],
            )
            .await?;
        }
    }
    Ok(())
}

/// Reads the whole safety state.
pub(super) async fn load(c: &impl GenericClient) -> Result<SafetyState, ChangeLogError> {
    let value = |key: &'static str| async move {
        let row = c
            .query_opt(
                "SELECT value FROM change_streamer.service_state WHERE key = $1",
                &[&key],
            )
            .await?;
        Ok::<_, ChangeLogError>(row.map(|r| r.get::<_, String>(0)))
    };
    let cleanup_delay_ms = value(CLEANUP_DELAY)
        .await?
        .map(|v| v.parse::<i64>().map_err(|_| ChangeLogError::Corrupt(v)))
        .transpose()?;
    let last_scheduled = value(LAST_SCHEDULED)
        .await?
        .map(parse_watermark)
        .transpose()?;
    let recorded = c
        .query(
            "SELECT watermark, replica, backed_up_ms FROM change_streamer.backup_watermarks
             ORDER BY watermark",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| {
            Ok(RecordedWatermark {
                watermark: parse_watermark(r.get(0))?,
                replica: r.get(1),
                backed_up_ms: r.get(2),
            })
        })
        .collect::<Result<_, ChangeLogError>>()?;
    let scheduled = c
        .query(
            "SELECT watermark FROM change_streamer.scheduled_purges ORDER BY watermark",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| parse_watermark(r.get(0)))
        .collect::<Result<_, _>>()?;
    let reservations = c
        .query(
            "SELECT task_id, started_ms FROM change_streamer.reservations ORDER BY started_ms",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| StoredReservation {
            task_id: r.get(0),
            started_ms: r.get(1),
        })
        .collect();
    Ok(SafetyState {
        cleanup_delay_ms,
        last_scheduled,
        recorded,
        scheduled,
        reservations,
    })
}
