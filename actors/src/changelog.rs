//! The change log: every change of every committed transaction, in SQLite (SPEC §3).
//!
//! One dedicated thread owns the only writing connection; everything that changes the database
//! (appending transactions, purging) is a command on its channel, answered through a oneshot.
//! Appends queued together are committed in one SQLite transaction (group commit), so the cost
//! of the fsync that makes them durable is shared; each caller is still answered only after
//! its transaction is durable, and that is when the upstream is acked. A second thread with its
//! own read connection serves catch-up reads, so a subscriber reading far behind never holds up
//! ingest (WAL mode lets the two run at once).
//!
//! Layout: the rows `(watermark, pos, kind, change)` keyed by `(watermark, pos)`, where `change`
//! is the JSON text of the message's second element exactly as received and `kind` its message
//! kind (`begin`, `data`, `commit`), and one `replication_state` row with the replicaVersion and
//! the last stored commit watermark.
//!
//! ### Segments, so that a purge is cheap
//! SQLite deletes rows one at a time: purging a million rows from one table takes seconds. So
//! the rows live in *segments*, tables `change_log_<n>` of about [`SEGMENT_ROWS`] rows each,
//! listed with their watermark range in `segments`; a new segment starts at a transaction
//! boundary once the current one is full. A purge drops every segment that lies wholly below
//! the purge watermark (dropping a table frees its pages in bulk) and deletes rows only in the
//! one segment it cuts through. Reads walk the segments in order inside one read transaction.
//!
//! [`ChangeLog`] is a cheap handle (two channel senders); dropping every handle ends the
//! threads after they finish what is queued.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use actix::Message;
use log::{error, info};
use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use tokio::sync::oneshot;

use crate::watermark::Watermark;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "change-log.db";

/// How many queued appends at most share one SQLite transaction.
const MAX_GROUP: usize = 512;

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

    /// Whether a subscriber at `w` can be served (SPEC §7): `Ok` or the earliest watermark.
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

enum WriteCommand {
    Append(Transaction, Reply<()>),
    Purge(Watermark, Reply<u64>),
    Stats(Reply<ChangeLogStats>),
    HasCommit(Watermark, Reply<bool>),
    Barrier(Reply<()>),
}

struct ReadCommand {
    after: (Watermark, i64),
    up_to: Watermark,
    limit: usize,
    reply: Reply<Vec<StoredChange>>,
}

/// A handle on the change log threads.
#[derive(Clone)]
pub struct ChangeLog {
    writes: mpsc::Sender<WriteCommand>,
    reads: mpsc::Sender<ReadCommand>,
    path: PathBuf,
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
        Self::open_with_segment_rows(data_dir, SEGMENT_ROWS)
    }

    /// [`open`](Self::open) with another segment size (tests use small ones).
    pub fn open_with_segment_rows(
        data_dir: &Path,
        segment_rows: u64,
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
                 rows INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS replication_state (
                 id INTEGER PRIMARY KEY CHECK (id = 0),
                 replica_version TEXT,
                 last_watermark TEXT
             );
             INSERT OR IGNORE INTO replication_state (id) VALUES (0);",
        )
        .map_err(|e| open_err(Box::new(e)))?;
        let writer = Writer::load(conn, segment_rows.max(1)).map_err(|e| open_err(Box::new(e)))?;
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
        thread::Builder::new()
            .name("change-log-writer".into())
            .spawn(move || writer.run(wrx))
            .map_err(|e| open_err(Box::new(e)))?;
        thread::Builder::new()
            .name("change-log-reader".into())
            .spawn(move || run_reader(reader, rrx))
            .map_err(|e| open_err(Box::new(e)))?;
        Ok(ChangeLog {
            writes,
            reads,
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues a command now (so that commands keep the caller's order) and returns the
    /// future of its answer.
    fn write<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> WriteCommand,
    ) -> impl std::future::Future<Output = Result<T, ChangeLogError>> {
        let (tx, rx) = oneshot::channel();
        let queued = self.writes.send(make(tx)).is_ok();
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
        self.write(|r| WriteCommand::Append(txn, r))
    }

    /// Deletes every row below `before`, except the newest stored transaction. Answers the
    /// number of rows deleted. Queued by the call.
    pub fn purge(
        &self,
        before: Watermark,
    ) -> impl std::future::Future<Output = Result<u64, ChangeLogError>> {
        self.write(|r| WriteCommand::Purge(before, r))
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

fn watermark_col(s: Option<String>) -> Result<Option<Watermark>, ChangeLogError> {
    s.map(|s| Watermark::parse(&s).map_err(|_| ChangeLogError::Corrupt(s)))
        .transpose()
}

/// A segment table's place in the log.
#[derive(Debug, Clone)]
struct Segment {
    id: i64,
    min: Watermark,
    max: Watermark,
    rows: u64,
}

fn segment_table(id: i64) -> String {
    format!("change_log_{id}")
}

fn load_segments(conn: &Connection) -> Result<Vec<Segment>, ChangeLogError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, min_watermark, max_watermark, rows FROM segments ORDER BY id",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, min, max, n) = row?;
        let parse = |w: String| Watermark::parse(&w).map_err(|_| ChangeLogError::Corrupt(w));
        out.push(Segment {
            id,
            min: parse(min)?,
            max: parse(max)?,
            rows: n as u64,
        });
    }
    Ok(out)
}

struct Writer {
    conn: Connection,
    stats: ChangeLogStats,
    segments: Vec<Segment>,
    segment_rows: u64,
}

impl Writer {
    fn load(conn: Connection, segment_rows: u64) -> Result<Writer, ChangeLogError> {
        conn.set_prepared_statement_cache_capacity(64);
        let (rv, _last): (Option<String>, Option<String>) = conn.query_row(
            "SELECT replica_version, last_watermark FROM replication_state WHERE id = 0",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let segments = load_segments(&conn)?;
        let mut w = Writer {
            conn,
            stats: ChangeLogStats {
                replica_version: watermark_col(rv)?,
                changes_stored_total: 0,
                changes_purged_total: 0,
                ..ChangeLogStats::default()
            },
            segments,
            segment_rows,
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

    fn run(mut self, rx: mpsc::Receiver<WriteCommand>) {
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
                WriteCommand::Purge(w, reply) => {
                    let _ = reply.send(self.purge(&w));
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
            }
        }
        info!("change log writer stopped");
    }

    fn append_group(&mut self, group: Vec<(Transaction, Reply<()>)>) {
        let (stats_before, segments_before) = (self.stats.clone(), self.segments.clone());
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
                    tx.execute_batch(&format!(
                        "CREATE TABLE {} (
                             watermark TEXT NOT NULL,
                             pos INTEGER NOT NULL,
                             kind TEXT NOT NULL,
                             change TEXT NOT NULL,
                             PRIMARY KEY (watermark, pos)
                         ) WITHOUT ROWID;",
                        segment_table(id)
                    ))?;
                    tx.execute(
                        "INSERT INTO segments (id, min_watermark, max_watermark, rows) VALUES (?1, ?2, ?2, 0)",
                        params![id, txn.watermark.as_str()],
                    )?;
                    self.segments.push(Segment {
                        id,
                        min: txn.watermark.clone(),
                        max: txn.watermark.clone(),
                        rows: 0,
                    });
                    touched_from = touched_from.min(self.segments.len() - 1);
                }
                let Some(seg) = self.segments.last_mut() else {
                    continue;
                };
                let mut insert = tx.prepare_cached(&format!(
                    "INSERT OR REPLACE INTO {} (watermark, pos, kind, change) VALUES (?1, ?2, ?3, ?4)",
                    segment_table(seg.id)
                ))?;
                for (pos, (kind, json)) in txn.changes.iter().enumerate() {
                    insert.execute(params![
                        txn.watermark.as_str(),
                        pos as i64,
                        kind.as_str(),
                        json
                    ])?;
                }
                seg.rows += txn.changes.len() as u64;
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
                    "UPDATE segments SET max_watermark = ?2, rows = ?3 WHERE id = ?1",
                    params![seg.id, seg.max.as_str(), seg.rows as i64],
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

    fn purge(&mut self, before: &Watermark) -> Result<u64, ChangeLogError> {
        let Some(max) = self.stats.max_watermark.clone() else {
            return Ok(0);
        };
        // The newest stored transaction always stays, so the log never forgets where it is.
        let bound = if *before > max { max } else { before.clone() };
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
            tx.commit()?;
            Ok(purged)
        })();
        match result {
            Ok(n) => {
                self.refresh_range();
                self.stats.changes_purged_total += n;
                Ok(n)
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

fn run_reader(mut conn: Connection, rx: mpsc::Receiver<ReadCommand>) {
    conn.set_prepared_statement_cache_capacity(64);
    while let Ok(cmd) = rx.recv() {
        let result = read_range(&mut conn, &cmd);
        let _ = cmd.reply.send(result);
    }
}

/// Reads in one read transaction, so the segment list and the rows are one snapshot.
fn read_range(
    conn: &mut Connection,
    cmd: &ReadCommand,
) -> Result<Vec<StoredChange>, ChangeLogError> {
    let tx = conn.transaction()?;
    let segments = load_segments(&tx)?;
    let mut out = Vec::with_capacity(cmd.limit.min(4096));
    for seg in segments
        .iter()
        .filter(|s| s.max >= cmd.after.0 && s.min <= cmd.up_to)
    {
        if out.len() >= cmd.limit {
            break;
        }
        let mut stmt = tx.prepare_cached(&format!(
            "SELECT watermark, pos, kind, change FROM {}
             WHERE (watermark, pos) > (?1, ?2) AND watermark <= ?3
             ORDER BY watermark, pos LIMIT ?4",
            segment_table(seg.id)
        ))?;
        let rows = stmt.query_map(
            params![
                cmd.after.0.as_str(),
                cmd.after.1,
                cmd.up_to.as_str(),
                (cmd.limit - out.len()) as i64
            ],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            },
        )?;
        for row in rows {
            let (w, pos, kind, json) = row?;
            let watermark = Watermark::parse(&w).map_err(|_| ChangeLogError::Corrupt(w.clone()))?;
            let kind = ChangeKind::parse(&kind).ok_or(ChangeLogError::Corrupt(kind))?;
            out.push(StoredChange {
                watermark,
                pos,
                kind,
                json,
            });
        }
    }
    tx.commit()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(n: u64, rows: usize) -> Transaction {
        let mut changes = vec![(ChangeKind::Begin, r#"{"tag":"begin"}"#.to_string())];
        for i in 0..rows {
            changes.push((
                ChangeKind::Data,
                format!(r#"{{"tag":"insert","n":{n},"i":{i}}}"#),
            ));
        }
        changes.push((ChangeKind::Commit, r#"{"tag":"commit"}"#.to_string()));
        Transaction {
            watermark: Watermark::from_u64(n),
            changes,
        }
    }

    #[actix_rt::test]
    async fn stores_reads_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = ChangeLog::open(dir.path()).unwrap();
            assert_eq!(log.stats().await.unwrap().replica_version, None);
            log.append(txn(100, 2)).await.unwrap();
            log.append(txn(101, 1)).await.unwrap();
            let s = log.stats().await.unwrap();
            assert_eq!(s.replica_version, Some(Watermark::from_u64(100)));
            assert_eq!(s.rows, 7);
            let all = log
                .read(
                    (Watermark::from_u64(100), i64::MAX),
                    Watermark::from_u64(101),
                    100,
                )
                .await
                .unwrap();
            assert_eq!(all.len(), 3);
            assert_eq!(all[0].kind, ChangeKind::Begin);
            assert_eq!(all[1].json, r#"{"tag":"insert","n":101,"i":0}"#);
        }
        let log = ChangeLog::open(dir.path()).unwrap();
        let s = log.stats().await.unwrap();
        assert_eq!(s.replica_version, Some(Watermark::from_u64(100)));
        assert_eq!(s.max_watermark, Some(Watermark::from_u64(101)));
        assert_eq!(s.rows, 7);
        assert!(log.has_commit(Watermark::from_u64(101)).await.unwrap());
        assert!(!log.has_commit(Watermark::from_u64(102)).await.unwrap());
    }

    #[actix_rt::test]
    async fn purge_keeps_the_newest_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let log = ChangeLog::open(dir.path()).unwrap();
        for n in 1..=5 {
            log.append(txn(n, 1)).await.unwrap();
        }
        assert_eq!(log.purge(Watermark::from_u64(3)).await.unwrap(), 6);
        let s = log.stats().await.unwrap();
        assert_eq!(s.min_watermark, Some(Watermark::from_u64(3)));
        assert_eq!(log.purge(Watermark::from_u64(99)).await.unwrap(), 6);
        let s = log.stats().await.unwrap();
        assert_eq!((s.min_watermark, s.rows), (Some(Watermark::from_u64(5)), 3));
        assert_eq!(s.changes_purged_total, 12);
    }

    #[actix_rt::test]
    async fn segments_roll_over_read_across_and_purge_whole() {
        let dir = tempfile::tempdir().unwrap();
        {
            // 5 rows a transaction, a new segment every 10 rows: two transactions a segment.
            let log = ChangeLog::open_with_segment_rows(dir.path(), 10).unwrap();
            for n in 1..=9 {
                log.append(txn(n, 3)).await.unwrap();
            }
            let all = log
                .read(
                    (Watermark::from_u64(1), i64::MAX),
                    Watermark::from_u64(9),
                    1000,
                )
                .await
                .unwrap();
            assert_eq!(all.len(), 40);
            let ws: Vec<u64> = all
                .iter()
                .filter(|c| c.kind == ChangeKind::Commit)
                .map(|c| c.watermark.to_u64().unwrap())
                .collect();
            assert_eq!(ws, (2..=9).collect::<Vec<_>>());
            // A limited read stops mid-segment and resumes where it stopped.
            let part = log
                .read((Watermark::from_u64(2), 2), Watermark::from_u64(9), 7)
                .await
                .unwrap();
            assert_eq!((part[0].watermark.to_u64(), part[0].pos), (Some(2), 3));
            assert_eq!(part.len(), 7);
            // Purge below 6: segments {1,2} and {3,4} dropped, 5 deleted from {5,6}.
            assert_eq!(log.purge(Watermark::from_u64(6)).await.unwrap(), 25);
            let s = log.stats().await.unwrap();
            assert_eq!(
                (s.min_watermark, s.rows),
                (Some(Watermark::from_u64(6)), 20)
            );
            assert!(log.has_commit(Watermark::from_u64(6)).await.unwrap());
            assert!(!log.has_commit(Watermark::from_u64(5)).await.unwrap());
            let rest = log
                .read(
                    (Watermark::from_u64(0), i64::MAX),
                    Watermark::from_u64(9),
                    1000,
                )
                .await
                .unwrap();
            assert_eq!(rest.len(), 20);
            assert_eq!(rest[0].watermark, Watermark::from_u64(6));
        }
        let log = ChangeLog::open_with_segment_rows(dir.path(), 10).unwrap();
        let s = log.stats().await.unwrap();
        assert_eq!(
            (s.min_watermark, s.max_watermark, s.rows),
            (
                Some(Watermark::from_u64(6)),
                Some(Watermark::from_u64(9)),
                20
            )
        );
        log.append(txn(10, 3)).await.unwrap();
        assert_eq!(log.purge(Watermark::from_u64(100)).await.unwrap(), 20);
        let s = log.stats().await.unwrap();
        assert_eq!(
            (s.min_watermark, s.rows),
            (Some(Watermark::from_u64(10)), 5)
        );
    }

    #[actix_rt::test]
    async fn queued_appends_commit_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = ChangeLog::open(dir.path()).unwrap();
        let rx: Vec<_> = (1..=1000).map(|n| log.append(txn(n, 3))).collect();
        for r in rx {
            r.await.unwrap();
        }
        let s = log.stats().await.unwrap();
        assert_eq!(s.rows, 5000);
        assert_eq!(s.max_watermark, Some(Watermark::from_u64(1000)));
    }
}
