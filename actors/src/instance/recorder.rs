//! The InstanceRecorder: keeps this instance's record in the shared change DB fresh
//! (PROTOCOL.md §14.1), and answers what it reads there: the instances not gone, and, for a
//! standby's `/status`, the change DB's state.
//!
//! Every [`REFRESH_EVERY`] (a timer on the runtime's clock) it asks the actors this instance
//! serves with (told by [`Serve`], forgotten at [`StandBy`]) for their subscribers and
//! reservations, writes its record through its own unfenced connection ([`InstanceRecords`]),
//! then deletes the records it finds gone. One refresh runs at a time: a slow change DB
//! makes refreshes late, never pile up; a [`Serve`] or [`StandBy`] during one refreshes again
//! as soon as it ends. A lost connection is made anew at the next refresh.
//! [`RecordSubscribers`] (a serving standby's streamer, before it checks a joining subscriber)
//! and [`RecordReservations`] (a standby's reservations, before a status is sent) are
//! answered by the next refresh to start, which asks the streamer and the reservations after
//! the request was made; a refresh that finds its record had lapsed tells a standby's streamer
//! ([`RecordLapsed`]). A serving standby's reservations are rows of its record; each refresh
//! also reads the ends by subscription of the tasks this instance holds and tells their holder
//! ([`EndedElsewhere`], `reservation/records.rs`). The owner's poll reads every instance's
//! reservations and ends through it ([`ReadReservationRecords`], [`ForgetRecords`]), and any
//! instance's accepted `initial=true` subscription records its end ([`RecordEnd`]).
//! The role it records is the change log's own view ([`ChangeLog::is_owner`]), so a deposed
//! owner records itself a standby from its first refresh after the fence failed, before the
//! service has finished stepping down. [`Stop`] deletes the record: a stopped instance is gone
//! at once rather than 10 s later.

use std::time::Duration;

use actix::prelude::*;
use log::{info, warn};

use super::{InstanceId, InstanceRecord, InstanceSeen, Refreshed, LEASE, REFRESH_EVERY};
use crate::changelog::{ChangeDbView, ChangeLog, ChangeLogError, InstanceRecords};
use crate::ownership::Role;
use crate::reservation::records::{
    EndedElsewhere, HeldReservation, ListHeld, RecordedEnd, RecordedReservation, ReservationHolder,
    ReservationRecords,
};
use crate::streamer::{GetStreamerState, RecordLapsed, RecordSubscribers, Streamer};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The actors whose subscribers and reservations this instance records, while it serves.
#[derive(Clone)]
pub struct Holders {
    pub log: ChangeLog,
    pub streamer: Addr<Streamer>,
    /// Whoever holds this instance's reservations: the owner's reservation actor, or a
    /// serving standby's (present when `--litestream-backup-url` is set).
    pub reservations: Option<ReservationHolder>,
}

/// The instance serves with these actors: record their subscribers and reservations.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Serve(pub Holders);

/// The instance stands by: it holds no subscriber or reservation.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StandBy;

/// The instances not gone, this one included.
#[derive(Message)]
#[rtype(result = "Result<Vec<InstanceSeen>, ChangeLogError>")]
pub struct ListInstances;

/// The change log's range and the safety state as stored in the change DB.
#[derive(Message)]
#[rtype(result = "Result<ChangeDbView, ChangeLogError>")]
pub struct GetChangeDbView;

/// Whether the last refresh reached the change DB: `None` before the first one ended.
#[derive(Message)]
#[rtype(result = "Option<bool>")]
pub struct IsReachable;

/// Answered by the next refresh to start, which records the reservations held after this was
/// sent (a standby's reservation is recorded before its status is sent).
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct RecordReservations;

/// The reservations every instance recorded, and every end by subscription (the owner's poll).
#[derive(Message)]
#[rtype(result = "Result<ReservationRecords, ChangeLogError>")]
pub struct ReadReservationRecords;

/// Records an end by subscription at this instance.
#[derive(Message)]
#[rtype(result = "Result<(), ChangeLogError>")]
pub struct RecordEnd(pub RecordedEnd);

/// Forgets reservation rows the owner wrote down as orphans, and ends it applied.
#[derive(Message)]
#[rtype(result = "Result<(), ChangeLogError>")]
pub struct ForgetRecords {
    pub held: Vec<RecordedReservation>,
    pub ends: Vec<RecordedEnd>,
}

/// Deletes this instance's record and stops.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// See the module documentation.
pub struct InstanceRecorder {
    id: InstanceId,
    url: String,
    every: Duration,
    db: Option<InstanceRecords>,
    holders: Option<Holders>,
    refreshing: bool,
    /// What it serves with changed during a refresh: refresh again as soon as it ends.
    again: bool,
    stopping: bool,
    reachable: Option<bool>,
    /// Asked to record now ([`RecordSubscribers`]): answered by the next refresh to start.
    waiting: Vec<oneshot::Sender<Result<(), String>>>,
    /// When the last successful refresh started (the runtime's clock).
    last_ok_start: Option<Instant>,
    /// The [`LEASE`] ran out since the last successful refresh: a standby's subscribers were
    /// given up.
    lease_lost: bool,
}

impl InstanceRecorder {
    /// The recorder of instance `id` on the change DB at `url`.
    pub fn new(id: InstanceId, url: impl Into<String>) -> InstanceRecorder {
        InstanceRecorder {
            id,
            url: url.into(),
            every: REFRESH_EVERY,
            db: None,
            holders: None,
            refreshing: false,
            again: false,
            stopping: false,
            reachable: None,
            waiting: Vec::new(),
            last_ok_start: None,
            lease_lost: false,
        }
    }

    /// The connection, made anew if there is none or it ended.
    fn connection(
        &self,
    ) -> impl std::future::Future<Output = Result<InstanceRecords, ChangeLogError>> {
        let db = self.db.clone().filter(|db| !db.is_closed());
        let url = self.url.clone();
        async move {
            match db {
                Some(db) => Ok(db),
                None => InstanceRecords::connect(&url).await,
            }
        }
    }

    fn refresh(&mut self, ctx: &mut Context<Self>) {
        if self.stopping {
            for w in self.waiting.drain(..) {
                let _ = w.send(Err("the instance is stopping".into()));
            }
            return;
        }
        if self.refreshing {
            self.again = true;
            return;
        }
        self.refreshing = true;
        // This refresh asks the streamer after every request waiting now was made.
        let covered = std::mem::take(&mut self.waiting);
        let started = Instant::now();
        let connection = self.connection();
        let holders = self.holders.clone();
        let id = self.id.clone();
        let work = async move {
            let db = connection.await.map_err(|e| (None, e))?;
            let (record, held) = record(id, holders.as_ref()).await;
            // Rows only from an answer: a holder that stopped leaves its rows as they were.
            let rows = holders
                .as_ref()
                .and_then(|h| h.reservations.as_ref())
                .filter(|r| r.record_rows)
                .and(held.as_deref());
            let refreshed = db.refresh_with(&record, rows).await;
            let refreshed = match refreshed {
                Ok(r) => r,
                Err(e) => return Err((Some(db), e)),
            };
            if let Some(held) = &held {
                ended_elsewhere(&db, holders.as_ref(), held).await;
            }
            let gone = db.sweep_gone().await.unwrap_or_default();
            Ok((db, refreshed, gone))
        };
        ctx.spawn(work.into_actor(self).map(move |done, act, ctx| {
            act.refreshing = false;
            if std::mem::take(&mut act.again) {
                act.refresh(ctx);
            }
            let first = act.reachable.is_none();
            let answer = match &done {
                Ok(_) => Ok(()),
                Err((_, e)) => Err(e.to_string()),
            };
            for w in covered {
                let _ = w.send(answer.clone());
            }
            match done {
                Ok((db, refreshed, gone)) => {
                    if refreshed == Refreshed::New && !first {
                        warn!(
                            "instance {}: its record had lapsed; the other instances may have treated it as gone",
                            act.id
                        );
                        act.lapsed();
                    } else if first || act.reachable == Some(false) {
                        info!("instance {} recorded in change DB {}", act.id, db.location());
                    }
                    for g in gone {
                        info!("instance {g} is gone: its record was deleted");
                    }
                    act.db = Some(db);
                    act.reachable = Some(true);
                    act.last_ok_start = Some(started);
                    act.lease_lost = false;
                }
                Err((db, e)) => {
                    if act.reachable != Some(false) {
                        warn!("instance {}: refreshing its record failed: {e}", act.id);
                    }
                    act.db = db;
                    act.reachable = Some(false);
                }
            }
        }));
    }
}

impl InstanceRecorder {
    /// A serving standby whose last successful refresh started more than [`LEASE`] ago gives
    /// its subscribers up, before the owner can count it gone and purge past them.
    fn check_lease(&mut self) {
        let expired = self.last_ok_start.is_some_and(|t| t.elapsed() > LEASE);
        if !expired || self.lease_lost {
            return;
        }
        if let Some(h) = self.holders.as_ref().filter(|h| !h.log.is_owner()) {
            warn!(
                "instance {}: no refresh of its record succeeded for {LEASE:?}; closing the subscribers it serves",
                self.id
            );
            self.lease_lost = true;
            h.streamer.do_send(RecordLapsed);
        }
    }

    /// The record was gone for the others: the owner may have purged past what this standby's
    /// subscribers acked, so they must start over (the owner's own subscribers are its
    /// streamer's to check, never the records').
    fn lapsed(&self) {
        if let Some(h) = self.holders.as_ref().filter(|h| !h.log.is_owner()) {
            h.streamer.do_send(RecordLapsed);
        }
    }
}

/// Tells the holder of `held` which of them were ended by a subscription recorded at any
/// instance (a failed read is tried again at the next refresh).
async fn ended_elsewhere(
    db: &InstanceRecords,
    holders: Option<&Holders>,
    held: &[HeldReservation],
) {
    let Some(holder) = holders.and_then(|h| h.reservations.as_ref()) else {
        return;
    };
    if held.is_empty() {
        return;
    }
    let tasks: Vec<&str> = held.iter().map(|r| r.task_id.as_str()).collect();
    let ends = match db.ends_for(&tasks).await {
        Ok(ends) => ends,
        Err(e) => {
            warn!("reading the ends by subscription of this instance's reservations failed: {e}");
            return;
        }
    };
    let ending: Vec<RecordedEnd> = ends
        .into_iter()
        .filter(|e| {
            held.iter()
                .any(|r| r.task_id == e.task_id && e.ends(r.started_ms))
        })
        .collect();
    if !ending.is_empty() {
        holder.ended.do_send(EndedElsewhere(ending));
    }
}

/// What this instance holds now, asked of the actors it serves with: its record, and the
/// reservations its sockets hold.
async fn record(
    id: InstanceId,
    holders: Option<&Holders>,
) -> (InstanceRecord, Option<Vec<HeldReservation>>) {
    let Some(h) = holders else {
        let record = InstanceRecord {
            id,
            role: Role::Standby,
            subscribers: Vec::new(),
            reservations: 0,
        };
        return (record, None);
    };
    let role = if h.log.is_owner() {
        Role::Owner
    } else {
        Role::Standby
    };
    let subscribers = match h.streamer.send(GetStreamerState).await {
        Ok(s) => s.subscribers.into_iter().map(|s| (s.id, s.acked)).collect(),
        Err(_) => Vec::new(), // stopped: it holds nobody
    };
    let held = match &h.reservations {
        Some(r) => r.list.send(ListHeld).await.ok(), // stopped: None
        None => None,
    };
    let record = InstanceRecord {
        id,
        role,
        subscribers,
        reservations: held.as_ref().map_or(0, |h| h.len() as u32),
    };
    (record, held)
}

impl Actor for InstanceRecorder {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.refresh(ctx);
        ctx.run_interval(self.every, |act, ctx| {
            act.check_lease();
            act.refresh(ctx);
        });
    }
}

impl Handler<Serve> for InstanceRecorder {
    type Result = ();
    fn handle(&mut self, msg: Serve, ctx: &mut Context<Self>) {
        self.holders = Some(msg.0);
        self.refresh(ctx);
    }
}

impl Handler<StandBy> for InstanceRecorder {
    type Result = ();
    fn handle(&mut self, _: StandBy, ctx: &mut Context<Self>) {
        self.holders = None;
        self.refresh(ctx);
    }
}

impl Handler<ListInstances> for InstanceRecorder {
    type Result = ResponseFuture<Result<Vec<InstanceSeen>, ChangeLogError>>;
    fn handle(&mut self, _: ListInstances, _: &mut Context<Self>) -> Self::Result {
        let connection = self.connection();
        Box::pin(async move { connection.await?.instances().await })
    }
}

impl Handler<GetChangeDbView> for InstanceRecorder {
    type Result = ResponseFuture<Result<ChangeDbView, ChangeLogError>>;
    fn handle(&mut self, _: GetChangeDbView, _: &mut Context<Self>) -> Self::Result {
        let connection = self.connection();
        Box::pin(async move { connection.await?.view().await })
    }
}

impl InstanceRecorder {
    /// Answered by the next refresh to start: the one that asks the actors it serves with
    /// after this request was made. With `serving_only`, refused while it serves nothing
    /// (between phases, or stopping): a subscriber asking to be recorded would not be. (A
    /// standby's reservations are stopped before the record lets them go, and their rows
    /// outlive the record: they are asked for without it.)
    fn record_now(
        &mut self,
        ctx: &mut Context<Self>,
        serving_only: bool,
    ) -> ResponseFuture<Result<(), String>> {
        if serving_only && self.holders.is_none() {
            return Box::pin(async { Err("this instance serves nothing now".into()) });
        }
        let (tx, rx) = oneshot::channel();
        self.waiting.push(tx);
        self.refresh(ctx);
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err("the instance recorder stopped".into()))
        })
    }
}

impl Handler<RecordSubscribers> for InstanceRecorder {
    type Result = ResponseFuture<Result<(), String>>;
    fn handle(&mut self, _: RecordSubscribers, ctx: &mut Context<Self>) -> Self::Result {
        self.record_now(ctx, true)
    }
}

impl Handler<RecordReservations> for InstanceRecorder {
    type Result = ResponseFuture<Result<(), String>>;
    fn handle(&mut self, _: RecordReservations, ctx: &mut Context<Self>) -> Self::Result {
        self.record_now(ctx, false)
    }
}

impl Handler<ReadReservationRecords> for InstanceRecorder {
    type Result = ResponseFuture<Result<ReservationRecords, ChangeLogError>>;
    fn handle(&mut self, _: ReadReservationRecords, _: &mut Context<Self>) -> Self::Result {
        let connection = self.connection();
        let own = self.id.clone();
        Box::pin(async move { connection.await?.reservation_records(own.as_str()).await })
    }
}

impl Handler<RecordEnd> for InstanceRecorder {
    type Result = ResponseFuture<Result<(), ChangeLogError>>;
    fn handle(&mut self, msg: RecordEnd, _: &mut Context<Self>) -> Self::Result {
        let connection = self.connection();
        Box::pin(async move { connection.await?.record_end(&msg.0).await })
    }
}

impl Handler<ForgetRecords> for InstanceRecorder {
    type Result = ResponseFuture<Result<(), ChangeLogError>>;
    fn handle(&mut self, msg: ForgetRecords, _: &mut Context<Self>) -> Self::Result {
        let connection = self.connection();
        Box::pin(async move { connection.await?.forget(&msg.held, &msg.ends).await })
    }
}

impl Handler<IsReachable> for InstanceRecorder {
    type Result = Option<bool>;
    fn handle(&mut self, _: IsReachable, _: &mut Context<Self>) -> Option<bool> {
        self.reachable
    }
}

impl Handler<Stop> for InstanceRecorder {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, _: Stop, _: &mut Context<Self>) -> Self::Result {
        // No refresh starts from here on (one in flight may still write: its record then
        // ends with this connection's session, which is gone once the actor is).
        self.stopping = true;
        let db = self.db.clone().filter(|db| !db.is_closed());
        let id = self.id.clone();
        Box::pin(
            async move {
                if let Some(db) = db {
                    match db.remove(&id).await {
                        Ok(()) => info!("instance {id}: record deleted"),
                        Err(e) => warn!("instance {id}: deleting its record failed: {e}"),
                    }
                }
            }
            .into_actor(self)
            .map(|(), _, ctx| ctx.stop()),
        )
    }
}
