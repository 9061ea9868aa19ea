//! The service's safety state, kept in the change log's database (PROTOCOL.md §3, §13).
//!
//! What protects a restoring replica must survive a restart, `kill -9` included: the cleanup
//! delay learned from past restores, the backup watermarks recorded but not yet scheduled, the
//! last scheduled watermark, the scheduled watermarks not yet purged, and the open
//! reservations. Each actor that owns a piece of it (cleanup, purge, reservations) reports every
//! change as a [`StateChange`]; the change log's writer thread applies it in its own SQLite
//! transaction, in order with the appends and purges, and answers once it is durable. At start
//! the service reads the whole [`SafetyState`] back and hands each actor its part.
//!
//! Each change is one transaction, so a crash leaves either the state before it or after it.
//! Scheduling a cleanup (record the watermark as scheduled, forget every recorded watermark at
//! or below it) is one change for that reason.

use rusqlite::{params, Connection, Transaction as SqlTransaction};

use super::segments::watermark_col;
use super::ChangeLogError;
use crate::watermark::Watermark;

/// The tables of the safety state.
pub(super) const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS service_state (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS backup_watermarks (
        watermark TEXT PRIMARY KEY,
        replica TEXT NOT NULL,
        backed_up_ms INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS scheduled_purges (
        watermark TEXT PRIMARY KEY
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS reservations (
        task_id TEXT PRIMARY KEY,
        started_ms INTEGER NOT NULL
    ) WITHOUT ROWID;";

const CLEANUP_DELAY: &str = "cleanup_delay_ms";
const LAST_SCHEDULED: &str = "last_scheduled_watermark";

/// A backup watermark seen in a poll, with its backup time (unix ms, first sighting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedWatermark {
    pub watermark: Watermark,
    pub replica: String,
    pub backed_up_ms: i64,
}

/// A reservation that was open when it was last written (PROTOCOL.md §13: orphaned at the next start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredReservation {
    pub task_id: String,
    pub started_ms: i64,
}

/// Everything of §3's safety state, as read back at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SafetyState {
    /// The cleanup delay learned so far; `None` before anything was written.
    pub cleanup_delay_ms: Option<i64>,
    pub last_scheduled: Option<Watermark>,
    /// Recorded backup watermarks, ascending.
    pub recorded: Vec<RecordedWatermark>,
    /// Scheduled watermarks not yet purged, ascending.
    pub scheduled: Vec<Watermark>,
    /// Open reservations, by task.
    pub reservations: Vec<StoredReservation>,
}

/// One change of the safety state, made durable on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange {
    /// The cleanup delay is now this (it only grows).
    CleanupDelay(i64),
    /// These backup watermarks were recorded (already recorded ones are left as they are).
    Recorded(Vec<RecordedWatermark>),
    /// A cleanup was scheduled to this watermark: it becomes the last scheduled one, waits to
    /// be purged, and every recorded watermark at or below it is forgotten.
    Scheduled(Watermark),
    /// The purge to this scheduled watermark is done.
    Purged(Watermark),
    /// A reservation opened (or replaced an older one of the same task).
    ReservationOpened(StoredReservation),
    /// The reservation of this task ended.
    ReservationEnded(String),
}

/// Applies `change` inside the writer's transaction.
pub(super) fn apply(tx: &SqlTransaction<'_>, change: &StateChange) -> Result<(), ChangeLogError> {
    match change {
        StateChange::CleanupDelay(ms) => {
            tx.execute(
                "INSERT OR REPLACE INTO service_state (key, value) VALUES (?1, ?2)",
                params![CLEANUP_DELAY, ms.to_string()],
            )?;
        }
        StateChange::Recorded(list) => {
            let mut insert = tx.prepare_cached(
                "INSERT OR IGNORE INTO backup_watermarks (watermark, replica, backed_up_ms)
                 VALUES (?1, ?2, ?3)",
            )?;
            for r in list {
                insert.execute(params![r.watermark.as_str(), r.replica, r.backed_up_ms])?;
            }
        }
        StateChange::Scheduled(w) => {
            tx.execute(
                "INSERT OR REPLACE INTO service_state (key, value) VALUES (?1, ?2)",
                params![LAST_SCHEDULED, w.as_str()],
            )?;
            tx.execute(
                "INSERT OR IGNORE INTO scheduled_purges (watermark) VALUES (?1)",
                params![w.as_str()],
            )?;
            tx.execute(
                "DELETE FROM backup_watermarks WHERE watermark <= ?1",
                params![w.as_str()],
            )?;
        }
        StateChange::Purged(w) => {
            tx.execute(
                "DELETE FROM scheduled_purges WHERE watermark = ?1",
                params![w.as_str()],
            )?;
        }
        StateChange::ReservationOpened(r) => {
            tx.execute(
                "INSERT OR REPLACE INTO reservations (task_id, started_ms) VALUES (?1, ?2)",
                params![r.task_id, r.started_ms],
            )?;
        }
        StateChange::ReservationEnded(task) => {
            tx.execute("DELETE FROM reservations WHERE task_id = ?1", params![task])?;
        }
    }
    Ok(())
}

/// Reads the whole safety state.
pub(super) fn load(conn: &Connection) -> Result<SafetyState, ChangeLogError> {
    let value = |key: &str| -> Result<Option<String>, ChangeLogError> {
        let mut stmt = conn.prepare_cached("SELECT value FROM service_state WHERE key = ?1")?;
        let mut rows = stmt.query(params![key])?;
        Ok(match rows.next()? {
            Some(row) => Some(row.get(0)?),
            None => None,
        })
    };
    let cleanup_delay_ms = value(CLEANUP_DELAY)?
        .map(|v| v.parse::<i64>().map_err(|_| ChangeLogError::Corrupt(v)))
        .transpose()?;
    let last_scheduled = watermark_col(value(LAST_SCHEDULED)?)?;

    let parse = |w: String| Watermark::parse(&w).map_err(|_| ChangeLogError::Corrupt(w));
    let mut recorded = Vec::new();
    let mut stmt = conn.prepare_cached(
        "SELECT watermark, replica, backed_up_ms FROM backup_watermarks ORDER BY watermark",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    for row in rows {
        let (w, replica, backed_up_ms) = row?;
        recorded.push(RecordedWatermark {
            watermark: parse(w)?,
            replica,
            backed_up_ms,
        });
    }
    let mut scheduled = Vec::new();
    let mut stmt =
        conn.prepare_cached("SELECT watermark FROM scheduled_purges ORDER BY watermark")?;
    for w in stmt.query_map([], |r| r.get::<_, String>(0))? {
        scheduled.push(parse(w?)?);
    }
    let mut reservations = Vec::new();
    let mut stmt =
        conn.prepare_cached("SELECT task_id, started_ms FROM reservations ORDER BY started_ms")?;
    for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
        let (task_id, started_ms) = row?;
        reservations.push(StoredReservation {
            task_id,
            started_ms,
        });
    }
    Ok(SafetyState {
        cleanup_delay_ms,
        last_scheduled,
        recorded,
        scheduled,
        reservations,
    })
}
