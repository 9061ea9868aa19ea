//! `ReservationActor`: snapshot reservations, one per task (PROTOCOL.md §6).
//!
//! A replica that is about to restore a litestream backup opens `/snapshot?taskID=T` and holds
//! it open until it has restored and subscribed. While it does, the change log must keep every
//! change the backup does not contain, so the [`CleanupActor`] is told to pause. This actor owns
//! the reservations: their tasks, start times and the session each one talks to.
//!
//! Rules it keeps:
//! - One reservation per task. A retry of the same task replaces the older reservation, whose
//!   session is told to close; the older session's later stop names its own `session_id` and
//!   so can never end the newer reservation.
//! - The status message (backup URL, replicaVersion, minWatermark) is sent once, as soon as the
//!   change log answers; a reservation that ended in the meantime gets nothing.
//! - Ending by subscription ([`EndBySubscription`]) reports the held time, which may grow the
//!   cleanup delay; every other end ([`Release`], replacement, failure, expiry, [`Stop`])
//!   does not.
//! - With `--max-reservation-ms`, a reservation held longer is ended (PROTOCOL.md §6.6): one stuck
//!   restore cannot pin the change log for ever.
//! - With the VFS backup source, the status waits until a poll has read a backed-up watermark
//!   at or above the change log's minWatermark (PROTOCOL.md §6.7): a replica is only told to restore a
//!   backup that exists and that the change log can serve from. Its `replicaSize` is the size
//!   the latest poll read (PROTOCOL.md §6.3).
//! - A replica's progress messages are kept with its reservation and shown in `/status`
//!   (`progress.rs`, PROTOCOL.md §6.8).
//!
//! ### Why reservations are written down
//! A replica restoring across a restart of the service still needs its backup's watermark kept
//! (PROTOCOL.md §13). So every reservation is written to the change log's database before its status
//! is sent, and erased when it ends for good; a service stop erases nothing. At the next start
//! the reservations found there are *orphaned*: they have no socket, but they keep cleanup
//! paused until the task reserves again or subscribes with `initial=true` (which measures the
//! held time from the original start), until the cleanup delay has passed since this start
//! (the replica gave up, or finished without telling us), or until `--max-reservation-ms` has
//! passed since the original start.
//!
//! A standby that takes over keeps its reservations: this actor adopts them as its own
//! (`adopt.rs`, PROTOCOL.md §14.1).
//!
//! [`CleanupActor`]: crate::cleanup::CleanupActor

mod adopt;
mod expiry;
mod others;
mod progress;
pub mod records;
pub mod standby;
mod status;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use log::{info, warn};
use serde::Serialize;

use crate::changelog::{ChangeLog, ChangeLogError, StateChange, StoredReservation};
use crate::cleanup::{CleanupActor, ReservationClosed, ReservationOpened};
use crate::clock::Clock;
use crate::instance::recorder::{InstanceRecorder, RecordEnd};
use crate::reservation::records::{EndedElsewhere, HeldReservation, ListHeld, RecordedEnd};

pub use self::adopt::{Adopt, HandedOver};
pub use self::expiry::ExpireReservations;
pub use self::progress::{Progress, ProgressInfo, Restore};
pub use self::status::{BackupRead, ReservationError, ReservationEvent, SnapshotStatus};
use crate::session_end::{SessionEnd, SessionId};
use crate::streamer::GetSnapshotBase;
use crate::watermark::Watermark;

/// Opens (or replaces) the reservation of `task_id`, held by the session `session_id`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reserve {
    pub task_id: String,
    pub session_id: SessionId,
    pub session: Recipient<ReservationEvent>,
}

/// The session `session_id` of `task_id` stopped: its reservation ends as a drop.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Release {
    pub task_id: String,
    pub session_id: SessionId,
}

/// The task subscribed with `initial=true`: end its reservation, reporting the held time.
/// Answers the held time, or `None` if the task held no reservation.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Option<Duration>")]
pub struct EndBySubscription {
    pub task_id: String,
}

/// Stops the actor. `end` is the close every reservation's session is told first (1001 on a
/// graceful stop), `None` when the service closes every session itself (a deposed owner's step
/// down). Either way the delay does not grow, and what was written down stays, to be orphaned
/// at the next start.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Stop {
    pub end: Option<SessionEnd>,
}

/// Lists open reservations for `/status`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Vec<ReservationInfo>")]
pub struct ListReservations;

/// Asks for the counters of `/metrics`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "ReservationStats")]
pub struct GetReservationStats;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReservationInfo {
    #[serde(rename = "taskID")]
    pub task_id: String,
    #[serde(rename = "heldMs")]
    pub held_ms: i64,
    /// Open when the service last stopped; no socket holds it (PROTOCOL.md §13).
    pub orphaned: bool,
    /// Its status was sent (with the VFS source: the backup was verified first, PROTOCOL.md §6.7).
    pub verified: bool,
    /// What its replica reported (PROTOCOL.md §6.8); absent before a first progress message.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressInfo>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReservationStats {
    /// Reservations ended by `--max-reservation-ms`.
    pub expired_total: u64,
}

/// The socket holding a reservation.
struct Holder {
    session_id: SessionId,
    session: Recipient<ReservationEvent>,
}

struct Reservation {
    /// `None`: orphaned, found written down at start, or recorded by an instance now gone.
    holder: Option<Holder>,
    started_ms: i64,
    /// The status went out.
    status_sent: bool,
    /// An orphan ends once this time (unix ms) has passed (PROTOCOL.md §13 (b)).
    orphan_end_ms: i64,
    /// The size its status carried and its replica's progress (PROTOCOL.md §6.8).
    restore: Restore,
}

/// See the module documentation.
pub struct ReservationActor {
    clock: Clock,
    backup_url: String,
    change_log: Recipient<GetSnapshotBase>,
    cleanup: Addr<CleanupActor>,
    reservations: HashMap<String, Reservation>,
    /// `--max-reservation-ms`; `None`: no cap.
    max_reservation: Option<Duration>,
    /// Status waits for a verified backup (VFS source).
    verify_backup: bool,
    /// Status waits for the backup to cover the watermark recorded before the restart
    /// (PROTOCOL.md §13.1), until the cleanup actor says [`BackupCovered`].
    ///
    /// [`BackupCovered`]: crate::restart_catch_up::BackupCovered
    held_after_restart: bool,
    /// The newest backed-up watermark a poll read.
    backed_up: Option<Watermark>,
    /// The size of the backup as the latest poll read it (VFS source, PROTOCOL.md §6.3).
    replica_size: Option<u64>,
    /// Where reservations are written down; `None` keeps them in memory only (the replay).
    store: Option<ChangeLog>,
    expired_total: u64,
    timer: Option<SpawnHandle>,
    /// This instance's record in a shared change DB, through which the other instances'
    /// reservations and the ends by subscription are read (`others.rs`); `None` on SQLite.
    records: Option<Addr<InstanceRecorder>>,
    others: others::Others,
}

impl ReservationActor {
    pub fn new(
        clock: Clock,
        backup_url: String,
        change_log: Recipient<GetSnapshotBase>,
        cleanup: Addr<CleanupActor>,
    ) -> Self {
        ReservationActor {
            clock,
            backup_url,
            change_log,
            cleanup,
            reservations: HashMap::new(),
            max_reservation: None,
            verify_backup: false,
            held_after_restart: false,
            backed_up: None,
            replica_size: None,
            store: None,
            expired_total: 0,
            timer: None,
            records: None,
            others: others::Others::default(),
        }
    }

    /// Ends reservations held longer than `max` (PROTOCOL.md §6.6); `None`: no cap.
    pub fn with_max_reservation(mut self, max: Option<Duration>) -> Self {
        self.max_reservation = max;
        self
    }

    /// Sends a reservation's status only once a poll read a backup that the change log can
    /// serve from (PROTOCOL.md §6.7).
    pub fn verifying_backups(mut self) -> Self {
        self.verify_backup = true;
        self
    }

    /// Holds every status until the cleanup actor says the backup covers the watermark recorded
    /// before the restart (PROTOCOL.md §13.1).
    pub fn held_until_backup_covers(mut self) -> Self {
        self.held_after_restart = true;
        self
    }

    /// Reads the other instances' reservations and the ends by subscription through
    /// `recorder` at each [`SyncRecords`](crate::cleanup::SyncRecords), and records this instance's ends there
    /// (PROTOCOL.md §14.1).
    pub fn with_records(mut self, recorder: Addr<InstanceRecorder>) -> Self {
        self.records = Some(recorder);
        self
    }

    /// Queues `change` on the change log's writer; the answer resolves once it is durable.
    fn write_down(
        &self,
        change: StateChange,
    ) -> Option<impl std::future::Future<Output = Result<(), crate::changelog::ChangeLogError>>>
    {
        self.store.as_ref().map(|s| s.save_state(change))
    }

    /// Erases the written-down reservation of `task_id` (queued now, in order).
    fn erase(&self, task_id: &str, ctx: &mut Context<Self>) {
        if let Some(done) = self.write_down(StateChange::ReservationEnded(task_id.to_string())) {
            let task = task_id.to_string();
            done.into_actor(self)
                .map(move |r, _, _| {
                    if let Err(e) = r {
                        warn!(
                            task:% = task; "end of the reservation of task {task} could not be written down: {e}"
                        );
                    }
                })
                .spawn(ctx);
        }
    }

    /// Removes the reservation of `task_id` if `session_id` (when given) still holds it.
    fn remove(&mut self, task_id: &str, session_id: Option<SessionId>) -> Option<Reservation> {
        let held_by = |r: &Reservation| r.holder.as_ref().map(|h| h.session_id);
        match self.reservations.get(task_id) {
            Some(r) if session_id.is_none() || held_by(r) == session_id => {
                self.reservations.remove(task_id)
            }
            _ => None,
        }
    }

    fn closed(&self, task_id: &str, held: Option<Duration>) {
        self.cleanup.do_send(ReservationClosed {
            task_id: task_id.to_string(),
            ended_by_subscription_after: held,
        });
    }
}

impl Actor for ReservationActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        for task_id in self.reservations.keys() {
            self.cleanup.do_send(ReservationOpened {
                task_id: task_id.clone(),
            });
        }
        self.arm_timer(ctx);
    }
}

impl ReservationActor {
    /// Ends the reservation of `task_id` held by `session_id`, which could not be written
    /// down: its socket is told why (a reservation that is not stored protects nothing across
    /// a restart).
    pub(super) fn fail_unstored(
        &mut self,
        task_id: &str,
        session_id: SessionId,
        e: ChangeLogError,
    ) {
        if let Some(res) = self.remove(task_id, Some(session_id)) {
            if let Some(h) = res.holder {
                h.session.do_send(ReservationEvent::Failed(Arc::new(
                    ReservationError::NotStored(e),
                )));
            }
            self.closed(task_id, None);
        }
    }

    /// Ends the reservation `task_id` holds, if any, as replaced by `by` (session
    /// `session_id`): its socket is told to close; an orphan just goes.
    pub(super) fn replace(&mut self, task_id: &str, session_id: SessionId, by: &str) {
        if let Some(old) = self.remove(task_id, None) {
            match old.holder {
                Some(h) => {
                    info!(task:% = task_id; "reservation of task {task_id} replaced by {by} (session {} -> {session_id})", h.session_id);
                    h.session
                        .do_send(ReservationEvent::Closed(SessionEnd::Replaced));
                }
                None => {
                    info!(task:% = task_id; "orphaned reservation of task {task_id} replaced by {by} (session {session_id})")
                }
            }
            self.closed(task_id, None);
        }
    }
}

impl Handler<Reserve> for ReservationActor {
    type Result = ();

    fn handle(&mut self, msg: Reserve, ctx: &mut Context<Self>) {
        let Reserve {
            task_id,
            session_id,
            session,
        } = msg;
        self.replace(&task_id, session_id, "a new one");
        let started_ms = self.clock.now_ms();
        info!(task:% = task_id; "snapshot reservation opened by task {task_id} (session {session_id})");
        self.reservations.insert(
            task_id.clone(),
            Reservation {
                holder: Some(Holder {
                    session_id,
                    session,
                }),
                started_ms,
                status_sent: false,
                orphan_end_ms: 0,
                restore: Restore::default(),
            },
        );
        self.cleanup.do_send(ReservationOpened {
            task_id: task_id.clone(),
        });
        self.arm_timer(ctx);

        // The session is registered before the status is known, so that it can start pinging
        // at once. The status follows once the reservation is written down (a replica is only
        // told to restore once a restart cannot forget it) and the change log answers.
        match self.write_down(StateChange::ReservationOpened(StoredReservation {
            task_id: task_id.clone(),
            started_ms,
        })) {
            None => self.send_status(task_id, session_id, ctx),
            Some(done) => done
                .into_actor(self)
                .map(move |r, act, ctx| match r {
                    Ok(()) => act.send_status(task_id, session_id, ctx),
                    Err(e) => {
                        warn!(task:% = task_id; "failing snapshot reservation of task {task_id}: it could not be written down: {e}");
                        act.fail_unstored(&task_id, session_id, e);
                    }
                })
                .spawn(ctx),
        };
    }
}

impl Handler<Release> for ReservationActor {
    type Result = ();
    fn handle(&mut self, msg: Release, ctx: &mut Context<Self>) {
        if self.remove(&msg.task_id, Some(msg.session_id)).is_some() {
            info!(
                task:% = msg.task_id; "snapshot reservation of task {} dropped by its client (session {}); cleanup delay unchanged",
                msg.task_id, msg.session_id
            );
            self.erase(&msg.task_id, ctx);
            self.closed(&msg.task_id, None);
        }
    }
}

impl ReservationActor {
    /// Ends the reservation of `task_id` by its subscription, accepted at `ended_ms` (here, or
    /// at another instance: `at`), reporting the held time.
    fn end_by_subscription(
        &mut self,
        task_id: &str,
        ended_ms: i64,
        at: &str,
        ctx: &mut Context<Self>,
    ) -> Option<Duration> {
        let res = self.remove(task_id, None)?;
        // Measured on the injected clock; a clock set back measures nothing.
        let held = Duration::from_millis((ended_ms - res.started_ms).max(0) as u64);
        let orphaned = if res.holder.is_none() {
            " (orphaned)"
        } else {
            ""
        };
        info!(
            task:% = task_id; "snapshot reservation{orphaned} of task {task_id} ended by its subscription{at} after {} ms",
            held.as_millis()
        );
        if let Some(h) = res.holder {
            h.session
                .do_send(ReservationEvent::Closed(SessionEnd::EndedBySubscription));
        }
        self.erase(task_id, ctx);
        self.closed(task_id, Some(held));
        Some(held)
    }
}

impl Handler<EndBySubscription> for ReservationActor {
    type Result = Option<Duration>;
    fn handle(&mut self, msg: EndBySubscription, ctx: &mut Context<Self>) -> Option<Duration> {
        let now = self.clock.now_ms();
        // Whoever else holds the task (a standby's socket) learns it from the change DB.
        if let Some(records) = &self.records {
            let task = msg.task_id.clone();
            let end = RecordedEnd {
                task_id: msg.task_id.clone(),
                ended_ms: now,
                started_ms: None,
            };
            records
                .send(RecordEnd(end))
                .into_actor(self)
                .map(move |r, _, _| match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(task:% = task; "the end by subscription of task {task} could not be recorded in the change DB: {e}"),
                    Err(_) => warn!(task:% = task; "the end by subscription of task {task} could not be recorded: the instance recorder is gone"),
                })
                .spawn(ctx);
        }
        self.end_by_subscription(&msg.task_id, now, "", ctx)
    }
}

impl Handler<EndedElsewhere> for ReservationActor {
    type Result = ();
    fn handle(&mut self, msg: EndedElsewhere, ctx: &mut Context<Self>) {
        for end in msg.0 {
            let ends = self
                .reservations
                .get(&end.task_id)
                .is_some_and(|r| r.holder.is_some() && end.ends(r.started_ms));
            if ends {
                self.end_by_subscription(&end.task_id, end.ended_ms, " at another instance", ctx);
            }
        }
    }
}

impl Handler<ListHeld> for ReservationActor {
    type Result = MessageResult<ListHeld>;
    fn handle(&mut self, _: ListHeld, _: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.reservations
                .iter()
                .filter(|(_, r)| r.holder.is_some())
                .map(|(t, r)| HeldReservation {
                    task_id: t.clone(),
                    started_ms: r.started_ms,
                })
                .collect(),
        )
    }
}

impl Handler<Stop> for ReservationActor {
    type Result = ();
    fn handle(&mut self, msg: Stop, ctx: &mut Context<Self>) {
        if let Some(end) = msg.end {
            for (task_id, res) in std::mem::take(&mut self.reservations) {
                if let Some(h) = res.holder {
                    info!(task:% = task_id; "closing snapshot reservation of task {task_id}: service stopping");
                    h.session.do_send(ReservationEvent::Closed(end.clone()));
                }
                self.closed(&task_id, None);
            }
        }
        ctx.stop();
    }
}

impl Handler<ListReservations> for ReservationActor {
    type Result = MessageResult<ListReservations>;
    fn handle(&mut self, _: ListReservations, _: &mut Context<Self>) -> Self::Result {
        let now = self.clock.now_ms();
        let mut list: Vec<ReservationInfo> = self
            .reservations
            .iter()
            .map(|(t, r)| ReservationInfo {
                task_id: t.clone(),
                held_ms: now - r.started_ms,
                orphaned: r.holder.is_none(),
                verified: r.status_sent || !(self.verify_backup || self.held_after_restart),
                progress: r.restore.info(now),
            })
            .collect();
        list.sort_by(|a, b| a.task_id.cmp(&b.task_id));
        MessageResult(list)
    }
}

impl Handler<GetReservationStats> for ReservationActor {
    type Result = MessageResult<GetReservationStats>;
    fn handle(&mut self, _: GetReservationStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(ReservationStats {
            expired_total: self.expired_total,
        })
    }
}
