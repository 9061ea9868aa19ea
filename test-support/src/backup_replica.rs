//! A real backup replica: subscribes to the service with `mode=backup`, applies each
//! transaction to its own SQLite file (WAL, what litestream replicates) and keeps
//! `"_zero.replicationState"(stateVersion, writeTimeMs)` current in the same SQLite transaction,
//! then acks. This is the file whose backup the VFS source reads, and which a restoring replica
//! restores.
//!
//! Rows are kept generically: `"rows"(relation, key, row)`, the key being the JSON of the
//! relation's key columns, so that a test can compare what a restore holds with what was sent.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection};
use serde_json::Value;

use crate::access::Credentials;
use crate::client::{Seen, WsClient};
use crate::wait::wait_until;

/// The SQL the replica's file is made of.
const SCHEMA: &str = r#"
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS "_zero.replicationState"(
    stateVersion TEXT NOT NULL, writeTimeMs INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS "rows"(
    relation TEXT NOT NULL, key TEXT NOT NULL, row TEXT NOT NULL, PRIMARY KEY(relation, key));
"#;

/// What the replica has done so far, shared with the test that runs it.
#[derive(Debug, Default)]
pub struct Progress {
    /// The last committed watermark.
    pub applied: Option<String>,
    /// When each watermark was committed to the file (for latency measurements).
    pub committed_at: HashMap<String, Instant>,
    /// Why the stream ended, once it has.
    pub ended: Option<String>,
}

/// A running backup replica.
pub struct BackupReplica {
    pub db: PathBuf,
    pub progress: Rc<RefCell<Progress>>,
}

impl BackupReplica {
    /// Creates `db` at `watermark` (the replica version for a fresh one) and follows the
    /// service at `base` (`host:port`) from there, on the current actix runtime.
    pub async fn start(
        base: &str,
        id: &str,
        replica_version: &str,
        watermark: &str,
        db: &Path,
    ) -> BackupReplica {
        Self::start_with(
            &Credentials::default(),
            base,
            id,
            replica_version,
            watermark,
            db,
        )
        .await
    }

    /// [`start`](Self::start) on a service that asks for `credentials`.
    pub async fn start_with(
        credentials: &Credentials,
        base: &str,
        id: &str,
        replica_version: &str,
        watermark: &str,
        db: &Path,
    ) -> BackupReplica {
        let query = format!("id={id}&mode=backup&replicaVersion={replica_version}");
        Self::open(credentials, base, &query, watermark, db).await
    }

    /// [`start`](Self::start) as the backup replicator of backup `backup` among several
    /// (`backup=NAME`, PROTOCOL.md §7.1).
    pub async fn start_for_backup(
        base: &str,
        backup: &str,
        replica_version: &str,
        watermark: &str,
        db: &Path,
    ) -> BackupReplica {
        let query =
            format!("id={backup}&mode=backup&backup={backup}&replicaVersion={replica_version}");
        Self::open(&Credentials::default(), base, &query, watermark, db).await
    }

    /// Creates `db` at `watermark` and follows `/changes?{query}&watermark=…` from there.
    async fn open(
        credentials: &Credentials,
        base: &str,
        query: &str,
        watermark: &str,
        db: &Path,
    ) -> BackupReplica {
        let conn = Connection::open(db).expect("open the backup replica's file");
        conn.execute_batch(SCHEMA)
            .expect("create the replica's tables");
        conn.execute(r#"DELETE FROM "_zero.replicationState""#, [])
            .expect("reset replicationState");
        conn.execute(
            r#"INSERT INTO "_zero.replicationState" VALUES (?1, ?2)"#,
            params![watermark, now_ms()],
        )
        .expect("write replicationState");
        let client = WsClient::connect_with(
            &format!(
                "{}://{base}/replication/v6/changes?{query}&watermark={watermark}",
                credentials.ws()
            ),
            credentials,
        )
        .await;
        let progress = Rc::new(RefCell::new(Progress::default()));
        actix_rt::spawn(follow(client, conn, progress.clone()));
        BackupReplica {
            db: db.to_path_buf(),
            progress,
        }
    }

    /// The last committed watermark.
    pub fn applied(&self) -> Option<String> {
        self.progress.borrow().applied.clone()
    }

    /// Waits (20 s at most) until the replica has committed `watermark`.
    pub async fn wait_applied(&self, watermark: &str) {
        wait_until(
            "the backup replica applies what was sent",
            Duration::from_secs(20),
            || self.applied().as_deref() == Some(watermark),
        )
        .await;
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

async fn follow(mut c: WsClient, conn: Connection, progress: Rc<RefCell<Progress>>) {
    let ended = loop {
        let (id, msg) = match c.next(std::time::Duration::from_secs(3600)).await {
            Some(Seen::Msg { id, msg }) => (id, msg),
            Some(Seen::Closed { code, reason }) => break format!("closed {code} {reason}"),
            None => break "silent for an hour".to_string(),
        };
        if let Err(e) = apply(&conn, &msg, &progress) {
            break e;
        }
        c.ack(id).await;
    };
    log::info!("backup replica stopped: {ended}");
    progress.borrow_mut().ended = Some(ended);
}

/// Applies one stream message; a commit also moves `stateVersion`, in the same transaction.
fn apply(conn: &Connection, msg: &Value, progress: &RefCell<Progress>) -> Result<(), String> {
    let sql = |r: rusqlite::Result<usize>| r.map(|_| ()).map_err(|e| e.to_string());
    match msg[0].as_str() {
        Some("status") => Ok(()),
        Some("begin") => sql(conn.execute("BEGIN", [])),
        Some("data") => apply_change(conn, &msg[1]),
        Some("commit") => {
            let w = msg[2]["watermark"]
                .as_str()
                .ok_or_else(|| format!("commit without a watermark: {msg}"))?;
            sql(conn.execute(
                r#"UPDATE "_zero.replicationState" SET stateVersion = ?1, writeTimeMs = ?2"#,
                params![w, now_ms()],
            ))?;
            sql(conn.execute("COMMIT", []))?;
            let mut p = progress.borrow_mut();
            p.applied = Some(w.to_string());
            p.committed_at.insert(w.to_string(), Instant::now());
            Ok(())
        }
        Some("rollback") => sql(conn.execute("ROLLBACK", [])),
        _ => Err(format!("the stream sent {msg}")),
    }
}

/// Row changes go to `"rows"`; other changes (schema) have nothing to keep here.
fn apply_change(conn: &Connection, change: &Value) -> Result<(), String> {
    let relation = format!(
        "{}.{}",
        change["relation"]["schema"].as_str().unwrap_or(""),
        change["relation"]["name"].as_str().unwrap_or("")
    );
    let key_of = |row: &Value| -> String {
        let cols = change["relation"]["keyColumns"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let key: Vec<Value> = cols
            .iter()
            .map(|c| row[c.as_str().unwrap_or("")].clone())
            .collect();
        Value::Array(key).to_string()
    };
    let res = match change["tag"].as_str() {
        Some("insert") | Some("update") => conn.execute(
            r#"INSERT OR REPLACE INTO "rows" VALUES (?1, ?2, ?3)"#,
            params![relation, key_of(&change["new"]), change["new"].to_string()],
        ),
        Some("delete") => {
            let old = if change["key"].is_object() {
                &change["key"]
            } else {
                &change["old"]
            };
            conn.execute(
                r#"DELETE FROM "rows" WHERE relation = ?1 AND key = ?2"#,
                params![relation, key_of(old)],
            )
        }
        Some("truncate") => conn.execute(r#"DELETE FROM "rows" WHERE relation = ?1"#, [relation]),
        _ => Ok(0),
    };
    res.map(|_| ()).map_err(|e| e.to_string())
}

/// Writes a replica file at `watermark` holding about `bytes` of rows (1 KiB each), as the
/// backup replica would have after a long run: for measuring reads of a large backup.
pub fn write_large_replica(db: &Path, watermark: &str, bytes: usize) {
    let mut conn = Connection::open(db).expect("open the replica file");
    conn.execute_batch(SCHEMA)
        .expect("create the replica's tables");
    let tx = conn.transaction().expect("begin");
    tx.execute(
        r#"INSERT INTO "_zero.replicationState" VALUES (?1, ?2)"#,
        params![watermark, now_ms()],
    )
    .expect("write replicationState");
    {
        let mut insert = tx
            .prepare(r#"INSERT INTO "rows" VALUES ('public.filler', ?1, ?2)"#)
            .expect("prepare");
        // Random text (6 bits a character), so that the backup's compression does not shrink
        // it to nothing.
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for i in 0..bytes / 1024 {
            let filler: String = (0..1000)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ALPHABET[(state >> 58) as usize] as char
                })
                .collect();
            let row = format!(r#"{{"id":{i},"v":"{filler}"}}"#);
            insert.execute(params![i.to_string(), row]).expect("insert");
        }
    }
    tx.commit().expect("commit");
}

/// What a (restored) replica file holds: its `stateVersion` and its rows' JSON.
pub fn read_replica(db: &Path) -> (String, Vec<Value>) {
    let conn = Connection::open(db).expect("open a replica file");
    let state: String = conn
        .query_row(
            r#"SELECT stateVersion FROM "_zero.replicationState""#,
            [],
            |r| r.get(0),
        )
        .expect("read stateVersion");
    let mut stmt = conn
        .prepare(r#"SELECT row FROM "rows""#)
        .expect("select rows");
    let rows = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .expect("read rows")
        .map(|r| serde_json::from_str(&r.expect("row")).expect("row JSON"))
        .collect();
    (state, rows)
}
