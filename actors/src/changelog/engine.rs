//! Which engine holds the change log, chosen once at start from the flags (PROTOCOL.md §2):
//! SQLite under `--data-dir`, one instance's own (§3), or a PostgreSQL change DB that several
//! instances share, one owning it and the others standing by (§14). The instance's wiring
//! matches on it once; everything after that speaks to a [`ChangeLog`](super::ChangeLog) and,
//! when shared, to the handles of `shared.rs`, and never learns the engine.

use std::path::PathBuf;

use super::types::ChangeLogError;

/// The engine of the change log, with what it needs to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeDb {
    /// SQLite in `dir` (created if missing): this instance is its owner from the start.
    Sqlite { dir: PathBuf },
    /// The PostgreSQL change DB at `url` (`postgres://`), shared by several instances.
    Postgres { url: String },
}

impl ChangeDb {
    /// Checks the engine's options before anything starts, so that a bad one is a start
    /// error rather than a standby retrying for ever.
    pub fn check(&self) -> Result<(), ChangeLogError> {
        match self {
            ChangeDb::Sqlite { .. } => Ok(()),
            ChangeDb::Postgres { url } => {
                url.parse::<tokio_postgres::Config>()?;
                Ok(())
            }
        }
    }

    /// The URL of a change log that several instances share; `None`: this instance's own.
    pub fn shared_url(&self) -> Option<&str> {
        match self {
            ChangeDb::Sqlite { .. } => None,
            ChangeDb::Postgres { url } => Some(url),
        }
    }
}
