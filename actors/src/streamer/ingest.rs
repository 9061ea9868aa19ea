//! Ingest: the streamer's conversation with the upstream client. Batches of upstream messages
//! come in ([`UpstreamBatch`]); each transaction is forwarded to live subscribers change by
//! change, stored pending in chunks as it comes, queued on the change log at its commit, and
//! answered with the acks the client must send upstream once durable ([`BatchReply`]). A
//! tracked send stops the batch: the client waits for its release before sending the rest.
//!
//! The open transaction is stored as it arrives, in pending chunks ([`pending`](super::pending),
//! PROTOCOL.md §3.0).
//!
//! Ordering rules of a transaction (begin before data, matching watermarks) are checked here,
//! where it is known where a transaction stands; a broken rule is a [`ProtocolViolation`] that
//! rolls the transaction back.

use std::sync::Arc;

use actix::prelude::*;
use log::{info, warn};
use tokio::sync::oneshot;

use super::change::{Change, Kind};
use super::Streamer;
use crate::changelog::{ChangeKind, ChangeLogError, Transaction};
use crate::upstream::protocol::{self, UpstreamMessage};
use crate::watermark::Watermark;

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

/// The change source broke the rules of a transaction; the connection must be dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProtocolViolation(pub String);

/// The upstream connection changed state.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub enum UpstreamEvent {
    /// Connected, resuming after `resume_after`, the change log's last durable commit.
    Connected { resume_after: Option<Watermark> },
    /// Connection ended; a transaction in progress is rolled back.
    Disconnected,
}

/// The transaction in progress.
pub(super) struct Txn {
    pub(super) watermark: Watermark,
    skip_ack: bool,
    /// A transaction already stored (watermark ≤ last commit): skipped, acked again.
    pub(super) replay: bool,
    /// Its changes not handed to the change log yet, from position `stored`.
    pub(super) changes: Vec<(ChangeKind, String)>,
    /// The bytes of JSON text in `changes`.
    pub(super) bytes: usize,
    /// How many of its first changes were queued as pending chunks (or, at a following
    /// standby, passed on: it stores nothing).
    pub(super) stored: u64,
}

impl Txn {
    /// The position of its next change.
    fn next_pos(&self) -> i64 {
        self.stored as i64 + self.changes.len() as i64
    }

    fn push(&mut self, kind: ChangeKind, payload: String) {
        self.bytes += payload.len();
        self.changes.push((kind, payload));
    }
}

/// A release once both `a` and `b` resolve (either may be absent).
fn both(
    a: Option<oneshot::Receiver<()>>,
    b: Option<oneshot::Receiver<()>>,
) -> Option<oneshot::Receiver<()>> {
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(a), Some(b)) => {
            let (tx, rx) = oneshot::channel();
            actix::spawn(async move {
                let _ = a.await;
                let _ = b.await;
                let _ = tx.send(());
            });
            Some(rx)
        }
    }
}

impl Streamer {
    /// Rolls back the transaction in progress (upstream gone or broken): subscribers that got
    /// its `begin` get a `rollback`; nothing of it is stored (its pending rows are deleted).
    pub(super) fn abort_txn(&mut self, ctx: &mut Context<Self>) {
        if let Some(txn) = self.txn.take() {
            self.flush_all();
            self.drop_pending(&txn);
            if !txn.replay {
                info!(watermark:% = txn.watermark;
                    "rolling back transaction watermark={} (upstream interrupted)",
                    txn.watermark
                );
                let pos = txn.next_pos();
                let rollback = Arc::new(Change::new(
                    Kind::Rollback,
                    txn.watermark,
                    pos,
                    r#"{"tag":"rollback"}"#,
                ));
                let mut budget = self.budget();
                for sub in self.subscribers.values_mut() {
                    sub.send_live(&rollback, None, &mut self.shared, &mut budget);
                }
                self.flush_all();
            }
            self.bound_queues(ctx);
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
            } => self.begin(ctx, payload, commit_watermark, skip_ack),
            UpstreamMessage::Data { payload } => self.data(ctx, payload),
            UpstreamMessage::Commit { payload, watermark } => {
                self.commit(ctx, payload, watermark, acks)
            }
            UpstreamMessage::Rollback { payload } => self.rollback(ctx, payload),
            UpstreamMessage::Status { ack, watermark } => {
                if ack {
                    acks.push(UpstreamAck {
                        durable: None,
                        frame: Some(protocol::status_ack(&watermark)),
                    });
                }
                Ok(None)
            }
            // Shown in /status and /readyz until a new transaction commits (PROTOCOL.md §4).
            UpstreamMessage::ResetRequired { message } => {
                warn!(
                    "change source requires a reset: {message} (last commit {:?}; /readyz answers 503 until it sends a new transaction)",
                    self.last_commit.as_ref().map(|w| w.to_string())
                );
                self.reset_required = Some(message);
                Ok(None)
            }
        }
    }

    /// Opens a transaction; one already stored (a replay after reconnecting) is only tracked,
    /// to be acked again at its commit.
    fn begin(
        &mut self,
        ctx: &mut Context<Self>,
        payload: String,
        commit_watermark: Watermark,
        skip_ack: bool,
    ) -> Result<Option<oneshot::Receiver<()>>, ProtocolViolation> {
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
            info!(watermark:% = commit_watermark; "skipping replayed transaction watermark={commit_watermark} (already stored)");
        }
        let mut txn = Txn {
            watermark: commit_watermark.clone(),
            skip_ack,
            replay,
            changes: Vec::new(),
            bytes: 0,
            stored: 0,
        };
        let mut release = None;
        if !replay {
            release = self.forward(ctx, Change::new(Kind::Begin, commit_watermark, 0, &payload));
            txn.push(ChangeKind::Begin, payload);
        }
        self.txn = Some(txn);
        Ok(release)
    }

    fn data(
        &mut self,
        ctx: &mut Context<Self>,
        payload: String,
    ) -> Result<Option<oneshot::Receiver<()>>, ProtocolViolation> {
        let Some(t) = self.txn.as_mut() else {
            return Err(ProtocolViolation("data outside a transaction".into()));
        };
        if t.replay {
            return Ok(None);
        }
        let pos = t.next_pos();
        let change = Change::new(Kind::Data, t.watermark.clone(), pos, &payload);
        t.push(ChangeKind::Data, payload);
        let forwarded = self.forward(ctx, change);
        let stored = if self.chunk_full() {
            self.store_chunk()
        } else {
            None
        };
        Ok(both(forwarded, stored))
    }

    /// Ends a transaction: forwards the commit, queues the rest of the transaction on the change
    /// log (its pending chunks counted, PROTOCOL.md §3.0) and acks it upstream once durable. Subscribers queued behind it join now.
    fn commit(
        &mut self,
        ctx: &mut Context<Self>,
        payload: String,
        watermark: Watermark,
        acks: &mut Vec<UpstreamAck>,
    ) -> Result<Option<oneshot::Receiver<()>>, ProtocolViolation> {
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
                    frame: Some(protocol::commit_ack(&watermark)),
                });
            }
            self.activate_queued(ctx);
            return Ok(None);
        }
        let pos = t.next_pos();
        let release = self.forward(
            ctx,
            Change::new(Kind::Commit, watermark.clone(), pos, &payload),
        );
        t.push(ChangeKind::Commit, payload);
        // The first commit is the replicaVersion at the owner, which stored it. A standby's
        // first forwarded commit need not be the change DB's first (its follower starts at
        // the newest commit it read, and may read the rows before their replicaVersion): a
        // following streamer takes the replicaVersion from the change DB only (`join.rs`,
        // `Ingest`).
        if self.replica_version.is_none() && self.follows.is_none() {
            info!(watermark:% = watermark; "initial sync committed: replicaVersion={watermark}");
            self.replica_version = Some(watermark.clone());
        }
        self.last_commit = Some(watermark.clone());
        // A new transaction shows the source can go on after all (PROTOCOL.md §4).
        if let Some(was) = self.reset_required.take() {
            info!(watermark:% = watermark; "reset-required cleared: the change source sent transaction watermark={watermark} after it (it said: {was})");
        }
        // A standby's rows are the owner's, already durable: nothing to store or ack.
        let mut paced = None;
        if self.follows.is_none() {
            let bytes = t.bytes;
            let durable = self.log.append(Transaction {
                watermark: watermark.clone(),
                pending: t.stored,
                changes: t.changes,
            });
            paced = self.write_mark(bytes);
            acks.push(UpstreamAck {
                durable: Some(Box::pin(durable)),
                frame: (!t.skip_ack).then(|| protocol::commit_ack(&watermark)),
            });
        }
        self.bound_queues(ctx);
        self.activate_queued(ctx);
        Ok(both(release, paced))
    }

    fn rollback(
        &mut self,
        ctx: &mut Context<Self>,
        payload: String,
    ) -> Result<Option<oneshot::Receiver<()>>, ProtocolViolation> {
        let Some(t) = self.txn.take() else {
            return Err(ProtocolViolation("rollback outside a transaction".into()));
        };
        let mut release = None;
        self.drop_pending(&t);
        if !t.replay {
            info!(watermark:% = t.watermark; "transaction watermark={} rolled back upstream", t.watermark);
            let pos = t.next_pos();
            release = self.forward(ctx, Change::new(Kind::Rollback, t.watermark, pos, &payload));
        }
        self.bound_queues(ctx);
        self.activate_queued(ctx);
        Ok(release)
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
                        warn!(watermark:% = durable; "last forwarded commit watermark={last} was never stored; resuming after watermark={durable}");
                        self.last_commit = resume_after;
                    }
                }
            }
            UpstreamEvent::Disconnected => {
                self.upstream_connected = false;
                self.abort_txn(ctx);
                self.flush_all();
            }
        }
    }
}
