//! The segment catalogue both engines keep in memory, and the decisions made from it alone.
//!
//! Changes live in segments of about `segment_rows` changes each (SQLite: tables, a row per
//! transaction; PostgreSQL: partitions, a row per change), each with its watermark range, its
//! count of changes (`rows`) and newest store time. Store times
//! only grow (the writer never stores a time older than the last one it stored), so "every row
//! stored before T" is a prefix of the log, and a segment whose newest store time is before T
//! lies wholly inside it. The engines differ only in the statements they run; which segment a
//! transaction goes to, what a purge may delete and which segment to search are decided here.

use super::types::{LogStats, Transaction};
use crate::watermark::Watermark;

/// A segment's place in the log.
#[derive(Debug, Clone)]
pub(super) struct Segment {
    pub id: i64,
    pub min: Watermark,
    pub max: Watermark,
    pub rows: u64,
    /// When its newest row was stored (unix ms).
    pub max_stored_ms: i64,
}

impl Segment {
    /// A new, still empty segment whose first transaction is `first`, stored at `stored_ms`.
    pub(super) fn opened(id: i64, first: &Watermark, stored_ms: i64) -> Segment {
        Segment {
            id,
            min: first.clone(),
            max: first.clone(),
            rows: 0,
            max_stored_ms: stored_ms,
        }
    }
}

/// Recomputes the stats' range and row count from the segments.
pub(super) fn refresh_range(stats: &mut LogStats, segments: &[Segment]) {
    stats.min_watermark = segments.first().map(|s| s.min.clone());
    stats.max_watermark = segments.last().map(|s| s.max.clone());
    stats.rows = segments.iter().map(|s| s.rows).sum();
}

/// The id of the segment to start before storing the next transaction, if the current one is
/// full (or there is none), or was written by an earlier build in an older layout (`older`:
/// never appended to, so the first append after an upgrade opens a new segment): a new segment
/// starts only at a transaction boundary.
pub(super) fn new_segment_id(
    segments: &[Segment],
    segment_rows: u64,
    older: impl Fn(i64) -> bool,
) -> Option<i64> {
    let full = segments
        .last()
        .is_none_or(|s| s.rows >= segment_rows || older(s.id));
    full.then(|| segments.last().map_or(1, |s| s.id + 1))
}

/// Counts `txn`, just stored at `stored_ms`, in the newest segment and the stats.
pub(super) fn record_append(
    segments: &mut [Segment],
    stats: &mut LogStats,
    txn: &Transaction,
    stored_ms: i64,
) {
    if let Some(seg) = segments.last_mut() {
        seg.rows += txn.pending + txn.changes.len() as u64;
        seg.max_stored_ms = stored_ms;
        if txn.watermark > seg.max {
            seg.max = txn.watermark.clone();
        }
    }
    if stats.replica_version.is_none() {
        log::info!("initial sync stored: replicaVersion={}", txn.watermark);
        stats.replica_version = Some(txn.watermark.clone());
    }
    stats.changes_stored_total += txn.pending + txn.changes.len() as u64;
}

/// The first segment holding a row stored after `stored_by_ms`: the only one to search for
/// the oldest row too young to purge.
pub(super) fn first_younger(segments: &[Segment], stored_by_ms: i64) -> Option<&Segment> {
    segments.iter().find(|s| s.max_stored_ms > stored_by_ms)
}

/// The segment whose range holds `w`, if any.
pub(super) fn holding<'a>(segments: &'a [Segment], w: &Watermark) -> Option<&'a Segment> {
    segments.iter().find(|s| s.min <= *w && *w <= s.max)
}

/// What a purge to `before` may delete: the rows below the returned bound, and whether the
/// oldest row too young to purge (`young`) held it below `before`. The newest stored
/// transaction always stays, so the log never forgets where it is. `None`: the log is empty.
pub(super) fn purge_bound(
    max: Option<&Watermark>,
    before: &Watermark,
    young: Option<Watermark>,
) -> Option<(Watermark, bool)> {
    let max = max?;
    let bound = if before > max { max } else { before };
    Some(match young {
        Some(young) if young < *bound => (young, true),
        _ => (bound.clone(), false),
    })
}

/// How many segments, from the oldest, lie wholly below `bound` (dropped whole).
pub(super) fn wholly_below(segments: &[Segment], bound: &Watermark) -> usize {
    segments.iter().take_while(|s| s.max < *bound).count()
}
