//! The service's safety state, kept beside the change log (PROTOCOL.md §3, §13), as both
//! engines read and write it; and [`ChangeDbView`], that state with the log's range as a standby
//! shows it.
//!
//! What protects a restoring replica must survive a restart, `kill -9` included: the cleanup
//! delay learned from past restores, the backup watermarks recorded but not yet scheduled, the
//! last scheduled watermark, the scheduled watermarks not yet purged, and the open
//! reservations. Each actor that owns a piece of it (cleanup, purge, reservations) reports every
//! change as a [`StateChange`]; the change log's writer applies it in its own database
//! transaction, in order with the appends and purges, and answers once it is durable. At start
//! the service reads the whole [`SafetyState`] back and hands each actor its part.
//!
//! Each change is one transaction, so a crash leaves either the state before it or after it.
//! Scheduling a cleanup (record the watermark as scheduled, forget every recorded watermark at
//! or below it) is one change for that reason. The engines' statements: `sqlite/state.rs` and
//! `postgres/state.rs`.

use std::time::Duration;

use super::types::{ChangeLogError, LogStats};
use crate::watermark::Watermark;

/// The key under which the cleanup delay is stored (in milliseconds).
pub(super) const CLEANUP_DELAY: &str = "cleanup_delay_ms";
/// The key under which the last scheduled watermark is stored.
pub(super) const LAST_SCHEDULED: &str = "last_scheduled_watermark";

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
    /// When it opened (unix ms).
    pub started_ms: i64,
}

/// Everything of §3's safety state, as read back at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SafetyState {
    /// The cleanup delay learned so far; `None` before anything was written.
    pub cleanup_delay: Option<Duration>,
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
    CleanupDelay(Duration),
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

/// The cleanup delay as stored: whole milliseconds.
pub(super) fn delay_to_stored(delay: Duration) -> String {
    delay.as_millis().to_string()
}

/// The cleanup delay read back: a count of milliseconds, or the log is corrupt.
pub(super) fn delay_from_stored(text: String) -> Result<Duration, ChangeLogError> {
    match text.parse::<u64>() {
        Ok(ms) => Ok(Duration::from_millis(ms)),
        Err(_) => Err(ChangeLogError::Corrupt(text)),
    }
}

/// What a standby shows of the shared change log on its `/status` (PROTOCOL.md §11): the
/// log's range and the safety state, as the owner last wrote them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeDbView {
    pub log: LogStats,
    pub safety: SafetyState,
}
