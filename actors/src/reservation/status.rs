//! The status message of a reservation, and when it may be sent (PROTOCOL.md §6.3, §6.7).
//!
//! A reservation's status tells the replica which backup to restore and where the change log
//! starts. It is sent once the reservation is written down and the change log answers; with
//! the VFS backup source it also waits until a poll of the backup read a watermark at or above
//! the change log's minWatermark, so that a replica is only sent to a backup that exists and
//! that the change log can serve from. After a restart, whatever the source, it also waits until
//! the backup covers the watermark recorded before the stop (PROTOCOL.md §13.1,
//! [`BackupCovered`]).

use std::sync::Arc;

use actix::prelude::*;
use log::{info, warn};
use serde::Serialize;

use super::ReservationActor;
use crate::changelog::{ChangeLogError, LogRange};
use crate::restart_catch_up::BackupCovered;
use crate::session_end::{SessionEnd, SessionId};
use crate::streamer::{GetSnapshotBase, SnapshotBaseError};
use crate::watermark::Watermark;

/// What a reservation's session is told.
#[derive(Message, Debug, Clone, PartialEq)]
#[rtype(result = "()")]
pub enum ReservationEvent {
    /// The one status message: `["status", {...}]`.
    Status(SnapshotStatus),
    /// The reservation could not be written down, or the change log could not answer; the
    /// reservation is gone.
    Failed(Arc<ReservationError>),
    /// The reservation ended; close the socket.
    Closed(SessionEnd),
}

/// Why a reservation failed before its status could be sent (the session closes with 1011
/// and this message, PROTOCOL.md §6.3).
#[derive(Debug, thiserror::Error)]
pub enum ReservationError {
    #[error("reservation could not be stored: {0}")]
    NotStored(ChangeLogError),
    /// A standby's reservation could not be recorded in the change DB (PROTOCOL.md §14.1).
    #[error("reservation could not be recorded in the change DB: {0}")]
    NotRecorded(String),
    /// The change log's state could not be read: the read's own failure (an engine error, a
    /// lost connection to the change DB, a deposed owner's refusal), said as it is, nothing
    /// added (PROTOCOL.md §6.3).
    #[error(transparent)]
    ReadFailed(ChangeLogError),
    /// No base for a status otherwise: the change log has no replicaVersion yet (the
    /// documented `change log is not initialized yet (no replicaVersion)`), or the streamer
    /// that reads it is gone.
    #[error(transparent)]
    NoStatus(SnapshotBaseError),
}

/// A failed read of the change log keeps its cause: it is that failure, not a missing base.
impl From<SnapshotBaseError> for ReservationError {
    fn from(e: SnapshotBaseError) -> Self {
        match e {
            SnapshotBaseError::ChangeLog(e) => ReservationError::ReadFailed(e),
            other => ReservationError::NoStatus(other),
        }
    }
}

/// Two failures are the same when they say the same (what a recording session compares).
impl PartialEq for ReservationError {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

/// The body of the status message, fields in wire order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotStatus {
    pub tag: &'static str,
    #[serde(rename = "backupURL")]
    pub backup_url: String,
    #[serde(rename = "replicaVersion")]
    pub replica_version: String,
    #[serde(rename = "minWatermark")]
    pub min_watermark: String,
    /// Bytes of the database the backup restores to; absent, never 0, when unknown
    /// (PROTOCOL.md §6.3).
    #[serde(rename = "replicaSize", skip_serializing_if = "Option::is_none")]
    pub replica_size: Option<u64>,
}

impl SnapshotStatus {
    /// The wire message, fields in the order above:
    /// `["status",{"tag":"status","backupURL":…,"replicaVersion":…,"minWatermark":…,"replicaSize":…}]`.
    pub fn to_message(&self) -> String {
        serde_json::to_string(&("status", self)).unwrap_or_default()
    }
}

/// A poll of the backup itself read this backed-up watermark (VFS source, PROTOCOL.md §6.7), and
/// the database's size in bytes when the poll could read it (PROTOCOL.md §6.3, §8.1b).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct BackupRead {
    pub watermark: Watermark,
    pub replica_size: Option<u64>,
}

impl ReservationActor {
    /// Sends the status of `task_id`'s reservation (held by `session_id`) once the change log
    /// answers and, with the VFS source, the backup is verified.
    pub(super) fn send_status(
        &mut self,
        task_id: String,
        session_id: SessionId,
        ctx: &mut Context<Self>,
    ) {
        self.change_log
            .send(GetSnapshotBase)
            .into_actor(self)
            .map(move |answer, act, ctx| {
                let state: Result<LogRange, SnapshotBaseError> =
                    answer.unwrap_or_else(|e| Err(e.into()));
                let verified = |s: &LogRange| {
                    !act.held_after_restart
                        && (!act.verify_backup
                            || act
                                .backed_up
                                .as_ref()
                                .is_some_and(|b| b.as_str() >= s.min_watermark.as_str()))
                };
                let verified = state.as_ref().map(verified).unwrap_or(false);
                let Some(res) = act.reservations.get_mut(&task_id) else {
                    return;
                };
                let Some(holder) = res.holder.as_ref().filter(|h| h.session_id == session_id)
                else {
                    return; // ended (or replaced) before the status was known
                };
                match state {
                    Ok(_) if !verified && act.held_after_restart => {
                        info!(task:% = task_id; "snapshot reservation of task {task_id} waits for the backup to cover the watermark recorded before the restart");
                    }
                    Ok(_) if !verified => {
                        info!(task:% = task_id; "snapshot reservation of task {task_id} waits for a backup at or above the change log's minWatermark");
                    }
                    Ok(s) => {
                        res.status_sent = true;
                        res.restore.replica_size = act.replica_size;
                        holder.session.do_send(ReservationEvent::Status(SnapshotStatus {
                            tag: "status",
                            backup_url: act.backup_url.clone(),
                            replica_version: s.replica_version,
                            min_watermark: s.min_watermark,
                            replica_size: act.replica_size,
                        }));
                    }
                    Err(e) => {
                        warn!(task:% = task_id; "failing snapshot reservation of task {task_id}: {e}");
                        holder
                            .session
                            .do_send(ReservationEvent::Failed(Arc::new(e.into())));
                        act.remove(&task_id, Some(session_id));
                        act.erase(&task_id, ctx);
                        act.closed(&task_id, None);
                    }
                }
            })
            .spawn(ctx);
    }
}

impl Handler<BackupRead> for ReservationActor {
    type Result = ();
    fn handle(&mut self, msg: BackupRead, ctx: &mut Context<Self>) {
        // The latest read's size, whatever its watermark: what a restore now would get.
        self.replica_size = msg.replica_size;
        if self.backed_up.as_ref().is_some_and(|b| *b >= msg.watermark) {
            return;
        }
        self.backed_up = Some(msg.watermark);
        self.send_waiting_statuses(ctx);
    }
}

impl ReservationActor {
    /// Tries again the status of every reservation that waits for it.
    fn send_waiting_statuses(&mut self, ctx: &mut Context<Self>) {
        let waiting: Vec<(String, SessionId)> = self
            .reservations
            .iter()
            .filter(|(_, r)| !r.status_sent)
            .filter_map(|(t, r)| r.holder.as_ref().map(|h| (t.clone(), h.session_id)))
            .collect();
        for (task_id, session_id) in waiting {
            self.send_status(task_id, session_id, ctx);
        }
    }
}

impl Handler<BackupCovered> for ReservationActor {
    type Result = ();
    fn handle(&mut self, _: BackupCovered, ctx: &mut Context<Self>) {
        if std::mem::take(&mut self.held_after_restart) {
            self.send_waiting_statuses(ctx);
        }
    }
}
