//! The streamer's side of a purge (PROTOCOL.md §9): [`PurgeIfSafe`], asked by the
//! [`Purger`](crate::purger::Purger) once a scheduled cleanup's delay has passed.
//!
//! The streamer knows every subscriber's acked watermark, so the check is answered here, and
//! the purge is queued on the change log in the same turn as the decision: no subscriber can
//! be admitted between the check and the delete.

use actix::prelude::*;

use super::Streamer;
use crate::changelog::ChangeLogError;
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
        let purge = self.log.purge_scheduled(msg.watermark, msg.stored_by_ms);
        Box::pin(async move {
            match purge.await {
                Ok(o) if o.held_by_retention => PurgeAnswer::HeldByRetention(o.rows),
                Ok(o) => PurgeAnswer::Purged(o.rows),
                Err(e) => PurgeAnswer::Failed(e.into()),
            }
        })
    }
}
