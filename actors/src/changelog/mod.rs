//! The change log: every change of every committed transaction, in SQLite (PROTOCOL.md §3) or in a
//! shared PostgreSQL change DB (PROTOCOL.md §14), and the service's safety state beside it.
//!
//! One interface, two engines. [`ChangeLog`] is a cheap handle on two channels
//! ([`commands`]): writes go to the engine's only writer (group commit of queued appends,
//! purges, the safety state), catch-up reads to its reader. The SQLite engine serves them with
//! two threads on their own connections ([`writer`], [`reader`]); the PostgreSQL engine with
//! two threads each driving its own connection ([`postgres`]), the writer's holding ownership
//! of the change DB ([`crate::ownership`]). Callers queue a command and await its answer and
//! never learn which engine they have. Dropping every handle ends the threads after they finish
//! what is queued.
//!
//! SQLite layout (PostgreSQL's: [`postgres_schema`]): the rows `(watermark, pos, kind, change, stored_ms)` keyed by `(watermark, pos)`,
//! where `change` is the JSON text of the message's second element exactly as received, `kind`
//! its message kind (`begin`, `data`, `commit`) and `stored_ms` when it was stored; one
//! `replication_state` row with the replicaVersion and the last stored commit watermark; and
//! the safety state's tables ([`state`]).
//!
//! ### Segments, so that a purge is cheap
//! SQLite deletes rows one at a time: purging a million rows from one table takes seconds. So
//! the rows live in *segments*, tables `change_log_<n>` of about [`SEGMENT_ROWS`] rows each,
//! listed with their watermark range in `segments`; a new segment starts at a transaction
//! boundary once the current one is full. A purge drops every segment that lies wholly below
//! the purge watermark (dropping a table frees its pages in bulk) and deletes rows only in the
//! one segment it cuts through. Reads walk the segments in order inside one read transaction.

mod catalogue;
mod commands;
mod postgres;
mod postgres_reader;
mod postgres_schema;
mod postgres_writer;
mod reader;
mod segments;
mod state;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use actix::Message;
use log::info;
use rusqlite::Connection;
use serde::Serialize;
use tokio::sync::{oneshot, watch};

use self::commands::{ReadCommand, WriteCommand, WriteQueue};
pub use self::postgres::PgOptions;
use self::reader::run_reader;
pub use self::state::{RecordedWatermark, SafetyState, StateChange, StoredReservation};
use self::writer::Writer;
use crate::clock::Clock;
use crate::watermark::Watermark;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "change-log.db";

/// Rows after which the next transaction starts a new segment.
pub const SEGMENT_ROWS: u64 = 50_000;

#[derive(Debug, thiserror::Error)]
pub enum ChangeLogError {
    #[error("change log at {path}: {source}")]
    Open {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("change log: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("change DB: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("change DB: this instance is not its owner")]
    NotOwner,
    #[error("change log write failed: {0}")]
    Write(String),
    #[error("change log is closed")]
    Closed,
    #[error("change log holds an invalid watermark {0:?}")]
    Corrupt(String),
}

/// The kind of a stored message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    Begin,
    Data,
    Commit,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Begin => "begin",
            ChangeKind::Data => "data",
            ChangeKind::Commit => "commit",
        }
    }
    fn parse(s: &str) -> Option<ChangeKind> {
        match s {
            "begin" => Some(ChangeKind::Begin),
            "data" => Some(ChangeKind::Data),
            "commit" => Some(ChangeKind::Commit),
            _ => None,
        }
    }
}

/// One stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredChange {
    pub watermark: Watermark,
    pub pos: i64,
    pub kind: ChangeKind,
    /// The JSON text of the message's second element.
    pub json: String,
}

/// A whole committed transaction: its commit watermark and its messages, begin to commit.
#[derive(Debug, Clone)]
pub struct Transaction {
    pub watermark: Watermark,
    pub changes: Vec<(ChangeKind, String)>,
}

/// What the change log holds, for `/status`, reservations and subscriptions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeLogStats {
    pub replica_version: Option<Watermark>,
    pub min_watermark: Option<Watermark>,
    pub max_watermark: Option<Watermark>,
    pub rows: u64,
    #[serde(skip)]
    pub changes_stored_total: u64,
    #[serde(skip)]
    pub changes_purged_total: u64,
    /// Groups of appends the SQLite writer held open for its commit window (load seen).
    #[serde(skip)]
    pub commits_held_total: u64,
}

/// The two fields a snapshot reservation's status carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeLogState {
    pub replica_version: String,
    pub min_watermark: String,
}

/// Asks for the [`ChangeLogState`]; fails while the change log has no replicaVersion.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<ChangeLogState, String>")]
pub struct GetChangeLogState;

impl ChangeLogStats {
    /// The reservation status, or why there is none yet.
    pub fn reservation_state(&self) -> Result<ChangeLogState, String> {
        let rv = self
            .replica_version
            .as_ref()
            .ok_or_else(|| "change log is not initialized yet (no replicaVersion)".to_string())?;
        Ok(ChangeLogState {
            replica_version: rv.to_string(),
            min_watermark: self.min_watermark.as_ref().unwrap_or(rv).to_string(),
        })
    }

    /// Whether a subscriber at `w` can be served (PROTOCOL.md §7): `Ok` or the earliest watermark.
    pub fn can_serve_from(&self, w: &Watermark, stored: bool) -> Result<(), Watermark> {
        let (Some(min), Some(max)) = (&self.min_watermark, &self.max_watermark) else {
            return Ok(()); // empty log: everything is live
        };
        if w > max || (w >= min && stored) {
            Ok(())
        } else {
            Err(min.clone())
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, ChangeLogError>>;

/// What one purge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeOutcome {
    /// Rows deleted.
    pub rows: u64,
    /// Rows below the purge watermark were kept because they were stored less than the
    /// retention ago (PROTOCOL.md §9): the watermark stays scheduled.
    pub held_by_retention: bool,
}

/// A handle on the change log threads.
#[derive(Clone)]
pub struct ChangeLog {
    writes: mpsc::Sender<WriteCommand>,
    reads: mpsc::Sender<ReadCommand>,
    /// The SQLite file, or the change DB's URL without its password.
    path: PathBuf,
    /// Whether this instance still owns the change log (SQLite: always).
    owner: watch::Receiver<bool>,
    /// The SQLite writer thread, unparked by every command but an append: it may be sleeping
    /// out a commit window ([`writer`]), which such a command ends. `None`: PostgreSQL.
    wake: Option<thread::Thread>,
}

impl std::fmt::Debug for ChangeLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeLog")
            .field("path", &self.path)
            .finish()
    }
}

fn open_connection(path: &Path) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    // 64 MiB of page cache: a large purge or group commit then stays in memory until its
    // commit instead of spilling pages to the WAL halfway.
    conn.pragma_update(None, "cache_size", -65536)?;
    Ok(conn)
}

impl ChangeLog {
    /// Opens (creating if needed) the change log under `data_dir` and starts its threads.
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
        let open_err = |e: Box<dyn std::error::Error + Send + Sync>| ChangeLogError::Open {
            path: data_dir.to_path_buf(),
            source: e,
        };
        std::fs::create_dir_all(data_dir).map_err(|e| open_err(Box::new(e)))?;
        let path = data_dir.join(DB_FILE);
        let conn = open_connection(&path).map_err(|e| open_err(Box::new(e)))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS segments (
                 id INTEGER PRIMARY KEY,
                 min_watermark TEXT NOT NULL,
                 max_watermark TEXT NOT NULL,
                 rows INTEGER NOT NULL,
                 max_stored_ms INTEGER NOT NULL DEFAULT 0
             );
             CREATE TABLE IF NOT EXISTS replication_state (
                 id INTEGER PRIMARY KEY CHECK (id = 0),
                 replica_version TEXT,
                 last_watermark TEXT
             );
             INSERT OR IGNORE INTO replication_state (id) VALUES (0);",
        )
        .map_err(|e| open_err(Box::new(e)))?;
        conn.execute_batch(state::SCHEMA)
            .map_err(|e| open_err(Box::new(e)))?;
        segments::migrate(&conn).map_err(|e| open_err(Box::new(e)))?;
        let writer =
            Writer::load(conn, segment_rows.max(1), clock).map_err(|e| open_err(Box::new(e)))?;
        info!(
            "change log at {} opened: replicaVersion={:?} watermarks {:?}..{:?}, {} rows",
            path.display(),
            writer.stats.replica_version,
            writer.stats.min_watermark,
            writer.stats.max_watermark,
            writer.stats.rows
        );
        let reader = open_connection(&path).map_err(|e| open_err(Box::new(e)))?;

        let (writes, wrx) = mpsc::channel();
        let (reads, rrx) = mpsc::channel();
        let (owner_tx, owner) = watch::channel(true);
        let writer_thread = thread::Builder::new()
            .name("change-log-writer".into())
            .spawn(move || {
                writer.run(WriteQueue::new(wrx));
                drop(owner_tx);
            })
            .map_err(|e| open_err(Box::new(e)))?;
        thread::Builder::new()
            .name("change-log-reader".into())
            .spawn(move || run_reader(reader, rrx))
            .map_err(|e| open_err(Box::new(e)))?;
        Ok(ChangeLog {
            writes,
            reads,
            path,
            owner,
            wake: Some(writer_thread.thread().clone()),
        })
    }

    /// Opens the PostgreSQL change DB at `options.url` once this instance owns it: resolves
    /// only after this instance took ownership (as a standby it tries every takeover interval)
    /// and loaded the catalogue. Dropping the future gives up waiting.
    pub async fn open_postgres(options: PgOptions) -> Result<ChangeLog, ChangeLogError> {
        let config: tokio_postgres::Config = options.url.parse()?;
        let path = PathBuf::from(postgres::redacted(&config));
        let (writes, wrx) = mpsc::channel();
        let (reads, rrx) = mpsc::channel();
        let (owner_tx, owner) = watch::channel(false);
        let (ready, ready_rx) = oneshot::channel();
        let engine = postgres::Engine {
            config,
            options,
            queue: WriteQueue::new(wrx),
            reads: rrx,
            ready,
            owner: owner_tx,
        };
        thread::Builder::new()
            .name("change-log-pg-writer".into())
            .spawn(move || postgres::run(engine))
            .map_err(|e| ChangeLogError::Open {
                path: path.clone(),
                source: Box::new(e),
            })?;
        ready_rx.await.map_err(|_| ChangeLogError::Closed)??;
        Ok(ChangeLog {
            writes,
            reads,
            path,
            owner,
            wake: None,
        })
    }

    /// The SQLite file, or the change DB's URL without its password.
    pub fn path(&self) -> &Path {
        &self.path
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
        let append = matches!(cmd, WriteCommand::Append(..));
        let queued = self.writes.send(cmd).is_ok();
        if let Some(writer) = self.wake.as_ref().filter(|_| !append) {
            writer.unpark();
        }
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
        self.write(|r| WriteCommand::Append(txn, r, std::time::Instant::now()))
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
    pub fn stats(
        &self,
    ) -> impl std::future::Future<Output = Result<ChangeLogStats, ChangeLogError>> {
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

    /// Resolves once every write queued before this call is durable.
    pub fn barrier(&self) -> impl std::future::Future<Output = Result<(), ChangeLogError>> {
        self.write(WriteCommand::Barrier)
    }

    /// Reads up to `limit` stored changes after `after` (a `(watermark, pos)` position,
    /// exclusive) and at or below `up_to`, in order.
    pub fn read(
        &self,
        after: (Watermark, i64),
        up_to: Watermark,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<Vec<StoredChange>, ChangeLogError>> {
        let (tx, rx) = oneshot::channel();
        let queued = self
            .reads
            .send(ReadCommand {
                after,
                up_to,
                limit,
                reply: tx,
            })
            .is_ok();
        async move {
            if !queued {
                return Err(ChangeLogError::Closed);
            }
            rx.await.map_err(|_| ChangeLogError::Closed)?
        }
    }
}

#[cfg(test)]
mod tests;
