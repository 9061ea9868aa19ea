//! How the SQLite engine opens its database: the same settings for the writer's connection and
//! the reader's.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

/// The writer's page cache, in KiB: a large purge or group commit then stays in memory until
/// its commit instead of spilling pages to the WAL halfway.
pub(super) const WRITER_CACHE_KIB: i64 = 64 * 1024;

/// The reader's page cache, in KiB. Catch-up reads walk the segments in order, each page once
/// per read, and the kernel's page cache holds the file: a large cache here only held, after a
/// catch-up through a 1 GiB transaction, 64 MiB of pages no read would use again (PROTOCOL.md
/// §3.0: memory does not grow with a transaction's size).
pub(super) const READER_CACHE_KIB: i64 = 8 * 1024;

/// Opens `path` in WAL mode (the reader then runs beside the writer) with full fsync and a page
/// cache of `cache_kib`.
pub(super) fn open_connection(path: &Path, cache_kib: i64) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "cache_size", -cache_kib)?;
    Ok(conn)
}
