//! The SQLite engine of the change log (PROTOCOL.md §3): one database file in the data
//! directory, served by a writer thread ([`writer`]) and a reader thread ([`reader`]), each on
//! its own connection ([`connection`]).
//!
//! Layout: a row per transaction `(watermark, changes, body, stored_ms)`, where `body` holds its
//! changes in order, each its kind (`begin`, `data`, `commit`) and the JSON text of the
//! message's second element exactly as received, compressed with LZ4 when that makes it
//! smaller, and `stored_ms` is when it was stored ([`txn_rows`]; segments written by earlier
//! builds have a row per change `(watermark, pos, kind, change, stored_ms)`, or uncompressed
//! transaction rows, and are read as they are); one `replication_state` row with the
//! replicaVersion and the last stored commit watermark; and the safety state's tables
//! ([`state`]).
//!
//! ### Segments, so that a purge is cheap
//! SQLite deletes rows one at a time: purging a million rows from one table takes seconds. So
//! the rows live in *segments*, tables `change_log_<n>` of about `segment_rows` changes each,
//! listed with their watermark range in `segments` ([`segments`]); a new segment starts at a
//! transaction boundary once the current one is full. A purge drops every segment that lies
//! wholly below the purge watermark (dropping a table frees its pages in bulk) and deletes rows
//! only in the one segment it cuts through. Reads walk the segments in order inside one read
//! transaction.

mod connection;
mod reader;
mod segments;
mod state;
mod txn_rows;
mod writer;

use std::path::Path;
use std::sync::mpsc;
use std::thread;

use log::info;
use tokio::sync::watch;

// The change log's shared leaves, for this engine's files.
use super::{catalogue, commands, safety, txn_value, types};

use self::commands::{Ends, WriteQueue, Writes};
use self::connection::{open_connection, READER_CACHE_KIB, WRITER_CACHE_KIB};
use self::types::ChangeLogError;
use self::writer::Writer;
use crate::clock::Clock;

#[cfg(test)]
pub(super) use self::writer::COMMIT_WINDOW;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "change-log.db";

/// Opens (creating if needed) the change log under `data_dir` and starts its threads.
pub(super) fn open(
    data_dir: &Path,
    segment_rows: u64,
    clock: Clock,
) -> Result<Ends, ChangeLogError> {
    let open_err = |e: Box<dyn std::error::Error + Send + Sync>| ChangeLogError::Open {
        path: data_dir.to_path_buf(),
        source: e,
    };
    std::fs::create_dir_all(data_dir).map_err(|e| open_err(Box::new(e)))?;
    let path = data_dir.join(DB_FILE);
    let conn = open_connection(&path, WRITER_CACHE_KIB).map_err(|e| open_err(Box::new(e)))?;
    conn.execute_batch(segments::SCHEMA)
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
    let reader = open_connection(&path, READER_CACHE_KIB).map_err(|e| open_err(Box::new(e)))?;

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
    let db = path.clone();
    thread::Builder::new()
        .name("change-log-reader".into())
        .spawn(move || reader::run(reader, &db, rrx))
        .map_err(|e| open_err(Box::new(e)))?;
    Ok(Ends {
        writes: Writes::windowed(writes, writer_thread.thread().clone()),
        reads,
        owner,
        location: path.display().to_string(),
    })
}
