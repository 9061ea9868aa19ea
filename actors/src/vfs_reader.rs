//! The VFS reader: the helper process that reads the backed-up watermark out of the backup
//! through litestream 0.5's SQLite VFS extension (PROTOCOL.md §8.1b). The monitor's side of the
//! conversation is [`crate::vfs`]; this is the other side, run by [`run`] as the `main` of a
//! child process (the service binary's hidden [`SUBCOMMAND`], or the actors crate's
//! `change-streamer-vfs-reader` binary).
//!
//! ### Why a process of its own
//! The extension is a Go shared library: loading it brings a second runtime (with its own
//! threads and signal handlers) into whatever process loads it. It reads
//! `LITESTREAM_REPLICA_URL` once, when loaded, and registers its VFS once per process. And
//! opening a replica that holds no backup yet blocks inside the extension until one appears:
//! no SQLite call can cancel it, a thread stuck there can only be leaked. A process can be
//! killed, which is how the monitor abandons a wedged read.
//!
//! ### Protocol (line-delimited JSON)
//! Configuration comes from the environment: [`ENV_EXTENSION`], [`ENV_QUERY`] and litestream's
//! own variables (`LITESTREAM_REPLICA_URL`, the AWS ones for `s3://`). Once the extension is
//! loaded the reader writes [`Reply::Ready`] (or a [`Reply::Error`] and exits 1). Then for each
//! [`Request::Poll`] line on stdin it opens the backup read-only, runs the query and, in the same
//! read transaction, `PRAGMA page_count` and `PRAGMA page_size` (the size of the database the
//! backup restores to, PROTOCOL.md §6.3, §8.1b), and writes one [`Reply`]. The extension logs to stdout too, so the monitor skips lines that are not replies.
//! End of stdin ends the process at once, even while a read is stuck, so a reader never
//! outlives the monitor that spoke to it.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::mpsc;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use serde::{Deserialize, Serialize};

/// The service binary runs [`run`] when this is its first argument.
pub const SUBCOMMAND: &str = "__vfs-reader";
/// Path of the extension to load.
pub const ENV_EXTENSION: &str = "CHANGE_STREAMER_VFS_EXTENSION";
/// The query whose first column of the first row is the backed-up watermark.
pub const ENV_QUERY: &str = "CHANGE_STREAMER_VFS_QUERY";
/// The name the extension registers its VFS under.
const VFS_NAME: &str = "litestream";

/// What the monitor asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Request {
    /// Open the backup, run the query, answer with the watermark and the database's size.
    Poll,
}

/// What the reader answers, one line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Reply {
    /// The extension is loaded.
    Ready,
    /// The first column of the first row of the query, and page count × page size in bytes
    /// (`None` when the pragmas failed: the watermark still counts).
    Backup {
        watermark: String,
        bytes: Option<u64>,
    },
    /// The extension did not load, or the backup could not be opened or queried.
    Error(String),
}

/// The reader's `main`; see the module documentation.
pub fn run() -> ExitCode {
    let (tx, rx) = mpsc::channel::<Request>();
    // SQLite work happens on its own thread so that this one can always notice the end of
    // stdin and exit, even while the extension is stuck opening the backup.
    std::thread::spawn(move || serve(rx));
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match serde_json::from_str::<Request>(&line) {
            Ok(req) => {
                if tx.send(req).is_err() {
                    // The SQLite thread is gone (it panicked): an error, never a clean exit.
                    eprintln!("change-streamer vfs reader: the reading thread stopped");
                    std::process::exit(1);
                }
            }
            Err(e) => answer(&Reply::Error(format!("bad request {line:?}: {e}"))),
        }
    }
    // Exit without waiting for the SQLite thread: it may be stuck in the extension.
    std::process::exit(0)
}

fn serve(rx: mpsc::Receiver<Request>) {
    let loader = match load_extension() {
        Ok(c) => c,
        Err(e) => {
            answer(&Reply::Error(e));
            std::process::exit(1);
        }
    };
    answer(&Reply::Ready);
    let query = std::env::var(ENV_QUERY).unwrap_or_default();
    for Request::Poll in rx {
        answer(&match read_backup(&query) {
            Ok((watermark, bytes)) => Reply::Backup { watermark, bytes },
            Err(e) => Reply::Error(e),
        });
    }
    drop(loader);
}

/// Loads the extension into an in-memory connection, which is kept for the life of the process
/// (the VFS it registers is process-wide).
fn load_extension() -> Result<Connection, String> {
    let path =
        std::env::var_os(ENV_EXTENSION).ok_or_else(|| format!("{ENV_EXTENSION} is not set"))?;
    let conn = Connection::open_in_memory().map_err(|e| e.to_string())?;
    // SAFETY: loading an extension runs its code in this process, which is this process's
    // whole purpose; the path is the operator's `--litestream-vfs`.
    unsafe {
        conn.load_extension_enable().map_err(|e| e.to_string())?;
        conn.load_extension(&path, None)
            .map_err(|e| format!("cannot load {}: {e}", path.to_string_lossy()))?;
        conn.load_extension_disable().map_err(|e| e.to_string())?;
    }
    Ok(conn)
}

/// Opens the backup afresh (so each poll sees what the replica holds now, not what the VFS
/// cached) and returns, from one read transaction, the query's first column of its first row
/// (which must be text) and the database's size in bytes, if the pragmas answer.
fn read_backup(query: &str) -> Result<(String, Option<u64>), String> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags_and_vfs("file:backup.db", flags, VFS_NAME)
        .map_err(|e| format!("cannot open the backup: {e}"))?;
    let txn = conn
        .unchecked_transaction()
        .map_err(|e| format!("cannot open the backup: {e}"))?;
    let watermark = read_watermark(&txn, query)?;
    let bytes = database_bytes(&txn);
    Ok((watermark, bytes))
}

/// `PRAGMA page_count` × `PRAGMA page_size`; `None` when either fails or is negative.
fn database_bytes(conn: &Connection) -> Option<u64> {
    let pragma = |name: &str| {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
            .ok()
            .and_then(|v| u64::try_from(v).ok())
    };
    pragma("page_count")?.checked_mul(pragma("page_size")?)
}

/// The query's first column of its first row, which must be text.
fn read_watermark(conn: &Connection, query: &str) -> Result<String, String> {
    let mut stmt = conn
        .prepare(query)
        .map_err(|e| format!("query failed: {e}"))?;
    let mut rows = stmt.query([]).map_err(|e| format!("query failed: {e}"))?;
    let row = rows
        .next()
        .map_err(|e| format!("query failed: {e}"))?
        .ok_or_else(|| "the query returned no row".to_string())?;
    match row.get_ref(0).map_err(|e| format!("query failed: {e}"))? {
        ValueRef::Text(t) => {
            String::from_utf8(t.to_vec()).map_err(|_| "the watermark is not UTF-8".to_string())
        }
        other => Err(format!(
            "the query's first column is {}, not text",
            other.data_type().to_string().to_lowercase()
        )),
    }
}

fn answer(reply: &Reply) {
    let mut line = serde_json::to_string(reply).unwrap_or_else(|e| {
        serde_json::to_string(&Reply::Error(e.to_string())).unwrap_or_default()
    });
    line.push('\n');
    // One write per reply: the extension writes its log lines to the same pipe.
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes()).and_then(|_| out.flush());
}
