//! The PostgreSQL engine's writer: the owner's one connection that writes, holding the
//! ownership lock (see [`crate::ownership`]).
//!
//! It serves the same [`WriteCommand`]s as the SQLite writer, with the same answers: queued
//! appends are committed in one PostgreSQL transaction (group commit: one statement stores the
//! group's rows, the catalogue's counts, the replication state and the commit notice), purges drop whole partitions, and each state change is its own transaction. Every
//! transaction that writes first passes the ownership fence, and fails with
//! [`ChangeLogError::NotOwner`] if this session no longer holds the lock.

use std::sync::Arc;

use log::error;
use tokio::sync::watch;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, IsolationLevel, Transaction as PgTransaction};

use super::catalogue::{self, Segment};
use super::commands::WriteCommand;
use super::group_statements::GroupStatements;
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
    statements: GroupStatements,
}

/// The rows of one group commit, as the columns of its insert.
#[derive(Default)]
struct Rows<'a> {
    segments: Vec<i64>,
    watermarks: Vec<&'a str>,
    positions: Vec<i64>,
    kinds: Vec<&'a str>,
    changes: Vec<&'a str>,
}

/// Opens a transaction that may write: only if this session still owns the change DB.
///
/// Always READ COMMITTED, whatever the database's default: the purge's gate
/// ([`records::purge_hold`]) relies on each statement seeing what committed before it started,
/// after the gate's lock was granted; a REPEATABLE READ snapshot taken at the fence would miss a
/// subscriber recorded while the purge waited for the lock.
async fn fenced(client: &mut Client) -> Result<PgTransaction<'_>, ChangeLogError> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;
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
        let statements = GroupStatements::prepare(&client).await?;
        Ok(PgWriter {
            client,
            stats,
            segments,
            segment_rows,
            clock,
            last_stored_ms,
            owner,
            instance,
            statements,
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

    /// Stores `group` in one transaction (see [`GroupStatements`]): the begin, the fence and
    /// the group's one statement travel together, then the commit; a group that opens a
    /// segment creates its partition first, once the fence passed. Whatever fails, the
    /// transaction is rolled back and nothing of the group is stored.
    async fn store(
        &mut self,
        group: &[(Transaction, Reply<()>)],
        stored_ms: i64,
    ) -> Result<(), ChangeLogError> {
        let mut touched_from = self.segments.len().saturating_sub(1);
        let mut opened: Vec<(i64, &Watermark)> = Vec::new();
        let mut rows = Rows::default();
        for (txn, _) in group {
            if let Some(id) = catalogue::new_segment_id(&self.segments, self.segment_rows) {
                opened.push((id, &txn.watermark));
                self.segments
                    .push(Segment::opened(id, &txn.watermark, stored_ms));
                touched_from = touched_from.min(self.segments.len() - 1);
            }
            let Some(id) = self.segments.last().map(|s| s.id) else {
                continue;
            };
            for (pos, (kind, json)) in txn.changes.iter().enumerate() {
                rows.segments.push(id);
                rows.watermarks.push(txn.watermark.as_str());
                rows.positions.push(pos as i64);
                rows.kinds.push(kind.as_str());
                rows.changes.push(json);
            }
            catalogue::record_append(&mut self.segments, &mut self.stats, txn, stored_ms);
        }
        let touched = &self.segments[touched_from..];
        let ids: Vec<i64> = touched.iter().map(|s| s.id).collect();
        let maxes: Vec<&str> = touched.iter().map(|s| s.max.as_str()).collect();
        let counts: Vec<i64> = touched.iter().map(|s| s.rows as i64).collect();
        let newest: Vec<i64> = touched.iter().map(|s| s.max_stored_ms).collect();
        let replica_version = self.stats.replica_version.as_ref().map(|w| w.as_str());
        let last = self.segments.last().map(|s| s.max.as_str());
        // Standbys follow the owner's commits (PROTOCOL.md §14.1): PostgreSQL delivers the
        // notice when, and only if, this transaction commits.
        let notice = group.last().map(|(t, _)| t.watermark.as_str());
        let params: [&(dyn ToSql + Sync); 14] = [
            &rows.segments,
            &rows.watermarks,
            &rows.positions,
            &rows.kinds,
            &rows.changes,
            &stored_ms,
            &ids,
            &maxes,
            &counts,
            &newest,
            &replica_version,
            &last,
            &COMMITS_CHANNEL,
            &notice,
        ];
        let c = &self.client;
        let written = async {
            let begin = c.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED");
            let fence = c.query_one(&self.statements.fence, &[&ownership::OWNER_LOCK_KEY]);
            let holds = if opened.is_empty() {
                let store = c.execute(&self.statements.group, &params);
                let (_, fence, _) = tokio::try_join!(begin, fence, store)?;
                fence.get::<_, bool>(0)
            } else {
                let (_, fence) = tokio::try_join!(begin, fence)?;
                let holds = fence.get::<_, bool>(0);
                if holds {
                    for (id, first) in &opened {
                        c.batch_execute(&create_partition_sql(*id)).await?;
                        c.execute(
                            &self.statements.open_segment,
                            &[id, &first.as_str(), &stored_ms],
                        )
                        .await?;
                    }
                    c.execute(&self.statements.group, &params).await?;
                }
                holds
            };
            if !holds {
                return Err(ChangeLogError::NotOwner);
            }
            c.batch_execute("COMMIT").await?;
            Ok(())
        };
        let result = written.await;
        if result.is_err() && !c.is_closed() {
            let _ = c.batch_execute("ROLLBACK").await;
        }
        result
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
        let whole = catalogue::wholly_below(&segments, &bound);
        let tx = fenced(&mut self.client).await?;
        if whole > 0 {
            // Dropping a partition takes the parent's ACCESS EXCLUSIVE lock, which waits for
            // every catch-up read at every instance. Wait for it before the gate's lock, so
            // that no refresh (nor a joiner at a standby) waits behind that wait; and not for
            // long: a purge can come again, a record that ages past 10 s cannot.
            tx.batch_execute(
                "SET LOCAL lock_timeout = '2s';
                 LOCK TABLE change_streamer.change_log IN ACCESS EXCLUSIVE MODE;
                 SET LOCAL lock_timeout = 0;",
            )
            .await?;
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
