//! The change log's writer thread: the only connection that writes.
//!
//! Everything that changes the database (appending transactions, purging, the safety state)
//! is a [`WriteCommand`] on its channel, answered through a oneshot, in the order queued.
//! Appends queued together are committed in one SQLite transaction (group commit), so the cost
//! of the fsync that makes them durable is shared; each caller is still answered only after its
//! transaction is durable, and that is when the upstream is acked.

use std::sync::mpsc;

use log::{error, info};
use rusqlite::{params, Connection, OptionalExtension};

use super::segments::{create_segment_sql, load_segments, segment_table, watermark_col, Segment};
use super::state::{self, SafetyState, StateChange};
use super::{ChangeLogError, ChangeLogStats, PurgeOutcome, Reply, Transaction};
use crate::clock::Clock;
use crate::watermark::Watermark;

/// How many queued appends at most share one SQLite transaction.
const MAX_GROUP: usize = 512;

pub(super) enum WriteCommand {
    Append(Transaction, Reply<()>),
    Purge {
        before: Watermark,
        /// Only rows stored at or before this time (unix ms) may go; `None`: any age.
        stored_by_ms: Option<i64>,
        reply: Reply<PurgeOutcome>,
    },
    Stats(Reply<ChangeLogStats>),
    HasCommit(Watermark, Reply<bool>),
    Barrier(Reply<()>),
    State(StateChange, Reply<()>),
    LoadState(Reply<SafetyState>),
}

pub(super) struct Writer {
    conn: Connection,
    pub(super) stats: ChangeLogStats,
    segments: Vec<Segment>,
    segment_rows: u64,
    clock: Clock,
    /// The newest store time written; store times never go back, even if the clock does.
    last_stored_ms: i64,
}

impl Writer {
    pub(super) fn load(
        conn: Connection,
        segment_rows: u64,
        clock: Clock,
    ) -> Result<Writer, ChangeLogError> {
        conn.set_prepared_statement_cache_capacity(64);
        let rv: Option<String> = conn.query_row(
            "SELECT replica_version FROM replication_state WHERE id = 0",
            [],
            |r| r.get(0),
        )?;
        let segments = load_segments(&conn)?;
        let last_stored_ms = segments.iter().map(|s| s.max_stored_ms).max().unwrap_or(0);
        let mut w = Writer {
            conn,
            stats: ChangeLogStats {
                replica_version: watermark_col(rv)?,
                ..ChangeLogStats::default()
            },
            segments,
            segment_rows,
            clock,
            last_stored_ms,
        };
        w.refresh_range();
        Ok(w)
    }

    /// Recomputes the stats' range and row count from the segments.
    fn refresh_range(&mut self) {
        self.stats.min_watermark = self.segments.first().map(|s| s.min.clone());
        self.stats.max_watermark = self.segments.last().map(|s| s.max.clone());
        self.stats.rows = self.segments.iter().map(|s| s.rows).sum();
    }

    pub(super) fn run(mut self, rx: mpsc::Receiver<WriteCommand>) {
        let mut next = None;
        loop {
            let cmd = match next.take() {
                Some(c) => c,
                None => match rx.recv() {
                    Ok(c) => c,
                    Err(_) => break,
                },
            };
            match cmd {
                WriteCommand::Append(txn, reply) => {
                    let mut group = vec![(txn, reply)];
                    while group.len() < MAX_GROUP {
                        match rx.try_recv() {
                            Ok(WriteCommand::Append(t, r)) => group.push((t, r)),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.append_group(group);
                }
                WriteCommand::Purge {
                    before,
                    stored_by_ms,
                    reply,
                } => {
                    let _ = reply.send(self.purge(&before, stored_by_ms));
                }
                WriteCommand::Stats(reply) => {
                    let _ = reply.send(Ok(self.stats.clone()));
                }
                WriteCommand::HasCommit(w, reply) => {
                    let _ = reply.send(self.has_commit(&w));
                }
                WriteCommand::Barrier(reply) => {
                    let _ = reply.send(Ok(()));
                }
                WriteCommand::State(change, reply) => {
                    let _ = reply.send(self.save_state(&change));
                }
                WriteCommand::LoadState(reply) => {
                    let _ = reply.send(state::load(&self.conn));
                }
            }
        }
        info!("change log writer stopped");
    }

    fn save_state(&mut self, change: &StateChange) -> Result<(), ChangeLogError> {
        let tx = self.conn.transaction()?;
        state::apply(&tx, change)?;
        tx.commit()?;
        Ok(())
    }

    fn append_group(&mut self, group: Vec<(Transaction, Reply<()>)>) {
        let (stats_before, segments_before) = (self.stats.clone(), self.segments.clone());
        let stored_ms = self.clock.now_ms().max(self.last_stored_ms);
        let result = (|| -> Result<(), rusqlite::Error> {
            let tx = self.conn.transaction()?;
            let mut touched_from = self.segments.len().saturating_sub(1);
            for (txn, _) in &group {
                let full = self
                    .segments
                    .last()
                    .is_none_or(|s| s.rows >= self.segment_rows);
                if full {
                    let id = self.segments.last().map_or(1, |s| s.id + 1);
                    tx.execute_batch(&create_segment_sql(id))?;
                    tx.execute(
                        "INSERT INTO segments (id, min_watermark, max_watermark, rows, max_stored_ms)
                         VALUES (?1, ?2, ?2, 0, ?3)",
                        params![id, txn.watermark.as_str(), stored_ms],
                    )?;
                    self.segments.push(Segment {
                        id,
                        min: txn.watermark.clone(),
                        max: txn.watermark.clone(),
                        rows: 0,
                        max_stored_ms: stored_ms,
                    });
                    touched_from = touched_from.min(self.segments.len() - 1);
                }
                let Some(seg) = self.segments.last_mut() else {
                    continue;
                };
                let mut insert = tx.prepare_cached(&format!(
                    "INSERT OR REPLACE INTO {} (watermark, pos, kind, change, stored_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    segment_table(seg.id)
                ))?;
                for (pos, (kind, json)) in txn.changes.iter().enumerate() {
                    insert.execute(params![
                        txn.watermark.as_str(),
                        pos as i64,
                        kind.as_str(),
                        json,
                        stored_ms
                    ])?;
                }
                seg.rows += txn.changes.len() as u64;
                seg.max_stored_ms = stored_ms;
                if txn.watermark > seg.max {
                    seg.max = txn.watermark.clone();
                }
                let s = &mut self.stats;
                if s.replica_version.is_none() {
                    info!("initial sync stored: replicaVersion={}", txn.watermark);
                    s.replica_version = Some(txn.watermark.clone());
                }
                s.changes_stored_total += txn.changes.len() as u64;
            }
            for seg in &self.segments[touched_from..] {
                tx.execute(
                    "UPDATE segments SET max_watermark = ?2, rows = ?3, max_stored_ms = ?4 WHERE id = ?1",
                    params![seg.id, seg.max.as_str(), seg.rows as i64, seg.max_stored_ms],
                )?;
            }
            tx.execute(
                "UPDATE replication_state SET replica_version = COALESCE(replica_version, ?1), last_watermark = ?2 WHERE id = 0",
                params![
                    self.stats.replica_version.as_ref().map(|w| w.as_str()),
                    self.segments.last().map(|s| s.max.as_str())
                ],
            )?;
            tx.commit()
        })();
        match result {
            Ok(()) => {
                self.last_stored_ms = stored_ms;
                self.refresh_range();
                for (_, reply) in group {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(e) => {
                error!("storing {} transaction(s) failed: {e}", group.len());
                self.stats = stats_before;
                self.segments = segments_before;
                for (_, reply) in group {
                    let _ = reply.send(Err(ChangeLogError::Write(e.to_string())));
                }
            }
        }
    }

    /// The oldest watermark stored after `stored_by_ms`, if any: rows from it on are too young
    /// to purge. Store times only grow, so the segments wholly older are skipped by their
    /// catalogue entry and only the first younger segment is searched.
    fn first_stored_after(&self, stored_by_ms: i64) -> Result<Option<Watermark>, ChangeLogError> {
        let Some(seg) = self
            .segments
            .iter()
            .find(|s| s.max_stored_ms > stored_by_ms)
        else {
            return Ok(None);
        };
        let w: Option<String> = self
            .conn
            .query_row(
                &format!(
                    "SELECT watermark FROM {} WHERE stored_ms > ?1 ORDER BY watermark, pos LIMIT 1",
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
    fn purge(
        &mut self,
        before: &Watermark,
        stored_by_ms: Option<i64>,
    ) -> Result<PurgeOutcome, ChangeLogError> {
        let Some(max) = self.stats.max_watermark.clone() else {
            return Ok(PurgeOutcome::default());
        };
        // The newest stored transaction always stays, so the log never forgets where it is.
        let mut bound = if *before > max { max } else { before.clone() };
        let mut held_by_retention = false;
        if let Some(young) = stored_by_ms
            .map(|t| self.first_stored_after(t))
            .transpose()?
            .flatten()
        {
            if young < bound {
                bound = young;
                held_by_retention = true;
            }
        }
        let segments_before = self.segments.clone();
        let result = (|| -> Result<u64, ChangeLogError> {
            let tx = self.conn.transaction()?;
            let mut purged = 0u64;
            // Whole segments below the bound go at once.
            let whole = self.segments.iter().take_while(|s| s.max < bound).count();
            for seg in self.segments.drain(..whole) {
                tx.execute_batch(&format!("DROP TABLE {}", segment_table(seg.id)))?;
                tx.execute("DELETE FROM segments WHERE id = ?1", params![seg.id])?;
                purged += seg.rows;
            }
            // Then the rows below it in the segment it cuts through.
            if let Some(seg) = self.segments.first_mut().filter(|s| s.min < bound) {
                let table = segment_table(seg.id);
                let n = tx.execute(
                    &format!("DELETE FROM {table} WHERE watermark < ?1"),
                    params![bound.as_str()],
                )? as u64;
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
                purged += n;
            }
            if !held_by_retention {
                state::apply(&tx, &StateChange::Purged(before.clone()))?;
            }
            tx.commit()?;
            Ok(purged)
        })();
        match result {
            Ok(rows) => {
                self.refresh_range();
                self.stats.changes_purged_total += rows;
                Ok(PurgeOutcome {
                    rows,
                    held_by_retention,
                })
            }
            Err(e) => {
                self.segments = segments_before;
                Err(e)
            }
        }
    }

    fn has_commit(&self, w: &Watermark) -> Result<bool, ChangeLogError> {
        let Some(seg) = self.segments.iter().find(|s| s.min <= *w && *w <= s.max) else {
            return Ok(false);
        };
        Ok(self
            .conn
            .query_row(
                &format!(
                    "SELECT 1 FROM {} WHERE watermark = ?1 AND kind = 'commit' LIMIT 1",
                    segment_table(seg.id)
                ),
                params![w.as_str()],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }
}
