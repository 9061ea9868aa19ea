//! `MonitorActor`: the backup monitor's eyes (PROTOCOL.md §8.1, §8.1b, §8.1c).
//!
//! Every poll interval it reads what is backed up from its [`BackupSource`] and hands it to the
//! [`CleanupActor`] as one [`PollResult`], which records it and then schedules:
//! - [`BackupSource::Metrics`]: GET litestream's `/metrics` and read the
//!   `litestream_replica_progress` samples (see [`crate::litestream`]); only Zero's litestream
//!   fork exports them, so a page without any is an error that points at `--litestream-vfs`.
//! - [`BackupSource::Vfs`]: read the watermark out of the backup itself through litestream 0.5's
//!   VFS (see [`crate::vfs`]): one sample of replica `vfs`, backed up at the time of the first
//!   poll that read that watermark (stock litestream says nothing more precise).
//! - [`BackupSource::Control`]: ask stock litestream 0.5's control API to sync and wait, at each
//!   commit the backup replicator acks (the streamer says so, [`BackupAcked`]) and at each
//!   poll; its success makes that commit one sample of replica `control` (see [`control`]).
//!
//! With an [`AuditConfig`] the monitor also reads its backup through the VFS now and then and
//! compares it with what it confirmed (PROTOCOL.md §8.1d, [`audit`]).
//!
//! With several backups (PROTOCOL.md §8.4) there is one monitor per backup, and each hands its
//! polls to the [`BackupQuorum`] instead ([`MonitorActor::in_quorum`]), which hands the cleanup
//! actor what K backups hold.
//!
//! With the VFS source the monitor also tells the reservations what it read
//! ([`MonitorActor::reporting_backups_to`]): a reservation's status waits for a backup at or
//! above the change log's minWatermark (PROTOCOL.md §6.7).
//!
//! A failed poll (network error, non-2xx, no answer within the timeout, garbage, no backup yet,
//! a failing query) is a warning, a counted error and an *empty* result: scheduling still runs,
//! because watermarks recorded earlier may have become due.
//!
//! Polls never overlap: a [`Check`] that arrives while one is in flight waits for that one's
//! outcome instead of starting another. The scheduling step does not wait for it: a period that
//! finds a poll still in flight (a frozen litestream, which keeps its timeout) hands on an empty
//! result, [`PollOutcome::StillInFlight`], so that watermarks recorded earlier are scheduled on
//! time whatever the source does (PROTOCOL.md §8.1c, §8.3). [`Stop`] aborts the poll in flight (dropping the
//! future closes the connection, or kills the VFS reader) and stops the actor, so nothing from
//! a half-read answer is ever recorded.
//!
//! This file holds the actor, its messages and its scheduling of polls; each source's poll lives
//! in its own file: [`metrics`], [`vfs`], [`control`]; the audit in [`audit`]; the quorum of
//! several backups in [`quorum`].
//!
//! [`CleanupActor`]: crate::cleanup::CleanupActor
//! [`BackupAcked`]: crate::streamer::BackupAcked

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use actix::prelude::*;
use log::{debug, warn};
use serde::Serialize;
use tokio::sync::oneshot;

use crate::cleanup::{CleanupActor, PollResult};
use crate::clock::Clock;
use crate::litestream::BackupSample;
use crate::reservation::BackupRead;
pub use crate::stall::ReportStalls;
use crate::stall::{stage, StallReport, StallWatch};
use crate::vfs::{VfsReader, VfsSource};
use crate::watermark::Watermark;

mod audit;
mod control;
mod metrics;
mod quorum;
mod vfs;

pub use audit::{AuditConfig, AuditStats, SINGLE_BACKUP};
pub use control::{ControlSource, CONTROL_REPLICA, CONTROL_TIMEOUT};
pub use quorum::{
    BackupPolled, BackupQuorum, BackupState, GetQuorumState, QuorumState, MAX_OBSERVATIONS,
};

/// The replica name of the observations read through the VFS.
pub const VFS_REPLICA: &str = "vfs";

/// Where the monitor reads what is backed up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackupSource {
    /// `--litestream-metrics-url`: Zero's litestream fork's `/metrics`.
    Metrics { url: String },
    /// `--litestream-vfs`: the backup itself, through stock litestream 0.5's VFS.
    Vfs(VfsSource),
    /// `--litestream-control-url`: stock litestream 0.5's control API, asked at each ack of
    /// the backup replicator.
    Control(ControlSource),
}

impl BackupSource {
    /// `/status` `backup.source`.
    pub fn name(&self) -> &'static str {
        match self {
            BackupSource::Metrics { .. } => "metrics",
            BackupSource::Vfs(_) => "vfs",
            BackupSource::Control(_) => "control",
        }
    }

    /// What is polled, for log lines.
    fn describe(&self) -> String {
        match self {
            BackupSource::Metrics { url } => format!("metrics at {url}"),
            BackupSource::Vfs(v) => format!("the backup at {} through the VFS", v.backup_url),
            BackupSource::Control(c) => {
                format!("litestream's control API at {} for {}", c.url, c.db_path)
            }
        }
    }
}

/// How the monitor polls.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    pub source: BackupSource,
    /// Dates the observations of the VFS source.
    pub clock: Clock,
    /// Period of the automatic polls; the first comes one interval after start.
    pub interval: Duration,
    /// No answer within this is a failed poll (PROTOCOL.md §8.1: `min(interval, 10 s)`; §8.1c:
    /// [`CONTROL_TIMEOUT`]).
    pub timeout: Duration,
    /// `false` leaves polling to explicit [`Check`]s (tests, replay).
    pub poll_automatically: bool,
    /// The audit of this backup through the VFS (PROTOCOL.md §8.1d); `None`: no audit.
    pub audit: Option<AuditConfig>,
    /// The backup's name among several (PROTOCOL.md §8.4), for log lines; `None`: the only one.
    pub backup: Option<String>,
}

impl MonitorConfig {
    /// Polls the metrics page at `metrics_url`.
    pub fn new(metrics_url: impl Into<String>, interval: Duration) -> Self {
        Self::with_source(
            BackupSource::Metrics {
                url: metrics_url.into(),
            },
            interval,
        )
    }

    /// Polls `source`, dating observations by the system clock.
    pub fn with_source(source: BackupSource, interval: Duration) -> Self {
        let timeout = match source {
            BackupSource::Control(_) => CONTROL_TIMEOUT,
            _ => interval.min(Duration::from_secs(10)),
        };
        MonitorConfig {
            source,
            clock: Clock::System,
            interval,
            timeout,
            poll_automatically: true,
            audit: None,
            backup: None,
        }
    }
}

/// How a poll ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PollOutcome {
    /// The page (or the backup) was read: `samples` valid samples, `invalid` rejected ones.
    Read { samples: usize, invalid: usize },
    /// Network error, non-2xx, timeout, garbage, a page without progress samples; no backup
    /// yet, or a failing query.
    Failed(String),
    /// The poll of an earlier period still waits for its answer: nothing was asked or read this
    /// period, and the scheduling step ran alone (PROTOCOL.md §8.3).
    StillInFlight,
    /// The monitor stopped before the poll finished.
    Aborted,
}

/// Polls now (or joins the poll in flight) and answers once the [`CleanupActor`] has acted on
/// the result.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "PollOutcome")]
pub struct Check;

/// Aborts any poll in flight and stops the monitor.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Stop;

/// Counters for `/metrics` and `/status`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "MonitorStats")]
pub struct GetMonitorStats;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MonitorStats {
    pub polls_total: u64,
    pub poll_errors_total: u64,
    pub invalid_watermarks_total: u64,
    pub last_poll_ok: Option<bool>,
    /// Why the latest poll failed; `None` once one succeeds (PROTOCOL.md §11).
    pub last_error: Option<String>,
    /// The watermark the latest poll found backed up: read from the backup (VFS source) or
    /// confirmed by litestream (control source); `None` when that poll failed.
    pub backup_watermark: Option<Watermark>,
    /// Reads of the backup itself since start (the VFS source's polls, the audit's reads).
    pub backup_reads_total: u64,
    /// The audit's state (PROTOCOL.md §8.1d); `None` without an audit.
    pub audit: Option<AuditStats>,
}

/// What one poll produced, before it is handed to the cleanup actor.
type Observed = (Vec<BackupSample>, PollOutcome);

/// See the module documentation.
pub struct MonitorActor {
    cfg: MonitorConfig,
    cleanup: Addr<CleanupActor>,
    client: Option<awc::Client>,
    /// The VFS reader, taken out while a poll uses it (a cancelled poll drops it, killing the
    /// reader process).
    vfs: Option<VfsReader>,
    /// The watermark the VFS source last read, and when it was first read.
    vfs_first_read: Option<(Watermark, i64)>,
    /// Told each watermark the VFS source reads (the reservations, PROTOCOL.md §6.7).
    backup_reads: Option<Recipient<BackupRead>>,
    /// In a quorum of several backups (PROTOCOL.md §8.4): this backup's number and the quorum,
    /// told each poll instead of the cleanup actor.
    quorum: Option<(usize, Recipient<BackupPolled>)>,
    /// In a quorum, the VFS source's read of the poll in flight, handed on with its result.
    read: Option<BackupRead>,
    /// The control source's state (PROTOCOL.md §8.1c).
    control: control::ControlState,
    /// The audit's state (PROTOCOL.md §8.1d).
    audit: audit::AuditState,
    in_flight: Option<SpawnHandle>,
    waiters: Vec<oneshot::Sender<PollOutcome>>,
    stats: MonitorStats,
    stopping: bool,
    /// Told when work waits on this backup and when it progresses (PROTOCOL.md §11.1).
    stall: StallReport,
}

impl MonitorActor {
    pub fn new(cfg: MonitorConfig, cleanup: Addr<CleanupActor>) -> Self {
        MonitorActor {
            cleanup,
            client: None,
            vfs: None,
            vfs_first_read: None,
            backup_reads: None,
            quorum: None,
            read: None,
            control: control::ControlState::default(),
            audit: audit::AuditState::new(cfg.audit.as_ref()),
            in_flight: None,
            waiters: Vec::new(),
            stats: MonitorStats::default(),
            stopping: false,
            stall: StallReport::default(),
            cfg,
        }
    }

    /// Reports to `watch` as stage `backup:NAME` (PROTOCOL.md §11.1): work is pending while
    /// the backup has not confirmed the newest ack (control source) or always (the others,
    /// which learn what is backed up by polling); each poll that read the backup is progress.
    fn report_stalls_to(&mut self, watch: &Addr<StallWatch>) {
        let name = self.cfg.backup.as_deref().unwrap_or(SINGLE_BACKUP);
        self.stall = StallReport::to(watch, stage::backup(name));
        match self.cfg.source {
            BackupSource::Control(_) if !self.control_behind() => self.stall.idle(),
            _ => self.stall.pending(),
        }
    }

    /// After a poll that read the backup: progress, or idle once nothing is left to confirm.
    fn report_progress(&self) {
        match self.cfg.source {
            BackupSource::Control(_) if !self.control_behind() => self.stall.idle(),
            _ => self.stall.progress(),
        }
    }

    /// Sends a [`BackupRead`] to `recipient` after each VFS poll that read a watermark.
    pub fn reporting_backups_to(mut self, recipient: Recipient<BackupRead>) -> Self {
        self.backup_reads = Some(recipient);
        self
    }

    /// Hands each poll to `quorum` as backup number `backup` ([`BackupPolled`]), instead of
    /// to the cleanup actor (PROTOCOL.md §8.4).
    pub fn in_quorum(mut self, backup: usize, quorum: Recipient<BackupPolled>) -> Self {
        self.quorum = Some((backup, quorum));
        self
    }

    /// Tells what the VFS source read: the reservations, or the quorum with the poll's result.
    fn report_read(&mut self, read: BackupRead) {
        if self.quorum.is_some() {
            self.read = Some(read);
        } else if let Some(r) = &self.backup_reads {
            r.do_send(read);
        }
    }

    /// Hands a poll's result on: to the quorum in one, else to the cleanup actor. The future
    /// ends once it was acted on.
    fn hand_on(
        &mut self,
        samples: Vec<BackupSample>,
        outcome: &PollOutcome,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        match &self.quorum {
            Some((backup, quorum)) => {
                let sent = quorum.send(BackupPolled {
                    backup: *backup,
                    samples,
                    outcome: outcome.clone(),
                    read: self.read.take(),
                });
                Box::pin(async move {
                    let _ = sent.await;
                })
            }
            None => {
                let sent = self.cleanup.send(PollResult { samples });
                Box::pin(async move {
                    let _ = sent.await;
                })
            }
        }
    }

    /// Uses `reader`, already started (the service checks at start that the extension loads),
    /// so that the first poll does not pay for loading it again.
    pub fn with_vfs_reader(mut self, reader: VfsReader) -> Self {
        self.vfs = Some(reader);
        self
    }

    /// One period (PROTOCOL.md §8.1c, §8.3): a poll, or, while the previous one still waits for
    /// its answer, the scheduling step alone; the request in flight keeps its timeout.
    fn period(&mut self, ctx: &mut Context<Self>) {
        if self.stopping {
            return;
        }
        if self.in_flight.is_none() {
            return self.start_poll(ctx);
        }
        debug!(
            "{} has not answered yet: the scheduling step runs without it",
            self.describe()
        );
        let step = self.hand_on(Vec::new(), &PollOutcome::StillInFlight);
        ctx.spawn(step.into_actor(self));
    }

    fn start_poll(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight.is_some() || self.stopping {
            return;
        }
        let poll = match &self.cfg.source {
            BackupSource::Metrics { url } => self.poll_metrics(url.clone()),
            BackupSource::Vfs(source) => self.poll_vfs(source.clone()),
            BackupSource::Control(source) => self.poll_control(ctx, source.clone()),
        };
        let handle = ctx.spawn(poll.then(|(samples, outcome), act, _| {
            act.stats.polls_total += 1;
            if matches!(outcome, PollOutcome::Read { .. }) {
                act.stats.last_error = None;
                act.report_progress();
            }
            act.audit.note_confirmed(&samples);
            act.hand_on(samples, &outcome)
                .into_actor(act)
                .map(move |_, act, ctx| {
                    act.in_flight = None;
                    for w in act.waiters.drain(..) {
                        let _ = w.send(outcome.clone());
                    }
                    if matches!(act.cfg.source, BackupSource::Control(_)) {
                        act.control_poll_ended(ctx, &outcome);
                    }
                })
        }));
        self.in_flight = Some(handle);
    }

    /// What is polled, for log lines: with several backups, which one.
    fn describe(&self) -> String {
        match &self.cfg.backup {
            Some(name) => format!("backup {name} ({})", self.cfg.source.describe()),
            None => self.cfg.source.describe(),
        }
    }

    /// A failed poll: a warning, a counted error, nothing observed.
    pub(super) fn failed(&mut self, reason: String) -> Observed {
        warn!("unable to read {}: {reason}", self.describe());
        self.stats.poll_errors_total += 1;
        self.stats.last_poll_ok = Some(false);
        self.stats.backup_watermark = None;
        self.stats.last_error = Some(reason.clone());
        (Vec::new(), PollOutcome::Failed(reason))
    }
}

impl Actor for MonitorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        log::info!(
            "monitoring {} every {} ms",
            self.describe(),
            self.cfg.interval.as_millis()
        );
        if self.cfg.poll_automatically {
            ctx.run_interval(self.cfg.interval, |act, ctx| act.period(ctx));
        }
        self.schedule_audits(ctx);
    }
}

impl Handler<Check> for MonitorActor {
    type Result = ResponseFuture<PollOutcome>;
    fn handle(&mut self, _: Check, ctx: &mut Context<Self>) -> Self::Result {
        if self.stopping {
            return Box::pin(async { PollOutcome::Aborted });
        }
        let (tx, rx) = oneshot::channel();
        self.waiters.push(tx);
        self.start_poll(ctx);
        Box::pin(async move { rx.await.unwrap_or(PollOutcome::Aborted) })
    }
}

impl Handler<ReportStalls> for MonitorActor {
    type Result = ();
    fn handle(&mut self, msg: ReportStalls, _: &mut Context<Self>) {
        self.report_stalls_to(&msg.watch);
    }
}

impl Handler<Stop> for MonitorActor {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        self.stopping = true;
        if let Some(h) = self.in_flight.take() {
            log::info!("aborting the poll in flight of {}", self.describe());
            ctx.cancel_future(h);
        }
        self.waiters.clear();
        ctx.stop();
    }
}

impl Handler<GetMonitorStats> for MonitorActor {
    type Result = MessageResult<GetMonitorStats>;
    fn handle(&mut self, _: GetMonitorStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(MonitorStats {
            audit: self.audit.stats.clone(),
            ..self.stats.clone()
        })
    }
}
