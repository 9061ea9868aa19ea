//! Restore progress (PROTOCOL.md §6.8): what a reserving replica says it has restored, the size
//! its status gave it (`replicaSize`, §6.3), and the rate shown in `/status`.
//!
//! A session passes each `["progress", {"bytes": n}]` it accepts on as a [`Progress`]; the
//! actor holding the reservation (the owner's [`ReservationActor`], or a serving standby's
//! `StandbyReservations`) keeps a [`Restore`] per reservation and shows it as [`ProgressInfo`]
//! once a first message arrived. A reservation that never reports shows nothing more.
//!
//! ### The rate, and what is kept for it
//! `restoreBytesPerSecond` at time T is (B(T) − B(S)) ÷ (T − S), with B(t) the bytes of the
//! latest message at or before t and S the later of T − [`RATE_WINDOW_MS`] and the first
//! message since the restore started (over); `null` while T − S is under [`MIN_WINDOW_MS`]. So
//! only the messages of the last window are needed, plus the latest one before it (B(S)): a
//! message is dropped once a later one is at or before the window's start. Messages less than
//! [`MERGE_MS`] after the last one kept are merged into it (their bytes at its time), so at
//! most about `RATE_WINDOW_MS / MERGE_MS` are kept however often a replica reports.
//!
//! [`ReservationActor`]: super::ReservationActor

use std::collections::VecDeque;

use actix::prelude::*;
use log::{debug, info};
use serde::Serialize;

use super::ReservationActor;
use crate::session_end::SessionId;

/// The window of `restoreBytesPerSecond`.
pub(crate) const RATE_WINDOW_MS: i64 = 10_000;
/// The shortest window a rate is given for; `null` before.
pub(crate) const MIN_WINDOW_MS: i64 = 1_000;
/// Messages closer than this to the last one kept are merged into it.
pub(crate) const MERGE_MS: i64 = 100;

/// The replica holding `task_id`'s reservation on session `session_id` has restored `bytes`.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct Progress {
    pub task_id: String,
    pub session_id: SessionId,
    pub bytes: u64,
}

/// A reservation's restore: the size its status carried, and what its replica reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restore {
    /// The `replicaSize` of the status sent; `None` before it, or when it carried none.
    pub replica_size: Option<u64>,
    /// (unix ms, bytes), oldest first, since the restore started (over); empty before any
    /// progress message.
    samples: VecDeque<(i64, u64)>,
}

/// What `/status` shows of a reservation that reported progress (PROTOCOL.md §6.8, §11).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProgressInfo {
    /// The bytes of the latest progress message.
    pub restored_bytes: u64,
    /// The `replicaSize` of its status; `null` when it carried none.
    pub replica_size: Option<u64>,
    /// See the module documentation; `null` while the window is under [`MIN_WINDOW_MS`].
    pub restore_bytes_per_second: Option<u64>,
}

impl ProgressInfo {
    /// `restoredBytes ÷ replicaSize`, the value of `change_streamer_reservation_restore_ratio`;
    /// `None` without a (non-zero) size.
    pub fn ratio(&self) -> Option<f64> {
        self.replica_size
            .filter(|&size| size > 0)
            .map(|size| self.restored_bytes as f64 / size as f64)
    }
}

impl Restore {
    /// Records that `bytes` were restored at `now_ms`. Answers whether it was the first report.
    pub fn record(&mut self, now_ms: i64, bytes: u64) -> bool {
        let first = self.samples.is_empty();
        match self.samples.back_mut() {
            // Below the previous total: the restore started over.
            Some(&mut (_, last)) if bytes < last => self.samples.clear(),
            Some((at, last)) if now_ms - *at < MERGE_MS => {
                *last = bytes;
                return first;
            }
            _ => {}
        }
        self.samples.push_back((now_ms, bytes));
        // B(S) for any later S needs only the latest message at or before this window's start.
        let start = now_ms - RATE_WINDOW_MS;
        while self.samples.len() > 1 && self.samples[1].0 <= start {
            self.samples.pop_front();
        }
        first
    }

    /// What `/status` shows at `now_ms`; `None` before any progress message.
    pub fn info(&self, now_ms: i64) -> Option<ProgressInfo> {
        let &(_, restored_bytes) = self.samples.back()?;
        Some(ProgressInfo {
            restored_bytes,
            replica_size: self.replica_size,
            restore_bytes_per_second: self.rate(now_ms),
        })
    }

    /// Bytes per second over the window ending at `now_ms` (module documentation).
    fn rate(&self, now_ms: i64) -> Option<u64> {
        let &(first_ms, _) = self.samples.front()?;
        let start = (now_ms - RATE_WINDOW_MS).max(first_ms);
        if now_ms - start < MIN_WINDOW_MS {
            return None;
        }
        let bytes_at = |t: i64| {
            self.samples
                .iter()
                .take_while(|&&(at, _)| at <= t)
                .last()
                .map_or(0, |&(_, b)| b)
        };
        let gained = bytes_at(now_ms).saturating_sub(bytes_at(start));
        Some((gained as f64 * 1000.0 / (now_ms - start) as f64).round() as u64)
    }

    /// How many messages are kept (for tests of the bound).
    pub fn kept(&self) -> usize {
        self.samples.len()
    }
}

impl Handler<Progress> for ReservationActor {
    type Result = ();
    fn handle(&mut self, msg: Progress, _: &mut Context<Self>) {
        let now = self.clock.now_ms();
        let Some(res) = self.reservations.get_mut(&msg.task_id) else {
            return;
        };
        if res.holder.as_ref().map(|h| h.session_id) != Some(msg.session_id) {
            return; // a replaced session's late message
        }
        log_progress(&msg, res.restore.record(now, msg.bytes), &res.restore);
    }
}

/// One line per report: the first at info, the others at debug (a replica may report often).
pub(super) fn log_progress(msg: &Progress, first: bool, restore: &Restore) {
    let of = restore
        .replica_size
        .map_or_else(String::new, |size| format!(" of {size}"));
    if first {
        info!(
            task:% = msg.task_id; "snapshot reservation of task {} reports restore progress: {} bytes{of} restored",
            msg.task_id, msg.bytes
        );
    } else {
        debug!(
            task:% = msg.task_id; "snapshot reservation of task {}: {} bytes{of} restored",
            msg.task_id, msg.bytes
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_over_the_last_ten_seconds_and_null_under_one() {
        let mut r = Restore::default();
        assert_eq!(r.info(0), None);
        r.record(0, 0);
        assert_eq!(r.info(500).unwrap().restore_bytes_per_second, None);
        r.record(1_000, 1_000);
        // S = first message (0): (1000 - 0) / 1 s.
        assert_eq!(r.info(1_000).unwrap().restore_bytes_per_second, Some(1_000));
        // At 2 s, B(2 s) is still 1000: (1000 - 0) / 2 s.
        assert_eq!(r.info(2_000).unwrap().restore_bytes_per_second, Some(500));
        for s in 2..=20 {
            r.record(s * 1_000, (s * 1_000) as u64);
        }
        // S = 10 s: (20000 - 10000) / 10 s.
        assert_eq!(
            r.info(20_000).unwrap().restore_bytes_per_second,
            Some(1_000)
        );
        // No report since 20 s: at 30 s the window holds no gain.
        assert_eq!(r.info(30_000).unwrap().restore_bytes_per_second, Some(0));
        assert_eq!(r.info(30_000).unwrap().restored_bytes, 20_000);
    }

    #[test]
    fn a_lower_total_starts_the_rate_over() {
        let mut r = Restore::default();
        r.record(0, 0);
        r.record(5_000, 50_000);
        r.record(6_000, 1_000);
        assert_eq!(r.kept(), 1);
        assert_eq!(r.info(6_500).unwrap().restore_bytes_per_second, None);
        r.record(8_000, 3_000);
        assert_eq!(r.info(8_000).unwrap().restore_bytes_per_second, Some(1_000));
    }

    #[test]
    fn frequent_reports_are_merged_so_that_few_are_kept() {
        let mut r = Restore::default();
        for ms in 0..=60_000 {
            r.record(ms, ms as u64);
        }
        assert!(r.kept() <= 102, "{} kept", r.kept());
        let rate = r.info(60_000).unwrap().restore_bytes_per_second.unwrap();
        assert!((990..=1_010).contains(&rate), "{rate}");
    }
}
