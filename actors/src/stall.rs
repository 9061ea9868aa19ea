//! `StallWatch`: no stage stalls without a word (PROTOCOL.md §11.1, issue 41 item 5).
//!
//! Each stage of the pipeline that can have work pending (the backup monitors, the purger, and
//! the others as they report) tells this actor, at its existing progress points, one of three
//! typed messages: [`Pending`] (work is waiting on it), [`Progress`] (it moved, work may still
//! be waiting) and [`Idle`] (nothing is waiting on it). The watch owns the one table of stages;
//! no state is shared. A stage with work pending and no progress for `--stall-alarm-ms` is
//! *stalled*: [`GetStages`] says so (for `/readyz` and the `change_streamer_stage_stalled`
//! gauge), and the watch logs one ERROR line naming it when the stall is first seen and one a
//! minute while it lasts ([`ERROR_EVERY`]), then one INFO line when it moves again.
//!
//! Time is the runtime's (tokio's [`Instant`]), which tests pause and advance.
//!
//! Stages hold a [`StallReport`]: the watch's address (or none, in tests and tools that run a
//! stage alone) and the stage's name, so a hook is one line: `self.stall.pending()`.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use log::{error, info};
use serde::Serialize;
use tokio::time::Instant;

/// `--stall-alarm-ms`'s default (PROTOCOL.md §2).
pub const DEFAULT_STALL_ALARM: Duration = Duration::from_secs(30);

/// While a stall lasts, one ERROR line per this period.
pub const ERROR_EVERY: Duration = Duration::from_secs(60);

/// Work is waiting on `stage`; its stall clock starts now unless it was already pending.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Pending {
    pub stage: String,
}

/// `stage` made progress; work may still be waiting on it (its stall clock restarts).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Progress {
    pub stage: String,
}

/// Nothing waits on `stage`: it is never stalled while idle.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Idle {
    pub stage: String,
}

/// Every stage that reported, by name, and how long each stalled one has been stalled.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Vec<StageState>")]
pub struct GetStages;

/// Tells a stage's actor to report to `watch` from now on (the backup monitors, the streamer's
/// flow control).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ReportStalls {
    pub watch: Addr<StallWatch>,
}

/// Stops the watch (the owner's actors stop).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Stop;

/// One stage as [`GetStages`] answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageState {
    pub stage: String,
    /// Milliseconds since its last progress while that is past the alarm; `None`: not stalled.
    pub stalled_ms: Option<u64>,
}

impl StageState {
    /// `/readyz`'s reason for the stage stalled longest, if one is (PROTOCOL.md §11).
    pub fn readyz_reason(stages: &[StageState]) -> Option<String> {
        stages
            .iter()
            .filter_map(|s| Some((s.stalled_ms?, &s.stage)))
            .max()
            .map(|(ms, stage)| format!("stalled: {stage} for {ms} ms"))
    }
}

/// One stage's row.
#[derive(Debug, Clone, Default)]
struct Row {
    /// While work is pending: its last progress (or when the work came).
    since: Option<Instant>,
    /// While stalled: when the last ERROR line was written.
    alarmed: Option<Instant>,
}

/// See the module documentation.
pub struct StallWatch {
    alarm: Duration,
    stages: BTreeMap<String, Row>,
}

impl StallWatch {
    pub fn new(alarm: Duration) -> StallWatch {
        StallWatch {
            alarm: alarm.max(Duration::from_millis(1)),
            stages: BTreeMap::new(),
        }
    }

    /// How often the table is looked at: often enough that a stall is logged within a tenth
    /// of the alarm (at most a second late).
    fn period(&self) -> Duration {
        (self.alarm / 10).clamp(Duration::from_millis(1), Duration::from_secs(1))
    }

    fn stalled_ms(&self, row: &Row, now: Instant) -> Option<u64> {
        let for_ = now.saturating_duration_since(row.since?);
        (for_ >= self.alarm).then(|| u64::try_from(for_.as_millis()).unwrap_or(u64::MAX))
    }

    /// The stage moved (or has nothing left): a stall it was in ends, with one INFO line.
    fn moved(&mut self, stage: String, pending: bool) {
        let now = Instant::now();
        let row = self.stages.entry(stage.clone()).or_default();
        if row.alarmed.take().is_some() {
            let for_ms = row
                .since
                .map_or(0, |s| now.saturating_duration_since(s).as_millis());
            info!("stage {stage} is no longer stalled: it progressed after {for_ms} ms");
        }
        row.since = pending.then_some(now);
    }

    /// One ERROR line for each stalled stage not logged within [`ERROR_EVERY`].
    fn look(&mut self) {
        let now = Instant::now();
        let alarm_ms = self.alarm.as_millis();
        let due: Vec<(String, u64)> = self
            .stages
            .iter()
            .filter(|(_, r)| r.alarmed.is_none_or(|a| now - a >= ERROR_EVERY))
            .filter_map(|(s, r)| Some((s.clone(), self.stalled_ms(r, now)?)))
            .collect();
        for (stage, ms) in due {
            error!("stage {stage} stalled: work pending and no progress for {ms} ms (--stall-alarm-ms {alarm_ms})");
            if let Some(row) = self.stages.get_mut(&stage) {
                row.alarmed = Some(now);
            }
        }
    }
}

impl Actor for StallWatch {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.period(), |act, _| act.look());
    }
}

impl Handler<Pending> for StallWatch {
    type Result = ();
    fn handle(&mut self, msg: Pending, _: &mut Context<Self>) {
        let row = self.stages.entry(msg.stage).or_default();
        row.since.get_or_insert_with(Instant::now);
    }
}

impl Handler<Progress> for StallWatch {
    type Result = ();
    fn handle(&mut self, msg: Progress, _: &mut Context<Self>) {
        self.moved(msg.stage, true);
    }
}

impl Handler<Idle> for StallWatch {
    type Result = ();
    fn handle(&mut self, msg: Idle, _: &mut Context<Self>) {
        self.moved(msg.stage, false);
    }
}

impl Handler<Stop> for StallWatch {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<GetStages> for StallWatch {
    type Result = MessageResult<GetStages>;
    fn handle(&mut self, _: GetStages, _: &mut Context<Self>) -> Self::Result {
        let now = Instant::now();
        MessageResult(
            self.stages
                .iter()
                .map(|(stage, row)| StageState {
                    stage: stage.clone(),
                    stalled_ms: self.stalled_ms(row, now),
                })
                .collect(),
        )
    }
}

/// What a stage holds to report to the watch: one line at each progress point.
///
/// It sends only what changes the watch's table: a [`Pending`] or an [`Idle`] when the stage's
/// state changes, a [`Progress`] at most every [`PROGRESS_EVERY`], so a hook on a hot path (each
/// frame, each write) costs a comparison, not a message.
#[derive(Debug, Clone, Default)]
pub struct StallReport {
    to: Option<Addr<StallWatch>>,
    stage: String,
    /// What was last sent: `Some(true)` pending (with when, for a progress), `Some(false)` idle.
    sent: Cell<Option<(bool, Instant)>>,
}

/// The most often a stage's progress is told (the watch's clock is at most this late).
pub const PROGRESS_EVERY: Duration = Duration::from_millis(50);

impl StallReport {
    /// Reports as `stage` to `watch`.
    pub fn to(watch: &Addr<StallWatch>, stage: impl Into<String>) -> StallReport {
        StallReport {
            to: Some(watch.clone()),
            stage: stage.into(),
            sent: Cell::new(None),
        }
    }

    /// Work waits on the stage.
    pub fn pending(&self) {
        if !matches!(self.sent.get(), Some((true, _))) {
            self.send(
                true,
                Pending {
                    stage: self.stage.clone(),
                },
            );
        }
    }

    /// The stage moved; work may still wait on it. Nothing to tell while it is idle.
    pub fn progress(&self) {
        let due = match self.sent.get() {
            Some((true, at)) => at.elapsed() >= PROGRESS_EVERY,
            _ => false,
        };
        if due {
            self.send(
                true,
                Progress {
                    stage: self.stage.clone(),
                },
            );
        }
    }

    /// Nothing waits on the stage.
    pub fn idle(&self) {
        if !matches!(self.sent.get(), Some((false, _))) {
            self.send(
                false,
                Idle {
                    stage: self.stage.clone(),
                },
            );
        }
    }

    fn send<M>(&self, pending: bool, msg: M)
    where
        M: Message<Result = ()> + Send + 'static,
        StallWatch: Handler<M>,
    {
        if let Some(w) = &self.to {
            w.do_send(msg);
            self.sent.set(Some((pending, Instant::now())));
        }
    }
}

/// The stages' names, as `/readyz`, the gauge's `stage` label and the log lines show them.
pub mod stage {
    /// The upstream reader, held by flow control until a tracked send is released.
    pub const UPSTREAM: &str = "upstream";
    pub const WRITER: &str = "writer";
    pub const CATCHUP: &str = "catchup";
    pub const PURGER: &str = "purger";
    pub const FOLLOWER: &str = "follower";

    /// Backup `name`'s monitor (`backup` for the single backup of the flags).
    pub fn backup(name: &str) -> String {
        format!("backup:{name}")
    }
}
