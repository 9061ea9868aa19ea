//! `StandbyReservations`: the snapshot reservations a serving standby's sockets hold
//! (PROTOCOL.md §14.1).
//!
//! A standby does not run the backup monitor and writes nothing of the safety state, so it
//! cannot pause cleanup itself: the owner does, from the standby's record. This actor holds
//! the sockets, one reservation per task (a retry replaces the older one, whose socket closes
//! with 1000), and the rules that make them count at the owner:
//!
//! - **Recorded before the status.** The instance recorder writes the reservations this actor
//!   holds ([`ListHeld`]) as rows of the standby's record at each refresh
//!   (`reservation/records.rs`); a new reservation's status is sent only after a refresh that
//!   recorded it ended ([`RecordReservations`]), so the owner's next poll finds it.
//! - **The same status.** replicaVersion and minWatermark from the standby's streamer
//!   ([`GetSnapshotBase`], read from the change DB), the backup URL of this instance's flags;
//!   with the VFS source it waits, checking every [`REFRESH_EVERY`], until the backup
//!   observations the owner wrote down in the change DB show a watermark at or above the
//!   minWatermark (PROTOCOL.md §6.7).
//! - **Ended by subscription anywhere.** An accepted `initial=true` subscription here records
//!   its end in the change DB (with the start, when this actor holds the task), then closes
//!   the socket with 1000; one at another instance reaches this actor at the next refresh
//!   ([`EndedElsewhere`]): it fills in the start it held, then closes the socket. Either way
//!   the owner grows the delay from the start.
//! - **A drop** (the socket closes, a replacement, a failure): the reservation leaves the
//!   record at the next refresh, and the owner ends it without growth. A stop closes every
//!   socket (1001) and leaves the rows: the owner orphans them once the instance is gone.
//! - **The cap** of `--max-reservation-ms` (PROTOCOL.md §6.6), as at the owner: a reservation
//!   held longer closes with 1011 and the owner's reason, and leaves the record as a drop
//!   (no growth) (`cap.rs`).
//! - **A takeover keeps them**: when this instance becomes the owner, [`HandOver`] gives every
//!   reservation to the owner's `ReservationActor`, and this actor forwards what their
//!   sessions send from then on (`handover.rs`).
//! - **Progress** messages (PROTOCOL.md §6.8) are kept per reservation and shown in `/status`, as
//!   at the owner; the status carries no `replicaSize` here (no backup is polled).

mod cap;
mod handover;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use log::{info, warn};

use super::progress::{log_progress, Progress, Restore};
use super::records::{EndedElsewhere, HeldReservation, ListHeld, RecordedEnd};
use super::status::{ReservationError, ReservationEvent, SnapshotStatus};
use super::{
    EndBySubscription, ListReservations, Release, ReservationActor, ReservationInfo, Reserve, Stop,
};
use crate::changelog::{ChangeDbView, LogRange};
use crate::clock::Clock;
use crate::instance::recorder::{GetChangeDbView, InstanceRecorder, RecordEnd, RecordReservations};
use crate::instance::{InstanceId, REFRESH_EVERY};
use crate::session_end::{SessionEnd, SessionId};
use crate::streamer::{GetSnapshotBase, SnapshotBaseError};
use crate::watermark::Watermark;

pub use self::handover::HandOver;

struct Held {
    session_id: SessionId,
    session: Recipient<ReservationEvent>,
    started_ms: i64,
    status_sent: bool,
    /// Its end by subscription is being written: it closes once written.
    ending: bool,
    /// What its replica reported (PROTOCOL.md §6.8); a standby's status carries no size.
    restore: Restore,
}

/// See the module documentation.
pub struct StandbyReservations {
    clock: Clock,
    instance: InstanceId,
    backup_url: String,
    change_log: Recipient<GetSnapshotBase>,
    recorder: Addr<InstanceRecorder>,
    verify_backup: bool,
    reservations: HashMap<String, Held>,
    /// A check of the waiting reservations' status is armed (VFS source).
    retry: Option<SpawnHandle>,
    /// `--max-reservation-ms`; `None`: no cap.
    max_reservation: Option<Duration>,
    /// Armed for the earliest end by the cap.
    cap_timer: Option<SpawnHandle>,
    /// This instance became the owner: its reservation actor holds what this one held, and
    /// gets what their sessions send (`handover.rs`).
    successor: Option<Addr<ReservationActor>>,
    /// What was handed over, still listed for the record until the owner's actors replace
    /// this one in it (the owner forgets the rows once it wrote them down).
    handed: Vec<HeldReservation>,
}

impl StandbyReservations {
    /// The reservations of standby `instance`, recorded through `recorder`; their status
    /// read through `change_log` (the standby's streamer).
    pub fn new(
        clock: Clock,
        instance: InstanceId,
        backup_url: String,
        change_log: Recipient<GetSnapshotBase>,
        recorder: Addr<InstanceRecorder>,
    ) -> Self {
        StandbyReservations {
            clock,
            instance,
            backup_url,
            change_log,
            recorder,
            verify_backup: false,
            reservations: HashMap::new(),
            retry: None,
            max_reservation: None,
            cap_timer: None,
            successor: None,
            handed: Vec::new(),
        }
    }

    /// The status waits for a verified backup (VFS source, PROTOCOL.md §6.7).
    pub fn verifying_backups(mut self) -> Self {
        self.verify_backup = true;
        self
    }

    /// Whether `session_id` still holds the reservation of `task_id`.
    fn holds(&self, task_id: &str, session_id: SessionId) -> bool {
        self.reservations
            .get(task_id)
            .is_some_and(|r| r.session_id == session_id)
    }

    /// Sends the status of `task_id`'s reservation (held by `session_id`) once the change DB
    /// answers and, with the VFS source, its backup observations verify the backup.
    fn send_status(&mut self, task_id: String, session_id: SessionId, ctx: &mut Context<Self>) {
        let base = self.change_log.send(GetSnapshotBase);
        let view = self
            .verify_backup
            .then(|| self.recorder.send(GetChangeDbView));
        async move {
            let base: Result<LogRange, SnapshotBaseError> = base.await.unwrap_or_else(|e| Err(e.into()));
            let backed_up = match view {
                None => None,
                Some(v) => match v.await {
                    Ok(Ok(view)) => Some(Ok(backed_up(&view))),
                    Ok(Err(e)) => Some(Err(e.to_string())),
                    Err(e) => Some(Err(e.to_string())),
                },
            };
            (base, backed_up)
        }
        .into_actor(self)
        .map(move |(base, backed_up), act, ctx| {
            if !act.holds(&task_id, session_id) {
                return; // ended (or replaced) before the status was known
            }
            let range = match base {
                Ok(range) => range,
                Err(e) => {
                    warn!(task:% = task_id; "failing snapshot reservation of task {task_id} at standby {}: {e}", act.instance);
                    if let Some(r) = act.reservations.remove(&task_id) {
                        r.session
                            .do_send(ReservationEvent::Failed(Arc::new(e.into())));
                    }
                    return;
                }
            };
            let verified = match backed_up {
                None => true,
                Some(Ok(b)) => b.is_some_and(|b| b.as_str() >= range.min_watermark.as_str()),
                Some(Err(e)) => {
                    warn!(task:% = task_id; "snapshot reservation of task {task_id}: the change DB's backup observations could not be read ({e}); checking again");
                    false
                }
            };
            if !verified {
                act.retry_later(ctx);
                return;
            }
            let Some(r) = act.reservations.get_mut(&task_id) else {
                return;
            };
            r.status_sent = true;
            r.session.do_send(ReservationEvent::Status(SnapshotStatus {
                tag: "status",
                backup_url: act.backup_url.clone(),
                replica_version: range.replica_version,
                min_watermark: range.min_watermark,
                // A standby polls no backup: the size is unknown here (PROTOCOL.md §6.3).
                replica_size: None,
            }));
        })
        .spawn(ctx);
    }

    /// Checks every waiting reservation's status again one refresh interval from now.
    fn retry_later(&mut self, ctx: &mut Context<Self>) {
        if self.retry.is_some() {
            return;
        }
        self.retry = Some(ctx.run_later(REFRESH_EVERY, |act, ctx| {
            act.retry = None;
            let waiting: Vec<(String, SessionId)> = act
                .reservations
                .iter()
                .filter(|(_, r)| !r.status_sent && !r.ending)
                .map(|(t, r)| (t.clone(), r.session_id))
                .collect();
            if let Some((task, _)) = waiting.first() {
                info!(task:% = task; "snapshot reservation of task {task} at standby {} waits for a backup at or above the change log's minWatermark", act.instance);
            }
            for (task_id, session_id) in waiting {
                act.send_status(task_id, session_id, ctx);
            }
        }));
    }

    /// Records the end of `task_id`'s reservation by a subscription accepted at `ended_ms`
    /// (with the start, when this actor holds it), then closes its socket with 1000.
    fn end(&mut self, task_id: String, ended_ms: i64, at: &'static str, ctx: &mut Context<Self>) {
        let held = self
            .reservations
            .get_mut(&task_id)
            .filter(|r| r.started_ms <= ended_ms && !r.ending);
        let (started_ms, session_id) = match held {
            Some(r) => {
                r.ending = true;
                (Some(r.started_ms), Some(r.session_id))
            }
            None => (None, None),
        };
        let end = RecordedEnd {
            task_id: task_id.clone(),
            ended_ms,
            started_ms,
        };
        self.recorder
            .send(RecordEnd(end))
            .into_actor(self)
            .map(move |written, act, _| {
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(task:% = task_id; "the end by subscription of task {task_id} could not be recorded in the change DB (standby {}): {e}", act.instance),
                    Err(_) => warn!(task:% = task_id; "the end by subscription of task {task_id} could not be recorded: the instance recorder is gone"),
                }
                let Some(session_id) = session_id else {
                    return;
                };
                if !act.holds(&task_id, session_id) {
                    return;
                }
                if let Some(r) = act.reservations.remove(&task_id) {
                    info!(
                        task:% = task_id; "snapshot reservation of task {task_id} at standby {} ended by its subscription{at} after {} ms",
                        act.instance,
                        (ended_ms - r.started_ms).max(0)
                    );
                    r.session
                        .do_send(ReservationEvent::Closed(SessionEnd::EndedBySubscription));
                }
            })
            .spawn(ctx);
    }
}

/// The newest backed-up watermark the owner wrote down: recorded and not yet scheduled, or
/// the last scheduled one (recorded watermarks up to it are forgotten when it is scheduled).
fn backed_up(view: &ChangeDbView) -> Option<Watermark> {
    view.safety
        .recorded
        .iter()
        .map(|r| &r.watermark)
        .chain(view.safety.last_scheduled.as_ref())
        .max()
        .cloned()
}

impl Actor for StandbyReservations {
    type Context = Context<Self>;
}

impl Handler<Reserve> for StandbyReservations {
    type Result = ();

    fn handle(&mut self, msg: Reserve, ctx: &mut Context<Self>) {
        if let Some(to) = &self.successor {
            to.do_send(msg);
            return;
        }
        let Reserve {
            task_id,
            session_id,
            session,
        } = msg;
        if let Some(old) = self.reservations.remove(&task_id) {
            info!(
                task:% = task_id; "reservation of task {task_id} at standby {} replaced by a newer one (session {} -> {session_id})",
                self.instance, old.session_id
            );
            old.session
                .do_send(ReservationEvent::Closed(SessionEnd::Replaced));
        }
        info!(
            task:% = task_id; "snapshot reservation opened by task {task_id} at standby {} (session {session_id})",
            self.instance
        );
        self.reservations.insert(
            task_id.clone(),
            Held {
                session_id,
                session,
                started_ms: self.clock.now_ms(),
                status_sent: false,
                ending: false,
                restore: Restore::default(),
            },
        );
        self.arm_cap(ctx);
        // The status follows once a refresh recorded the reservation: the owner's next poll
        // then finds it (PROTOCOL.md §14.1).
        self.recorder
            .send(RecordReservations)
            .into_actor(self)
            .map(move |recorded, act, ctx| {
                let failed = match recorded {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e),
                    Err(e) => Some(e.to_string()),
                };
                match failed {
                    None => act.send_status(task_id, session_id, ctx),
                    Some(e) => {
                        if !act.holds(&task_id, session_id) {
                            return;
                        }
                        warn!(task:% = task_id; "failing snapshot reservation of task {task_id} at standby {}: it could not be recorded in the change DB: {e}", act.instance);
                        if let Some(r) = act.reservations.remove(&task_id) {
                            r.session.do_send(ReservationEvent::Failed(Arc::new(
                                ReservationError::NotRecorded(e),
                            )));
                        }
                    }
                }
            })
            .spawn(ctx);
    }
}

impl Handler<Release> for StandbyReservations {
    type Result = ();
    fn handle(&mut self, msg: Release, _: &mut Context<Self>) {
        if let Some(to) = &self.successor {
            to.do_send(msg);
            return;
        }
        if self.holds(&msg.task_id, msg.session_id) {
            self.reservations.remove(&msg.task_id);
            info!(
                task:% = msg.task_id; "snapshot reservation of task {} at standby {} dropped by its client (session {}); cleanup delay unchanged",
                msg.task_id, self.instance, msg.session_id
            );
        }
    }
}

impl Handler<Progress> for StandbyReservations {
    type Result = ();
    fn handle(&mut self, msg: Progress, _: &mut Context<Self>) {
        if let Some(to) = &self.successor {
            to.do_send(msg);
            return;
        }
        let now = self.clock.now_ms();
        let Some(r) = self.reservations.get_mut(&msg.task_id) else {
            return;
        };
        if r.session_id == msg.session_id {
            let first = r.restore.record(now, msg.bytes);
            log_progress(&msg, first, &r.restore);
        }
    }
}

impl Handler<EndBySubscription> for StandbyReservations {
    type Result = ResponseFuture<Option<Duration>>;
    fn handle(&mut self, msg: EndBySubscription, ctx: &mut Context<Self>) -> Self::Result {
        if let Some(to) = &self.successor {
            let sent = to.send(msg);
            return Box::pin(async move { sent.await.unwrap_or(None) });
        }
        let now = self.clock.now_ms();
        let held = self
            .reservations
            .get(&msg.task_id)
            .map(|r| Duration::from_millis((now - r.started_ms).max(0) as u64));
        self.end(msg.task_id, now, "", ctx);
        Box::pin(async move { held })
    }
}

impl Handler<EndedElsewhere> for StandbyReservations {
    type Result = ();
    fn handle(&mut self, msg: EndedElsewhere, ctx: &mut Context<Self>) {
        for end in msg.0 {
            let ends = self
                .reservations
                .get(&end.task_id)
                .is_some_and(|r| !r.ending && end.ends(r.started_ms));
            if ends {
                self.end(end.task_id, end.ended_ms, " at another instance", ctx);
            }
        }
    }
}

impl Handler<ListHeld> for StandbyReservations {
    type Result = MessageResult<ListHeld>;
    fn handle(&mut self, _: ListHeld, _: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.reservations
                .iter()
                .map(|(t, r)| HeldReservation {
                    task_id: t.clone(),
                    started_ms: r.started_ms,
                })
                .chain(self.handed.iter().cloned())
                .collect(),
        )
    }
}

impl Handler<ListReservations> for StandbyReservations {
    type Result = MessageResult<ListReservations>;
    fn handle(&mut self, _: ListReservations, _: &mut Context<Self>) -> Self::Result {
        let now = self.clock.now_ms();
        let mut list: Vec<ReservationInfo> = self
            .reservations
            .iter()
            .map(|(t, r)| ReservationInfo {
                task_id: t.clone(),
                held_ms: now - r.started_ms,
                orphaned: false,
                verified: r.status_sent || !self.verify_backup,
                progress: r.restore.info(now),
            })
            .collect();
        list.sort_by(|a, b| a.task_id.cmp(&b.task_id));
        MessageResult(list)
    }
}

impl Handler<Stop> for StandbyReservations {
    type Result = ();
    fn handle(&mut self, msg: Stop, ctx: &mut Context<Self>) {
        if let Some(end) = msg.end {
            for (task_id, r) in self.reservations.drain() {
                info!(
                    task:% = task_id; "closing snapshot reservation of task {task_id} at standby {}: {}",
                    self.instance,
                    end.close_frame().1
                );
                r.session.do_send(ReservationEvent::Closed(end.clone()));
            }
        }
        ctx.stop();
    }
}
