//! The `Streamer`: owns the order of changes. Each upstream change is stored and forwarded in
//! one sequence, and new subscribers join that sequence at a transaction boundary.
//!
//! ### One order for storage and forwarding
//! Upstream messages arrive in batches from the upstream client ([`ingest`]). For each
//! transaction the streamer forwards `begin`, `data`… and `commit` to the live subscribers as
//! they come, stores its changes pending in chunks as they come (PROTOCOL.md §3.0), and at the
//! commit queues the rest of the transaction on the change log (whose writes keep call order)
//! and hands the upstream client the future of its durability, on which the client acks
//! upstream. A subscriber that asks to join is checked, then activated between
//! transactions, catching up from the change log before it goes live ([`join`], [`catchup`]).
//!
//! ### Flow control
//! About every [`StreamerConfig::flow_control_bytes`] of payload one commit is sent tracked, and
//! the upstream client waits for its release, which follows the consensus rule ([`flow`]). A
//! subscriber that lags on a tracked send no longer holds later ones, and is evicted after a
//! grace period (PROTOCOL.md §10.1).
//!
//! ### Bounded memory per subscriber
//! What the service holds for one subscriber (sent and not acked, and its backlog) never exceeds
//! [`StreamerConfig::max_queue_changes`] nor [`StreamerConfig::max_queue_bytes`], and all of
//! them together [`StreamerConfig::max_queued_bytes`], checked at every admission: past a bound,
//! the subscriber reads from the change log instead (PROTOCOL.md §10.2, [`catchup`]; the global
//! budget in [`budget`]).
//!
//! ### Purge
//! The streamer knows every subscriber's acked watermark, so the purge check is answered here
//! and the purge is queued on the change log in the same turn as the decision ([`purge`]).
//!
//! ### At a serving standby
//! The same streamer forwards what the owner stored, fed from the change DB, and stores nothing
//! ([`follow`], PROTOCOL.md §14.1).
//!
//! This file holds the actor, its state and its `/status` answers; each conversation with
//! another party lives in its own file: [`ingest`] (the upstream client), [`join`] (a new
//! subscriber), [`catchup`] (its reads of what it missed), [`session_messages`] (a
//! subscriber's session), [`flow`] (the tracked send), [`purge`] (the purge check), [`follow`]
//! (a standby's follower and record), [`backup_acks`] (the backup monitor, told of the backup
//! replicator's acks), [`required`] (the backup replicator, waited for and never evicted, one
//! per backup).

mod backup_acks;
mod broadcast;
mod budget;
mod catchup;
mod change;
mod cohort;
mod flow;
mod follow;
mod frames;
mod ingest;
mod join;
mod pending;
mod purge;
mod readiness;
mod required;
mod session_messages;
mod shared;
mod subscriber;
mod upstream_link;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use actix::prelude::*;
use log::warn;
use tokio::time::Instant;

use crate::alarm::Alarm;
use crate::changelog::{ChangeLog, ChangeLogError, LogRange, LogStats};
use crate::session_end::{SessionEnd, SessionId};
use crate::watermark::Watermark;
use catchup::Catchup;
use flow::FlowControl;
use ingest::Txn;
use shared::SharedFrames;
use subscriber::{HeldTotal, Subscriber};

pub use backup_acks::{BackupAcked, ReportBackupAcks, RouteBackupAcks};
pub use budget::QueuedBytesPeak;
pub use follow::{Ingest, Rebase, RecordLapsed, RecordSubscribers, LAPSED_REASON, REBASE_REASON};
pub use frames::{
    Batch, FrameList, Outgoing, ToSession, Token, BATCH_MAX_BYTES, BATCH_MAX_PAYLOADS,
};
pub use ingest::{
    BatchReply, DurableFuture, ProtocolViolation, UpstreamAck, UpstreamBatch, UpstreamEvent,
};
pub use join::{Subscribe, SubscribeError};
pub use purge::{PurgeAnswer, PurgeError, PurgeIfSafe};
pub use readiness::{IsResetRequired, IsUpstreamSilent};
pub use session_messages::{SessionGone, SessionProgress};
pub use subscriber::{Bounds, Mode, Phase, SubscriberInfo};
pub use upstream_link::{UpstreamDown, UpstreamLink};

/// Tunables of the streamer.
#[derive(Debug, Clone)]
pub struct StreamerConfig {
    /// Flow-control padding: how long after the latest ack a tracked send waits for the rest
    /// once a majority acked it; `None` waits for all subscribers.
    pub padding: Option<Duration>,
    /// Payload bytes forwarded before the next commit is sent tracked.
    pub flow_control_bytes: usize,
    /// The most rows of one catch-up read (reads are sized from the window's room, within it).
    pub catchup_batch: usize,
    /// `--catchup-window-bytes`: the most payload a catch-up sends that the client has not
    /// acked yet (PROTOCOL.md §10.2); at most `max_queue_bytes`.
    pub catchup_window_bytes: usize,
    /// `--max-subscriber-queue-changes`: the most changes held in memory for one subscriber,
    /// sent and not acked plus its backlog (PROTOCOL.md §10.2); ≥ 1.
    pub max_queue_changes: usize,
    /// `--max-subscriber-queue-bytes`: the most bytes of payload held for one subscriber, in
    /// the same changes (PROTOCOL.md §10.2).
    pub max_queue_bytes: usize,
    /// `--max-queued-bytes`: the most bytes of payload held for all subscribers together.
    pub max_queued_bytes: usize,
    /// `--slow-subscriber-grace-ms`: how long a subscriber may lag on one tracked send before
    /// it is evicted (PROTOCOL.md §10.1); `None` never evicts.
    pub slow_grace: Option<Duration>,
    /// An open transaction is stored pending once this many of its changes wait
    /// (PROTOCOL.md §3.0); ≥ 1. Internal: tests set it small.
    pub txn_chunk_changes: usize,
    /// … or once their JSON text reaches this many bytes, whichever comes first.
    pub txn_chunk_bytes: usize,
}

impl Default for StreamerConfig {
    fn default() -> Self {
        StreamerConfig {
            padding: Some(Duration::from_secs(1)),
            flow_control_bytes: 64 * 1024,
            catchup_batch: 16_384,
            catchup_window_bytes: 4 << 20,
            max_queue_changes: 20_000,
            max_queue_bytes: 16 << 20,
            max_queued_bytes: 256 << 20,
            slow_grace: Some(Duration::from_secs(30)),
            txn_chunk_changes: 4096,
            txn_chunk_bytes: 4 << 20,
        }
    }
}

/// Stops the streamer. `end` is the close every subscriber's session is told first (1001 on a
/// graceful stop); `None` when the service closes every session at once itself (a deposed
/// owner's step down, PROTOCOL.md §14).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Stop {
    pub end: Option<SessionEnd>,
}

/// Asks for the change log's replicaVersion and minWatermark, on which a snapshot
/// reservation's status is based (PROTOCOL.md §6.3). The streamer answers it: it holds the
/// change log's handle.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<LogRange, SnapshotBaseError>")]
pub struct GetSnapshotBase;

/// Why there is no base for a snapshot status yet.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotBaseError {
    #[error("change log is not initialized yet (no replicaVersion)")]
    NotInitialized,
    #[error("change log unavailable: {0}")]
    ChangeLog(#[from] ChangeLogError),
    #[error("change log unavailable: {0}")]
    StreamerGone(#[from] actix::MailboxError),
}

/// The streamer's part of `/status`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "StreamerState")]
pub struct GetStreamerState;

#[derive(Debug, Clone, PartialEq)]
pub struct StreamerState {
    pub upstream_connected: bool,
    /// While not connected, why ([`UpstreamLink`]).
    pub upstream_down: Option<UpstreamDown>,
    pub reset_required: Option<String>,
    pub subscribers: Vec<SubscriberInfo>,
    pub releases_all: u64,
    pub releases_consensus: u64,
    pub tracked_sends: u64,
    pub last_commit: Option<Watermark>,
    /// Subscribers evicted for lagging (PROTOCOL.md §10.1) since start.
    pub subscribers_evicted: u64,
    /// Bytes of payload held for all subscribers (PROTOCOL.md §10.2).
    pub queued_bytes: u64,
}

/// See the module documentation.
pub struct Streamer {
    cfg: StreamerConfig,
    log: ChangeLog,
    replica_version: Option<Watermark>,
    last_commit: Option<Watermark>,
    txn: Option<Txn>,
    subscribers: BTreeMap<SessionId, Subscriber>,
    /// Catch-up progress of the subscribers catching up.
    catchup: HashMap<SessionId, Catchup>,
    /// Mean bytes of a message of the last catch-up read of any subscriber: the size of a
    /// fresh catch-up's first read ([`catchup`]); `None` before any.
    catchup_row_bytes: Option<u64>,
    flow: FlowControl,
    /// The frames of the live changes forwarded in this turn, once for all subscribers.
    shared: SharedFrames,
    next_token: u64,
    /// Subscriptions asked for so far: the order of each subscriber (its `joined`).
    joins: u64,
    /// The zero of the streamer's millisecond scale. Flow control's "now" and its timers both
    /// run on the runtime's clock (tokio time), so a test that pauses it moves them together.
    origin: Instant,
    upstream_connected: bool,
    /// Why not connected, as the upstream client last said ([`UpstreamLink`]).
    upstream_down: Option<UpstreamDown>,
    reset_required: Option<String>,
    subscribers_evicted: u64,
    /// A serving standby's: what records its subscribers ([`follow`]); `None` on the owner.
    follows: Option<Recipient<RecordSubscribers>>,
    /// Rings every second for the subscribers' rate samples ([`SampleRates`]).
    sampler: Option<Alarm>,
    /// Told each commit a `mode=backup` subscriber acks ([`backup_acks`]), per backup.
    backup_acks: backup_acks::AckRoutes,
    /// The most payload held for all subscribers at the end of a turn ([`QueuedBytesPeak`]).
    queued_peak: u64,
    /// The payload held for all subscribers, as it changes.
    held: HeldTotal,
    /// The subscribers taking the rest of the current transaction as one ([`cohort`]).
    cohort: Option<cohort::Cohort>,
    /// A cohort may form after the first change of a turn (besides after each `begin`).
    cohort_may_form: bool,
    /// How far the change log's writer may fall behind ingest ([`pending`]).
    write_pace: pending::WritePace,
}

impl Streamer {
    /// `stats` is the change log's state at start.
    pub fn new(cfg: StreamerConfig, log: ChangeLog, stats: &LogStats) -> Streamer {
        Streamer {
            cfg,
            log,
            replica_version: stats.replica_version.clone(),
            last_commit: stats.max_watermark.clone(),
            txn: None,
            write_pace: pending::WritePace::default(),
            subscribers: BTreeMap::new(),
            catchup: HashMap::new(),
            catchup_row_bytes: None,
            flow: FlowControl::default(),
            shared: SharedFrames::default(),
            next_token: 1,
            joins: 0,
            origin: Instant::now(),
            upstream_connected: false,
            upstream_down: None,
            reset_required: None,
            subscribers_evicted: 0,
            follows: None,
            sampler: None,
            backup_acks: backup_acks::AckRoutes::default(),
            queued_peak: 0,
            held: HeldTotal::default(),
            cohort: None,
            cohort_may_form: true,
        }
    }

    /// Milliseconds since the streamer started, on the runtime's clock.
    pub(super) fn now_ms(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * 1000.0
    }

    /// A fresh number for a tracked frame ([`Token`]).
    pub(super) fn next_token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    /// What one subscriber may hold (PROTOCOL.md §10.2).
    pub(super) fn bounds(&self) -> subscriber::Bounds {
        subscriber::Bounds {
            changes: self.cfg.max_queue_changes,
            bytes: self.cfg.max_queue_bytes,
        }
    }

    /// Bytes of payload held for all subscribers together (PROTOCOL.md §10.2).
    pub(super) fn queued_bytes(&self) -> u64 {
        self.held.get()
    }

    /// Hands every subscriber's queued frames to its session: once per streamer turn.
    pub(super) fn flush_all(&mut self) {
        self.settle_cohort();
        self.cohort_may_form = true;
        let now = self.now_ms();
        let batch = self.shared.take();
        for sub in self.subscribers.values_mut() {
            sub.flush_turn(now, &batch);
        }
        self.note_queued_peak();
    }

    /// Forgets a subscriber (its session stopped, or it is being closed): it no longer holds
    /// back a broadcast or a purge.
    pub(super) fn remove_subscriber(
        &mut self,
        ctx: &mut Context<Self>,
        session_id: SessionId,
    ) -> Option<Subscriber> {
        self.settle_cohort();
        let mut sub = self.subscribers.remove(&session_id);
        if let Some(s) = &mut sub {
            s.leave_total();
        }
        self.catchup.remove(&session_id);
        self.broadcast_completed(ctx, session_id, None);
        if sub.is_some() {
            // What it held is free: catch-ups waiting for the budget read on (§10.2).
            self.read_waiting_catchups(ctx);
        }
        sub
    }

    /// Closes the session of a subscriber with `end` and forgets it at once, rather than when
    /// its session reports it gone: a session whose client stopped reading may not run again
    /// until its socket drains.
    pub(super) fn close_subscriber(
        &mut self,
        ctx: &mut Context<Self>,
        session_id: SessionId,
        end: SessionEnd,
    ) {
        if let Some(sub) = self.remove_subscriber(ctx, session_id) {
            warn!(subscriber:% = sub.id; "closing subscriber {}: {}", sub.id, end.close_frame().1);
            sub.session.do_send(ToSession::Close(end));
        }
    }
}

impl Actor for Streamer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let every = Duration::from_secs(1);
        self.sampler = Some(Alarm::every(every, &ctx.address(), || SampleRates));
    }
}

/// Time to sample each subscriber's processing rate (once a second).
#[derive(Message)]
#[rtype(result = "()")]
struct SampleRates;

impl Handler<SampleRates> for Streamer {
    type Result = ();
    fn handle(&mut self, _: SampleRates, _: &mut Context<Self>) {
        let now = self.now_ms();
        for sub in self.subscribers.values_mut() {
            sub.sample(now);
        }
    }
}

impl Handler<GetSnapshotBase> for Streamer {
    type Result = ResponseFuture<Result<LogRange, SnapshotBaseError>>;
    fn handle(&mut self, _: GetSnapshotBase, _: &mut Context<Self>) -> Self::Result {
        let stats = self.log.stats();
        Box::pin(async move {
            // Its one error is the missing replicaVersion.
            stats
                .await?
                .range()
                .ok_or(SnapshotBaseError::NotInitialized)
        })
    }
}

impl Handler<Stop> for Streamer {
    type Result = ();
    fn handle(&mut self, msg: Stop, ctx: &mut Context<Self>) {
        if let Some(end) = msg.end {
            for sub in self.subscribers.values() {
                sub.session.do_send(ToSession::Close(end.clone()));
            }
        }
        ctx.stop();
    }
}

impl Handler<GetStreamerState> for Streamer {
    type Result = MessageResult<GetStreamerState>;
    fn handle(&mut self, _: GetStreamerState, _: &mut Context<Self>) -> Self::Result {
        MessageResult(StreamerState {
            upstream_connected: self.upstream_connected,
            upstream_down: self.upstream_down.clone(),
            reset_required: self.reset_required.clone(),
            subscribers: self
                .subscribers
                .values()
                .map(|s| s.info(self.now_ms()))
                .collect(),
            releases_all: self.flow.releases_all,
            releases_consensus: self.flow.releases_consensus,
            tracked_sends: self.flow.tracked_sends,
            last_commit: self.last_commit.clone(),
            subscribers_evicted: self.subscribers_evicted,
            queued_bytes: self.queued_bytes(),
        })
    }
}
