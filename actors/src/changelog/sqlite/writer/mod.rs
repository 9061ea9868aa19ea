//! The SQLite engine's writer thread: the only connection that writes.
//!
//! Everything that changes the database (appending transactions, purging, the safety state)
//! is a [`WriteCommand`] on its channel, answered through a oneshot, in the order queued.
//! Appends queued together are committed in one SQLite transaction (group commit), so the cost
//! of the fsync that makes them durable is shared; under load the group is first held open for
//! more, up to a bounded window (`Writer::commit_group`). Each caller is still answered only
//! after its transaction is durable, and that is when the upstream is acked. Its purge:
//! [`purge`]; the pending rows of an open transaction: [`pending`].

mod pending;
mod purge;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{error, info};
use rusqlite::{params, Connection, OptionalExtension};

use super::catalogue::{self, Segment};
use super::commands::{Work, WriteCommand, WriteQueue};
use super::safety::StateChange;
use super::segments::{create_segment_sql, load_segments, segment_table, watermark_col};
use super::state;
use super::txn_rows::{Layout, CURRENT};
use super::txn_value::{chunks, encode, pack, CHUNK_BYTES};
use super::types::{ChangeLogError, LogStats, PurgeHold, PurgeOutcome, Reply, Transaction};
use crate::clock::Clock;
use crate::watermark::Watermark;

/// How long at most a group of appends is held open for more before its one fsynced commit
/// (like PostgreSQL's `commit_delay`). See `Writer::commit_group` and ARCHITECTURE.md.
pub(in crate::changelog) const COMMIT_WINDOW: Duration = Duration::from_millis(100);

/// A group this large commits at once, without waiting out the window.
const WINDOW_TXNS: usize = 32;

/// The shortest sleep inside the window, so that a high rate does not wake the writer for
/// every transaction.
const MIN_NAP: Duration = Duration::from_millis(1);

/// The `INSERT` of a transaction's row into segment table `table` ([`CURRENT`]).
fn insert_sql(table: &str) -> String {
    format!(
        "INSERT OR REPLACE INTO {table} (watermark, first_pos, changes, body, stored_ms)
         VALUES (?1, ?2, ?3, ?4, ?5)"
    )
}

/// The most [`Writer::body`] keeps between transactions.
const BODY_KEPT: usize = 4 * CHUNK_BYTES;

pub(super) struct Writer {
    conn: Connection,
    pub(super) stats: LogStats,
    segments: Vec<Segment>,
    /// The segments of [`Layout::RowPerChange`], written by builds before transaction rows.
    row_per_change: HashSet<i64>,
    /// The segments of a layout other than [`CURRENT`], written by earlier builds: never
    /// appended to.
    earlier: HashSet<i64>,
    /// The encoded changes of the row being stored, its buffer kept between rows.
    body: Vec<u8>,
    /// The same packed ([`pack`]): the row's value.
    packed: Vec<u8>,
    segment_rows: u64,
    clock: Clock,
    /// The newest store time written; store times never go back, even if the clock does.
    last_stored_ms: i64,
    /// The mean time between appends seen in the last commit window: how long the next
    /// window first sleeps before it could be full.
    arrival_gap: Option<Duration>,
    /// When the last group of appends was committed and its callers about to be answered: an
    /// append queued before then came while the writer was busy (load); one queued after may
    /// be a caller's answer to its reply.
    last_answered: Instant,
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
        let (segments, layouts): (Vec<Segment>, Vec<Layout>) =
            load_segments(&conn)?.into_iter().unzip();
        let ids_of = |keep: &dyn Fn(Layout) -> bool| -> HashSet<i64> {
            segments
                .iter()
                .zip(&layouts)
                .filter(|(_, l)| keep(**l))
                .map(|(s, _)| s.id)
                .collect()
        };
        let row_per_change = ids_of(&|l| l == Layout::RowPerChange);
        let earlier = ids_of(&|l| l != CURRENT);
        let last_stored_ms = segments.iter().map(|s| s.max_stored_ms).max().unwrap_or(0);
        let mut w = Writer {
            conn,
            stats: LogStats {
                replica_version: watermark_col(rv)?,
                ..LogStats::default()
            },
            segments,
            row_per_change,
            earlier,
            body: Vec::new(),
            packed: Vec::new(),
            segment_rows,
            clock,
            last_stored_ms,
            arrival_gap: None,
            last_answered: Instant::now(),
        };
        catalogue::refresh_range(&mut w.stats, &w.segments);
        w.clear_pending_at_start()?;
        Ok(w)
    }

    pub(super) fn run(mut self, mut queue: WriteQueue) {
        // Whether the last group showed appends coming faster than they commit.
        let mut busy = false;
        while let Some(work) = queue.next(None) {
            match work {
                Work::Appends(group, queued) => {
                    // An append queued while the writer was committing the last group is itself
                    // a sign of load. One queued after that group was answered is not: it may
                    // be the same caller's next append, sent on its reply; holding it would
                    // slow a caller that awaits each append to one per window.
                    let hold = busy || group.len() > 1 || queued < self.last_answered;
                    let (size, after) = self.commit_group(&mut queue, group, hold);
                    busy = size > 1;
                    if let Some(cmd) = after {
                        self.serve(cmd);
                    }
                }
                Work::Other(cmd) => self.serve(cmd),
                Work::Idle => {}
            }
        }
        info!("change log writer stopped");
    }

    /// Commits `group` in one fsynced transaction, first, if `hold`, holding it open for more
    /// appends for up to [`COMMIT_WINDOW`] (or until [`WINDOW_TXNS`] transactions).
    ///
    /// Why: at moderate rates each transaction arrives alone, and committing it alone costs
    /// the writer ~300 µs of CPU (most of it the WAL writes and the fsync in the kernel), ten
    /// times what storing its rows costs. Holding the group open lets several transactions
    /// share that, like PostgreSQL's `commit_delay`. Subscribers are not delayed (the streamer
    /// forwards before it appends); only the upstream ack of a transaction in the window is,
    /// by at most the window. The window is held only under load, like `commit_siblings`:
    /// when the last group had several transactions, or appends queued while the writer was
    /// busy. A client that waits for each ack before sending more never shows that, so it is
    /// never slowed. While held, the thread sleeps (appends do not wake it); any other command
    /// unparks it (see `ChangeLog::write`), ends the window at once and is served after the
    /// commit, so barriers, stats and purges are never held up by it.
    ///
    /// Returns the number of transactions committed and the command that ended the window.
    fn commit_group(
        &mut self,
        queue: &mut WriteQueue,
        mut group: Vec<(Transaction, Reply<()>)>,
        hold: bool,
    ) -> (usize, Option<WriteCommand>) {
        let opened = Instant::now();
        let deadline = opened + COMMIT_WINDOW;
        let cap = WINDOW_TXNS;
        let first = group.len();
        let mut after = None;
        'window: while hold && group.len() < cap {
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                break;
            }
            // Appends do not wake the thread: sleep until the window ends or, at the rate seen
            // so far in it, until it would be full.
            let came = (group.len() - first) as u32;
            let gap = match came {
                0 => self.arrival_gap,
                n => Some(now.duration_since(opened) / n),
            };
            let nap = gap.map_or(left, |g| (g * (cap - group.len()) as u32).min(left));
            std::thread::park_timeout(nap.max(MIN_NAP));
            loop {
                match queue.next(Some(Duration::ZERO)) {
                    Some(Work::Appends(more, _)) => group.extend(more),
                    Some(Work::Other(cmd)) => {
                        after = Some(cmd);
                        break 'window;
                    }
                    Some(Work::Idle) => break,
                    None => break 'window,
                }
            }
        }
        if hold {
            self.stats.commits_held_total += 1;
        }
        let came = (group.len() - first) as u32;
        if hold && came > 0 {
            self.arrival_gap = Some(opened.elapsed() / came);
        }
        let size = group.len();
        self.append_group(group);
        (size, after)
    }

    /// Serves one command other than a group of appends.
    fn serve(&mut self, cmd: WriteCommand) {
        match cmd {
            WriteCommand::Append(txn, reply, _) => self.append_group(vec![(txn, reply)]),
            WriteCommand::Pending(chunk, reply) => {
                let r = self.store_pending(&chunk);
                if let Err(e) = &r {
                    error!(
                        "storing a pending chunk of transaction watermark={} failed: {e} (change log {}); its commit will be refused",
                        chunk.watermark,
                        self.file()
                    );
                }
                let _ = reply.send(r);
            }
            WriteCommand::DropPending(reply) => {
                let _ = reply.send(self.clear_pending().map(|_| ()).map_err(Into::into));
            }
            WriteCommand::Purge {
                before,
                stored_by_ms,
                gate,
                reply,
            } => {
                // One instance: its own subscribers are all there are.
                let answer = match gate {
                    Some(g) if g.local_subscribers == 0 => Ok(PurgeOutcome {
                        held: Some(PurgeHold::NoSubscribers),
                        ..PurgeOutcome::default()
                    }),
                    _ => self.purge(&before, stored_by_ms),
                };
                let _ = reply.send(answer);
            }
            WriteCommand::Stats(reply) => {
                let _ = reply.send(Ok(self.stats.clone()));
            }
            WriteCommand::HasCommit(w, reply) => {
                let _ = reply.send(self.has_commit(&w));
            }
            WriteCommand::ReportStalls(_) => {} // taken by the queue
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

    /// The change log's file, for messages.
    fn file(&self) -> String {
        self.conn.path().unwrap_or("(in memory)").to_string()
    }

    fn save_state(&mut self, change: &StateChange) -> Result<(), ChangeLogError> {
        let tx = self.conn.transaction()?;
        state::apply(&tx, change)?;
        tx.commit()?;
        Ok(())
    }

    /// Stores `group` in one database transaction and answers each caller once it is durable
    /// (or failed). On failure nothing of the group is stored and the catalogue is as before.
    fn append_group(&mut self, group: Vec<(Transaction, Reply<()>)>) {
        let (stats_before, segments_before) = (self.stats.clone(), self.segments.clone());
        let stored_ms = self.clock.now_ms().max(self.last_stored_ms);
        let result = self
            .conn
            .prepare_cached("BEGIN IMMEDIATE")
            .and_then(|mut begin| begin.execute([]))
            .and_then(|_| self.write_group(&group, stored_ms))
            .and_then(|()| self.conn.prepare_cached("COMMIT")?.execute([]));
        match result {
            Ok(_) => {
                self.last_answered = Instant::now();
                self.last_stored_ms = stored_ms;
                catalogue::refresh_range(&mut self.stats, &self.segments);
                if self.stats.write_error.take().is_some() {
                    info!("change log {} writes again", self.file());
                }
                for (_, reply) in group {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(e) => {
                let why = format!("{e} (change log {})", self.file());
                error!(
                    "storing {} transaction(s) failed: {why}; nothing more is acked upstream until a write succeeds",
                    group.len()
                );
                if !self.conn.is_autocommit() {
                    if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                        error!("rolling back the failed append failed: {e}");
                    }
                }
                self.stats = stats_before;
                self.stats.write_error = Some(why);
                self.segments = segments_before;
                let cause = Arc::new(ChangeLogError::from(e));
                for (_, reply) in group {
                    let _ = reply.send(Err(ChangeLogError::Write(cause.clone())));
                }
            }
        }
    }

    /// The statements of one group, inside its transaction. Every statement that runs once per
    /// group or per transaction is prepared once and kept (`prepare_cached`): parsing SQL cost
    /// more CPU than executing it. A transaction of ordinary size is one row (`txn_rows.rs`:
    /// the writer's cost was per row), and the catalogue rows and the replication state are updated once per
    /// group, not per transaction.
    fn write_group(
        &mut self,
        group: &[(Transaction, Reply<()>)],
        stored_ms: i64,
    ) -> Result<(), rusqlite::Error> {
        let mut touched_from = self.segments.len().saturating_sub(1);
        for (txn, _) in group {
            let older = |id| self.earlier.contains(&id);
            if let Some(id) = catalogue::new_segment_id(&self.segments, self.segment_rows, older) {
                self.conn.execute_batch(&create_segment_sql(id))?;
                self.conn.execute(
                    "INSERT INTO segments (id, min_watermark, max_watermark, rows, max_stored_ms, layout)
                     VALUES (?1, ?2, ?2, 0, ?3, ?4)",
                    params![
                        id,
                        txn.watermark.as_str(),
                        stored_ms,
                        CURRENT as i64
                    ],
                )?;
                self.segments
                    .push(Segment::opened(id, &txn.watermark, stored_ms));
                touched_from = touched_from.min(self.segments.len() - 1);
            }
            let Some(seg) = self.segments.last() else {
                continue;
            };
            let table = segment_table(seg.id);
            self.move_pending(txn, &table, stored_ms)?;
            let mut insert = self.conn.prepare_cached(&insert_sql(&table))?;
            for (rel, run) in chunks(&txn.changes) {
                encode(run, &mut self.body)
                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
                pack(&self.body, &mut self.packed);
                insert.execute(params![
                    txn.watermark.as_str(),
                    txn.pending as i64 + rel,
                    run.len() as i64,
                    self.packed.as_slice(),
                    stored_ms
                ])?;
            }
            drop(insert);
            self.trim_buffers();
            catalogue::record_append(&mut self.segments, &mut self.stats, txn, stored_ms);
        }
        let mut update = self.conn.prepare_cached(
            "UPDATE segments SET max_watermark = ?2, rows = ?3, max_stored_ms = ?4 WHERE id = ?1",
        )?;
        for seg in &self.segments[touched_from..] {
            update.execute(params![
                seg.id,
                seg.max.as_str(),
                seg.rows as i64,
                seg.max_stored_ms
            ])?;
        }
        self.conn
            .prepare_cached(
                "UPDATE replication_state SET replica_version = COALESCE(replica_version, ?1), last_watermark = ?2 WHERE id = 0",
            )?
            .execute(params![
                self.stats.replica_version.as_ref().map(|w| w.as_str()),
                self.segments.last().map(|s| s.max.as_str())
            ])?;
        Ok(())
    }

    fn has_commit(&self, w: &Watermark) -> Result<bool, ChangeLogError> {
        let Some(seg) = catalogue::holding(&self.segments, w) else {
            return Ok(false);
        };
        // A transaction row is a whole transaction, its commit included.
        let table = segment_table(seg.id);
        let sql = if self.row_per_change.contains(&seg.id) {
            format!("SELECT 1 FROM {table} WHERE watermark = ?1 AND kind = 'commit' LIMIT 1")
        } else {
            format!("SELECT 1 FROM {table} WHERE watermark = ?1 LIMIT 1")
        };
        Ok(self
            .conn
            .query_row(&sql, params![w.as_str()], |_| Ok(()))
            .optional()?
            .is_some())
    }
}
