//! Who owns a shared PostgreSQL change DB (PROTOCOL.md §14): one owner writes, the others stand by.
//!
//! Ownership is a session-level advisory lock, [`OWNER_LOCK_KEY`], held by the owner's writer
//! connection, the one connection through which it writes. PostgreSQL itself keeps it:
//! it is released the moment that session ends (the process dies, its connection drops, or
//! its backend is terminated), and no other session can take it while it is held, so at most
//! one instance is the owner at any time. Standbys try [`try_acquire`] every
//! `--takeover-interval-ms`.
//!
//! ### Fencing: never two writers
//! Every write transaction of the owner starts with [`holds_lock`], which asks `pg_locks`
//! whether *this* session (`pg_backend_pid()`) still holds the lock, and aborts the
//! transaction if not. Because the lock and the writes share one session, a write can only
//! commit through a session that held the lock when the transaction began and still exists
//! when it commits; if the session ended in between, the commit fails with it. A writer that
//! loses its connection never reconnects to write: it is deposed, answers
//! [`ChangeLogError::NotOwner`](crate::changelog::ChangeLogError::NotOwner) to every later
//! write and must claim ownership anew, as a standby, to write again. While idle the owner
//! runs the same check every takeover interval, so it learns it was deposed even when nothing
//! is written.

use serde::Serialize;
use tokio_postgres::GenericClient;

/// The key of the session advisory lock that is ownership of a change DB ("cs" + 1).
pub const OWNER_LOCK_KEY: i64 = 0x6373_0001;

/// Whether this instance owns the change DB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Owner,
    Standby,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Standby => "standby",
        }
    }
}

/// Takes ownership if no other session holds it; `true` if this session now holds it.
pub async fn try_acquire(c: &impl GenericClient) -> Result<bool, tokio_postgres::Error> {
    let row = c
        .query_one("SELECT pg_try_advisory_lock($1)", &[&OWNER_LOCK_KEY])
        .await?;
    Ok(row.get(0))
}

/// Whether this session holds ownership: the fence every write transaction passes first.
///
/// A bigint advisory key appears in `pg_locks` split in two: its high 32 bits as `classid`,
/// its low 32 bits as `objid`, with `objsubid` 1.
pub async fn holds_lock(c: &impl GenericClient) -> Result<bool, tokio_postgres::Error> {
    let row = c.query_one(HOLDS_LOCK, &[&OWNER_LOCK_KEY]).await?;
    Ok(row.get(0))
}

/// [`holds_lock`]'s statement, `$1` the key: for a writer that prepares it once.
pub const HOLDS_LOCK: &str = "SELECT EXISTS (SELECT 1 FROM pg_locks
     WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()
       AND classid::int8 = ($1::int8 >> 32) AND objid::int8 = ($1::int8 & 4294967295)
       AND objsubid = 1)";
