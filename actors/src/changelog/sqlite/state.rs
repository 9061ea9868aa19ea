//! The SQLite tables of the service's safety state (what it is and why: `changelog/safety.rs`),
//! and the statements that apply a [`StateChange`] and read the [`SafetyState`] back. The
//! writer thread runs them, each change in its own transaction.

use rusqlite::{params, Connection, Transaction as SqlTransaction};

use super::safety::{
    delay_from_stored, delay_to_stored, RecordedWatermark, SafetyState, StateChange,
    StoredReservation, CLEANUP_DELAY, LAST_SCHEDULED,
};
use super::segments::watermark_col;
use super::types::ChangeLogError;
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

/// Applies `change` inside the writer's transaction.
pub(super) fn apply(tx: &SqlTransaction<'_>, change: &StateChange) -> Result<(), ChangeLogError> {
    match change {
        StateChange::CleanupDelay(delay) => {
            tx.execute(
                "INSERT OR REPLACE INTO service_state (key, value) VALUES (?1, ?2)",
                params![CLEANUP_DELAY, delay_to_stored(*delay)],
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
    let cleanup_delay = value(CLEANUP_DELAY)?.map(delay_from_stored).transpose()?;
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
        cleanup_delay,
        last_scheduled,
        recorded,
        scheduled,
        reservations,
    })
}
