//! The `Streamer`: owns the order of changes. Each upstream change is stored and forwarded in
//! one sequence, and new subscribers join that sequence at a transaction boundary.
//!
//! ### One order for storage and forwarding
//! Upstream messages arrive in batches ([`UpstreamBatch`]) from the upstream client. For each
//! transaction the streamer forwards `begin`, `data`… and `commit` to the live subscribers as
//! they come, and at the commit queues the whole transaction on the change log (whose writes
//! keep call order) and hands the upstream client the future of its durability, on which the
//! client acks upstream. A subscriber that asks to join is first checked against the change log
//! (replicaVersion, watermark), then *activated* between transactions: its catch-up reads every
//! stored transaction after its watermark up to the last commit forwarded before activation,
//! and every later change reaches it live (kept in a backlog until catch-up ends). So each
//! transaction reaches it exactly once, by storage or live, never both, never neither.
//!
//! ### Flow control
//! Forwarding is pipelined; about every [`StreamerConfig::flow_control_bytes`] of payload one
//! change is sent tracked as a [`Broadcast`], and the upstream client is told to wait
//! for its release before sending more. Release follows the consensus rule of
//! [`broadcast`]; a timer is armed for the moment it is due, not a periodic tick.
//!
//! ### Purge
//! The streamer knows every subscriber's acked watermark, so [`PurgeIfSafe`] is answered here
//! and the purge is queued on the change log in the same turn as the decision: no subscriber
//! can be admitted between the check and the delete.

pub mod broadcast;
pub mod change;
pub mod purge;
pub mod subscriber;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use log::{debug, info, warn};
use serde::Serialize;
use tokio::sync::oneshot;

use crate::changelog::{
    ChangeKind, ChangeLog, ChangeLogError, ChangeLogState, ChangeLogStats, GetChangeLogState,
    Transaction,
};
use crate::upstream::protocol::UpstreamMessage;
use crate::watermark::Watermark;
use broadcast::{Broadcast, Release, SubscriberId};
use change::{Change, Kind};
use subscriber::{
    Delivery, Mode, Phase, SessionGone, SessionProgress, Subscriber, SubscriberInfo, ToSession,
};

/// The initial frame of a subscription (protocol ≥ 2).
pub const STATUS_FRAME: &str = r#"["status",{"tag":"status"}]"#;

/// Tunables of the streamer.
#[derive(Debug, Clone)]
pub struct StreamerConfig {
    /// Flow-control padding in milliseconds; negative waits for all subscribers.
    pub padding_ms: f64,
    /// Payload bytes forwarded between two tracked sends.
    pub flow_control_bytes: usize,
    /// Rows per catch-up read.
    pub catchup_batch: usize,
    /// Live changes kept for a subscriber still catching up before they are dropped and read
    /// from the change log instead.
    pub backlog_limit: usize,
}

impl Default for StreamerConfig {
    fn default() -> Self {
        StreamerConfig {
            padding_ms: 1000.0,
            flow_control_bytes: 64 * 1024,
            catchup_batch: 2000,
            backlog_limit: 20_000,
        }
    }
}

/// A batch of upstream messages, in order.
#[derive(Message, Debug)]
#[rtype(result = "Result<BatchReply, ProtocolViolation>")]
pub struct UpstreamBatch(pub Vec<UpstreamMessage>);

/// What the upstream client must do after a batch.
#[derive(Debug, Default)]
pub struct BatchReply {
    /// How many messages of the batch were taken.
    pub consumed: usize,
    /// The messages not taken, handed back: send them after `release`.
    pub rest: Vec<UpstreamMessage>,
    /// Acks to send upstream, in this order, each once its condition holds.
    pub acks: Vec<UpstreamAck>,
    /// Set when a tracked send is waiting: send nothing more until it resolves.
    pub release: Option<oneshot::Receiver<()>>,
}

/// An ack for the change source: once `durable` (if any) resolves, and every ack before it
/// was sent, send `frame` (if any).
pub struct UpstreamAck {
    pub durable: Option<DurableFuture>,
    pub frame: Option<String>,
}

impl std::fmt::Debug for UpstreamAck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamAck")
            .field("durable", &self.durable.is_some())
            .field("frame", &self.frame)
            .finish()
    }
}

/// The durability of an appended transaction.
pub type DurableFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ChangeLogError>> + Send>>;

impl UpstreamAck {
    pub fn commit_frame(w: &Watermark) -> String {
        format!(r#"["status",{{"tag":"commit"}},{{"watermark":"{w}"}}]"#)
    }
    pub fn status_frame(w: &Watermark) -> String {
        format!(r#"["status",{{"ack":true}},{{"watermark":"{w}"}}]"#)
    }
}

/// The change source broke the rules of a transaction; the connection must be dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProtocolViolation(pub String);

/// The upstream connection changed state.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub enum UpstreamEvent {
    /// Connected, resuming after `resume_after`, the change log's last durable commit.
    Connected {
        resume_after: Option<Watermark>,
    },
    /// Connection ended; a transaction in progress is rolled back.
    Disconnected,
    ResetRequired(String),
}

/// A replica asks to subscribe.
#[derive(Message)]
#[rtype(result = "Result<(), SubscribeError>")]
pub struct Subscribe {
    /// Unique per session; names the subscriber in [`SessionProgress`] and [`SessionGone`].
    pub key: SubscriberId,
    pub id: String,
    pub mode: Mode,
    pub protocol: u32,
    pub replica_version: String,
    pub watermark: Watermark,
    pub session: Recipient<ToSession>,
}

/// Why a subscription is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeError {
    #[error("change log is not initialized yet (no replicaVersion)")]
    NotInitialized,
    /// Error type 1.
    #[error("current replica version is {ours} (requested {requested})")]
    WrongReplicaVersion { ours: String, requested: String },
    /// Error type 2.
    #[error("earliest supported watermark is {earliest} (requested {requested})")]
    WatermarkTooOld { earliest: String, requested: String },
    #[error("change log unavailable: {0}")]
    Unavailable(String),
}

impl SubscribeError {
    /// The `type` of the error frame, for the two errors that get one.
    pub fn error_type(&self) -> Option<u8> {
        match self {
            SubscribeError::WrongReplicaVersion { .. } => Some(1),
            SubscribeError::WatermarkTooOld { .. } => Some(2),
            _ => None,
        }
    }
}

/// Purge the change log below `watermark` if every connected subscriber has acked it.
#[derive(Message, Debug, Clone)]
#[rtype(result = "PurgeAnswer")]
pub struct PurgeIfSafe {
    pub watermark: Watermark,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeAnswer {
    Purged(u64),
    NoSubscribers,
    Blocked {
        subscriber: String,
        acked: Watermark,
    },
    Failed(String),
}

/// Closes every subscription (service stop).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct CloseAllSubscribers;

/// The streamer's part of `/status`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "StreamerState")]
pub struct GetStreamerState;

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StreamerState {
    pub upstream_connected: bool,
    pub reset_required: Option<String>,
    pub subscribers: Vec<SubscriberInfo>,
    pub releases_all: u64,
    pub releases_consensus: u64,
    pub tracked_sends: u64,
    pub last_commit: Option<Watermark>,
}

struct Txn {
    watermark: Watermark,
    skip_ack: bool,
    /// A transaction already stored (watermark ≤ last commit): skipped, acked again.
    replay: bool,
    changes: Vec<(ChangeKind, String)>,
}

struct Current {
    broadcast: Broadcast,
    token: u64,
    watermark: Watermark,
    release: oneshot::Sender<()>,
    timer: Option<SpawnHandle>,
}

/// See the module documentation.
pub struct Streamer {
    cfg: StreamerConfig,
    log: ChangeLog,
    replica_version: Option<Watermark>,
    last_commit: Option<Watermark>,
    txn: Option<Txn>,
    subscribers: BTreeMap<SubscriberId, Subscriber>,
    /// Catch-up progress: subscriber → token of the batch it is acking.
    catchup: HashMap<SubscriberId, Catchup>,
    bytes_since_tracked: usize,
    current: Option<Current>,
    next_token: u64,
    origin: Instant,
    upstream_connected: bool,
    reset_required: Option<String>,
    releases_all: u64,
    releases_consensus: u64,
    tracked_sends: u64,
}

struct Catchup {
    after: (Watermark, i64),
    up_to: Watermark,
    waiting_token: Option<u64>,
    /// `up_to` moved past what the last barrier covered: wait for durability before reading.
    needs_barrier: bool,
}

impl Streamer {
    /// `stats` is the change log's state at start.
    pub fn new(cfg: StreamerConfig, log: ChangeLog, stats: &ChangeLogStats) -> Streamer {
        Streamer {
            cfg,
            log,
            replica_version: stats.replica_version.clone(),
            last_commit: stats.max_watermark.clone(),
            txn: None,
            subscribers: BTreeMap::new(),
            catchup: HashMap::new(),
            bytes_since_tracked: 0,
            current: None,
            next_token: 1,
            origin: Instant::now(),
            upstream_connected: false,
            reset_required: None,
            releases_all: 0,
            releases_consensus: 0,
            tracked_sends: 0,
        }
    }

    fn now_ms(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * 1000.0
    }

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    /// Forwards one change to the active subscribers, tracked if the flow-control budget is
    /// spent. Returns the release receiver when the upstream must wait.
    fn forward(
        &mut self,
        ctx: &mut Context<Self>,
        change: Change,
    ) -> Option<oneshot::Receiver<()>> {
        let change = Arc::new(change);
        self.bytes_since_tracked += change.payload_len;
        let tracked =
            self.bytes_since_tracked >= self.cfg.flow_control_bytes && self.current.is_none();
        if !tracked {
            for sub in self.subscribers.values_mut() {
                sub.send_live(&change, None);
            }
            return None;
        }
        self.bytes_since_tracked = 0;
        self.tracked_sends += 1;
        let token = self.token();
        let now = self.now_ms();
        let active: Vec<SubscriberId> = self
            .subscribers
            .values()
            .filter(|s| s.is_active())
            .map(|s| s.key)
            .collect();
        let mut broadcast = Broadcast::new(active.iter().copied(), now);
        for sub in self.subscribers.values_mut() {
            if sub.send_live(&change, Some(token)) != Delivery::Sent && sub.is_active() {
                broadcast.mark_completed(sub.key, now);
            }
        }
        if broadcast.is_done() {
            self.releases_all += 1;
            return None;
        }
        let (tx, rx) = oneshot::channel();
        self.current = Some(Current {
            broadcast,
            token,
            watermark: change.watermark.clone(),
            release: tx,
            timer: None,
        });
        self.arm_release_timer(ctx);
        Some(rx)
    }

    fn flush_all(&mut self) {
        for sub in self.subscribers.values_mut() {
            sub.flush();
        }
    }

    /// Arms (or re-arms) the timer for the consensus release of the current broadcast.
    fn arm_release_timer(&mut self, ctx: &mut Context<Self>) {
        let padding = self.cfg.padding_ms;
        let now = self.now_ms();
        let Some(cur) = self.current.as_mut() else {
            return;
        };
        if let Some(t) = cur.timer.take() {
            ctx.cancel_future(t);
        }
        if let Some(at) = cur.broadcast.release_at(padding) {
            let wait = Duration::from_secs_f64(((at - now).max(0.0)) / 1000.0);
            cur.timer = Some(ctx.run_later(wait, |act, ctx| act.check_release(ctx)));
        }
    }

    fn check_release(&mut self, ctx: &mut Context<Self>) {
        let now = self.now_ms();
        let padding = self.cfg.padding_ms;
        let Some(cur) = self.current.as_mut() else {
            return;
        };
        if cur.broadcast.check_progress(padding, now) {
            self.finish_broadcast();
        } else {
            self.arm_release_timer(ctx);
        }
    }

    fn finish_broadcast(&mut self) {
        let Some(cur) = self.current.take() else {
            return;
        };
        let now = self.now_ms();
        match cur.broadcast.released() {
            Some(Release::Consensus) => {
                self.releases_consensus += 1;
                let pending: Vec<String> = cur
                    .broadcast
                    .pending()
                    .filter_map(|k| self.subscribers.get(&k))
                    .map(|s| {
                        format!(
                            "{} (pending {}, {:.0}/s)",
                            s.id,
                            s.pending(),
                            s.process_rate()
                        )
                    })
                    .collect();
                info!(
                    "flow control: watermark={} released by consensus of {} after {:.1} ms; still pending: {}",
                    cur.watermark,
                    cur.broadcast.completed().len(),
                    cur.broadcast.elapsed_ms(now),
                    pending.join(", ")
                );
            }
            _ => {
                self.releases_all += 1;
                debug!(
                    "flow control: watermark={} acked by all after {:.1} ms",
                    cur.watermark,
                    cur.broadcast.elapsed_ms(now)
                );
            }
        }
        let _ = cur.release.send(());
    }

    /// A subscriber finished the current broadcast (acked, closed).
    fn broadcast_completed(
        &mut self,
        ctx: &mut Context<Self>,
        key: SubscriberId,
        token: Option<u64>,
    ) {
        let now = self.now_ms();
        let Some(cur) = self.current.as_mut() else {
            return;
        };
        if token.is_some_and(|t| t != cur.token) {
            return;
        }
        if cur.broadcast.mark_completed(key, now) {
            self.finish_broadcast();
        } else {
            self.arm_release_timer(ctx);
        }
    }

    /// Activates subscribers queued behind a transaction that has just ended.
    fn activate_queued(&mut self, ctx: &mut Context<Self>) {
        let queued: Vec<SubscriberId> = self
            .subscribers
            .values()
            .filter(|s| s.phase == Phase::Queued)
            .map(|s| s.key)
            .collect();
        for key in queued {
            self.activate(ctx, key);
        }
    }

    /// Starts a checked subscriber: status frame, then catch-up up to the last commit
    /// forwarded so far, then live.
    fn activate(&mut self, ctx: &mut Context<Self>, key: SubscriberId) {
        let last_commit = self.last_commit.clone();
        let Some(sub) = self.subscribers.get_mut(&key) else {
            return;
        };
        if sub.protocol >= 2 {
            sub.send_frame(Arc::from(STATUS_FRAME));
        }
        match last_commit {
            Some(up_to) if up_to > sub.watermark => {
                sub.phase = Phase::CatchingUp;
                info!(
                    "subscriber {} catching up from watermark={} to {up_to}",
                    sub.id, sub.watermark
                );
                let after = (sub.watermark.clone(), i64::MAX);
                sub.flush();
                self.catchup.insert(
                    key,
                    Catchup {
                        after,
                        up_to,
                        waiting_token: None,
                        // Everything up to `up_to` was queued on the change log before this
                        // point: the first read waits until it is durable.
                        needs_barrier: true,
                    },
                );
                self.read_catchup(ctx, key);
            }
            _ => {
                sub.phase = Phase::Live;
                info!(
                    "subscriber {} is live from watermark={}",
                    sub.id, sub.watermark
                );
                sub.flush();
            }
        }
    }

    fn read_catchup(&mut self, ctx: &mut Context<Self>, key: SubscriberId) {
        let Some(c) = self.catchup.get_mut(&key) else {
            return;
        };
        if std::mem::take(&mut c.needs_barrier) {
            let barrier = self.log.barrier();
            ctx.spawn(
                barrier
                    .into_actor(self)
                    .map(move |res, act, ctx| match res {
                        Ok(()) => act.read_catchup(ctx, key),
                        Err(e) => act.drop_subscriber(key, 1011, &format!("catch-up failed: {e}")),
                    }),
            );
            return;
        }
        let up_to = c.up_to.clone();
        let read = self
            .log
            .read(c.after.clone(), up_to.clone(), self.cfg.catchup_batch);
        ctx.spawn(read.into_actor(self).map(move |res, act, ctx| match res {
            Ok(rows) => act.send_catchup(ctx, key, rows, up_to),
            Err(e) => act.drop_subscriber(key, 1011, &format!("catch-up failed: {e}")),
        }));
    }

    /// Bounds the backlog of subscribers still catching up: past
    /// [`StreamerConfig::backlog_limit`] live changes, the backlog is dropped and the catch-up
    /// reads those transactions from the change log instead. Called between transactions only,
    /// so the backlog holds whole committed transactions, all queued on the change log.
    fn trim_backlogs(&mut self) {
        let limit = self.cfg.backlog_limit;
        let Some(last) = self.last_commit.clone() else {
            return;
        };
        for sub in self.subscribers.values_mut() {
            if sub.phase != Phase::CatchingUp || sub.backlog.len() <= limit {
                continue;
            }
            if let Some(c) = self.catchup.get_mut(&sub.key) {
                info!(
                    "subscriber {} is still catching up with {} live change(s) waiting; reading them from the change log instead (up to watermark={last})",
                    sub.id,
                    sub.backlog.len()
                );
                sub.backlog.clear();
                c.up_to = last.clone();
                c.needs_barrier = true;
            }
        }
    }

    fn send_catchup(
        &mut self,
        ctx: &mut Context<Self>,
        key: SubscriberId,
        rows: Vec<crate::changelog::StoredChange>,
        read_up_to: Watermark,
    ) {
        let token = self.token();
        let (Some(sub), Some(c)) = (self.subscribers.get_mut(&key), self.catchup.get_mut(&key))
        else {
            return;
        };
        if rows.is_empty() && c.up_to != read_up_to {
            // The target moved while this read was out: read on.
            self.read_catchup(ctx, key);
            return;
        }
        if rows.is_empty() {
            // Caught up: the backlog follows, then live changes.
            self.catchup.remove(&key);
            let backlog = std::mem::take(&mut sub.backlog);
            for change in &backlog {
                sub.send(change, None);
            }
            sub.phase = Phase::Live;
            info!(
                "subscriber {} caught up to watermark={}; {} live change(s) from its backlog",
                sub.id,
                sub.watermark,
                backlog.len()
            );
            sub.flush();
            return;
        }
        if let Some(last) = rows.last() {
            c.after = (last.watermark.clone(), last.pos);
        }
        let sent = rows
            .iter()
            .filter(|row| sub.send(&Change::from_stored(row), None) == Delivery::Sent)
            .count();
        // The batch's last frame is tracked: its ack asks for the next batch.
        if let Some(last) = sub.outbox.last_mut() {
            last.token = Some(token);
        }
        sub.flush();
        if sent == 0 {
            self.read_catchup(ctx, key);
        } else {
            c.waiting_token = Some(token);
        }
    }

    fn drop_subscriber(&mut self, key: SubscriberId, code: u16, reason: &str) {
        if let Some(sub) = self.subscribers.get(&key) {
            warn!("dropping subscriber {}: {reason}", sub.id);
            sub.session.do_send(ToSession::Close {
                code,
                reason: reason.to_string(),
            });
        }
    }

    /// Rolls back the transaction in progress (upstream gone or broken): subscribers that got
    /// its `begin` get a `rollback`; nothing of it was stored.
    fn abort_txn(&mut self, ctx: &mut Context<Self>) {
        if let Some(txn) = self.txn.take() {
            self.flush_all();
            if !txn.replay {
                info!(
                    "rolling back transaction watermark={} (upstream interrupted)",
                    txn.watermark
                );
                let rollback = Arc::new(Change::new(
                    Kind::Rollback,
                    txn.watermark,
                    r#"{"tag":"rollback"}"#,
                ));
                for sub in self.subscribers.values_mut() {
                    sub.send_live(&rollback, None);
                }
                self.flush_all();
            }
            self.activate_queued(ctx);
        }
    }

    /// Applies one upstream message. Returns a release receiver if it made a tracked send.
    fn apply(
        &mut self,
        ctx: &mut Context<Self>,
        msg: UpstreamMessage,
        acks: &mut Vec<UpstreamAck>,
    ) -> Result<Option<oneshot::Receiver<()>>, ProtocolViolation> {
        match msg {
            UpstreamMessage::Begin {
                payload,
                commit_watermark,
                skip_ack,
            } => {
                if let Some(t) = &self.txn {
                    return Err(ProtocolViolation(format!(
                        "begin of watermark={commit_watermark} inside transaction watermark={}",
                        t.watermark
                    )));
                }
                let replay = self
                    .last_commit
                    .as_ref()
                    .is_some_and(|l| commit_watermark <= *l);
                if replay {
                    info!("skipping replayed transaction watermark={commit_watermark} (already stored)");
                }
                let mut changes = Vec::new();
                let mut release = None;
                if !replay {
                    release = self.forward(
                        ctx,
                        Change::new(Kind::Begin, commit_watermark.clone(), &payload),
                    );
                    changes.push((ChangeKind::Begin, payload));
                }
                self.txn = Some(Txn {
                    watermark: commit_watermark,
                    skip_ack,
                    replay,
                    changes,
                });
                Ok(release)
            }
            UpstreamMessage::Data { payload } => {
                let Some(t) = self.txn.as_mut() else {
                    return Err(ProtocolViolation("data outside a transaction".into()));
                };
                if t.replay {
                    return Ok(None);
                }
                let w = t.watermark.clone();
                let change = Change::new(Kind::Data, w, &payload);
                t.changes.push((ChangeKind::Data, payload));
                Ok(self.forward(ctx, change))
            }
            UpstreamMessage::Commit { payload, watermark } => {
                let Some(t) = self.txn.as_ref() else {
                    return Err(ProtocolViolation(format!(
                        "commit of watermark={watermark} outside a transaction"
                    )));
                };
                if t.watermark != watermark {
                    return Err(ProtocolViolation(format!(
                        "commit watermark={watermark} does not match its begin's {}",
                        t.watermark
                    )));
                }
                let Some(mut t) = self.txn.take() else {
                    return Ok(None);
                };
                if t.replay {
                    if !t.skip_ack {
                        acks.push(UpstreamAck {
                            durable: None,
                            frame: Some(UpstreamAck::commit_frame(&watermark)),
                        });
                    }
                    self.activate_queued(ctx);
                    return Ok(None);
                }
                let release =
                    self.forward(ctx, Change::new(Kind::Commit, watermark.clone(), &payload));
                t.changes.push((ChangeKind::Commit, payload));
                if self.replica_version.is_none() {
                    info!("initial sync committed: replicaVersion={watermark}");
                    self.replica_version = Some(watermark.clone());
                }
                self.last_commit = Some(watermark.clone());
                let durable = self.log.append(Transaction {
                    watermark: watermark.clone(),
                    changes: t.changes,
                });
                acks.push(UpstreamAck {
                    durable: Some(Box::pin(durable)),
                    frame: (!t.skip_ack).then(|| UpstreamAck::commit_frame(&watermark)),
                });
                self.trim_backlogs();
                self.activate_queued(ctx);
                Ok(release)
            }
            UpstreamMessage::Rollback { payload } => {
                let Some(t) = self.txn.take() else {
                    return Err(ProtocolViolation("rollback outside a transaction".into()));
                };
                let mut release = None;
                if !t.replay {
                    info!("transaction watermark={} rolled back upstream", t.watermark);
                    release = self.forward(ctx, Change::new(Kind::Rollback, t.watermark, &payload));
                }
                self.trim_backlogs();
                self.activate_queued(ctx);
                Ok(release)
            }
            UpstreamMessage::Status { ack, watermark } => {
                if ack {
                    acks.push(UpstreamAck {
                        durable: None,
                        frame: Some(UpstreamAck::status_frame(&watermark)),
                    });
                }
                Ok(None)
            }
            UpstreamMessage::ResetRequired { message } => {
                warn!("change source requires a reset: {message}");
                self.reset_required = Some(message);
                Ok(None)
            }
        }
    }
}

impl Actor for Streamer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(Duration::from_secs(1), |act, _| {
            let now = act.now_ms();
            for sub in act.subscribers.values_mut() {
                sub.sample(now);
            }
        });
    }
}

impl Handler<UpstreamBatch> for Streamer {
    type Result = Result<BatchReply, ProtocolViolation>;

    fn handle(&mut self, batch: UpstreamBatch, ctx: &mut Context<Self>) -> Self::Result {
        let mut reply = BatchReply::default();
        let mut result = Ok(());
        let mut messages = batch.0.into_iter();
        for msg in messages.by_ref() {
            reply.consumed += 1;
            match self.apply(ctx, msg, &mut reply.acks) {
                Ok(Some(release)) => {
                    reply.release = Some(release);
                    break;
                }
                Ok(None) => {}
                Err(v) => {
                    warn!("upstream protocol violation: {v}");
                    result = Err(v);
                    break;
                }
            }
        }
        reply.rest = messages.collect();
        if result.is_err() {
            self.abort_txn(ctx);
        }
        self.flush_all();
        result.map(|()| reply)
    }
}

impl Handler<UpstreamEvent> for Streamer {
    type Result = ();
    fn handle(&mut self, ev: UpstreamEvent, ctx: &mut Context<Self>) {
        match ev {
            UpstreamEvent::Connected { resume_after } => {
                self.upstream_connected = true;
                // A transaction forwarded but never made durable (its append failed) comes
                // again from the change source; it must not then be skipped as a replay.
                if let (Some(durable), Some(last)) = (&resume_after, &self.last_commit) {
                    if durable < last {
                        warn!("last forwarded commit watermark={last} was never stored; resuming after watermark={durable}");
                        self.last_commit = resume_after;
                    }
                }
            }
            UpstreamEvent::Disconnected => {
                self.upstream_connected = false;
                self.abort_txn(ctx);
                self.flush_all();
            }
            UpstreamEvent::ResetRequired(m) => self.reset_required = Some(m),
        }
    }
}

impl Handler<Subscribe> for Streamer {
    type Result = ResponseActFuture<Self, Result<(), SubscribeError>>;

    fn handle(&mut self, msg: Subscribe, _: &mut Context<Self>) -> Self::Result {
        let Subscribe {
            key,
            id,
            mode,
            protocol,
            replica_version,
            watermark,
            session,
        } = msg;
        // Registered at once (as validating) so that a purge decided from now on respects it.
        self.subscribers.insert(
            key,
            Subscriber::new(key, id.clone(), mode, protocol, watermark.clone(), session),
        );
        let stats = self.log.stats();
        let has_commit = self.log.has_commit(watermark.clone());
        Box::pin(
            async move { (stats.await, has_commit.await) }.into_actor(self).map(
                move |(stats, has_commit), act, ctx| {
                    let checked = (|| {
                        let stats = stats.map_err(|e| SubscribeError::Unavailable(e.to_string()))?;
                        let has_commit = has_commit.map_err(|e| SubscribeError::Unavailable(e.to_string()))?;
                        let ours = act.replica_version.clone().or(stats.replica_version.clone());
                        let Some(ours) = ours else { return Err(SubscribeError::NotInitialized) };
                        if ours.as_str() != replica_version {
                            return Err(SubscribeError::WrongReplicaVersion {
                                ours: ours.to_string(),
                                requested: replica_version.clone(),
                            });
                        }
                        stats.can_serve_from(&watermark, has_commit).map_err(|earliest| {
                            SubscribeError::WatermarkTooOld {
                                earliest: earliest.to_string(),
                                requested: watermark.to_string(),
                            }
                        })
                    })();
                    match checked {
                        Err(e) => {
                            info!("subscription of {id} refused: {e}");
                            act.subscribers.remove(&key);
                            Err(e)
                        }
                        Ok(()) => {
                            let Some(sub) = act.subscribers.get_mut(&key) else {
                                return Ok(()); // the session left meanwhile
                            };
                            info!("subscriber {id} ({mode:?}, v{protocol}) accepted at watermark={watermark}");
                            if act.txn.is_some() {
                                sub.phase = Phase::Queued;
                            } else {
                                act.activate(ctx, key);
                            }
                            Ok(())
                        }
                    }
                },
            ),
        )
    }
}

impl Handler<SessionProgress> for Streamer {
    type Result = ();
    fn handle(&mut self, p: SessionProgress, ctx: &mut Context<Self>) {
        let Some(sub) = self.subscribers.get_mut(&p.subscriber) else {
            return;
        };
        sub.progress(p.acked_messages, p.acked_commit);
        for token in p.tokens {
            if self
                .catchup
                .get(&p.subscriber)
                .is_some_and(|c| c.waiting_token == Some(token))
            {
                if let Some(c) = self.catchup.get_mut(&p.subscriber) {
                    c.waiting_token = None;
                }
                self.read_catchup(ctx, p.subscriber);
            } else {
                self.broadcast_completed(ctx, p.subscriber, Some(token));
            }
        }
    }
}

impl Handler<SessionGone> for Streamer {
    type Result = ();
    fn handle(&mut self, g: SessionGone, ctx: &mut Context<Self>) {
        if let Some(sub) = self.subscribers.remove(&g.subscriber) {
            info!(
                "subscriber {} left at acked watermark={}",
                sub.id, sub.acked
            );
        }
        self.catchup.remove(&g.subscriber);
        self.broadcast_completed(ctx, g.subscriber, None);
    }
}

impl Handler<PurgeIfSafe> for Streamer {
    type Result = ResponseFuture<PurgeAnswer>;
    fn handle(&mut self, msg: PurgeIfSafe, _: &mut Context<Self>) -> Self::Result {
        if self.subscribers.is_empty() {
            return Box::pin(async { PurgeAnswer::NoSubscribers });
        }
        if let Some(lagging) = self.subscribers.values().find(|s| s.acked < msg.watermark) {
            let answer = PurgeAnswer::Blocked {
                subscriber: lagging.id.clone(),
                acked: lagging.acked.clone(),
            };
            return Box::pin(async move { answer });
        }
        let purge = self.log.purge(msg.watermark);
        Box::pin(async move {
            match purge.await {
                Ok(n) => PurgeAnswer::Purged(n),
                Err(e) => PurgeAnswer::Failed(e.to_string()),
            }
        })
    }
}

impl Handler<GetChangeLogState> for Streamer {
    type Result = ResponseFuture<Result<ChangeLogState, String>>;
    fn handle(&mut self, _: GetChangeLogState, _: &mut Context<Self>) -> Self::Result {
        let stats = self.log.stats();
        Box::pin(async move { stats.await.map_err(|e| e.to_string())?.reservation_state() })
    }
}

impl Handler<CloseAllSubscribers> for Streamer {
    type Result = ();
    fn handle(&mut self, _: CloseAllSubscribers, _: &mut Context<Self>) {
        for sub in self.subscribers.values() {
            sub.session.do_send(ToSession::Close {
                code: 1001,
                reason: "service stopping".into(),
            });
        }
    }
}

impl Handler<GetStreamerState> for Streamer {
    type Result = MessageResult<GetStreamerState>;
    fn handle(&mut self, _: GetStreamerState, _: &mut Context<Self>) -> Self::Result {
        MessageResult(StreamerState {
            upstream_connected: self.upstream_connected,
            reset_required: self.reset_required.clone(),
            subscribers: self.subscribers.values().map(Subscriber::info).collect(),
            releases_all: self.releases_all,
            releases_consensus: self.releases_consensus,
            tracked_sends: self.tracked_sends,
            last_commit: self.last_commit.clone(),
        })
    }
}
