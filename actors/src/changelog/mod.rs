//! The change log: every change of every committed transaction, in SQLite (PROTOCOL.md §3) or in a
//! shared PostgreSQL change DB (PROTOCOL.md §14), and the service's safety state beside it.
//!
//! One interface, two engines. [`ChangeLog`] is a cheap handle on two channels
//! ([`commands`]): writes go to the engine's only writer (group commit of queued appends,
//! purges, the safety state), catch-up reads and the size on disk to its reader. The SQLite
//! engine ([`sqlite`]) serves them with two threads on their own connections; the PostgreSQL
//! engine ([`postgres`]) with two threads each driving its own connection, the writer's
//! holding ownership of the change DB ([`crate::ownership`]). Callers queue a command and await
//! its answer and never learn which engine they have. Dropping every handle ends the threads
//! after they finish what is queued.
//!
//! The folder: this file is the handle; [`types`] the vocabulary both engines share (rows,
//! stats, errors), [`safety`] the safety state's types, [`catalogue`] the segment decisions
//! both engines make the same way, [`txn_value`] how both store a transaction's changes in a
//! row, [`commands`] what the handle sends them. None of these
//! imports an engine or this file, and the engines do not import each other.

mod catalogue;
mod commands;
mod engine;
mod postgres;
mod safety;
mod shared;
mod sqlite;
mod txn_value;
pub(crate) mod types;

use std::path::Path;
use std::sync::mpsc;
use std::time::Instant;

use tokio::sync::{oneshot, watch};

use self::commands::{Ends, RangeQuery, ReadCommand, WriteCommand, Writes};
pub use self::engine::ChangeDb;
pub use self::postgres::{
    lease_for as change_db_lease_for, set_lease as set_change_db_lease, PgOptions,
    MIN_LEASE as MIN_CHANGE_DB_LEASE,
};
pub use self::safety::{
    ChangeDbView, RecordedWatermark, SafetyState, StateChange, StoredReservation,
};
pub use self::shared::{CommitFeed, InstanceRecords};
pub use self::sqlite::DB_FILE;
use self::types::Reply;
pub use self::types::{
    ChangeKind, ChangeLogError, LogRange, LogStats, PendingChunk, PurgeGate, PurgeHold,
    PurgeOutcome, StoredChange, Transaction, Unservable, SEGMENT_ROWS,
};
use crate::clock::Clock;
use crate::watermark::Watermark;

/// A handle on the change log threads.
#[derive(Clone)]
pub struct ChangeLog {
    writes: Writes,
    reads: mpsc::Sender<ReadCommand>,
    /// The SQLite file, or the change DB's URL without its password.
    location: String,
    /// Whether this instance still owns the change log (SQLite: always).
    owner: watch::Receiver<bool>,
}

impl std::fmt::Debug for ChangeLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeLog")
            .field("location", &self.location)
            .finish()
    }
}

impl From<Ends> for ChangeLog {
    fn from(ends: Ends) -> ChangeLog {
        let Ends {
            writes,
            reads,
            owner,
            location,
        } = ends;
        ChangeLog {
            writes,
            reads,
            location,
            owner,
        }
    }
}

impl ChangeLog {
    /// Opens (creating if needed) the SQLite change log under `data_dir` and starts its threads.
    pub fn open(data_dir: &Path) -> Result<ChangeLog, ChangeLogError> {
        Self::open_with(data_dir, SEGMENT_ROWS, Clock::System)
    }

    /// [`open`](Self::open) with another segment size (tests use small ones).
    pub fn open_with_segment_rows(
        data_dir: &Path,
        segment_rows: u64,
    ) -> Result<ChangeLog, ChangeLogError> {
        Self::open_with(data_dir, segment_rows, Clock::System)
    }

    /// [`open`](Self::open) with another segment size and the clock that stamps store times.
    pub fn open_with(
        data_dir: &Path,
        segment_rows: u64,
        clock: Clock,
    ) -> Result<ChangeLog, ChangeLogError> {
        sqlite::open(data_dir, segment_rows, clock).map(ChangeLog::from)
    }

    /// Opens the PostgreSQL change DB at `options.url` once this instance owns it: resolves
    /// only after this instance took ownership (as a standby it tries every takeover interval)
    /// and loaded the catalogue. Dropping the future gives up waiting.
    pub async fn open_postgres(options: PgOptions) -> Result<ChangeLog, ChangeLogError> {
        postgres::open(options).await.map(ChangeLog::from)
    }

    /// A standby's handle on the PostgreSQL change DB at `url`, which another instance owns:
    /// it reads (catch-up, stats) and refuses every write with [`ChangeLogError::NotOwner`]
    /// (PROTOCOL.md §14.1). Returns at once; the change DB is reached on the first command.
    pub fn open_standby(url: &str) -> Result<ChangeLog, ChangeLogError> {
        postgres::open_standby(url).map(ChangeLog::from)
    }

    /// Where the change log is, for logs: the SQLite file, or the change DB's URL without its
    /// password.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Whether this instance still owns the change log (always, with SQLite).
    pub fn is_owner(&self) -> bool {
        *self.owner.borrow()
    }

    /// Resolves once this instance no longer owns the change log: its engine found it was
    /// deposed (PostgreSQL) or stopped. Every write after that fails with
    /// [`ChangeLogError::NotOwner`] or [`ChangeLogError::Closed`].
    pub async fn deposed(&self) {
        let mut owner = self.owner.clone();
        let _ = owner.wait_for(|owner| !owner).await;
    }

    /// Queues a command now (so that commands keep the caller's order) and returns the
    /// future of its answer.
    fn write<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> WriteCommand,
    ) -> impl std::future::Future<Output = Result<T, ChangeLogError>> {
        let (tx, rx) = oneshot::channel();
        let cmd = make(tx);
        let queued = self.writes.send(cmd);
        async move {
            if !queued {
                return Err(ChangeLogError::Closed);
            }
            rx.await.map_err(|_| ChangeLogError::Closed)?
        }
    }

    /// Stores a whole transaction; the future resolves once it is durable. The write is
    /// queued by the call itself, so calls are stored in call order. The first transaction of
    /// an empty change log sets the replicaVersion.
    pub fn append(
        &self,
        txn: Transaction,
    ) -> impl std::future::Future<Output = Result<(), ChangeLogError>> {
        self.write(|r| WriteCommand::Append(txn, r, Instant::now()))
    }

    /// Stores `chunk` of an open transaction pending: invisible to every reader and to the
    /// purge until the append of its transaction (with [`Transaction::pending`] counting it)
    /// moves it into the change log (PROTOCOL.md §3.0). Queued by the call, in order with
    /// appends; the future resolves once it is written.
    pub fn store_pending(
        &self,
        chunk: PendingChunk,
    ) -> impl std::future::Future<Output = Result<(), ChangeLogError>> {
        self.write(|r| WriteCommand::Pending(chunk, r))
    }

    /// Deletes every pending row (the open transaction was rolled back or cut off, PROTOCOL.md
    /// §3.0). Queued by the call.
    pub fn drop_pending(&self) -> impl std::future::Future<Output = Result<(), ChangeLogError>> {
        self.write(WriteCommand::DropPending)
    }

    /// Deletes every row below `before`, except the newest stored transaction. Answers the
    /// number of rows deleted. Queued by the call.
    pub fn purge(
        &self,
        before: Watermark,
    ) -> impl std::future::Future<Output = Result<u64, ChangeLogError>> {
        let answer = self.write(|reply| WriteCommand::Purge {
            before,
            stored_by_ms: None,
            gate: None,
            reply,
        });
        async move { answer.await.map(|o| o.rows) }
    }

    /// The purge of a scheduled watermark (PROTOCOL.md §9): deletes the rows below `before` that were
    /// stored at or before `stored_by_ms`, always keeping the newest stored transaction. Once
    /// nothing below `before` is left for later, `before` is taken off the scheduled purges in
    /// the same transaction. Queued by the call.
    pub fn purge_scheduled(
        &self,
        before: Watermark,
        stored_by_ms: i64,
    ) -> impl std::future::Future<Output = Result<PurgeOutcome, ChangeLogError>> {
        self.write(move |reply| WriteCommand::Purge {
            before,
            stored_by_ms: Some(stored_by_ms),
            gate: None,
            reply,
        })
    }

    /// [`purge_scheduled`](Self::purge_scheduled), held back ([`PurgeOutcome::held`]) unless
    /// §9's subscriber rules hold across every instance sharing the change log: at least one
    /// subscriber is connected somewhere, and every subscriber of another instance not gone
    /// has acked `before` (PROTOCOL.md §14.1). The engine checks those in the transaction that
    /// purges; `gate` says what the caller checked of its own.
    pub fn purge_gated(
        &self,
        before: Watermark,
        stored_by_ms: i64,
        gate: PurgeGate,
    ) -> impl std::future::Future<Output = Result<PurgeOutcome, ChangeLogError>> {
        self.write(move |reply| WriteCommand::Purge {
            before,
            stored_by_ms: Some(stored_by_ms),
            gate: Some(gate),
            reply,
        })
    }

    /// Makes one change of the safety state durable, in order with every write queued before
    /// it (PROTOCOL.md §3). Queued by the call.
    pub fn save_state(
        &self,
        change: StateChange,
    ) -> impl std::future::Future<Output = Result<(), ChangeLogError>> {
        self.write(|reply| WriteCommand::State(change, reply))
    }

    /// Reads the safety state back, after every write queued before this call.
    pub fn load_state(
        &self,
    ) -> impl std::future::Future<Output = Result<SafetyState, ChangeLogError>> {
        self.write(WriteCommand::LoadState)
    }

    /// What the change log holds, including every write queued before this call.
    pub fn stats(&self) -> impl std::future::Future<Output = Result<LogStats, ChangeLogError>> {
        self.write(WriteCommand::Stats)
    }

    /// Whether `w` is the commit watermark of a stored transaction (after every write queued
    /// before this call).
    pub fn has_commit(
        &self,
        w: Watermark,
    ) -> impl std::future::Future<Output = Result<bool, ChangeLogError>> {
        self.write(|r| WriteCommand::HasCommit(w, r))
    }

    /// From now on the writer reports to `watch` as stage `writer`, the reader (catch-up reads)
    /// as stage `catchup` (PROTOCOL.md §11.1).
    pub fn report_stalls_to(&self, watch: &actix::Addr<crate::stall::StallWatch>) {
        let report = crate::stall::StallReport::to(watch, crate::stall::stage::WRITER);
        self.writes.send(WriteCommand::ReportStalls(report));
        self.report_read_stalls_to(watch);
    }

    /// From now on the reader (catch-up reads, a standby's follower's reads) reports to `watch`
    /// as stage `catchup` (PROTOCOL.md §11.1): a standby's, whose write channel only answers
    /// questions, reports this alone.
    pub fn report_read_stalls_to(&self, watch: &actix::Addr<crate::stall::StallWatch>) {
        let report = crate::stall::StallReport::to(watch, crate::stall::stage::CATCHUP);
        let _ = self.reads.send(ReadCommand::ReportStalls(report));
    }

    /// Resolves once every write queued before this call is durable.
    pub fn barrier(&self) -> impl std::future::Future<Output = Result<(), ChangeLogError>> {
        self.write(WriteCommand::Barrier)
    }

    /// Queues a command for the reader now and returns the future of its answer.
    fn ask_reader<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> ReadCommand,
    ) -> impl std::future::Future<Output = Result<T, ChangeLogError>> {
        let (tx, rx) = oneshot::channel();
        let queued = self.reads.send(make(tx)).is_ok();
        async move {
            if !queued {
                return Err(ChangeLogError::Closed);
            }
            rx.await.map_err(|_| ChangeLogError::Closed)?
        }
    }

    /// Reads up to `limit` stored changes after `after` (a `(watermark, pos)` position,
    /// exclusive) and at or below `up_to`, in order.
    pub fn read(
        &self,
        after: (Watermark, i64),
        up_to: Watermark,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<Vec<StoredChange>, ChangeLogError>> {
        self.read_within(after, up_to, limit, usize::MAX)
    }

    /// [`ChangeLog::read`], stopping once the changes reach `max_bytes` of downstream messages
    /// ([`StoredChange::message_len`]; the change that reaches it is the last, so a read
    /// returns at least one change when there is one): a catch-up's read is as large as its
    /// window's room, whatever the size of the changes (PROTOCOL.md §10.2).
    pub fn read_within(
        &self,
        after: (Watermark, i64),
        up_to: Watermark,
        limit: usize,
        max_bytes: usize,
    ) -> impl std::future::Future<Output = Result<Vec<StoredChange>, ChangeLogError>> {
        let query = RangeQuery {
            after,
            up_to,
            limit,
            max_bytes,
        };
        self.ask_reader(|reply| ReadCommand::Range(query, reply))
    }

    /// The bytes the change log takes on disk, as its engine counts them: SQLite, the database
    /// file and its write-ahead log; PostgreSQL, the tables of its schema (partitions, indexes
    /// and TOAST included). Asked of the reader, so it never waits behind a commit.
    pub fn disk_bytes(&self) -> impl std::future::Future<Output = Result<u64, ChangeLogError>> {
        self.ask_reader(ReadCommand::Size)
    }
}

#[cfg(test)]
mod tests;
