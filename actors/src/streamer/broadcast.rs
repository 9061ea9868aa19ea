//! `Broadcast`: the progress of one tracked send, and the consensus rule that releases it
//! (PROTOCOL.md §10).
//!
//! ### Why flow control, and why consensus
//! Changes are forwarded pipelined, without waiting. Left at that, a fast upstream fills the
//! socket buffers of every slower subscriber without bound. So about every 64 KiB one change is
//! sent *tracked*, and reading from the upstream waits until it has been acked: the upstream is
//! then read no faster than subscribers process.
//!
//! Waiting for *every* subscriber would let one slow or half-dead replica (a new one with a
//! backlog, a broken TCP connection not yet caught by liveness checks) stall all the others. A
//! fixed ack timeout is no answer either: some changes (a table-wide rewrite, an index build)
//! legitimately take long, and a timeout short enough to matter would stop replication
//! altogether on them. Instead the subscribers set the timeout themselves: once more than half
//! of them (`floor(n/2)+1`) have finished, the rest get at most `padding` more after the latest
//! finish. Usually they finish well within it; a minority that is genuinely behind is given a
//! bounded amount of time at every batch, and catches up eventually because the others wait for
//! it that long each time. With one subscriber, or one replication-manager and one view-syncer,
//! the majority is everyone, so this reduces to waiting for all.
//!
//! A subscriber to whom the change is filtered, or that fails or closes, counts as finished.
//! `n` is fixed when the broadcast starts. A negative padding disables early release.
//!
//! ### Required subscribers (PROTOCOL.md §10.3)
//! The backup replicator is *required*: the consensus waits for it as for a majority, so no
//! early release happens while it has not finished. The purge can never pass what it has
//! applied, so leaving it behind would buy the others nothing but an eviction of the one
//! subscriber whose progress everything else depends on.
//!
//! This type is pure bookkeeping with times passed in; the streamer arms a timer for
//! [`Broadcast::release_at`], so the release happens when due rather than at a coarse tick.

use std::collections::HashSet;
use std::time::Duration;

use crate::session_end::SessionId;

/// How a broadcast was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Every subscriber finished.
    All,
    /// A majority finished and the padding passed since the latest of them.
    Consensus,
}

/// The progress of one tracked send. Times are milliseconds on any monotonic scale.
#[derive(Debug, Clone)]
pub struct Broadcast {
    pending: HashSet<SessionId>,
    /// The required subscribers (PROTOCOL.md §10.3): no consensus release while one is pending.
    required: HashSet<SessionId>,
    completed: Vec<(SessionId, f64)>,
    majority: usize,
    start_ms: f64,
    latest_completed_ms: Option<f64>,
    released: Option<Release>,
}

impl Broadcast {
    /// Starts tracking a send to `subscribers` at `now_ms`, of which `required` (PROTOCOL.md
    /// §10.3) must finish before any consensus release.
    pub fn new(
        subscribers: impl IntoIterator<Item = SessionId>,
        required: impl IntoIterator<Item = SessionId>,
        now_ms: f64,
    ) -> Broadcast {
        let pending: HashSet<_> = subscribers.into_iter().collect();
        let required = required
            .into_iter()
            .filter(|r| pending.contains(r))
            .collect();
        let majority = pending.len() / 2 + 1;
        Broadcast {
            required,
            released: if pending.is_empty() {
                Some(Release::All)
            } else {
                None
            },
            pending,
            completed: Vec::new(),
            majority,
            start_ms: now_ms,
            latest_completed_ms: None,
        }
    }

    /// Records that `sub` finished (acked, was filtered, failed or closed). Returns `true` when
    /// that made every subscriber finished.
    pub fn mark_completed(&mut self, sub: SessionId, now_ms: f64) -> bool {
        if self.pending.remove(&sub) {
            self.completed.push((sub, now_ms - self.start_ms));
            self.latest_completed_ms = Some(now_ms);
            if self.pending.is_empty() && self.released.is_none() {
                self.released = Some(Release::All);
                return true;
            }
        }
        false
    }

    pub fn is_done(&self) -> bool {
        self.released.is_some()
    }

    pub fn released(&self) -> Option<Release> {
        self.released
    }

    /// Whether a required subscriber (PROTOCOL.md §10.3) has not finished.
    pub fn waits_for_required(&self) -> bool {
        self.required.iter().any(|r| self.pending.contains(r))
    }

    pub fn pending(&self) -> impl Iterator<Item = SessionId> + '_ {
        self.pending.iter().copied()
    }

    pub fn completed(&self) -> &[(SessionId, f64)] {
        &self.completed
    }

    pub fn elapsed_ms(&self, now_ms: f64) -> f64 {
        now_ms - self.start_ms
    }

    /// When the consensus rule will release this broadcast if nothing else finishes: the
    /// latest finish plus `padding`, once a majority and every required subscriber have
    /// finished. `None` while below the majority, while a required subscriber is pending, when
    /// done, or when there is no padding (wait for all).
    pub fn release_at(&self, padding: Option<Duration>) -> Option<f64> {
        let padding_ms = padding?.as_secs_f64() * 1000.0;
        if self.is_done() || self.completed.len() < self.majority || self.waits_for_required() {
            return None;
        }
        self.latest_completed_ms.map(|t| t + padding_ms)
    }

    /// The consensus rule: `true` if the broadcast was already done or is released now, that
    /// is once `now_ms` has reached [`Broadcast::release_at`] (the one place the rule is
    /// written). No padding (wait for all) never releases early.
    pub fn check_progress(&mut self, padding: Option<Duration>, now_ms: f64) -> bool {
        if self.is_done() {
            return true;
        }
        match self.release_at(padding) {
            Some(at) if now_ms >= at => {
                self.released = Some(Release::Consensus);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    //! The seed's broadcast tests, translated: sends without and with tracking, and
    //! `check_progress` below the majority, at the majority before and after the padding.
    use super::*;

    fn ids<const N: usize>(n: [u64; N]) -> [SessionId; N] {
        n.map(SessionId)
    }

    #[test]
    fn no_subscribers_is_done_at_once() {
        let b = Broadcast::new([], [], 0.0);
        assert!(b.is_done());
        assert_eq!(b.released(), Some(Release::All));
    }

    #[test]
    fn done_when_all_subscribers_ack() {
        let mut b = Broadcast::new(ids([1, 2, 3]), [], 0.0);
        assert!(!b.mark_completed(SessionId(1), 1.0));
        assert!(!b.mark_completed(SessionId(2), 2.0));
        assert!(!b.is_done());
        assert!(b.mark_completed(SessionId(3), 3.0));
        assert_eq!(b.released(), Some(Release::All));
        // A late duplicate changes nothing.
        assert!(!b.mark_completed(SessionId(3), 4.0));
    }

    #[test]
    fn check_progress_below_majority_waits_forever() {
        // 5 subscribers: majority 3. Two finished = majority minus one.
        let mut b = Broadcast::new((1..=5).map(SessionId), [], 0.0);
        assert_eq!(b.majority, 3);
        b.mark_completed(SessionId(1), 10.0);
        b.mark_completed(SessionId(2), 20.0);
        assert!(!b.check_progress(Some(Duration::from_secs(1)), 1_000_000.0));
        assert_eq!(b.release_at(Some(Duration::from_secs(1))), None);
    }

    #[test]
    fn check_progress_at_majority_waits_for_the_padding_since_the_latest_ack() {
        let mut b = Broadcast::new((1..=5).map(SessionId), [], 0.0);
        b.mark_completed(SessionId(1), 10.0);
        b.mark_completed(SessionId(2), 20.0);
        b.mark_completed(SessionId(3), 30.0);
        assert_eq!(b.release_at(Some(Duration::from_secs(1))), Some(1030.0));
        assert!(!b.check_progress(Some(Duration::from_secs(1)), 1029.0));
        assert!(!b.is_done());
        // Another ack restarts the padding.
        b.mark_completed(SessionId(4), 500.0);
        assert!(!b.check_progress(Some(Duration::from_secs(1)), 1030.0));
        assert!(b.check_progress(Some(Duration::from_secs(1)), 1500.0));
        assert_eq!(b.released(), Some(Release::Consensus));
        assert_eq!(b.pending().collect::<Vec<_>>(), vec![SessionId(5)]);
        assert!(b.check_progress(Some(Duration::from_secs(1)), 1500.0));
    }

    #[test]
    fn negative_padding_waits_for_all() {
        let mut b = Broadcast::new((1..=3).map(SessionId), [], 0.0);
        b.mark_completed(SessionId(1), 1.0);
        b.mark_completed(SessionId(2), 2.0);
        assert!(!b.check_progress(None, 1e12));
        assert_eq!(b.release_at(None), None);
        assert!(b.mark_completed(SessionId(3), 3.0));
    }

    #[test]
    fn one_subscriber_is_its_own_majority() {
        let mut b = Broadcast::new(ids([7]), [], 0.0);
        assert_eq!(b.majority, 1);
        assert!(!b.check_progress(Some(Duration::ZERO), 1e9));
        assert!(b.mark_completed(SessionId(7), 5.0));
    }

    #[test]
    fn a_required_subscriber_holds_the_consensus_until_it_finishes() {
        // 5 subscribers, the 5th required: four finish, a majority, yet no release ever.
        let mut b = Broadcast::new((1..=5).map(SessionId), ids([5]), 0.0);
        for (k, t) in [(1, 10.0), (2, 20.0), (3, 30.0), (4, 40.0)] {
            b.mark_completed(SessionId(k), t);
        }
        assert!(b.waits_for_required());
        assert_eq!(b.release_at(Some(Duration::ZERO)), None);
        assert!(!b.check_progress(Some(Duration::ZERO), 1e12));
        // It finishes: all are done.
        assert!(b.mark_completed(SessionId(5), 5000.0));
        assert_eq!(b.released(), Some(Release::All));
    }

    #[test]
    fn a_required_subscriber_and_a_majority_release_after_the_padding() {
        let mut b = Broadcast::new((1..=5).map(SessionId), ids([1]), 0.0);
        b.mark_completed(SessionId(2), 10.0);
        b.mark_completed(SessionId(3), 20.0);
        assert_eq!(b.release_at(Some(Duration::from_secs(1))), None);
        b.mark_completed(SessionId(1), 3000.0);
        assert_eq!(b.release_at(Some(Duration::from_secs(1))), Some(4000.0));
        assert!(b.check_progress(Some(Duration::from_secs(1)), 4000.0));
        assert_eq!(b.released(), Some(Release::Consensus));
    }

    #[test]
    fn a_required_subscriber_not_sent_to_is_not_waited_for() {
        let mut b = Broadcast::new(ids([1, 2, 3]), ids([9]), 0.0);
        assert!(!b.waits_for_required());
        b.mark_completed(SessionId(1), 1.0);
        b.mark_completed(SessionId(2), 2.0);
        assert!(b.check_progress(Some(Duration::ZERO), 2.0));
    }

    #[test]
    fn two_subscribers_need_both() {
        let mut b = Broadcast::new(ids([1, 2]), [], 0.0);
        b.mark_completed(SessionId(1), 1.0);
        assert!(!b.check_progress(Some(Duration::ZERO), 1e9));
    }
}
