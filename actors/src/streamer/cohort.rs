//! [`Cohort`]: the live subscribers that take the rest of a transaction as one, so that a
//! change forwarded costs the streamer one frame for all of them instead of an admission per
//! subscriber (PROTOCOL.md §10.2's bounds unchanged).
//!
//! ### Why
//! Each live change was admitted for every subscriber in turn: its bounds, the global budget,
//! its watermark filter, its counters, its place in the turn's shared frames. At 64
//! subscribers that loop was the largest part of the streamer thread's work in the profile,
//! although nearly every subscriber passes every check the same way. So after a transaction's
//! `begin` (or the first change of a turn) went out through that loop, the subscribers that
//! are live, inside that transaction, with every frame of the turn so far, of protocol 5 or
//! more and with room form a cohort, and its room is the least of theirs. Each later change
//! of the transaction that fits that room (and the global budget even if every subscriber
//! took it: [`Budget::admits`]) is queued once in the shared frames and counted once in the
//! held total; only the other subscribers go through the loop. Each member takes what the
//! cohort queued (counters, position, watermark, its run of the shared frames) when it
//! settles: at the commit, before any change that does not fit (which then goes through the
//! loop for everyone), before a tracked send, before a budget check that must look at each
//! subscriber, and at the end of the turn ([`Streamer::flush_all`]); so nothing else ever
//! reads a member's state unsettled.
//!
//! A member passes every check the loop would make on these changes: they are inside the
//! transaction it was sent the `begin` of (so never filtered by watermark), its protocol knows
//! every tag, and the room taken for it, from its held changes and bytes at forming, bounds
//! what it could reach by the cohort's last change, acks never arriving within a turn.
//!
//! [`Budget::admits`]: super::budget::Budget::admits
//! [`Streamer::flush_all`]: super::Streamer::flush_all

use std::sync::Arc;

use super::budget::Budget;
use super::change::{Change, Kind};
use super::frames::{Outgoing, Token};
use super::Streamer;
use crate::watermark::Watermark;

/// Bytes a live subscriber keeps free for the closing `commit` or `rollback` (as
/// `subscriber.rs` does).
const CLOSING_RESERVE: u64 = 256;

/// See the module documentation.
pub(super) struct Cohort {
    /// How many subscribers are in it (each marked `in_cohort`).
    members: usize,
    /// The transaction it follows.
    watermark: Watermark,
    /// The fewest changes, and bytes, any member may still take after forming.
    changes_room: u64,
    bytes_room: u64,
    /// What it queued since it formed: changes, their bytes, the last of them.
    queued: u64,
    bytes: u64,
    last: Option<Arc<Change>>,
}

impl Streamer {
    /// Forwards `change` (not tracked) through the cohort, if there is one and the change
    /// fits it: the members' frame once, then the others one by one. `false` (the cohort
    /// settled) when it does not fit.
    pub(super) fn forward_in_cohort(
        &mut self,
        change: &Arc<Change>,
        progress: Option<Token>,
        budget: &mut Budget,
    ) -> bool {
        let Some(c) = self.cohort.as_mut() else {
            return false;
        };
        let len = change.message.len() as u64;
        let fits = match change.kind {
            Kind::Data => {
                c.queued + 2 <= c.changes_room && c.bytes + len + CLOSING_RESERVE <= c.bytes_room
            }
            Kind::Commit => true,
            Kind::Begin | Kind::Rollback => false,
        };
        let same_txn = std::ptr::eq(c.watermark.as_str(), change.watermark.as_str())
            || c.watermark == change.watermark;
        if !fits
            || !same_txn
            || !budget.admits(change.message.len() * self.subscribers.len(), false)
        {
            self.settle_cohort();
            return false;
        }
        let commit = change.kind == Kind::Commit;
        self.shared.frames.push(Outgoing {
            message: change.message.clone(),
            commit: commit.then(|| change.watermark.clone()),
            token: progress,
        });
        c.queued += 1;
        c.bytes += len;
        c.last = Some(change.clone());
        let members = c.members;
        budget.add(change.message.len() * members);
        self.held.add(len * members as u64);
        for sub in self.subscribers.values_mut() {
            if !sub.in_cohort {
                sub.send_live(change, progress, &mut self.shared, budget);
            }
        }
        if commit {
            self.settle_cohort();
        }
        true
    }

    /// After `change` went through the loop: the subscribers that can take the rest of its
    /// transaction as one form a cohort, if at least two can. Tried after a `begin`, and once
    /// at the start of a turn.
    pub(super) fn form_cohort(&mut self, change: &Change) {
        if self.cohort.is_some() || change.kind != Kind::Begin && !self.cohort_may_form {
            return;
        }
        self.cohort_may_form = false;
        if !matches!(change.kind, Kind::Begin | Kind::Data) {
            return;
        }
        let len = self.shared.frames.len();
        let mut members = 0;
        let (mut changes_room, mut bytes_room) = (u64::MAX, u64::MAX);
        for sub in self.subscribers.values_mut() {
            if let Some((changes, bytes)) = sub.cohort_room(len, &change.watermark) {
                sub.in_cohort = true;
                members += 1;
                changes_room = changes_room.min(changes);
                bytes_room = bytes_room.min(bytes);
            }
        }
        if members < 2 {
            for sub in self.subscribers.values_mut() {
                sub.in_cohort = false;
            }
            return;
        }
        self.cohort = Some(Cohort {
            members,
            watermark: change.watermark.clone(),
            changes_room,
            bytes_room,
            queued: 0,
            bytes: 0,
            last: None,
        });
    }

    /// Each member takes what the cohort queued, and the cohort ends.
    pub(super) fn settle_cohort(&mut self) {
        let Some(c) = self.cohort.take() else {
            return;
        };
        for sub in self.subscribers.values_mut() {
            if sub.in_cohort {
                sub.in_cohort = false;
                if let Some(last) = &c.last {
                    sub.settle_cohort(c.queued, c.bytes, last);
                }
            }
        }
    }
}
