//! The writer's purge (PROTOCOL.md §9): whole segments below the purge watermark dropped, rows
//! deleted only in the one it cuts through, the retention floor and the newest transaction
//! kept.

use rusqlite::{params, OptionalExtension};

use super::super::catalogue::{self, Segment};
use super::super::safety::StateChange;
use super::super::segments::{segment_table, watermark_col};
use super::super::state;
use super::super::types::{ChangeLogError, PurgeOutcome};
use super::Writer;
use crate::watermark::Watermark;

impl Writer {
    /// The oldest watermark stored after `stored_by_ms`, if any: rows from it on are too young
    /// to purge. Store times only grow, so the segments wholly older are skipped by their
    /// catalogue entry and only the first younger segment is searched.
    fn first_stored_after(&self, stored_by_ms: i64) -> Result<Option<Watermark>, ChangeLogError> {
        let Some(seg) = catalogue::first_younger(&self.segments, stored_by_ms) else {
            return Ok(None);
        };
        let w: Option<String> = self
            .conn
            .query_row(
                &format!(
                    "SELECT watermark FROM {} WHERE stored_ms > ?1 ORDER BY watermark LIMIT 1",
                    segment_table(seg.id)
                ),
                params![stored_by_ms],
                |r| r.get(0),
            )
            .optional()?;
        watermark_col(w)
    }

    /// Deletes the rows below `before` (and, with `stored_by_ms`, stored by then), always
    /// keeping the newest stored transaction. When nothing below `before` is left for a later
    /// purge, `before` is also taken off the scheduled purges, in the same transaction.
    pub(super) fn purge(
        &mut self,
        before: &Watermark,
        stored_by_ms: Option<i64>,
    ) -> Result<PurgeOutcome, ChangeLogError> {
        let young = stored_by_ms
            .map(|t| self.first_stored_after(t))
            .transpose()?
            .flatten();
        let Some((bound, held_by_retention)) =
            catalogue::purge_bound(self.stats.max_watermark.as_ref(), before, young)
        else {
            return Ok(PurgeOutcome::default());
        };
        let segments_before = self.segments.clone();
        let result = (|| -> Result<u64, ChangeLogError> {
            let tx = self.conn.transaction()?;
            let mut purged = 0u64;
            // Whole segments below the bound go at once.
            let whole = catalogue::wholly_below(&self.segments, &bound);
            for seg in self.segments.drain(..whole) {
                tx.execute_batch(&format!("DROP TABLE {}", segment_table(seg.id)))?;
                tx.execute("DELETE FROM segments WHERE id = ?1", params![seg.id])?;
                purged += seg.rows;
            }
            // Then the rows below it in the segment it cuts through.
            if let Some(seg) = self.segments.first_mut().filter(|s| s.min < bound) {
                let per_change = self.row_per_change.contains(&seg.id);
                purged += cut_segment(&tx, seg, per_change, &bound)?;
            }
            if !held_by_retention {
                state::apply(&tx, &StateChange::Purged(before.clone()))?;
            }
            tx.commit()?;
            Ok(purged)
        })();
        match result {
            Ok(rows) => {
                let segments = &self.segments;
                self.row_per_change
                    .retain(|id| segments.iter().any(|s| s.id == *id));
                catalogue::refresh_range(&mut self.stats, &self.segments);
                self.stats.changes_purged_total += rows;
                Ok(PurgeOutcome {
                    rows,
                    held_by_retention,
                    held: None,
                })
            }
            Err(e) => {
                self.segments = segments_before;
                Err(e)
            }
        }
    }
}

/// Deletes the rows below `bound` in `seg`, the segment it cuts through, and records the
/// segment's new low end; returns how many changes went (counted in changes, in either layout:
/// a row per change, or a row per transaction with its `changes`).
fn cut_segment(
    tx: &rusqlite::Transaction<'_>,
    seg: &mut Segment,
    row_per_change: bool,
    bound: &Watermark,
) -> Result<u64, ChangeLogError> {
    let table = segment_table(seg.id);
    let n = if row_per_change {
        tx.execute(
            &format!("DELETE FROM {table} WHERE watermark < ?1"),
            params![bound.as_str()],
        )? as u64
    } else {
        let n: i64 = tx.query_row(
            &format!("SELECT COALESCE(SUM(changes), 0) FROM {table} WHERE watermark < ?1"),
            params![bound.as_str()],
            |r| r.get(0),
        )?;
        tx.execute(
            &format!("DELETE FROM {table} WHERE watermark < ?1"),
            params![bound.as_str()],
        )?;
        n as u64
    };
    let min: Option<String> =
        tx.query_row(&format!("SELECT MIN(watermark) FROM {table}"), [], |r| {
            r.get(0)
        })?;
    if let Some(min) = watermark_col(min)? {
        seg.min = min;
    }
    seg.rows -= n;
    tx.execute(
        "UPDATE segments SET min_watermark = ?2, rows = ?3 WHERE id = ?1",
        params![seg.id, seg.min.as_str(), seg.rows as i64],
    )?;
    Ok(n)
}
