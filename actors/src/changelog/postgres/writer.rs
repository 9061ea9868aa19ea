//! The PostgreSQL engine's writer: the owner's one connection that writes, holding the
//! ownership lock (see [`crate::ownership`]).
//!
//! It serves the same [`WriteCommand`]s as the SQLite writer, with the same answers: queued
//! appends are committed in one PostgreSQL transaction (group commit, one multi-row insert per
//! segment), purges drop whole partitions, and each state change is its own transaction. Every
//! transaction that writes first passes the ownership fence, and fails with
//! [`ChangeLogError::NotOwner`] if this session no longer holds the lock.

use std::sync::Arc;

use log::error;
use tokio::sync::watch;
use tokio_postgres::{Client, Transaction as PgTransaction};

use super::catalogue::{self, Segment};
use super::commands::WriteCommand;
use super::records;
use super::safety::StateChange;
use super::schema::{self, create_partition_sql, parse_watermark, partition};
use super::state;
use super::types::{ChangeLogError, LogStats, PurgeGate, PurgeOutcome, Reply, Transaction};
use super::COMMITS_CHANNEL;
use crate::clock::Clock;
use crate::ownership;
use crate::watermark::Watermark;

pub(super) struct PgWriter {
    pub(super) client: Client,
    pub(super) stats: LogStats,
    segments: Vec<Segment>,
    segment_rows: u64,
    clock: Clock,
    /// The newest store time written; store times never go back, even if the clock does.
    last_stored_ms: i64,
    /// Whether this instance owns the change DB, as the handles see it.
    owner: watch::Sender<bool>,
    /// This instance's id in the instance records: its own subscribers are its streamer's to
    /// check, not the records'.
    instance: Option<String>,
}

/// The rows of one group commit that go to one segment, as the columns of one insert.
#[derive(Default)]
struct Rows<'a> {
    watermarks: Vec<&'a str>,
    positions: Vec<i64>,
    kinds: Vec<&'a str>,
    changes: Vec<&'a str>,
}

/// Opens a transaction that may write: only if this session still owns the change DB.
async fn fenced(client: &mut Client) -> Result<PgTransaction<'_>, ChangeLogError> {
    let tx = client.transaction().await?;
    if !ownership::holds_lock(&tx).await? {
        return Err(ChangeLogError::NotOwner);
    }
    Ok(tx)
}

impl PgWriter {
    /// Creates what is missing of the schema and reads the catalogue back. Called once this
    /// session holds the ownership lock, so two instances never create tables at once.
    pub(super) async fn load(
        client: Client,
        segment_rows: u64,
        clock: Clock,
        owner: watch::Sender<bool>,
        instance: Option<String>,
    ) -> Result<PgWriter, ChangeLogError> {
        schema::create_missing(&client, schema::SCHEMA).await?;
        // A purge reads the instance records: they exist before the first one.
        schema::create_missing(&client, schema::INSTANCES_SCHEMA).await?;
        let (stats, segments) = schema::read_stats(&client).await?;
        let last_stored_ms = segments.iter().map(|s| s.max_stored_ms).max().unwrap_or(0);
        Ok(PgWriter {
            client,
            stats,
            segments,
            segment_rows,
            clock,
            last_stored_ms,
            owner,
            instance,
        })
    }

    /// Serves one command; `Err(())` once this writer found it no longer owns the change DB
    /// (it answered the command with [`ChangeLogError::NotOwner`]).
    pub(super) async fn serve(&mut self, cmd: WriteCommand) -> Result<(), ()> {
        match cmd {
            WriteCommand::Append(txn, reply, _) => self.append_group(vec![(txn, reply)]).await,
            WriteCommand::Purge {
                before,
                stored_by_ms,
                gate,
                reply,
            } => {
                let r = self.purge(&before, stored_by_ms, gate).await;
                self.answer(reply, r)
            }
            WriteCommand::Stats(reply) => {
                let _ = reply.send(Ok(self.stats.clone()));
                Ok(())
            }
            WriteCommand::HasCommit(w, reply) => {
                let r = self.has_commit(&w).await;
                self.answer(reply, r)
            }
            WriteCommand::Barrier(reply) => {
                let _ = reply.send(Ok(()));
                Ok(())
            }
            WriteCommand::State(change, reply) => {
                let r = self.save_state(&change).await;
                self.answer(reply, r)
            }
            WriteCommand::LoadState(reply) => {
                let r = state::load(&self.client).await;
                self.answer(reply, r)
            }
        }
    }

    /// Whether `e` means this writer lost the change DB: the fence refused, or the session
    /// (and with it the lock) is gone. If so, the handles learn it at once, before any caller
    /// is answered.
    fn deposed_by(&self, e: &ChangeLogError) -> bool {
        let deposed = matches!(e, ChangeLogError::NotOwner) || self.client.is_closed();
        if deposed {
            self.depose();
        }
        deposed
    }

    /// Tells the handles this instance no longer owns the change DB.
    pub(super) fn depose(&self) {
        self.owner.send_replace(false);
    }

    /// Tells the handles this instance owns the change DB.
    pub(super) fn crown(&self) {
        self.owner.send_replace(true);
    }

    fn answer<T>(&self, reply: Reply<T>, r: Result<T, ChangeLogError>) -> Result<(), ()> {
        match r {
            Err(e) if self.deposed_by(&e) => {
                error!("change DB write refused, no longer the owner: {e}");
                let _ = reply.send(Err(ChangeLogError::NotOwner));
                Err(())
            }
            r => {
                let _ = reply.send(r);
                Ok(())
            }
        }
    }

    /// The idle check: whether this session still holds the ownership lock.
    pub(super) async fn still_owner(&self) -> bool {
        matches!(ownership::holds_lock(&self.client).await, Ok(true))
    }

    async fn save_state(&mut self, change: &StateChange) -> Result<(), ChangeLogError> {
        let tx = fenced(&mut self.client).await?;
        state::apply(&tx, change).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn append_group(
        &mut self,
        group: Vec<(Transaction, Reply<()>)>,
    ) -> Result<(), ()> {
        let (stats_before, segments_before) = (self.stats.clone(), self.segments.clone());
        let stored_ms = self.clock.now_ms().max(self.last_stored_ms);
        let result = self.store(&group, stored_ms).await;
        match result {
            Ok(()) => {
                self.last_stored_ms = stored_ms;
                catalogue::refresh_range(&mut self.stats, &self.segments);
                for (_, reply) in group {
                    let _ = reply.send(Ok(()));
                }
                Ok(())
            }
            Err(e) => {
                self.stats = stats_before;
                self.segments = segments_before;
                let deposed = self.deposed_by(&e);
                error!("storing {} transaction(s) failed: {e}", group.len());
                let cause = Arc::new(e);
                for (_, reply) in group {
                    let _ = reply.send(Err(if deposed {
                        ChangeLogError::NotOwner
                    } else {
                        ChangeLogError::Write(cause.clone())
                    }));
                }
                if deposed {
                    Err(())
                } else {
                    Ok(())
                }
            }
        }
    }

    async fn store(
        &mut self,
        group: &[(Transaction, Reply<()>)],
        stored_ms: i64,
    ) -> Result<(), ChangeLogError> {
        let tx = fenced(&mut self.client).await?;
        let mut touched_from = self.segments.len().saturating_sub(1);
        let mut batches: Vec<(i64, Rows<'_>)> = Vec::new();
        for (txn, _) in group {
            if let Some(id) = catalogue::new_segment_id(&self.segments, self.segment_rows) {
                tx.batch_execute(&create_partition_sql(id)).await?;
                tx.execute(
                    "INSERT INTO change_streamer.segments
                         (id, min_watermark, max_watermark, rows, max_stored_ms)
                     VALUES ($1, $2, $2, 0, $3)",
                    &[&id, &txn.watermark.as_str(), &stored_ms],
                )
                .await?;
                self.segments
                    .push(Segment::opened(id, &txn.watermark, stored_ms));
                touched_from = touched_from.min(self.segments.len() - 1);
            }
            let Some(id) = self.segments.last().map(|s| s.id) else {
                continue;
            };
            if batches.last().is_none_or(|(b, _)| *b != id) {
                batches.push((id, Rows::default()));
            }
            if let Some((_, rows)) = batches.last_mut() {
                for (pos, (kind, json)) in txn.changes.iter().enumerate() {
                    rows.watermarks.push(txn.watermark.as_str());
                    rows.positions.push(pos as i64);
                    rows.kinds.push(kind.as_str());
                    rows.changes.push(json);
                }
            }
            catalogue::record_append(&mut self.segments, &mut self.stats, txn, stored_ms);
        }
        for (id, rows) in &batches {
            tx.execute(
                "INSERT INTO change_streamer.change_log
                     (segment, watermark, pos, kind, change, stored_ms)
                 SELECT $1, w, p, k, c, $6
                 FROM unnest($2::text[], $3::int8[], $4::text[], $5::text[]) AS t(w, p, k, c)
                 ON CONFLICT (watermark, pos, segment) DO UPDATE
                 SET kind = excluded.kind, change = excluded.change, stored_ms = excluded.stored_ms",
                &[
                    id,
                    &rows.watermarks,
                    &rows.positions,
                    &rows.kinds,
                    &rows.changes,
                    &stored_ms,
                ],
            )
            .await?;
        }
        for seg in &self.segments[touched_from..] {
            tx.execute(
                "UPDATE change_streamer.segments
                 SET max_watermark = $2, rows = $3, max_stored_ms = $4 WHERE id = $1",
                &[
                    &seg.id,
                    &seg.max.as_str(),
                    &(seg.rows as i64),
                    &seg.max_stored_ms,
                ],
            )
            .await?;
        }
        tx.execute(
            "UPDATE change_streamer.replication_state
             SET replica_version = COALESCE(replica_version, $1), last_watermark = $2 WHERE id = 0",
            &[
                &self.stats.replica_version.as_ref().map(|w| w.as_str()),
                &self.segments.last().map(|s| s.max.as_str()),
            ],
        )
        .await?;
        // Standbys follow the owner's commits (PROTOCOL.md §14.1): PostgreSQL delivers the
        // notice when, and only if, this transaction commits.
        if let Some((last, _)) = group.last() {
            tx.execute(
                "SELECT pg_notify($1, $2)",
                &[&COMMITS_CHANNEL, &last.watermark.as_str()],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

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
                    "SELECT watermark FROM {} WHERE stored_ms > $1 ORDER BY watermark, pos LIMIT 1",
                    partition(seg.id)
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
    async fn purge(
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
        let tx = fenced(&mut self.client).await?;
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
        let whole = catalogue::wholly_below(&segments, &bound);
        for seg in segments.drain(..whole) {
            tx.batch_execute(&format!("DROP TABLE {}", partition(seg.id)))
                .await?;
            tx.execute(
                "DELETE FROM change_streamer.segments WHERE id = $1",
                &[&seg.id],
            )
            .await?;
            purged += seg.rows;
        }
        if let Some(seg) = segments.first_mut().filter(|s| s.min < bound) {
            let table = partition(seg.id);
            let n = tx
                .execute(
                    &format!("DELETE FROM {table} WHERE watermark < $1"),
                    &[&bound.as_str()],
                )
                .await?;
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
            purged += n;
        }
        if !held_by_retention {
            state::apply(&tx, &StateChange::Purged(before.clone())).await?;
        }
        tx.commit().await?;
        self.segments = segments;
        catalogue::refresh_range(&mut self.stats, &self.segments);
        self.stats.changes_purged_total += purged;
        Ok(PurgeOutcome {
            rows: purged,
            held_by_retention,
            held: None,
        })
    }

    async fn has_commit(&self, w: &Watermark) -> Result<bool, ChangeLogError> {
        let Some(seg) = catalogue::holding(&self.segments, w) else {
            return Ok(false);
        };
        let row = self
            .client
            .query_opt(
                &format!(
                    "SELECT 1 FROM {} WHERE watermark = $1 AND kind = 'commit' LIMIT 1",
                    partition(seg.id)
                ),
                &[&w.as_str()],
            )
            .await?;
        Ok(row.is_some())
    }
}
