//! The reservations other instances hold, as the owner sees them (PROTOCOL.md §14.1): read
//! from the change DB at each backup poll, before cleanup is scheduled.
//!
//! The [`CleanupActor`] asks for them ([`SyncRecords`]) at every poll, between recording what
//! the poll saw and scheduling, so a reservation recorded at a standby pauses the scheduling
//! of the first poll that starts after it was recorded, like one held here. The answer
//! ([`OthersView`]) names what pauses and the held times of the ends by subscription found
//! (applied before this poll schedules, as the owner's own end would have been). What the
//! records say (`records.rs`) is turned into the owner's rules:
//!
//! - A reservation in a live instance's record pauses cleanup unless an end by subscription of
//!   its task, accepted after it opened, is recorded. Gone from that record without such an
//!   end, it was dropped: the delay stays.
//! - An end grows the delay once, by the time from the reservation's start (the row's, or
//!   the start its holder filled in) to the subscription; an end of a reservation the owner
//!   holds (its own, or an orphan) ends it as its own `initial=true` subscription would. The
//!   end is forgotten at a later poll, once no live instance records its task any more (so its
//!   holder had the time to read it and close the socket).
//! - A reservation recorded by an instance that is gone (or by this owner during its standby
//!   phase, which it no longer serves) becomes this owner's **orphan** (PROTOCOL.md §13): written
//!   down as its own with the original start, then forgotten in the records. It ends by §13's
//!   rules, (b) counted from the poll that found it gone. The rows of the reservations it
//!   adopted at its takeover (`adopt.rs`) are the exception: they are its own, and only
//!   forgotten.
//!
//! [`CleanupActor`]: crate::cleanup::CleanupActor

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use actix::prelude::*;
use log::{info, warn};

use super::expiry::millis;
use super::records::{RecordedEnd, RecordedReservation, ReservationRecords};
use super::{Reservation, ReservationActor, Restore};
use crate::changelog::{StateChange, StoredReservation};
use crate::cleanup::{OthersView, RecordsError, ReservationOpened, SyncRecords};
use crate::instance::recorder::{ForgetRecords, ReadReservationRecords};

/// What the actor remembers of the records between polls.
#[derive(Default)]
pub(super) struct Others {
    polls: u64,
    /// The open reservations of live instances at the last poll: (instance, task) → start.
    open: BTreeMap<(String, String), i64>,
    /// The ends applied, by (task, end time), with the poll that applied them.
    applied: HashMap<(String, i64), u64>,
    /// The rows (instance, task, start) of the reservations adopted from this instance's
    /// standby phase (`adopt.rs`): never orphans, only forgotten.
    pub(super) handed_over: HashSet<(String, String, i64)>,
}

impl Handler<SyncRecords> for ReservationActor {
    type Result = ResponseActFuture<Self, Result<OthersView, RecordsError>>;

    fn handle(&mut self, msg: SyncRecords, _: &mut Context<Self>) -> Self::Result {
        let Some(records) = self.records.clone() else {
            return Box::pin(fut::ready(Ok(OthersView::default())));
        };
        Box::pin(
            async move { records.send(ReadReservationRecords).await }
                .into_actor(self)
                .map(move |read, act, ctx| {
                    let read = read.map_err(|_| RecordsError::RecorderGone)??;
                    Ok(act.sync(read, msg.cleanup_delay, ctx))
                }),
        )
    }
}

impl ReservationActor {
    /// Applies one poll's records (see the module documentation).
    fn sync(
        &mut self,
        records: ReservationRecords,
        cleanup_delay: Duration,
        ctx: &mut Context<Self>,
    ) -> OthersView {
        self.others.polls += 1;
        let poll = self.others.polls;
        let ReservationRecords { held, ends } = records;
        let (live, gone): (Vec<RecordedReservation>, Vec<RecordedReservation>) =
            held.into_iter().partition(|r| r.live);
        // Adopted at the takeover, already this owner's own: their rows are only forgotten.
        let (handed_over, gone): (Vec<RecordedReservation>, Vec<RecordedReservation>) =
            gone.into_iter().partition(|r| {
                let row = (r.instance.clone(), r.task_id.clone(), r.started_ms);
                self.others.handed_over.contains(&row)
            });
        let mut view = OthersView::default();

        // Gone instances' reservations: this owner's orphans from now on.
        let orphaned = self.adopt(gone, cleanup_delay, ctx);
        view.paused_by.extend(orphaned);

        let forget = self.apply_ends(&ends, &live, poll, &mut view, ctx);
        self.track_open(&live, &ends, &mut view);

        if !forget.is_empty() || !handed_over.is_empty() {
            self.forget(handed_over, forget, ctx);
        }
        view
    }

    /// The ends by subscription recorded (PROTOCOL.md §14.1): one of a reservation this owner
    /// holds ends it; another's grows the delay once (`view.grown`). Answers the ends applied
    /// at an earlier poll whose holders are gone, to forget.
    fn apply_ends(
        &mut self,
        ends: &[RecordedEnd],
        live: &[RecordedReservation],
        poll: u64,
        view: &mut OthersView,
        ctx: &mut Context<Self>,
    ) -> Vec<RecordedEnd> {
        let mut forget = Vec::new();
        for e in ends {
            let own = self
                .reservations
                .get(&e.task_id)
                .is_some_and(|r| e.ends(r.started_ms));
            if own {
                self.end_by_subscription(&e.task_id, e.ended_ms, " at another instance", ctx);
            }
            let holders: Vec<&RecordedReservation> = live
                .iter()
                .filter(|r| r.task_id == e.task_id && e.ends(r.started_ms))
                .collect();
            match self.others.applied.get(&(e.task_id.clone(), e.ended_ms)) {
                None => {
                    let start = e
                        .started_ms
                        .or_else(|| holders.iter().map(|r| r.started_ms).min());
                    if let (Some(start), false) = (start, own) {
                        let held = Duration::from_millis((e.ended_ms - start).max(0) as u64);
                        let at = holders
                            .first()
                            .map(|r| format!(" at instance {}", r.instance))
                            .unwrap_or_default();
                        info!(
                            task:% = e.task_id; "snapshot reservation of task {}{at} ended by its subscription after {} ms",
                            e.task_id,
                            held.as_millis()
                        );
                        view.grown.push((e.task_id.clone(), held));
                    }
                    self.others
                        .applied
                        .insert((e.task_id.clone(), e.ended_ms), poll);
                }
                Some(at) if *at < poll && holders.is_empty() => forget.push(e.clone()),
                Some(_) => {}
            }
        }
        self.others
            .applied
            .retain(|(t, at), _| ends.iter().any(|e| e.task_id == *t && e.ended_ms == *at));

        forget
    }

    /// The open reservations of live instances, each pausing cleanup (`view.paused_by`) unless
    /// an end of it is recorded; logs those found and those dropped since the last poll.
    fn track_open(
        &mut self,
        live: &[RecordedReservation],
        ends: &[RecordedEnd],
        view: &mut OthersView,
    ) {
        let ended_by = |r: &RecordedReservation| {
            ends.iter()
                .any(|e| e.task_id == r.task_id && e.ends(r.started_ms))
        };
        let open: BTreeMap<(String, String), i64> = live
            .iter()
            .filter(|r| !ended_by(r))
            .map(|r| ((r.instance.clone(), r.task_id.clone()), r.started_ms))
            .collect();
        for (instance, task) in open.keys() {
            if !self
                .others
                .open
                .contains_key(&(instance.clone(), task.clone()))
            {
                info!(task:% = task; "snapshot reservation of task {task} held at instance {instance}: pausing change-log cleanup");
            }
        }
        for ((instance, task), started) in &self.others.open {
            let still = live
                .iter()
                .any(|r| &r.instance == instance && &r.task_id == task && r.started_ms == *started);
            if !still {
                info!(task:% = task; "snapshot reservation of task {task} at instance {instance} dropped; cleanup delay unchanged");
            }
        }
        view.paused_by.extend(
            open.keys()
                .map(|(instance, task)| format!("{task}@{instance}")),
        );
        self.others.open = open;
    }

    /// Writes the reservations of gone instances down as this owner's orphans, ending
    /// `cleanup_delay` from now, then forgets them in the records; answers the tasks orphaned.
    fn adopt(
        &mut self,
        gone: Vec<RecordedReservation>,
        cleanup_delay: Duration,
        ctx: &mut Context<Self>,
    ) -> Vec<String> {
        if gone.is_empty() {
            return Vec::new();
        }
        let now = self.clock.now_ms();
        let mut orphaned = Vec::new();
        let mut writes = Vec::new();
        for r in &gone {
            if self.reservations.contains_key(&r.task_id) {
                info!(
                    task:% = r.task_id; "snapshot reservation of task {} at instance {} (gone) is forgotten: this owner holds the task's reservation",
                    r.task_id, r.instance
                );
                continue;
            }
            info!(
                task:% = r.task_id; "snapshot reservation of task {} at instance {}: the instance is gone, the reservation is orphaned, cleanup stays paused",
                r.task_id, r.instance
            );
            self.reservations.insert(
                r.task_id.clone(),
                Reservation {
                    holder: None,
                    started_ms: r.started_ms,
                    status_sent: true,
                    orphan_end_ms: now.saturating_add(millis(cleanup_delay)),
                    restore: Restore::default(),
                },
            );
            self.cleanup.do_send(ReservationOpened {
                task_id: r.task_id.clone(),
            });
            orphaned.push(r.task_id.clone());
            if let Some(w) = self.write_down(StateChange::ReservationOpened(StoredReservation {
                task_id: r.task_id.clone(),
                started_ms: r.started_ms,
            })) {
                writes.push(w);
            }
        }
        self.arm_timer(ctx);
        // Forgotten in the records only once written down: a crash in between finds them
        // again, and writing one down twice is the same.
        futures_util::future::join_all(writes)
            .into_actor(self)
            .map(move |written, act, ctx| {
                if let Some(e) = written.into_iter().find_map(Result::err) {
                    warn!("orphaned reservations of gone instances could not be written down ({e}); they stay in the records");
                    return;
                }
                act.forget(gone, Vec::new(), ctx);
            })
            .spawn(ctx);
        orphaned
    }

    pub(super) fn forget(
        &self,
        held: Vec<RecordedReservation>,
        ends: Vec<RecordedEnd>,
        ctx: &mut Context<Self>,
    ) {
        let Some(records) = self.records.clone() else {
            return;
        };
        async move { records.send(ForgetRecords { held, ends }).await }
            .into_actor(self)
            .map(|r, _, _| match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!("forgetting applied reservation records failed (tried again at a later poll): {e}"),
                Err(_) => warn!("forgetting applied reservation records failed: the instance recorder is gone"),
            })
            .spawn(ctx);
    }
}
