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
//! Layout: `change_log(watermark, pos, kind, change)` keyed by `(watermark, pos)`, where
//! `change` is the JSON text of the message's second element exactly as received and `kind` its
//! message kind (`begin`, `data`, `commit`); and one `replication_state` row with the
//! replicaVersion and the last stored commit watermark.
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
        let open_err = |e: Box<dyn std::error::Error + Send + Sync>| ChangeLogError::Open {
            path: data_dir.to_path_buf(),
            source: e,
        };
        std::fs::create_dir_all(data_dir).map_err(|e| open_err(Box::new(e)))?;
        let path = data_dir.join(DB_FILE);
        let conn = open_connection(&path).map_err(|e| open_err(Box::new(e)))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS change_log (
                 watermark TEXT NOT NULL,
                 pos INTEGER NOT NULL,
                 kind TEXT NOT NULL,
                 change TEXT NOT NULL,
                 PRIMARY KEY (watermark, pos)
             ) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS replication_state (
                 id INTEGER PRIMARY KEY CHECK (id = 0),
                 replica_version TEXT,
                 last_watermark TEXT
             );
             INSERT OR IGNORE INTO replication_state (id) VALUES (0);",
        )
        .map_err(|e| open_err(Box::new(e)))?;
        let writer = Writer::load(conn).map_err(|e| open_err(Box::new(e)))?;
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

struct Writer {
    conn: Connection,
    stats: ChangeLogStats,
}

impl Writer {
    fn load(conn: Connection) -> Result<Writer, ChangeLogError> {
        let (rv, _last): (Option<String>, Option<String>) = conn.query_row(
            "SELECT replica_version, last_watermark FROM replication_state WHERE id = 0",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let (min, max, rows): (Option<String>, Option<String>, i64) = conn.query_row(
            "SELECT MIN(watermark), MAX(watermark), COUNT(*) FROM change_log",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        Ok(Writer {
            conn,
            stats: ChangeLogStats {
                replica_version: watermark_col(rv)?,
                min_watermark: watermark_col(min)?,
                max_watermark: watermark_col(max)?,
                rows: rows as u64,
                changes_stored_total: 0,
                changes_purged_total: 0,
            },
        })
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
        let before = self.stats.clone();
        let result = (|| -> Result<(), rusqlite::Error> {
            let tx = self.conn.transaction()?;
            {
                let mut insert = tx.prepare_cached(
                    "INSERT OR REPLACE INTO change_log (watermark, pos, kind, change) VALUES (?1, ?2, ?3, ?4)",
                )?;
                for (txn, _) in &group {
                    for (pos, (kind, json)) in txn.changes.iter().enumerate() {
                        insert.execute(params![
                            txn.watermark.as_str(),
                            pos as i64,
                            kind.as_str(),
                            json
                        ])?;
                    }
                    let s = &mut self.stats;
                    if s.replica_version.is_none() {
                        info!("initial sync stored: replicaVersion={}", txn.watermark);
                        s.replica_version = Some(txn.watermark.clone());
                    }
                    if s.min_watermark.as_ref().is_none_or(|m| txn.watermark < *m) {
                        s.min_watermark = Some(txn.watermark.clone());
                    }
                    if s.max_watermark.as_ref().is_none_or(|m| txn.watermark > *m) {
                        s.max_watermark = Some(txn.watermark.clone());
                    }
                    s.rows += txn.changes.len() as u64;
                    s.changes_stored_total += txn.changes.len() as u64;
                }
            }
            tx.execute(
                "UPDATE replication_state SET replica_version = COALESCE(replica_version, ?1), last_watermark = ?2 WHERE id = 0",
                params![
                    self.stats.replica_version.as_ref().map(|w| w.as_str()),
                    self.stats.max_watermark.as_ref().map(|w| w.as_str())
                ],
            )?;
            tx.commit()
        })();
        match result {
            Ok(()) => {
                for (_, reply) in group {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(e) => {
                error!("storing {} transaction(s) failed: {e}", group.len());
                self.stats = before;
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
        let tx = self.conn.transaction()?;
        let n = tx.execute(
            "DELETE FROM change_log WHERE watermark < ?1",
            params![bound.as_str()],
        )?;
        let min: Option<String> =
            tx.query_row("SELECT MIN(watermark) FROM change_log", [], |r| r.get(0))?;
        tx.commit()?;
        self.stats.min_watermark = watermark_col(min)?;
        self.stats.rows -= n as u64;
        self.stats.changes_purged_total += n as u64;
        Ok(n as u64)
    }

    fn has_commit(&self, w: &Watermark) -> Result<bool, ChangeLogError> {
        Ok(self
            .conn
            .query_row(
                "SELECT 1 FROM change_log WHERE watermark = ?1 AND kind = 'commit' LIMIT 1",
                params![w.as_str()],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }
}

fn run_reader(conn: Connection, rx: mpsc::Receiver<ReadCommand>) {
    while let Ok(cmd) = rx.recv() {
        let result = read_range(&conn, &cmd);
        let _ = cmd.reply.send(result);
    }
}

fn read_range(conn: &Connection, cmd: &ReadCommand) -> Result<Vec<StoredChange>, ChangeLogError> {
    let mut stmt = conn.prepare_cached(
        "SELECT watermark, pos, kind, change FROM change_log
         WHERE (watermark, pos) > (?1, ?2) AND watermark <= ?3
         ORDER BY watermark, pos LIMIT ?4",
    )?;
    let rows = stmt.query_map(
        params![
            cmd.after.0.as_str(),
            cmd.after.1,
            cmd.up_to.as_str(),
            cmd.limit as i64
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
    let mut out = Vec::with_capacity(cmd.limit.min(4096));
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
