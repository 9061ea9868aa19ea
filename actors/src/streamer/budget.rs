//! The global budget, `--max-queued-bytes` (PROTOCOL.md §10.2): what all subscribers hold
//! together, checked at every admission of a change to one of them.
//!
//! ### Why at every admission
//! Checking once per change for all the subscribers it goes to (or once per upstream frame)
//! lets every subscriber that was let in take the change, and a burst of changes add up past
//! the bound before the next check. So [`Budget`] follows the total as admissions go, and each
//! subscriber's admission of a live change, a backlogged change or a catch-up row asks it first:
//! the total never exceeds the bound by more than the one change a subscriber that holds
//! nothing may take while the total is within it (so that it still moves on).
//!
//! ### Who runs out of room first
//! Before a live change goes out, the subscribers holding the most overflow first, until the
//! change fits for all the others ([`Streamer::keep_within_budget`]); a subscriber that finds no
//! room at its own admission overflows too. Either reads the rest from the change log
//! ([`catchup`](super::catchup)), which waits for room; acks anywhere make some and wake the
//! catch-ups waiting for it ([`Streamer::read_waiting_catchups`]).

use actix::prelude::*;
use log::info;

use super::Streamer;

/// Asks for the most payload bytes held for all subscribers together at the end of any
/// streamer turn since start: within a turn no ack is read, so the total only grows, and its
/// end is the turn's most. Tests hold `--max-queued-bytes` against it (PROTOCOL.md §10.2).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "u64")]
pub struct QueuedBytesPeak;

impl Handler<QueuedBytesPeak> for Streamer {
    type Result = u64;
    fn handle(&mut self, _: QueuedBytesPeak, _: &mut Context<Self>) -> u64 {
        self.queued_peak
    }
}

/// `--max-queued-bytes` and the payload bytes all subscribers hold, as admissions go.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    limit: u64,
    total: u64,
}

impl Budget {
    pub fn new(limit: u64, total: u64) -> Budget {
        Budget { limit, total }
    }

    /// Whether `len` more bytes may be held for a subscriber: within the limit, or, for one
    /// that holds nothing, while the total is still within it (one change past it, at most).
    pub fn admits(&self, len: usize, holds_nothing: bool) -> bool {
        self.total + len as u64 <= self.limit || (holds_nothing && self.total <= self.limit)
    }

    /// `len` bytes were admitted.
    pub fn add(&mut self, len: usize) {
        self.total += len as u64;
    }

    /// Bytes left within the limit.
    pub fn room(&self) -> u64 {
        self.limit.saturating_sub(self.total)
    }

    /// Whether a subscriber that holds nothing may take one change past the room.
    pub fn within(&self) -> bool {
        self.total <= self.limit
    }
}

impl Streamer {
    /// The budget as it stands now.
    pub(super) fn budget(&self) -> Budget {
        Budget::new(self.cfg.max_queued_bytes as u64, self.queued_bytes())
    }

    /// Before a live change of `len` bytes goes out: while it would not fit for every
    /// subscriber still receiving live changes, the one holding the most (and holding
    /// anything) overflows. Answers the budget for the admissions that follow.
    pub(super) fn keep_within_budget(&mut self, len: usize) -> Budget {
        let budget = self.budget();
        // Fits even if every subscriber takes it: nothing to count.
        if budget.admits(len * self.subscribers.len(), false) {
            return budget;
        }
        // Each subscriber's holdings are looked at: a cohort's members first take theirs.
        self.settle_cohort();
        let budget = self.budget();
        loop {
            let receiving = self
                .subscribers
                .values()
                .filter(|s| s.receives_live())
                .count();
            if receiving == 0 || budget.admits(len * receiving, false) {
                return budget;
            }
            let Some(sub) = self
                .subscribers
                .values_mut()
                .filter(|s| s.receives_live() && s.held_bytes() > 0)
                .max_by_key(|s| s.held_bytes())
            else {
                // Those left hold nothing: their own admissions decide.
                return budget;
            };
            info!(subscriber:% = sub.id;
                "subscribers hold {} bytes, over --max-queued-bytes {} with the next change: subscriber {} ({} bytes) reads from the change log from the end of this transaction",
                budget.total,
                budget.limit,
                sub.id,
                sub.held_bytes()
            );
            sub.overflowed = true;
        }
    }

    /// Notes what all subscribers hold now, at the end of a turn that admitted changes
    /// ([`QueuedBytesPeak`]), from the running total (`HeldTotal`), not from a [`Budget`].
    /// Debug builds (the tests) check that total against the subscribers, counted afresh.
    pub(super) fn note_queued_peak(&mut self) {
        debug_assert_eq!(
            self.queued_bytes(),
            self.subscribers
                .values()
                .map(|s| s.held_bytes())
                .sum::<u64>(),
            "the running total of held bytes"
        );
        self.queued_peak = self.queued_peak.max(self.queued_bytes());
    }

    /// Acks or a departure made room in the budget: the catch-ups with nothing out and no ack
    /// sure to come read on. (One with a commit in flight waits for its own acks, which read
    /// on for it: woken at every other ack it would read the same rows again and again. One
    /// with only the start of a transaction in flight may get no ack before its commit.)
    pub(super) fn read_waiting_catchups(&mut self, ctx: &mut Context<Self>) {
        let waiting: Vec<_> = self
            .catchup
            .iter()
            .filter(|(k, c)| {
                !c.reading && self.subscribers.get(k).is_some_and(|s| !s.ack_to_come())
            })
            .map(|(&k, _)| k)
            .collect();
        for session_id in waiting {
            self.read_catchup(ctx, session_id);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The admission rule of the global budget (PROTOCOL.md §10.2).
    use super::Budget;

    #[test]
    fn the_global_budget_admits_within_the_bound_and_one_change_past_it_to_one_that_holds_nothing()
    {
        let b = Budget::new(100, 90);
        assert!(b.admits(10, false));
        assert!(!b.admits(11, false));
        assert!(b.admits(500, true), "one change alone, while within");
        let mut over = b;
        over.add(11);
        assert!(!over.admits(1, true), "nothing more once past");
        assert_eq!((b.room(), over.room()), (10, 0));
    }
}
