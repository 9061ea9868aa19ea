//! Joining: the streamer's conversation with a replica that asks to subscribe (PROTOCOL.md §7).
//!
//! A subscriber that asks to join ([`Subscribe`]) is first checked against the change log
//! (replicaVersion, watermark), then *activated* between transactions: its catch-up reads every
//! stored transaction after its watermark up to the last commit forwarded before activation,
//! and every later change reaches it live (kept in a backlog until catch-up ends). So each
//! transaction reaches it exactly once, by storage or live, never both, never neither.
//!
//! What a subscriber does once activated, catch-up and back to catch-up, is in
//! [`catchup`](super::catchup).

use std::sync::Arc;

use actix::prelude::*;
use log::info;

use super::catchup::Catchup;
use super::follow::RecordSubscribers;
use super::frames::ToSession;
use super::subscriber::{Mode, Phase, Subscriber};
use super::Streamer;
use crate::changelog::{ChangeLogError, LogStats, Unservable};
use crate::session_end::SessionId;
use crate::watermark::Watermark;
use futures_util::future::LocalBoxFuture;

/// The initial frame of a subscription (protocol ≥ 2).
const STATUS_FRAME: &str = r#"["status",{"tag":"status"}]"#;

/// A replica asks to subscribe.
#[derive(Message)]
#[rtype(result = "Result<(), SubscribeError>")]
pub struct Subscribe {
    /// Names the subscriber in [`SessionProgress`](super::SessionProgress) and
    /// [`SessionGone`](super::SessionGone).
    pub session_id: SessionId,
    pub id: String,
    pub mode: Mode,
    /// With `mode=backup`: the backup it feeds, `None` for the only one (PROTOCOL.md §7.1).
    pub backup: Option<String>,
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
    /// Error type 1: the replica's watermark is inside the stored range but no stored commit,
    /// so its history is not this change log's (PROTOCOL.md §7).
    #[error("watermark {requested} is not a commit of this change log (it holds {min} to {max})")]
    NotACommit {
        requested: String,
        min: String,
        max: String,
    },
    #[error("change log unavailable: {0}")]
    Unavailable(String),
}

impl From<ChangeLogError> for SubscribeError {
    fn from(e: ChangeLogError) -> SubscribeError {
        SubscribeError::Unavailable(e.to_string())
    }
}

impl SubscribeError {
    /// The `type` of the error frame, for the two errors that get one.
    pub fn error_type(&self) -> Option<u8> {
        match self {
            SubscribeError::WrongReplicaVersion { .. } | SubscribeError::NotACommit { .. } => {
                Some(1)
            }
            SubscribeError::WatermarkTooOld { .. } => Some(2),
            _ => None,
        }
    }
}

impl Handler<Subscribe> for Streamer {
    type Result = ResponseActFuture<Self, Result<(), SubscribeError>>;

    fn handle(&mut self, msg: Subscribe, _: &mut Context<Self>) -> Self::Result {
        let Subscribe {
            session_id,
            id,
            mode,
            backup,
            protocol,
            replica_version,
            watermark,
            session,
        } = msg;
        // Registered at once (as validating) so that a purge decided from now on respects it.
        let mut sub = Subscriber::new(
            session_id,
            id.clone(),
            mode,
            protocol,
            watermark.clone(),
            session,
            self.bounds(),
        );
        sub.backup = backup;
        self.joins += 1;
        sub.joined = self.joins;
        sub.share_total(&self.held);
        self.subscribers.insert(session_id, sub);
        let checks = self.join_checks(watermark.clone());
        Box::pin(checks.into_actor(self).map(move |checked, act, ctx| {
            let checked = checked.and_then(|(stats, has_commit)| {
                let ours = act
                    .replica_version
                    .clone()
                    .or(stats.replica_version.clone());
                check(ours, &stats, has_commit, &replica_version, &watermark)
            });
            if let Err(e) = checked {
                info!(subscriber:% = id; "subscription of {id} refused: {e}");
                if let Some(mut sub) = act.subscribers.remove(&session_id) {
                    sub.leave_total();
                }
                return Err(e);
            }
            if !act.subscribers.contains_key(&session_id) {
                return Ok(()); // the session left meanwhile, or was replaced (§7.1)
            }
            info!(watermark:% = watermark, subscriber:% = id; "subscriber {id} ({mode:?}, v{protocol}) accepted at watermark={watermark}");
            // Before it queues behind the transaction in progress, which its ghost may hold.
            act.replace_older_backup_replicators(ctx, session_id);
            let Some(sub) = act.subscribers.get_mut(&session_id) else {
                return Ok(());
            };
            if act.txn.is_some() {
                sub.phase = Phase::Queued;
            } else {
                act.activate(ctx, session_id);
            }
            Ok(())
        }))
    }
}

impl Streamer {
    /// What a joiner is checked against: the change log's stats and whether it holds the
    /// joiner's watermark as a commit.
    fn join_checks(
        &self,
        watermark: Watermark,
    ) -> LocalBoxFuture<'static, Result<(LogStats, bool), SubscribeError>> {
        // The owner checks against its own writes (queued now, they see every write queued
        // before); a standby first records the subscriber, then reads what the owner stored
        // (see `follow`).
        match self.follows.clone() {
            None => {
                let stats = self.log.stats();
                let has_commit = self.log.has_commit(watermark.clone());
                Box::pin(async move { Ok((stats.await?, has_commit.await?)) })
            }
            Some(record) => {
                let log = self.log.clone();
                let w = watermark.clone();
                Box::pin(async move {
                    match record.send(RecordSubscribers).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            return Err(SubscribeError::Unavailable(format!(
                                "recording the subscriber in the change DB failed: {e}"
                            )))
                        }
                        Err(_) => {
                            return Err(SubscribeError::Unavailable(
                                "this instance's record is no longer kept (stopping)".into(),
                            ))
                        }
                    }
                    Ok((log.stats().await?, log.has_commit(w).await?))
                })
            }
        }
    }
}

/// Whether a subscription can be served: the change log is initialized (`ours`), the replica
/// is of the same replicaVersion, and the change log still holds what follows its watermark.
fn check(
    ours: Option<Watermark>,
    stats: &LogStats,
    has_commit: bool,
    replica_version: &str,
    watermark: &Watermark,
) -> Result<(), SubscribeError> {
    let Some(ours) = ours else {
        return Err(SubscribeError::NotInitialized);
    };
    if ours.as_str() != replica_version {
        return Err(SubscribeError::WrongReplicaVersion {
            ours: ours.to_string(),
            requested: replica_version.to_string(),
        });
    }
    stats
        .can_serve_from(watermark, has_commit)
        .map_err(|why| match why {
            Unservable::TooOld { earliest } => SubscribeError::WatermarkTooOld {
                earliest: earliest.to_string(),
                requested: watermark.to_string(),
            },
            Unservable::NotACommit { min, max } => SubscribeError::NotACommit {
                requested: watermark.to_string(),
                min: min.to_string(),
                max: max.to_string(),
            },
        })
}

impl Streamer {
    /// Activates subscribers queued behind a transaction that has just ended.
    pub(super) fn activate_queued(&mut self, ctx: &mut Context<Self>) {
        let queued: Vec<SessionId> = self
            .subscribers
            .values()
            .filter(|s| s.phase == Phase::Queued)
            .map(|s| s.session_id)
            .collect();
        for session_id in queued {
            self.activate(ctx, session_id);
        }
    }

    /// Starts a checked subscriber: status frame, then catch-up up to the last commit
    /// forwarded so far, then live.
    pub(super) fn activate(&mut self, ctx: &mut Context<Self>, session_id: SessionId) {
        let last_commit = self.last_commit.clone();
        let now = self.now_ms();
        let Some(sub) = self.subscribers.get_mut(&session_id) else {
            return;
        };
        self.backup_acks.joined(sub);
        if sub.protocol >= 2 {
            sub.send_frame(Arc::from(STATUS_FRAME), &mut self.shared);
        }
        sub.flush(now, &self.shared);
        match last_commit {
            Some(up_to) if up_to > sub.watermark => {
                info!(subscriber:% = sub.id, watermark:% = sub.watermark;
                    "subscriber {} catching up from watermark={} to {up_to}",
                    sub.id, sub.watermark
                );
                sub.phase = Phase::CatchingUp;
                sub.behind_since = Some(now);
                let after = (sub.watermark.clone(), i64::MAX);
                self.catchup.insert(session_id, Catchup::new(after, up_to));
                self.read_catchup(ctx, session_id);
            }
            _ => {
                sub.phase = Phase::Live;
                info!(subscriber:% = sub.id, watermark:% = sub.watermark;
                    "subscriber {} is live from watermark={}",
                    sub.id, sub.watermark
                );
            }
        }
    }
}
