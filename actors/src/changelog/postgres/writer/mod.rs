//! The PostgreSQL engine's writer: the owner's one connection that writes, holding the
//! ownership lock (see [`crate::ownership`]).
//!
//! It serves the same [`WriteCommand`]s as the SQLite writer, with the same answers: queued
//! appends are committed in one PostgreSQL transaction (group commit: one statement stores the
//! group's rows, the catalogue's counts, the replication state and the commit notice), purges drop whole partitions, and each state change is its own transaction. Every
//! transaction that writes first passes the ownership fence, and fails with
//! [`ChangeLogError::NotOwner`] if this session no longer holds the lock. Its purge:
//! [`purge`]; the pending rows of an open transaction: [`pending`].

mod pending;
mod purge;

use std::collections::HashSet;
use std::rc::Rc;
use std::sync::Arc;

use log::error;
use tokio::sync::watch;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, IsolationLevel, Transaction as PgTransaction};

use super::catalogue::{self, Segment};
use super::commands::WriteCommand;
use super::group_statements::GroupStatements;
use super::liveness::Probe;
use super::safety::StateChange;
use super::schema::{self, create_partition_sql, Layout, CURRENT};
use super::state;
use super::txn_value::{chunks, encode, pack};
use super::types::{ChangeLogError, LogStats, Reply, Transaction};
use super::COMMITS_CHANNEL;
use crate::clock::Clock;
use crate::ownership;
use crate::watermark::Watermark;

pub(super) struct PgWriter {
    pub(super) client: Client,
    pub(super) stats: LogStats,
    segments: Vec<Segment>,
    /// The segments of [`Layout::RowPerChange`], written by builds before transaction rows:
    /// never appended to.
    row_per_change: HashSet<i64>,
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
    /// Hears each call out while the server works on it, and finds a silent change DB
    /// (PROTOCOL.md §14.2).
    probe: Rc<Probe>,
}

/// The rows of one group commit, as the columns of its insert: a row per transaction of
/// ordinary size, its value packed (`changelog/txn_value.rs`).
#[derive(Default)]
struct Rows<'a> {
    segments: Vec<i64>,
    watermarks: Vec<&'a str>,
    first_positions: Vec<i64>,
    counts: Vec<i64>,
    bodies: Vec<Vec<u8>>,
    /// The segment of each transaction of the group, in order.
    segment_of: Vec<i64>,
}

/// Opens a transaction that may write: only if this session still owns the change DB.
///
/// Always READ COMMITTED, whatever the database's default: the purge's gate
/// ([`super::records::purge_hold`]) relies on each statement seeing what committed before it started,
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
        probe: Rc<Probe>,
        segment_rows: u64,
        clock: Clock,
        owner: watch::Sender<bool>,
        instance: Option<String>,
    ) -> Result<PgWriter, ChangeLogError> {
        schema::create_missing(&client, schema::SCHEMA).await?;
        // A purge reads the instance records: they exist before the first one.
        schema::create_missing(&client, schema::INSTANCES_SCHEMA).await?;
        pending::clear_at_start(&client).await?;
        let (stats, catalogue) = schema::read_stats(&client).await?;
        let row_per_change = catalogue
            .iter()
            .filter(|(_, l)| *l == Layout::RowPerChange)
            .map(|(s, _)| s.id)
            .collect();
        let segments: Vec<Segment> = catalogue.into_iter().map(|(s, _)| s).collect();
        let last_stored_ms = segments.iter().map(|s| s.max_stored_ms).max().unwrap_or(0);
        let statements = GroupStatements::prepare(&client).await?;
        Ok(PgWriter {
            client,
            stats,
            segments,
            row_per_change,
            segment_rows,
            clock,
            last_stored_ms,
            owner,
            instance,
            statements,
            probe,
        })
    }

    /// Serves one command; `Err(())` once this writer found it no longer owns the change DB
    /// (it answered the command with [`ChangeLogError::NotOwner`]).
    ///
    /// Each call the change DB is found silent on ([`Probe::heard`], PROTOCOL.md §14.2) is
    /// answered as if the connection had ended: deposed.
    pub(super) async fn serve(&mut self, cmd: WriteCommand) -> Result<(), ()> {
        let probe = self.probe.clone();
        match cmd {
            WriteCommand::Append(txn, reply, _) => self.append_group(vec![(txn, reply)]).await,
            WriteCommand::Pending(chunk, reply) => {
                let r = probe.heard(self.store_pending(&chunk)).await;
                if let Err(e) = &r {
                    error!(
                        "storing a pending chunk of transaction watermark={} failed: {e}; its commit will be refused",
                        chunk.watermark
                    );
                }
                self.answer(reply, r)
            }
            WriteCommand::DropPending(reply) => {
                let r = probe.heard(self.drop_pending()).await;
                self.answer(reply, r)
            }
            WriteCommand::Purge {
                before,
                stored_by_ms,
                gate,
                reply,
            } => {
                let r = probe.heard(self.purge(&before, stored_by_ms, gate)).await;
                self.answer(reply, r)
            }
            WriteCommand::Stats(reply) => {
                let _ = reply.send(Ok(self.stats.clone()));
                Ok(())
            }
            WriteCommand::HasCommit(w, reply) => {
                let r = probe.heard(self.has_commit(&w)).await;
                self.answer(reply, r)
            }
            WriteCommand::ReportStalls(_) => Ok(()), // taken by the queue
            WriteCommand::Barrier(reply) => {
                let _ = reply.send(Ok(()));
                Ok(())
            }
            WriteCommand::State(change, reply) => {
                let r = probe.heard(self.save_state(&change)).await;
                self.answer(reply, r)
            }
            WriteCommand::LoadState(reply) => {
                let r = probe.heard(state::load(&self.client)).await;
                self.answer(reply, r)
            }
        }
    }

    /// Whether `e` means this writer lost the change DB: the fence refused, the session
    /// (and with it the lock) is gone, or the change DB did not answer in time (a silent
    /// change DB, PROTOCOL.md §14.2: the server ends the session it no longer hears from). If
    /// so, the handles learn it at once, before any caller is answered.
    fn deposed_by(&self, e: &ChangeLogError) -> bool {
        let silent = matches!(e, ChangeLogError::Silent(_));
        if silent {
            error!("change DB silent: {e}; stepping down as its owner");
        }
        let deposed = silent || matches!(e, ChangeLogError::NotOwner) || self.client.is_closed();
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

    /// The idle check: whether this session still holds the ownership lock (an error, a
    /// silent change DB's included, if it cannot tell).
    pub(super) async fn still_owner(&self) -> Result<bool, ChangeLogError> {
        let r = self.probe.heard(ownership::holds_lock(&self.client)).await;
        if let Err(e @ ChangeLogError::Silent(_)) = &r {
            error!("change DB silent: {e}; stepping down as its owner");
        }
        r
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
        // Given up, the store is dropped where it was (no rollback sent on a silent
        // connection): the connection goes with the deposed writer.
        let probe = self.probe.clone();
        let result = probe.heard(self.store(&group, stored_ms)).await;
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
        let (rows, opened, touched_from) = self.rows_of(group, stored_ms)?;
        // Transactions with pending rows to move in (PROTOCOL.md §3.0): with their segment.
        let moves: Vec<(&Transaction, i64)> = group
            .iter()
            .map(|(t, _)| t)
            .zip(rows.segment_of.iter().copied())
            .filter(|(t, _)| t.pending > 0)
            .collect();
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
            &rows.first_positions,
            &rows.counts,
            &rows.bodies,
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
            let holds = if opened.is_empty() && moves.is_empty() {
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
                            &[id, &first.as_str(), &stored_ms, &(CURRENT as i16)],
                        )
                        .await?;
                    }
                    for (txn, segment) in &moves {
                        pending::move_pending(c, txn, *segment, stored_ms).await?;
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

    /// The rows of `group` (a transaction's changes in runs, each packed), with the catalogue
    /// brought up to date in memory: the segments it opens (id, first watermark) and the index
    /// of the first segment it touched.
    #[allow(clippy::type_complexity)]
    fn rows_of<'g>(
        &mut self,
        group: &'g [(Transaction, Reply<()>)],
        stored_ms: i64,
    ) -> Result<(Rows<'g>, Vec<(i64, &'g Watermark)>, usize), ChangeLogError> {
        let mut touched_from = self.segments.len().saturating_sub(1);
        let mut opened: Vec<(i64, &Watermark)> = Vec::new();
        let mut rows = Rows::default();
        let mut plain = Vec::new();
        for (txn, _) in group {
            let older = |id| self.row_per_change.contains(&id);
            if let Some(id) = catalogue::new_segment_id(&self.segments, self.segment_rows, older) {
                opened.push((id, &txn.watermark));
                self.segments
                    .push(Segment::opened(id, &txn.watermark, stored_ms));
                touched_from = touched_from.min(self.segments.len() - 1);
            }
            let Some(id) = self.segments.last().map(|s| s.id) else {
                continue;
            };
            rows.segment_of.push(id);
            for (rel, run) in chunks(&txn.changes) {
                encode(run, &mut plain)?;
                let mut body = Vec::new();
                pack(&plain, &mut body);
                rows.segments.push(id);
                rows.watermarks.push(txn.watermark.as_str());
                rows.first_positions.push(txn.pending as i64 + rel);
                rows.counts.push(run.len() as i64);
                rows.bodies.push(body);
            }
            catalogue::record_append(&mut self.segments, &mut self.stats, txn, stored_ms);
        }
        Ok((rows, opened, touched_from))
    }

    async fn has_commit(&self, w: &Watermark) -> Result<bool, ChangeLogError> {
        let Some(seg) = catalogue::holding(&self.segments, w) else {
            return Ok(false);
        };
        // A transaction row is a whole transaction, its commit included.
        let sql = match self.layout(seg.id) {
            Layout::RowPerChange => format!(
                "SELECT 1 FROM {} WHERE watermark = $1 AND kind = 'commit' LIMIT 1",
                Layout::RowPerChange.partition(seg.id)
            ),
            layout => format!(
                "SELECT 1 FROM {} WHERE watermark = $1 LIMIT 1",
                layout.partition(seg.id)
            ),
        };
        let row = self.client.query_opt(&sql, &[&w.as_str()]).await?;
        Ok(row.is_some())
    }

    /// Segment `id`'s layout.
    fn layout(&self, id: i64) -> Layout {
        layout_of(&self.row_per_change, id)
    }
}

/// Segment `id`'s layout, `row_per_change` listing those of the older one.
fn layout_of(row_per_change: &HashSet<i64>, id: i64) -> Layout {
    if row_per_change.contains(&id) {
        Layout::RowPerChange
    } else {
        CURRENT
    }
}
