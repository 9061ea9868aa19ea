//! `CleanupActor`: decides *when* the change log may be cleaned up (PROTOCOL.md §8.2, §8.3).
//!
//! It owns the backup watermarks seen so far, the last scheduled watermark, the cleanup delay
//! and the set of tasks holding a snapshot reservation. The [`MonitorActor`] feeds it one
//! [`PollResult`] per poll; the [`ReservationActor`] tells it when reservations open and close.
//! It never touches the database: a decision goes out as a [`ScheduleCleanup`] to whoever
//! purges (the purger in the service, a recorder in the replay).
//!
//! ### Why a delay at all
//! Purging the change log as soon as litestream has backed a watermark up would strand a replica
//! that is still restoring an *older* backup: when it finishes, the changes it needs to catch up
//! from its backup's watermark are gone. Reservations are the primary guard (no cleanup is
//! scheduled while any is open). The delay is the second: a watermark is only cleaned up once
//! its backup is older than the longest restore seen so far (`cleanupDelay`), which grows
//! whenever a reservation ends by subscription after being held longer than the current delay.
//! A reservation that merely drops (crash, replacement, shutdown) says nothing about how long a
//! restore takes, so it never grows the delay.
//!
//! ### Other instances' reservations
//! On a shared change DB (PROTOCOL.md §14.1) a standby's reservations pause cleanup too. With
//! [`CleanupActor::with_others`], each poll asks the [`ReservationActor`] for them
//! ([`SyncRecords`]: read from the change DB) after recording and before scheduling, and waits
//! for the answer: what pauses, and the held times of their ends by subscription, which grow
//! the delay before this poll schedules. A poll whose records cannot be read schedules nothing.
//!
//! ### Why it is written down
//! Everything it decides protects a replica that may be restoring right now, so it must survive
//! a restart, `kill -9` included (PROTOCOL.md §3, §13): with a change log to persist to, every change
//! (a recorded watermark, a scheduled one, a grown delay) is queued on the change log's writer
//! as it is made, before it is acted on, and read back at the next start ([`CleanupActor::restore`]).
//!
//! ### After a restart
//! It also keeps the start's [`RestartCatchUp`] (PROTOCOL.md §13.1): the poll results it
//! receives say when the backup covers the watermark recorded before the restart, which it
//! tells the reservations ([`CleanupActor::telling_covered`]) and `/readyz` ([`CleanupState`]).
//!
//! [`MonitorActor`]: crate::monitor::MonitorActor
//! [`ReservationActor`]: crate::reservation::ReservationActor

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use actix::prelude::*;
use log::{info, warn};
use serde::Serialize;

use crate::changelog::{ChangeLog, ChangeLogError, RecordedWatermark, SafetyState, StateChange};
use crate::clock::{format_rfc3339_ms, Clock};
use crate::litestream::BackupSample;
use crate::restart_catch_up::{BackupCovered, CatchUpView, RestartCatchUp};
use crate::watermark::Watermark;

/// The longest a poll waits for the other instances' reservations.
const SYNC_LIMIT: Duration = Duration::from_secs(5);

/// Tells the purge side that every change below `watermark` may go (PROTOCOL.md §9 decides whether it
/// is safe yet).
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct ScheduleCleanup {
    pub watermark: Watermark,
}

/// The samples of one poll (empty when the poll failed); recording is followed by scheduling.
#[derive(Message, Debug, Clone, Default)]
#[rtype(result = "()")]
pub struct PollResult {
    pub samples: Vec<BackupSample>,
}

/// A reservation of `task_id` opened: scheduling pauses.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ReservationOpened {
    pub task_id: String,
}

/// A reservation of `task_id` closed. `ended_by_subscription_after` is `Some(held)` only when
/// the task subscribed with `initial=true` (the restore finished): only then may the delay grow.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ReservationClosed {
    pub task_id: String,
    pub ended_by_subscription_after: Option<Duration>,
}

/// The cleanup actor's question to whoever holds the other instances' reservations (on a
/// shared change DB, the reservation actor: `reservation/others.rs`). It is written here, with
/// the one who asks, so that the cleanup actor depends on no reservation type.
/// Reads the other instances' reservations and the ends by subscription (one backup poll);
/// `cleanup_delay` is the delay now, from which a newly found orphan ends.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<OthersView, RecordsError>")]
pub struct SyncRecords {
    pub cleanup_delay: Duration,
}

/// What the other instances' reservations mean for this poll's scheduling.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OthersView {
    /// What pauses cleanup besides this actor's reported reservations: `task@instance` of
    /// each open reservation of a live instance, and the tasks orphaned at this poll.
    pub paused_by: Vec<String>,
    /// Ends by subscription of other instances' reservations found at this poll: the task and
    /// the time its reservation was held.
    pub grown: Vec<(String, Duration)>,
}

/// Why the records could not be read (the poll then schedules nothing).
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("the change DB's reservation records could not be read: {0}")]
    Read(#[from] ChangeLogError),
    #[error("the instance recorder is gone")]
    RecorderGone,
}

/// Stops the actor; what it wrote down stays for the next start.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Stop;

/// Asks for the state shown in `/status` and `/metrics`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "CleanupState")]
pub struct GetCleanupState;

/// Asks for what `/readyz` needs of the actor alone (PROTOCOL.md §11, §13.1): the restart's
/// catch-up while the backup does not cover the watermark recorded before it. Cheaper than
/// [`GetCleanupState`], which lists every pending watermark.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Option<CatchUpView>")]
pub struct GetRestartCatchUp;

/// A watermark seen in a poll and not yet scheduled.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PendingWatermark {
    pub watermark: Watermark,
    pub replica: String,
    #[serde(rename = "backedUpAt")]
    pub backed_up_at: String,
    #[serde(skip)]
    pub backed_up_at_ms: i64,
}

impl PendingWatermark {
    /// A watermark backed up at `backed_up_at_ms` (unix ms).
    pub fn new(watermark: Watermark, replica: String, backed_up_at_ms: i64) -> PendingWatermark {
        PendingWatermark {
            watermark,
            replica,
            backed_up_at: format_rfc3339_ms(backed_up_at_ms),
            backed_up_at_ms,
        }
    }
}

/// A snapshot of the actor's state.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CleanupState {
    pub cleanup_delay_ms: i64,
    pub paused: bool,
    pub last_scheduled_watermark: Option<Watermark>,
    pub pending_watermarks: Vec<PendingWatermark>,
    pub cleanups_scheduled_total: u64,
    /// While the backup does not cover the watermark recorded before the restart
    /// (PROTOCOL.md §13.1).
    pub restart_catch_up: Option<CatchUpView>,
}

struct Recorded {
    replica: String,
    backed_up_at_ms: i64,
}

/// See the module documentation.
pub struct CleanupActor {
    clock: Clock,
    cleanup_delay_ms: i64,
    watermarks: BTreeMap<Watermark, Recorded>,
    last_scheduled: Option<Watermark>,
    reservations: BTreeSet<String>,
    target: Recipient<ScheduleCleanup>,
    scheduled_total: u64,
    /// Where decisions are written down; `None` keeps them in memory only (the replay).
    store: Option<ChangeLog>,
    /// Asked at each poll for the other instances' reservations (a shared change DB).
    others: Option<Recipient<SyncRecords>>,
    /// What paused cleanup at the last poll besides `reservations`: other instances'.
    others_paused: BTreeSet<String>,
    /// The start's wait for the backup (PROTOCOL.md §13.1); `None` once covered.
    catch_up: Option<RestartCatchUp>,
    /// Told once the backup covers it.
    covered_to: Option<Recipient<BackupCovered>>,
}

impl CleanupActor {
    /// `initial_delay` is raised to `min_delay` (the floor).
    pub fn new(
        clock: Clock,
        initial_delay: Duration,
        min_delay: Duration,
        target: Recipient<ScheduleCleanup>,
    ) -> Self {
        // The delay is compared with the injected clock's milliseconds (and written down so).
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let (initial_delay_ms, min_delay_ms) = (ms(initial_delay), ms(min_delay));
        let cleanup_delay_ms = initial_delay_ms.max(min_delay_ms);
        info!("cleanup delay is {cleanup_delay_ms} ms (initial {initial_delay_ms} ms, floor {min_delay_ms} ms)");
        CleanupActor {
            clock,
            cleanup_delay_ms,
            watermarks: BTreeMap::new(),
            last_scheduled: None,
            reservations: BTreeSet::new(),
            target,
            scheduled_total: 0,
            store: None,
            others: None,
            others_paused: BTreeSet::new(),
            catch_up: None,
            covered_to: None,
        }
    }

    /// Asks `others` at each poll, before scheduling, which reservations of other instances
    /// pause cleanup (see the module documentation).
    pub fn with_others(mut self, others: Recipient<SyncRecords>) -> Self {
        self.others = Some(others);
        self
    }

    /// Takes back what a previous run wrote down: the learned delay (never below this run's
    /// starting delay), the recorded watermarks and the last scheduled one; and writes every
    /// later decision to `store`.
    pub fn restore(mut self, state: &SafetyState, store: ChangeLog) -> Self {
        if let Some(ms) = state
            .cleanup_delay
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .filter(|ms| *ms > self.cleanup_delay_ms)
        {
            info!("cleanup delay is {ms} ms, as learned before the restart");
            self.cleanup_delay_ms = ms;
        }
        self.last_scheduled = state.last_scheduled.clone();
        for r in &state.recorded {
            self.watermarks.insert(
                r.watermark.clone(),
                Recorded {
                    replica: r.replica.clone(),
                    backed_up_at_ms: r.backed_up_ms,
                },
            );
        }
        self.store = Some(store);
        self.catch_up = RestartCatchUp::from_state(state);
        if let Some(c) = &self.catch_up {
            info!(watermark:% = c.view().recorded; "waiting for the backup to cover watermark={}, recorded before the restart, before any snapshot status or readiness", c.view().recorded);
        }
        self
    }

    /// Tells `to` [`BackupCovered`] once the backup covers the watermark recorded before the
    /// restart (PROTOCOL.md §13.1).
    pub fn telling_covered(mut self, to: Recipient<BackupCovered>) -> Self {
        self.covered_to = Some(to);
        self
    }

    /// PROTOCOL.md §13.1: does this poll's observation end the start's wait?
    fn catch_up(&mut self, samples: &[BackupSample]) {
        if self.catch_up.as_mut().is_some_and(|c| c.observe(samples)) {
            self.catch_up = None;
            if let Some(to) = &self.covered_to {
                to.do_send(BackupCovered);
            }
        }
    }

    /// Queues `change` on the change log's writer (in order with everything queued before) and
    /// logs a failure. The write is queued by this call, so whatever the actor does next is
    /// ordered after it.
    fn write_down(&self, change: StateChange, ctx: &mut Context<Self>) {
        let Some(store) = &self.store else {
            return;
        };
        let what = format!("{change:?}");
        store
            .save_state(change)
            .into_actor(self)
            .map(move |r, _, _| {
                if let Err(e) = r {
                    warn!("cleanup state could not be written down ({what}): {e}");
                }
            })
            .spawn(ctx);
    }

    /// PROTOCOL.md §8.2: keep a sample only if it is newer than the last scheduled watermark and not
    /// already recorded; its first sighting's backup time is the one that counts.
    fn record(&mut self, samples: Vec<BackupSample>, ctx: &mut Context<Self>) {
        let mut new = Vec::new();
        for s in samples {
            if self
                .last_scheduled
                .as_ref()
                .is_some_and(|l| s.watermark <= *l)
                || self.watermarks.contains_key(&s.watermark)
            {
                continue;
            }
            info!(
                watermark:% = s.watermark; "replicated watermark={} to {} at {}",
                s.watermark,
                s.replica,
                format_rfc3339_ms(s.backed_up_at_ms)
            );
            new.push(RecordedWatermark {
                watermark: s.watermark.clone(),
                replica: s.replica.clone(),
                backed_up_ms: s.backed_up_at_ms,
            });
            self.watermarks.insert(
                s.watermark,
                Recorded {
                    replica: s.replica,
                    backed_up_at_ms: s.backed_up_at_ms,
                },
            );
        }
        if !new.is_empty() {
            self.write_down(StateChange::Recorded(new), ctx);
        }
    }

    /// PROTOCOL.md §8.3: unless paused, schedule the greatest watermark whose backup is at least
    /// `cleanupDelay` old and forget every recorded watermark up to it. Only the greatest is
    /// scheduled because cleaning up to it covers all the smaller ones.
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if self.paused() {
            let tasks: Vec<&str> = self
                .reservations
                .iter()
                .chain(&self.others_paused)
                .map(String::as_str)
                .collect();
            info!("cleanup paused for snapshot(s): {}", tasks.join(","));
            return;
        }
        let latest = self.clock.now_ms() - self.cleanup_delay_ms;
        let Some(due) = self
            .watermarks
            .iter()
            .filter(|(_, r)| r.backed_up_at_ms <= latest)
            .map(|(w, _)| w.clone())
            .next_back()
        else {
            return;
        };
        info!(watermark:% = due; "scheduling cleanup of changes before watermark={due}");
        self.watermarks = self.watermarks.split_off(&due);
        self.watermarks.remove(&due);
        self.last_scheduled = Some(due.clone());
        self.scheduled_total += 1;
        self.write_down(StateChange::Scheduled(due.clone()), ctx);
        if self
            .target
            .try_send(ScheduleCleanup {
                watermark: due.clone(),
            })
            .is_err()
        {
            // The purger's mailbox is unbounded, so this only happens when it has stopped.
            warn!(watermark:% = due; "cleanup to watermark={due} could not be handed to the purger: it is gone");
        }
    }

    fn paused(&self) -> bool {
        !self.reservations.is_empty() || !self.others_paused.is_empty()
    }

    /// A reservation of `task` ended by its subscription after being held `held_for`: the
    /// delay grows to it if it is longer (PROTOCOL.md §8.3).
    fn grow(&mut self, task: &str, held_for: Duration, ctx: &mut Context<Self>) {
        let held = i64::try_from(held_for.as_millis()).unwrap_or(i64::MAX);
        info!("snapshot initialized by {task} in {held} ms");
        if held > self.cleanup_delay_ms {
            self.cleanup_delay_ms = held;
            self.write_down(StateChange::CleanupDelay(held_for), ctx);
            info!(task:% = task; "increased cleanup delay to {held} ms (task {task})");
        }
    }

    /// Takes the other instances' part of this poll, then schedules.
    fn schedule_with_others(&mut self, others: Recipient<SyncRecords>, ctx: &mut Context<Self>) {
        let cleanup_delay = Duration::from_millis(self.cleanup_delay_ms.max(0) as u64);
        others
            .send(SyncRecords { cleanup_delay })
            .timeout(SYNC_LIMIT)
            .into_actor(self)
            .map(|answer, act, ctx| {
                let view: OthersView = match answer {
                    Ok(Ok(view)) => view,
                    Ok(Err(e)) => {
                        warn!("cleanup not scheduled at this poll: {e}");
                        return;
                    }
                    Err(e) => {
                        warn!("cleanup not scheduled at this poll: the other instances' reservations were not read ({e})");
                        return;
                    }
                };
                for (task, held) in &view.grown {
                    act.grow(task, *held, ctx);
                }
                act.others_paused = view.paused_by.into_iter().collect();
                act.schedule(ctx);
            })
            // Nothing else is handled until this poll has scheduled.
            .wait(ctx);
    }

    fn state(&self) -> CleanupState {
        CleanupState {
            cleanup_delay_ms: self.cleanup_delay_ms,
            paused: self.paused(),
            last_scheduled_watermark: self.last_scheduled.clone(),
            pending_watermarks: self
                .watermarks
                .iter()
                .map(|(w, r)| {
                    PendingWatermark::new(w.clone(), r.replica.clone(), r.backed_up_at_ms)
                })
                .collect(),
            cleanups_scheduled_total: self.scheduled_total,
            restart_catch_up: self.catch_up.as_ref().map(|c| c.view().clone()),
        }
    }
}

impl Actor for CleanupActor {
    type Context = Context<Self>;
}

impl Handler<PollResult> for CleanupActor {
    type Result = ();
    fn handle(&mut self, msg: PollResult, ctx: &mut Context<Self>) {
        self.catch_up(&msg.samples);
        self.record(msg.samples, ctx);
        match self.others.clone() {
            Some(others) => self.schedule_with_others(others, ctx),
            None => self.schedule(ctx),
        }
    }
}

impl Handler<ReservationOpened> for CleanupActor {
    type Result = ();
    fn handle(&mut self, msg: ReservationOpened, _: &mut Context<Self>) {
        info!("pausing change-log cleanup while {} snapshots", msg.task_id);
        self.reservations.insert(msg.task_id);
    }
}

impl Handler<ReservationClosed> for CleanupActor {
    type Result = ();
    fn handle(&mut self, msg: ReservationClosed, ctx: &mut Context<Self>) {
        self.reservations.remove(&msg.task_id);
        if let Some(held_for) = msg.ended_by_subscription_after {
            self.grow(&msg.task_id, held_for, ctx);
        }
    }
}

impl Handler<GetCleanupState> for CleanupActor {
    type Result = MessageResult<GetCleanupState>;
    fn handle(&mut self, _: GetCleanupState, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state())
    }
}

impl Handler<GetRestartCatchUp> for CleanupActor {
    type Result = Option<CatchUpView>;
    fn handle(&mut self, _: GetRestartCatchUp, _: &mut Context<Self>) -> Self::Result {
        self.catch_up.as_ref().map(|c| c.view().clone())
    }
}

impl Handler<Stop> for CleanupActor {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
