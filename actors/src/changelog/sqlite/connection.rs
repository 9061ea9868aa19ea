//! How the SQLite engine opens its database: the same settings for the writer's connection and
//! the reader's.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

/// Opens `path` in WAL mode (the reader then runs beside the writer) with full fsync.
pub(super) fn open_connection(path: &Path) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    // 64 MiB of page cache: a large purge or group commit then stays in memory until its
    // commit instead of spilling pages to the WAL halfway.
    conn.pragma_update(None, "cache_size", -65536)?;
    Ok(conn)
}
