//! Following: the streamer of a serving standby (PROTOCOL.md §14.1). It forwards what the owner
//! stored, fed by the [`follower`](crate::follower) through the same [`UpstreamBatch`]es as
//! the upstream client's, but stores nothing (every row it forwards is already durable in the
//! change DB) and acks nothing upstream. Everything else is the owner's: the same checks,
//! catch-up from the change DB, framing, flow control and bounds, per standby.
//!
//! Two more conversations are a standby's only:
//! - a joining subscriber is recorded in the change DB ([`RecordSubscribers`]) before it is
//!   checked, so that from its first `status` on the owner's purge holds its watermark back
//!   (the purge and the record serialize on one lock: `changelog/postgres/records.rs`);
//! - [`RecordLapsed`]: the record was gone for the others meanwhile, so the owner may have
//!   purged past what the subscribers acked; every subscriber is closed;
//! - [`Ingest`]: the standby became the owner; the same streamer, with every subscriber,
//!   now stores and forwards what the upstream client brings;
//! - [`Rebase`]: the follower found the change log purged past it; every subscriber is closed
//!   (their next catch-up would have a gap) and the streamer goes on from the newest commit.
//!
//! [`UpstreamBatch`]: super::UpstreamBatch

use actix::prelude::*;
use log::{info, warn};

use super::Streamer;
use crate::changelog::{ChangeLog, LogStats};
use crate::session_end::SessionEnd;
use crate::watermark::Watermark;

/// Records this instance's subscribers in the change DB now, answering once a record that
/// includes every subscriber registered before this message was written.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<(), String>")]
pub struct RecordSubscribers;

/// The change log was purged past what this standby forwarded: close every subscriber, drop a
/// transaction in progress, and go on after `last_commit`.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Rebase {
    pub last_commit: Watermark,
}

/// This instance now owns the change DB: ingest from upstream and store in `log` (the owner's
/// handle) from here on, keeping every subscriber (PROTOCOL.md §14.1, takeover keeps
/// subscribers). `stats` is what the owned change log holds: if the streamer forwarded less
/// (its follower could not read the last commits), its subscribers are closed rather than
/// left with a gap.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Ingest {
    pub log: ChangeLog,
    pub stats: LogStats,
}

/// The close reason of a standby's subscribers when it became the owner without having
/// forwarded every stored commit.
pub const BEHIND_AT_TAKEOVER_REASON: &str =
    "standby: became the owner behind the change log; reconnect to catch up";

/// This standby's record in the change DB had lapsed: for the owner it was gone, and no longer
/// held the purge back; every subscriber is closed, as their next catch-up might have a gap.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct RecordLapsed;

/// The close reason of a standby's subscribers after [`RecordLapsed`].
pub const LAPSED_REASON: &str =
    "standby: its record in the change DB had lapsed; reconnect to catch up";

/// The close reason of a standby's subscribers after a [`Rebase`].
pub const REBASE_REASON: &str =
    "standby: the change log was purged past what this standby forwarded; reconnect to catch up";

impl Streamer {
    /// This streamer forwards what the owner stored and stores nothing (a serving standby),
    /// recording each joining subscriber through `record` before it checks it.
    pub fn following(mut self, record: Recipient<RecordSubscribers>) -> Streamer {
        self.follows = Some(record);
        self
    }
}

impl Streamer {
    /// Closes every subscriber with 1011 `reason`.
    fn close_every_subscriber(&mut self, ctx: &mut Context<Self>, reason: &str) {
        let ids: Vec<_> = self.subscribers.keys().copied().collect();
        if !ids.is_empty() {
            warn!("closing {} subscriber(s): {reason}", ids.len());
        }
        for id in ids {
            self.close_subscriber(ctx, id, SessionEnd::Unavailable(reason.into()));
        }
    }
}

impl Handler<Rebase> for Streamer {
    type Result = ();
    fn handle(&mut self, msg: Rebase, ctx: &mut Context<Self>) {
        // Subscribers that got the begin of a transaction in progress are closed with it.
        self.txn = None;
        self.close_every_subscriber(ctx, REBASE_REASON);
        self.last_commit = Some(msg.last_commit);
    }
}

impl Handler<Ingest> for Streamer {
    type Result = ();
    fn handle(&mut self, msg: Ingest, ctx: &mut Context<Self>) {
        let Ingest { log, stats } = msg;
        if self.last_commit != stats.max_watermark || self.txn.is_some() {
            warn!(
                "taking over: forwarded up to watermark={:?}, the change log holds up to {:?}",
                self.last_commit, stats.max_watermark
            );
            self.txn = None;
            self.close_every_subscriber(ctx, BEHIND_AT_TAKEOVER_REASON);
            self.last_commit = stats.max_watermark.clone();
        }
        if self.replica_version.is_none() {
            self.replica_version = stats.replica_version;
        }
        info!(
            "ingesting as the owner from watermark={:?}, keeping {} subscriber(s)",
            self.last_commit,
            self.subscribers.len()
        );
        self.follows = None;
        self.log = log;
    }
}

impl Handler<RecordLapsed> for Streamer {
    type Result = ();
    fn handle(&mut self, _: RecordLapsed, ctx: &mut Context<Self>) {
        if self.follows.is_some() {
            self.close_every_subscriber(ctx, LAPSED_REASON);
        }
    }
}
