//! The reader's memory of its last reads, so that subscribers reading the same range (replicas
//! restored from one backup catch up from the same watermark, a few reads apart) are served
//! from one read of the change DB instead of one each.
//!
//! ### When a kept read answers another
//! A read is "the first rows after `after` with watermarks up to `up_to`, in `(watermark, pos)`
//! order, until `limit` rows or until they reach `max_bytes`". Rows up to a watermark the
//! reader was asked for never change: the owner stores commits in watermark order and a
//! reader is only asked up to what is durable. So a kept read `e` answers a query `q` with the
//! same `after` when either
//! - its rows within `q.up_to` reach `q`'s limit in rows or in bytes: `q`'s answer is their
//!   start; or
//! - they do not, but `e` holds every row within `q.up_to`: a row of `e` lies past `q.up_to`,
//!   or `e` stopped short of both its own limits (it holds all its range) and
//!   `q.up_to ≤ e.up_to`.
//!
//! A purge can take rows a kept read still holds; it never takes rows a protected subscriber
//! still needs (PROTOCOL.md §14.1), and a standby checks, even when answered from memory, that
//! nothing was purged past the position asked for ([`super::reader`]).
//!
//! Bounded in bytes and in count: [`KEPT_BYTES`] over all reads kept and [`KEPT_READS`] reads,
//! the oldest forgotten first (the count keeps each lookup, a scan, short however small the
//! reads: a follower's are a commit group each); a read larger than a quarter of the bytes is
//! not kept.

use std::collections::VecDeque;

use super::commands::RangeQuery;
use super::types::StoredChange;

/// The bytes of rows kept at most, over all reads kept.
pub(super) const KEPT_BYTES: usize = 16 << 20;

/// The reads kept at most.
pub(super) const KEPT_READS: usize = 32;

/// What a row is counted as beyond its JSON text: its watermark, position and the vector's slot.
const ROW_OVERHEAD: usize = 64;

struct Kept {
    query: RangeQuery,
    rows: Vec<StoredChange>,
    bytes: usize,
    /// The bytes of downstream messages of `rows`, as the query's byte limit counts them.
    msg_bytes: usize,
}

/// The reads kept, newest last.
#[derive(Default)]
pub(super) struct ReadCache {
    kept: VecDeque<Kept>,
    bytes: usize,
}

impl ReadCache {
    /// `q`'s answer from a kept read, if one holds it (see the module documentation).
    pub(super) fn answer(&self, q: &RangeQuery) -> Option<Vec<StoredChange>> {
        self.kept.iter().rev().find_map(|e| answer_from(e, q))
    }

    /// Keeps `rows`, the change DB's answer to `q`.
    pub(super) fn keep(&mut self, q: &RangeQuery, rows: &[StoredChange]) {
        let bytes: usize = rows.iter().map(|r| r.json.len() + ROW_OVERHEAD).sum();
        if rows.is_empty() || bytes > KEPT_BYTES / 4 {
            return;
        }
        if let Some(i) = self.kept.iter().position(|e| e.query == *q) {
            if let Some(e) = self.kept.remove(i) {
                self.bytes -= e.bytes;
            }
        }
        while self.bytes + bytes > KEPT_BYTES || self.kept.len() >= KEPT_READS {
            match self.kept.pop_front() {
                Some(e) => self.bytes -= e.bytes,
                None => break,
            }
        }
        self.bytes += bytes;
        self.kept.push_back(Kept {
            query: q.clone(),
            rows: rows.to_vec(),
            bytes,
            msg_bytes: rows.iter().map(StoredChange::message_len).sum(),
        });
    }

    /// The bytes kept now.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

fn answer_from(e: &Kept, q: &RangeQuery) -> Option<Vec<StoredChange>> {
    if e.query.after != q.after {
        return None;
    }
    let within = e.rows.partition_point(|r| r.watermark <= q.up_to);
    // `q`'s limits applied to those rows: where they stop it, if they do.
    let mut bytes = 0;
    for (i, r) in e.rows[..within].iter().enumerate() {
        if i >= q.limit || bytes >= q.max_bytes {
            return Some(e.rows[..i].to_vec());
        }
        bytes += r.message_len();
    }
    if within >= q.limit || bytes >= q.max_bytes {
        return Some(e.rows[..within].to_vec());
    }
    let whole = e.rows.len() < e.query.limit && e.msg_bytes < e.query.max_bytes;
    let holds_all = within < e.rows.len() || (whole && q.up_to <= e.query.up_to);
    holds_all.then(|| e.rows[..within].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changelog::ChangeKind;
    use crate::watermark::Watermark;

    fn w(n: u64) -> Watermark {
        Watermark::from_u64(n)
    }

    /// Transactions `from..=to`, each a begin and a commit.
    fn rows(from: u64, to: u64) -> Vec<StoredChange> {
        (from..=to)
            .flat_map(|n| {
                [(0, ChangeKind::Begin), (1, ChangeKind::Commit)].map(|(pos, kind)| StoredChange {
                    watermark: w(n),
                    pos,
                    kind,
                    json: format!("{{\"n\":{n}}}").into(),
                })
            })
            .collect()
    }

    fn q(after: u64, up_to: u64, limit: usize) -> RangeQuery {
        qb(after, up_to, limit, usize::MAX)
    }

    /// [`q`] with a byte limit.
    fn qb(after: u64, up_to: u64, limit: usize, max_bytes: usize) -> RangeQuery {
        RangeQuery {
            after: (w(after), i64::MAX),
            up_to: w(up_to),
            limit,
            max_bytes,
        }
    }

    #[test]
    fn a_kept_read_answers_a_byte_limit_within_its_rows_and_one_cut_by_bytes_holds_no_more() {
        let all = rows(2, 4);
        let first = all[0].message_len();
        let mut cache = ReadCache::default();
        cache.keep(&q(1, 9, 100), &all);
        // The limit is reached at the second row: it is the last.
        assert_eq!(
            cache.answer(&qb(1, 9, 100, first + 1)),
            Some(all[..2].to_vec())
        );
        assert_eq!(cache.answer(&qb(1, 9, 100, first)), Some(all[..1].to_vec()));
        // A read its byte limit stopped does not hold the rest of its range.
        let mut cache = ReadCache::default();
        cache.keep(&qb(1, 9, 100, first + 1), &all[..2]);
        assert_eq!(cache.answer(&q(1, 9, 100)), None);
        assert_eq!(
            cache.answer(&qb(1, 9, 100, first + 1)),
            Some(all[..2].to_vec())
        );
    }

    #[test]
    fn a_kept_read_answers_the_same_read_and_a_shorter_one() {
        let mut cache = ReadCache::default();
        cache.keep(&q(1, 9, 6), &rows(2, 4));
        assert_eq!(cache.answer(&q(1, 9, 6)), Some(rows(2, 4)));
        // Fewer rows, a lower bound, a higher bound once the limit is within the rows kept.
        assert_eq!(cache.answer(&q(1, 9, 4)), Some(rows(2, 3)));
        assert_eq!(cache.answer(&q(1, 3, 6)), Some(rows(2, 3)));
        assert_eq!(cache.answer(&q(1, 20, 6)), Some(rows(2, 4)));
        assert_eq!(cache.answer(&q(2, 9, 6)), None, "another position");
    }

    #[test]
    fn a_kept_read_never_answers_past_what_it_holds() {
        let mut cache = ReadCache::default();
        // Stopped at its limit: what lies past watermark 4 is unknown.
        cache.keep(&q(1, 9, 6), &rows(2, 4));
        assert_eq!(cache.answer(&q(1, 20, 8)), None);
        // Short of its limit: it holds all up to 9, nothing past.
        cache.keep(&q(5, 9, 100), &rows(6, 9));
        assert_eq!(cache.answer(&q(5, 9, 200)), Some(rows(6, 9)));
        assert_eq!(cache.answer(&q(5, 8, 200)), Some(rows(6, 8)));
        assert_eq!(cache.answer(&q(5, 10, 200)), None);
    }

    #[test]
    fn at_most_kept_reads_are_kept_the_oldest_forgotten() {
        let mut cache = ReadCache::default();
        for n in 0..(KEPT_READS as u64 + 5) {
            cache.keep(&q(n, 100, 2), &rows(n + 1, n + 1));
        }
        assert_eq!(cache.kept.len(), KEPT_READS);
        assert_eq!(cache.answer(&q(4, 100, 2)), None);
        assert!(cache.answer(&q(5, 100, 2)).is_some());
    }

    #[test]
    fn the_reads_kept_stay_within_their_bytes() {
        let mut cache = ReadCache::default();
        let big: Vec<StoredChange> = rows(1, 1)
            .into_iter()
            .map(|mut r| {
                r.json = "x".repeat(KEPT_BYTES / 32).into();
                r
            })
            .collect();
        for n in 0..20 {
            cache.keep(&q(n, 100, 2), &big);
            assert!(cache.bytes() <= KEPT_BYTES);
        }
        assert_eq!(
            cache.answer(&q(0, 100, 2)),
            None,
            "the oldest was forgotten"
        );
        assert!(cache.answer(&q(19, 100, 2)).is_some());
        let huge = vec![StoredChange {
            json: "x".repeat(KEPT_BYTES / 2).into(),
            ..big[0].clone()
        }];
        cache.keep(&q(50, 100, 2), &huge);
        assert_eq!(cache.answer(&q(50, 100, 2)), None, "too large to keep");
    }
}
