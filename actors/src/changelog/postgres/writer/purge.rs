//! The owner's purge (PROTOCOL.md §9, §14.1): partitions wholly below the purge watermark
//! dropped, rows deleted only in the one it cuts through, the retention floor, the newest
//! transaction and the other instances' subscribers held to.

use std::collections::HashSet;

use tokio_postgres::Transaction as PgTransaction;

use super::super::catalogue::{self, Segment};
use super::super::records;
use super::super::safety::StateChange;
use super::super::schema::{parse_watermark, Layout};
use super::super::state;
use super::super::types::{ChangeLogError, PurgeGate, PurgeOutcome};
use super::{fenced, layout_of, PgWriter};
use crate::watermark::Watermark;

impl PgWriter {
    /// The oldest watermark stored after `stored_by_ms`, if any (see
    /// [`catalogue::first_younger`]).
    async fn first_stored_after(
        &self,
        stored_by_ms: i64,
    ) -> Result<Option<Watermark>, ChangeLogError> {
        let Some(seg) = catalogue::first_younger(&self.segments, stored_by_ms) else {
            return Ok(None);
        };
        let row = self
            .client
            .query_opt(
                &format!(
                    "SELECT watermark FROM {} WHERE stored_ms > $1 ORDER BY watermark LIMIT 1",
                    self.layout(seg.id).partition(seg.id)
                ),
                &[&stored_by_ms],
            )
            .await?;
        row.map(|r| parse_watermark(r.get(0))).transpose()
    }

    /// Deletes the rows below `before` (and, with `stored_by_ms`, stored by then), keeping the
    /// newest stored transaction; drops every partition wholly below the bound and deletes rows
    /// only in the one it cuts through. A complete purge also takes `before` off the scheduled
    /// purges, in the same transaction.
    ///
    /// With a `gate`, the other instances' subscribers are checked first, in the same
    /// transaction ([`records::purge_hold`]); one that holds the purge back leaves everything
    /// as it was.
    pub(super) async fn purge(
        &mut self,
        before: &Watermark,
        stored_by_ms: Option<i64>,
        gate: Option<PurgeGate>,
    ) -> Result<PurgeOutcome, ChangeLogError> {
        let young = match stored_by_ms {
            Some(t) => self.first_stored_after(t).await?,
            None => None,
        };
        let Some((bound, held_by_retention)) =
            catalogue::purge_bound(self.stats.max_watermark.as_ref(), before, young)
        else {
            return Ok(PurgeOutcome::default());
        };
        let mut segments = self.segments.clone();
        let whole = catalogue::wholly_below(&segments, &bound);
        let tx = fenced(&mut self.client).await?;
        let old = &self.row_per_change;
        if whole > 0 {
            lock_parents(&tx, &segments[..whole], old).await?;
        }
        if let Some(gate) = gate {
            let held = records::purge_hold(&tx, before, gate, self.instance.as_deref()).await?;
            if held.is_some() {
                tx.rollback().await?;
                return Ok(PurgeOutcome {
                    held,
                    ..PurgeOutcome::default()
                });
            }
        }
        let mut purged = 0u64;
        let mut dropped = Vec::new();
        for seg in segments.drain(..whole) {
            drop_segment(&tx, &seg, old).await?;
            dropped.push(seg.id);
            purged += seg.rows;
        }
        if let Some(seg) = segments.first_mut().filter(|s| s.min < bound) {
            purged += cut_segment(&tx, seg, &bound, old).await?;
        }
        if !held_by_retention {
            state::apply(&tx, &StateChange::Purged(before.clone())).await?;
        }
        tx.commit().await?;
        self.segments = segments;
        for id in dropped {
            self.row_per_change.remove(&id);
        }
        catalogue::refresh_range(&mut self.stats, &self.segments);
        self.stats.changes_purged_total += purged;
        Ok(PurgeOutcome {
            rows: purged,
            held_by_retention,
            held: None,
        })
    }
}

/// Dropping a partition takes its parent's ACCESS EXCLUSIVE lock, which waits for every
/// catch-up read at every instance. Waits for it before the gate's lock, so that no refresh
/// (nor a joiner at a standby) waits behind that wait; and not for long: a purge can come
/// again, a record that ages past 10 s cannot.
async fn lock_parents(
    tx: &PgTransaction<'_>,
    segments: &[Segment],
    old: &HashSet<i64>,
) -> Result<(), ChangeLogError> {
    let mut parents: Vec<&str> = segments
        .iter()
        .map(|s| layout_of(old, s.id).parent())
        .collect();
    parents.dedup();
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '2s';
         LOCK TABLE {} IN ACCESS EXCLUSIVE MODE;
         SET LOCAL lock_timeout = 0;",
        parents.join(", ")
    ))
    .await?;
    Ok(())
}

/// Drops a segment wholly below the bound: its partition and its catalogue row.
async fn drop_segment(
    tx: &PgTransaction<'_>,
    seg: &Segment,
    old: &HashSet<i64>,
) -> Result<(), ChangeLogError> {
    tx.batch_execute(&format!(
        "DROP TABLE {}",
        layout_of(old, seg.id).partition(seg.id)
    ))
    .await?;
    tx.execute(
        "DELETE FROM change_streamer.segments WHERE id = $1",
        &[&seg.id],
    )
    .await?;
    Ok(())
}

/// Deletes the rows below `bound` in the segment the bound cuts through, and updates its
/// catalogue row; answers the changes deleted (counted in changes, in either layout).
async fn cut_segment(
    tx: &PgTransaction<'_>,
    seg: &mut Segment,
    bound: &Watermark,
    old: &HashSet<i64>,
) -> Result<u64, ChangeLogError> {
    let layout = layout_of(old, seg.id);
    let table = layout.partition(seg.id);
    let n = match layout {
        Layout::RowPerChange => {
            tx.execute(
                &format!("DELETE FROM {table} WHERE watermark < $1"),
                &[&bound.as_str()],
            )
            .await?
        }
        Layout::RowPerTransaction => {
            let n: i64 = tx
                .query_one(
                    &format!(
                        "WITH gone AS (DELETE FROM {table} WHERE watermark < $1
                                       RETURNING changes)
                         SELECT COALESCE(SUM(changes), 0)::int8 FROM gone"
                    ),
                    &[&bound.as_str()],
                )
                .await?
                .get(0);
            n as u64
        }
    };
    let min: Option<String> = tx
        .query_one(&format!("SELECT MIN(watermark) FROM {table}"), &[])
        .await?
        .get(0);
    if let Some(min) = min {
        seg.min = parse_watermark(min)?;
    }
    seg.rows -= n;
    tx.execute(
        "UPDATE change_streamer.segments SET min_watermark = $2, rows = $3 WHERE id = $1",
        &[&seg.id, &seg.min.as_str(), &(seg.rows as i64)],
    )
    .await?;
    Ok(n)
}
