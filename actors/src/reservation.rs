//! `ReservationActor`: snapshot reservations, one per task (SPEC §6).
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
//!   cleanup delay; every other end ([`Release`], replacement, failure, [`CloseAll`]) does not.
//!
//! [`CleanupActor`]: crate::cleanup::CleanupActor

use std::collections::HashMap;

use actix::prelude::*;
use log::{info, warn};
use serde::Serialize;

use crate::changelog::{ChangeLogState, GetChangeLogState};
use crate::cleanup::{CleanupActor, ReservationClosed, ReservationOpened};
use crate::clock::Clock;
use crate::session::{SessionEnd, SessionId};

/// What a reservation's session is told.
#[derive(Message, Debug, Clone, PartialEq)]
#[rtype(result = "()")]
pub enum ReservationEvent {
    /// The one status message: `["status", {...}]`.
    Status(SnapshotStatus),
    /// The change log could not answer; the reservation is gone.
    Failed(String),
    /// The reservation ended; close the socket.
    Closed(SessionEnd),
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
}

impl SnapshotStatus {
    /// The wire message, fields in the order above:
    /// `["status",{"tag":"status","backupURL":…,"replicaVersion":…,"minWatermark":…}]`.
    pub fn to_message(&self) -> String {
        serde_json::to_string(&("status", self)).unwrap_or_default()
    }
}

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
#[rtype(result = "Option<i64>")]
pub struct EndBySubscription {
    pub task_id: String,
}

/// Closes every reservation (service stop); the delay does not grow.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct CloseAll;

/// Lists open reservations for `/status`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Vec<ReservationInfo>")]
pub struct ListReservations;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReservationInfo {
    #[serde(rename = "taskID")]
    pub task_id: String,
    #[serde(rename = "heldMs")]
    pub held_ms: i64,
}

struct Reservation {
    session_id: SessionId,
    started_ms: i64,
    session: Recipient<ReservationEvent>,
}

/// See the module documentation.
pub struct ReservationActor {
    clock: Clock,
    backup_url: String,
    change_log: Recipient<GetChangeLogState>,
    cleanup: Addr<CleanupActor>,
    reservations: HashMap<String, Reservation>,
}

impl ReservationActor {
    pub fn new(
        clock: Clock,
        backup_url: String,
        change_log: Recipient<GetChangeLogState>,
        cleanup: Addr<CleanupActor>,
    ) -> Self {
        ReservationActor {
            clock,
            backup_url,
            change_log,
            cleanup,
            reservations: HashMap::new(),
        }
    }

    /// Removes the reservation of `task_id` if `session_id` (when given) still holds it.
    fn remove(&mut self, task_id: &str, session_id: Option<SessionId>) -> Option<Reservation> {
        match self.reservations.get(task_id) {
            Some(r) if session_id.is_none_or(|id| id == r.session_id) => {
                self.reservations.remove(task_id)
            }
            _ => None,
        }
    }

    fn closed(&self, task_id: &str, held: Option<i64>) {
        self.cleanup.do_send(ReservationClosed {
            task_id: task_id.to_string(),
            ended_by_subscription_after_ms: held,
        });
    }
}

impl Actor for ReservationActor {
    type Context = Context<Self>;
}

impl Handler<Reserve> for ReservationActor {
    type Result = ();

    fn handle(&mut self, msg: Reserve, ctx: &mut Context<Self>) {
        let Reserve {
            task_id,
            session_id,
            session,
        } = msg;
        if let Some(old) = self.remove(&task_id, None) {
            info!("reservation of task {task_id} replaced by a newer one (session {} -> {session_id})", old.session_id);
            old.session
                .do_send(ReservationEvent::Closed(SessionEnd::Replaced));
            self.closed(&task_id, None);
        }
        info!("snapshot reservation opened by task {task_id} (session {session_id})");
        self.reservations.insert(
            task_id.clone(),
            Reservation {
                session_id,
                started_ms: self.clock.now_ms(),
                session,
            },
        );
        self.cleanup.do_send(ReservationOpened {
            task_id: task_id.clone(),
        });

        // The session is registered before the status is known, so that it can start pinging at
        // once; the status follows when the change log answers.
        self.change_log
            .send(GetChangeLogState)
            .into_actor(self)
            .map(move |answer, act, _| {
                let state: Result<ChangeLogState, String> = match answer {
                    Ok(r) => r,
                    Err(e) => Err(format!("change log unavailable: {e}")),
                };
                let current = act
                    .reservations
                    .get_mut(&task_id)
                    .filter(|r| r.session_id == session_id);
                let Some(res) = current else {
                    return; // ended (or replaced) before the status was known
                };
                match state {
                    Ok(s) => {
                        res.session
                            .do_send(ReservationEvent::Status(SnapshotStatus {
                                tag: "status",
                                backup_url: act.backup_url.clone(),
                                replica_version: s.replica_version,
                                min_watermark: s.min_watermark,
                            }));
                    }
                    Err(e) => {
                        warn!("failing snapshot reservation of task {task_id}: {e}");
                        res.session.do_send(ReservationEvent::Failed(e));
                        act.remove(&task_id, Some(session_id));
                        act.closed(&task_id, None);
                    }
                }
            })
            .spawn(ctx);
    }
}

impl Handler<Release> for ReservationActor {
    type Result = ();
    fn handle(&mut self, msg: Release, _: &mut Context<Self>) {
        if self.remove(&msg.task_id, Some(msg.session_id)).is_some() {
            info!(
                "snapshot reservation of task {} dropped by its client (session {}); cleanup delay unchanged",
                msg.task_id, msg.session_id
            );
            self.closed(&msg.task_id, None);
        }
    }
}

impl Handler<EndBySubscription> for ReservationActor {
    type Result = Option<i64>;
    fn handle(&mut self, msg: EndBySubscription, _: &mut Context<Self>) -> Option<i64> {
        let res = self.remove(&msg.task_id, None)?;
        let held = self.clock.now_ms() - res.started_ms;
        info!(
            "snapshot reservation of task {} ended by its subscription after {held} ms",
            msg.task_id
        );
        res.session
            .do_send(ReservationEvent::Closed(SessionEnd::EndedBySubscription));
        self.closed(&msg.task_id, Some(held));
        Some(held)
    }
}

impl Handler<CloseAll> for ReservationActor {
    type Result = ();
    fn handle(&mut self, _: CloseAll, _: &mut Context<Self>) {
        for (task_id, res) in std::mem::take(&mut self.reservations) {
            info!("closing snapshot reservation of task {task_id}: service stopping");
            res.session
                .do_send(ReservationEvent::Closed(SessionEnd::ServiceStop));
            self.closed(&task_id, None);
        }
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
            })
            .collect();
        list.sort_by(|a, b| a.task_id.cmp(&b.task_id));
        MessageResult(list)
    }
}
