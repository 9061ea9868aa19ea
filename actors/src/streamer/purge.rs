//! The streamer's side of a purge (PROTOCOL.md §9): [`PurgeIfSafe`], asked by the
//! [`Purger`](crate::purger::Purger) once a scheduled cleanup's delay has passed.
//!
//! The streamer knows every subscriber's acked watermark, so the check is answered here, and
//! the purge is queued on the change log in the same turn as the decision: no subscriber can
//! be admitted between the check and the delete. What it cannot see, the subscribers of the
//! other instances sharing a change DB, the engine checks in the transaction that purges
//! ([`ChangeLog::purge_gated`](crate::changelog::ChangeLog::purge_gated), PROTOCOL.md §14.1).

use actix::prelude::*;

use super::Streamer;
use crate::changelog::{ChangeLogError, PurgeGate, PurgeHold, PurgeOutcome};
use crate::watermark::Watermark;

/// Purge the change log below `watermark` if every connected subscriber has acked it; only
/// rows stored at or before `stored_by_ms` (unix ms) go.
#[derive(Message, Debug, Clone)]
#[rtype(result = "PurgeAnswer")]
pub struct PurgeIfSafe {
    pub watermark: Watermark,
    pub stored_by_ms: i64,
}

#[derive(Debug)]
pub enum PurgeAnswer {
    /// Nothing below the watermark is left (but the newest transaction); these rows went.
    Purged(u64),
    /// These rows went, and rows below the watermark stored after `stored_by_ms` stayed.
    HeldByRetention(u64),
    NoSubscribers,
    Blocked {
        subscriber: String,
        acked: Watermark,
    },
    Failed(PurgeError),
}

/// Why a purge check could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum PurgeError {
    /// The change log refused or failed the purge.
    #[error(transparent)]
    ChangeLog(#[from] ChangeLogError),
    /// The streamer stopped before it answered.
    #[error("streamer unavailable: {0}")]
    StreamerGone(actix::MailboxError),
}

impl Handler<PurgeIfSafe> for Streamer {
    type Result = ResponseFuture<PurgeAnswer>;
    fn handle(&mut self, msg: PurgeIfSafe, _: &mut Context<Self>) -> Self::Result {
        if let Some(lagging) = self.subscribers.values().find(|s| s.acked < msg.watermark) {
            let answer = PurgeAnswer::Blocked {
                subscriber: lagging.id.clone(),
                acked: lagging.acked.clone(),
            };
            return Box::pin(async move { answer });
        }
        // The other instances' subscribers, and whether there is any subscriber at all, are
        // the engine's to check, in the transaction that purges (PROTOCOL.md §14.1).
        let gate = PurgeGate {
            local_subscribers: self.subscribers.len(),
        };
        let purge = self.log.purge_gated(msg.watermark, msg.stored_by_ms, gate);
        Box::pin(async move {
            match purge.await {
                Ok(PurgeOutcome {
                    held: Some(PurgeHold::NoSubscribers),
                    ..
                }) => PurgeAnswer::NoSubscribers,
                Ok(PurgeOutcome {
                    held:
                        Some(PurgeHold::Subscriber {
                            instance,
                            subscriber,
                            acked,
                        }),
                    ..
                }) => PurgeAnswer::Blocked {
                    subscriber: format!("{subscriber} (instance {instance})"),
                    acked,
                },
                Ok(o) if o.held_by_retention => PurgeAnswer::HeldByRetention(o.rows),
                Ok(o) => PurgeAnswer::Purged(o.rows),
                Err(e) => PurgeAnswer::Failed(e.into()),
            }
        })
    }
}
