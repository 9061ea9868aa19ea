//! The [`Purger`]: carries out scheduled cleanups when they are safe (PROTOCOL.md §9), asking the
//! streamer ([`PurgeIfSafe`], answered in `streamer/purge.rs`).
//!
//! The [`CleanupActor`] decides a watermark `W` may go; the purger waits `purge_delay`, then asks
//! the streamer to purge below `W` *if* every connected subscriber has acked `W`
//! ([`PurgeIfSafe`]). A subscriber still behind `W`, or no subscriber at all, means "not yet":
//! the same check runs again after the same delay. A scheduled watermark is never dropped;
//! several are handled smallest first, and a larger one waits while a smaller one is blocked.
//!
//! ### Retention floor
//! The purge deletes only rows stored at least `--change-log-retention-ms` ago (the purger
//! passes `now - retention` as the store-time bound). Whatever the cleanup decided, a change
//! just written stays long enough for a replica that is a little behind to read it. When rows
//! below `W` were kept for that reason, `W` stays scheduled and is checked again after the
//! purge delay.
//!
//! ### What survives a restart
//! The cleanup actor writes `W` down as scheduled when it decides it; the change log takes it
//! off that list in the same transaction as the purge that leaves nothing below `W`. So a
//! scheduled watermark is never lost between the decision and the purge, `kill -9` included:
//! at the next start the purger gets the list back ([`Purger::restore`]).
//!
//! ### What blocks
//! The purger is the one place that knows why the oldest scheduled purge waits: the last
//! answer of its check, as a [`BlockedBy`] (PROTOCOL.md §9 `purge.blockedBy`).
//!
//! ### The audit
//! A backup's audit that read back less than was confirmed ([`AuditBlock`], PROTOCOL.md §8.1d)
//! stops every purge until that backup's audit lifts its block: nothing scheduled is checked
//! meanwhile, and `blockedBy` is `audit` whatever is scheduled.
//!
//! [`CleanupActor`]: crate::cleanup::CleanupActor

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use log::{info, warn};
use serde::Serialize;
use tokio::time::Instant;

use crate::cleanup::ScheduleCleanup;
use crate::clock::Clock;
use crate::stall::{stage, StallReport, StallWatch};
use crate::streamer::{PurgeAnswer, PurgeError, PurgeIfSafe};
use crate::watermark::Watermark;

/// What holds the oldest scheduled purge back (PROTOCOL.md §9 `purge.blockedBy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockedBy {
    /// A connected subscriber has not acked the watermark.
    Subscriber,
    /// No subscriber is connected.
    NoSubscriber,
    /// Rows below the watermark are younger than `--change-log-retention-ms`.
    Retention,
    /// A backup read back below what was confirmed (PROTOCOL.md §8.1d): every purge stops.
    Audit,
}

impl BlockedBy {
    /// Every reason, for the `change_streamer_purge_blocked{reason}` series.
    pub const ALL: [BlockedBy; 4] = [
        BlockedBy::Subscriber,
        BlockedBy::NoSubscriber,
        BlockedBy::Retention,
        BlockedBy::Audit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BlockedBy::Subscriber => "subscriber",
            BlockedBy::NoSubscriber => "no-subscriber",
            BlockedBy::Retention => "retention",
            BlockedBy::Audit => "audit",
        }
    }
}

/// A backup's audit blocks every purge (`below`: the watermark a read must reach again), or
/// lifts its block (`None`), PROTOCOL.md §8.1d.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct AuditBlock {
    pub backup: String,
    pub below: Option<Watermark>,
}

/// The purger's part of `/status`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "PurgeState")]
pub struct GetPurgeState;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct PurgeState {
    pub scheduled: Vec<Watermark>,
    pub last_purged_before: Option<Watermark>,
    pub rows_purged: u64,
    pub purges: u64,
    /// Why the smallest scheduled watermark is waiting, if it is.
    pub waiting: Option<String>,
    /// What blocked the smallest scheduled watermark at its last check; `None` when nothing
    /// is scheduled, or its check has not run yet or failed.
    pub blocked_by: Option<BlockedBy>,
}

/// See the module documentation.
pub struct Purger {
    streamer: Recipient<PurgeIfSafe>,
    delay: Duration,
    /// `--change-log-retention-ms`.
    retention: Duration,
    /// The clock of the change log's store times.
    clock: Clock,
    /// Each scheduled watermark and when it is next checked, on the runtime's clock (tokio time,
    /// which tests can pause), the clock its timer runs on.
    scheduled: BTreeMap<Watermark, Instant>,
    checking: bool,
    timer: Option<SpawnHandle>,
    state: PurgeState,
    /// The backups whose audit blocks every purge, and what a read must reach.
    audit_blocks: BTreeMap<String, Watermark>,
    /// Told while a purge check waits for its answer (PROTOCOL.md §11.1).
    stall: StallReport,
}

impl Purger {
    /// A purger that checks a scheduled watermark `delay` after it was scheduled, and purges
    /// only rows stored at least `retention` ago by `clock` (the change log's clock).
    pub fn new(
        streamer: Recipient<PurgeIfSafe>,
        delay: Duration,
        retention: Duration,
        clock: Clock,
    ) -> Purger {
        Purger {
            streamer,
            delay,
            retention,
            clock,
            scheduled: BTreeMap::new(),
            checking: false,
            timer: None,
            state: PurgeState::default(),
            audit_blocks: BTreeMap::new(),
            stall: StallReport::default(),
        }
    }

    /// Reports to `watch` as stage `purger` (PROTOCOL.md §11.1): work is pending while a purge
    /// check waits for the streamer's answer (a check that waits on a subscriber has its
    /// answer: it is retried, not stalled).
    pub fn reporting_stalls_to(mut self, watch: &Addr<StallWatch>) -> Purger {
        self.stall = StallReport::to(watch, stage::PURGER);
        self
    }

    /// Takes back the watermarks scheduled before a restart and not yet purged; each is
    /// checked one purge delay after the start.
    pub fn restore(mut self, scheduled: &[Watermark]) -> Purger {
        let due = Instant::now() + self.delay;
        for w in scheduled {
            info!(watermark:% = w; "purge before watermark={w} was scheduled before the restart: checked again in {} ms", self.delay.as_millis());
            self.scheduled.insert(w.clone(), due);
        }
        self
    }

    fn arm(&mut self, ctx: &mut Context<Self>) {
        if let Some(t) = self.timer.take() {
            ctx.cancel_future(t);
        }
        if self.checking || !self.audit_blocks.is_empty() {
            return;
        }
        if let Some((_, due)) = self.scheduled.first_key_value() {
            let wait = due.saturating_duration_since(Instant::now());
            self.timer = Some(ctx.run_later(wait, |act, ctx| {
                act.timer = None;
                act.check(ctx);
            }));
        }
    }

    fn check(&mut self, ctx: &mut Context<Self>) {
        let Some((w, due)) = self
            .scheduled
            .first_key_value()
            .map(|(w, d)| (w.clone(), *d))
        else {
            return;
        };
        if self.checking || !self.audit_blocks.is_empty() {
            return;
        }
        if due > Instant::now() {
            self.arm(ctx);
            return;
        }
        self.checking = true;
        self.stall.pending();
        let retention_ms = i64::try_from(self.retention.as_millis()).unwrap_or(i64::MAX);
        let stored_by_ms = self.clock.now_ms().saturating_sub(retention_ms);
        self.streamer
            .send(PurgeIfSafe {
                watermark: w.clone(),
                stored_by_ms,
            })
            .into_actor(self)
            .map(move |answer, act, ctx| {
                act.checking = false;
                act.stall.idle();
                let answer =
                    answer.unwrap_or_else(|e| PurgeAnswer::Failed(PurgeError::StreamerGone(e)));
                act.answered(ctx, w, answer);
            })
            .spawn(ctx);
    }

    /// The streamer's answer to the purge check of `w`: purged (then the next one, at once),
    /// or kept scheduled with why, retried after the delay.
    fn answered(&mut self, ctx: &mut Context<Self>, w: Watermark, answer: PurgeAnswer) {
        let act = self;
        let retry = |act: &mut Purger, why: String, blocked_by: Option<BlockedBy>| {
            act.state.waiting = Some(why);
            act.state.blocked_by = blocked_by;
            act.scheduled.insert(w.clone(), Instant::now() + act.delay);
        };
        let delay_ms = act.delay.as_millis();
        match answer {
            PurgeAnswer::Purged(n) => {
                info!(watermark:% = w; "purged {n} change-log row(s) before watermark={w}");
                act.scheduled.remove(&w);
                act.state.rows_purged += n;
                act.state.purges += 1;
                act.state.last_purged_before = Some(w.clone());
                act.state.waiting = None;
                act.state.blocked_by = None;
                act.check(ctx);
                return;
            }
            PurgeAnswer::HeldByRetention(n) => {
                info!(watermark:% = w; "purged {n} change-log row(s) before watermark={w}; younger rows below it are kept for --change-log-retention-ms ({} ms); retrying in {delay_ms} ms", act.retention.as_millis());
                act.state.rows_purged += n;
                retry(
                    act,
                    format!("rows stored less than {} ms ago", act.retention.as_millis()),
                    Some(BlockedBy::Retention),
                );
            }
            PurgeAnswer::NoSubscribers => {
                info!(watermark:% = w; "purge before watermark={w} waits: no subscriber connected; retrying in {delay_ms} ms");
                retry(
                    act,
                    "no subscriber connected".into(),
                    Some(BlockedBy::NoSubscriber),
                );
            }
            PurgeAnswer::Blocked { subscriber, acked } => {
                info!(watermark:% = w, subscriber:% = subscriber; "purge before watermark={w} waits: subscriber {subscriber} acked only {acked}; retrying in {delay_ms} ms");
                retry(
                    act,
                    format!("subscriber {subscriber} acked {acked}"),
                    Some(BlockedBy::Subscriber),
                );
            }
            PurgeAnswer::Failed(e) => {
                warn!(watermark:% = w; "purge before watermark={w} failed: {e}; retrying in {delay_ms} ms");
                retry(act, format!("failed: {e}"), None);
            }
        }
        act.arm(ctx);
    }
}

/// Stops the purger: a scheduled watermark stays written down for the next start.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Stop;

impl Actor for Purger {
    type Context = Context<Self>;

    /// Arms the timer for the watermarks [`restore`](Purger::restore)d.
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.arm(ctx);
    }
}

impl Handler<ScheduleCleanup> for Purger {
    type Result = ();
    fn handle(&mut self, msg: ScheduleCleanup, ctx: &mut Context<Self>) {
        info!(
            watermark:% = msg.watermark; "cleanup scheduled: purge before watermark={} in {} ms",
            msg.watermark,
            self.delay.as_millis()
        );
        self.scheduled
            .entry(msg.watermark)
            .or_insert_with(|| Instant::now() + self.delay);
        self.arm(ctx);
    }
}

impl Handler<AuditBlock> for Purger {
    type Result = ();
    fn handle(&mut self, msg: AuditBlock, ctx: &mut Context<Self>) {
        match msg.below {
            Some(below) => {
                warn!(
                    backup:% = msg.backup, watermark:% = below; "every purge stops: backup {} read back below watermark={below}",
                    msg.backup
                );
                self.audit_blocks.insert(msg.backup, below);
            }
            None => {
                if self.audit_blocks.remove(&msg.backup).is_some() && self.audit_blocks.is_empty() {
                    info!(
                        backup:% = msg.backup; "purging resumes: the audit of backup {} reads back what was confirmed",
                        msg.backup
                    );
                }
            }
        }
        self.arm(ctx);
    }
}

impl Handler<GetPurgeState> for Purger {
    type Result = MessageResult<GetPurgeState>;
    fn handle(&mut self, _: GetPurgeState, _: &mut Context<Self>) -> Self::Result {
        let mut s = self.state.clone();
        s.scheduled = self.scheduled.keys().cloned().collect();
        if let Some((backup, below)) = self.audit_blocks.iter().next() {
            s.blocked_by = Some(BlockedBy::Audit);
            s.waiting = Some(format!(
                "the audit of backup {backup} read back below watermark {below}"
            ));
        }
        MessageResult(s)
    }
}

impl Handler<Stop> for Purger {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
