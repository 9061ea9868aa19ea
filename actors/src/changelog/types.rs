//! The vocabulary both change-log engines share: what is stored ([`Transaction`],
//! [`StoredChange`]), what the log holds ([`LogStats`], [`LogRange`]), what a purge did
//! ([`PurgeOutcome`]) and how a command fails ([`ChangeLogError`], said with its causes by
//! [`with_causes`]).
//!
//! A leaf: it imports nothing else of the change log, so the handle, the commands and both
//! engines can all use it without importing each other.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::oneshot;

use crate::watermark::Watermark;

/// Rows after which the next transaction starts a new segment.
pub const SEGMENT_ROWS: u64 = 50_000;

/// Why a change-log command failed.
#[derive(Debug, thiserror::Error)]
pub enum ChangeLogError {
    #[error("change log at {path}: {source}")]
    Open {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("change log: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Said with its causes: tokio-postgres's own text is only its kind ("db error", "error
    /// communicating with the server"), the server's message is its source, and this text is
    /// what a reservation's close reason says (PROTOCOL.md §6.3).
    #[error("change DB: {}", with_causes(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// An engine's failure that no variant here names, in the engine's own words: a third
    /// engine's error, or the replay's stand-in change log saying a scenario's failure.
    #[error("{}", with_causes(.0.as_ref()))]
    Engine(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A thread or runtime of the engine could not be started.
    #[error("change log could not start: {0}")]
    Start(#[from] std::io::Error),
    #[error("change DB: this instance is not its owner")]
    NotOwner,
    /// A group commit failed: every caller in the group gets the one cause.
    #[error("change log write failed: {0}")]
    Write(Arc<ChangeLogError>),
    #[error("change log is closed")]
    Closed,
    #[error("change log holds an invalid watermark {0:?}")]
    Corrupt(String),
    /// A standby's read after `after`: the owner purged past it, so what follows may not all
    /// be there any more (PROTOCOL.md §14.1).
    #[error("the change log was purged past watermark={after} (its oldest row is now {oldest}); what follows it may be incomplete")]
    PurgedPast { after: Watermark, oldest: Watermark },
    /// A call the change DB did not answer within its bound (PROTOCOL.md §14.2, a silent
    /// change DB): the connection it was made on is given up.
    #[error("no answer from the change DB within {0:?}")]
    Silent(std::time::Duration),
}

impl ChangeLogError {
    /// Whether this failure is the change DB out of reach, rather than a failure of what was
    /// asked of it (PROTOCOL.md §14.2, "An outage is one event in the log"): the connection
    /// refused, reset or ended ([`tokio_postgres::Error::is_closed`], or an I/O error under
    /// it), a call it did not answer in time ([`ChangeLogError::Silent`]), or the server
    /// saying it cannot serve the session: SQLSTATE class 08 (connection
    /// exception), 57P (operator intervention: `pg_terminate_backend`, a shutdown, a crash,
    /// "cannot connect now") or 53300 (too many connections). An outage is said once and ends
    /// with one line when the change DB answers again; anything else (a query the server
    /// refused, a row that does not decode, a corrupt watermark) is a fault of its own, said
    /// each time it happens, and says nothing of whether the change DB is reachable.
    pub fn is_unreachable(&self) -> bool {
        match self {
            ChangeLogError::Postgres(e) => postgres_unreachable(e),
            ChangeLogError::Write(cause) => cause.is_unreachable(),
            ChangeLogError::Silent(_) => true,
            _ => false,
        }
    }
}

/// [`ChangeLogError::is_unreachable`] for the PostgreSQL client's error.
fn postgres_unreachable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(state) = e.code() {
        let code = state.code();
        return code.starts_with("08") || code.starts_with("57P") || code == "53300";
    }
    // Not an answer of the server's: the client's I/O (refused, reset, a DNS failure) is
    // the connection; the rest (a value that does not convert, a bad configuration) is not.
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// `e` and its causes, each said once: "db error: FATAL: terminating connection due to
/// administrator command" where tokio-postgres alone says "db error". A cause whose text is
/// already said (a wrapper that prints its source) is not repeated.
pub(super) fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
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
    pub(super) fn parse(s: &str) -> Option<ChangeKind> {
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
    /// The JSON text of the message's second element. Shared (`Arc`): a read kept in memory
    /// answers many subscribers' catch-ups with the same rows, and cloning a row must not
    /// copy its text.
    pub json: Arc<str>,
}

impl StoredChange {
    /// The length of the downstream message it becomes (PROTOCOL.md §7): its JSON in its
    /// envelope, `["begin",J,{"commitWatermark":"W"}]`, `["data",J]` or
    /// `["commit",J,{"watermark":"W"}]`. What a read's byte limit counts ([`ChangeLog::read`]).
    ///
    /// [`ChangeLog::read`]: super::ChangeLog::read
    pub fn message_len(&self) -> usize {
        let w = self.watermark.as_str().len();
        self.json.len()
            + match self.kind {
                ChangeKind::Begin => 33 + w,
                ChangeKind::Data => 9,
                ChangeKind::Commit => 28 + w,
            }
    }
}

/// A whole committed transaction: its commit watermark and its messages, begin to commit.
#[derive(Debug, Clone)]
pub struct Transaction {
    pub watermark: Watermark,
    pub changes: Vec<(ChangeKind, String)>,
}

/// What the change log holds and what its writer did, for `/status`, `/metrics`,
/// reservations and subscriptions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogStats {
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
    /// Why the latest append failed and where (a full disk, say), until an append succeeds
    /// again: `/readyz` says it (PROTOCOL.md §3.1).
    #[serde(skip)]
    pub write_error: Option<String>,
}

/// The range a snapshot reservation's status reports (PROTOCOL.md §6): the replicaVersion
/// and the oldest watermark still stored, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRange {
    pub replica_version: String,
    pub min_watermark: String,
}

impl LogStats {
    /// The range a reservation reports; `None` while nothing was stored (no replicaVersion).
    pub fn range(&self) -> Option<LogRange> {
        let rv = self.replica_version.as_ref()?;
        Some(LogRange {
            replica_version: rv.to_string(),
            min_watermark: self.min_watermark.as_ref().unwrap_or(rv).to_string(),
        })
    }

    /// Whether a subscriber at `w` can be served (PROTOCOL.md §7); `stored`: whether `w` is the
    /// commit watermark of a stored transaction.
    pub fn can_serve_from(&self, w: &Watermark, stored: bool) -> Result<(), Unservable> {
        let (Some(min), Some(max)) = (&self.min_watermark, &self.max_watermark) else {
            return Ok(()); // empty log: everything is live
        };
        if w > max || (w >= min && stored) {
            Ok(())
        } else if w < min {
            Err(Unservable::TooOld {
                earliest: min.clone(),
            })
        } else {
            Err(Unservable::NotACommit {
                min: min.clone(),
                max: max.clone(),
            })
        }
    }
}

/// Why the change log cannot serve a subscriber from its watermark (PROTOCOL.md §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unservable {
    /// Older than the oldest stored transaction: a newer backup serves it.
    TooOld { earliest: Watermark },
    /// Within the stored range but not the commit of a stored transaction: the replica applied
    /// a history the change log does not hold.
    NotACommit { min: Watermark, max: Watermark },
}

/// Where an engine sends a command's answer.
pub(super) type Reply<T> = oneshot::Sender<Result<T, ChangeLogError>>;

/// What one purge did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeOutcome {
    /// Rows deleted.
    pub rows: u64,
    /// Rows below the purge watermark were kept because they were stored less than the
    /// retention ago (PROTOCOL.md §9): the watermark stays scheduled.
    pub held_by_retention: bool,
    /// Nothing was purged: a subscriber rule held the purge back (PROTOCOL.md §9, §14.1).
    pub held: Option<PurgeHold>,
}

/// A purge of a scheduled watermark asks the engine to check the subscribers it cannot see
/// from the streamer: those of the other instances sharing a change DB (PROTOCOL.md §14.1),
/// in the transaction that purges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeGate {
    /// How many subscribers the asking instance has itself (all of which have acked the
    /// purge watermark: the streamer checked them in the same turn).
    pub local_subscribers: usize,
}

/// What held a gated purge back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeHold {
    /// No subscriber is connected to any instance (PROTOCOL.md §9's rule).
    NoSubscribers,
    /// A subscriber of another instance has not acked the purge watermark.
    Subscriber {
        instance: String,
        subscriber: String,
        acked: Watermark,
    },
}
