//! What a change log shared by several instances provides besides the log itself (PROTOCOL.md
//! §14, §14.1), in engine-neutral handles: the instance records ([`InstanceRecords`]), the
//! owner's commit notices ([`CommitFeed`]) and what a standby shows of the shared state
//! ([`ChangeDbView`], a value of `safety.rs`). The recorder, the follower and a standby's reservations use these and
//! never learn which engine serves them.
//!
//! ### Why handles over an enum of engines, not trait objects
//! Every method is async and called from actors that hold the handle across awaits; a
//! `dyn` trait would box each future and hide which engines exist. An enum keeps the calls
//! static and makes a new engine a compile error at every method until it answers it, which
//! is the list ARCHITECTURE.md's "Adding an engine" names. PostgreSQL is the only engine that
//! can be shared today; SQLite's log is one instance's own.

use super::postgres;
use super::safety::ChangeDbView;
use super::types::ChangeLogError;
use crate::instance::{InstanceId, InstanceRecord, InstanceSeen, Refreshed};
use crate::reservation::records::{
    HeldReservation, RecordedEnd, RecordedReservation, ReservationRecords,
};
use crate::watermark::Watermark;

/// An instance's own connection to the shared change log's instance records (PROTOCOL.md
/// §14.1): never fenced, apart from the owner's writer. Cheap to clone; clones share the one
/// connection.
#[derive(Clone)]
pub struct InstanceRecords(Records);

#[derive(Clone)]
enum Records {
    Postgres(postgres::InstanceDb),
}

impl InstanceRecords {
    /// Connects to the records of the shared change log at `url` (creating their tables if
    /// missing), on the current runtime.
    pub async fn connect(url: &str) -> Result<InstanceRecords, ChangeLogError> {
        Ok(InstanceRecords(Records::Postgres(
            postgres::InstanceDb::connect(url).await?,
        )))
    }

    /// Where the records are, for logs (no password).
    pub fn location(&self) -> &str {
        match &self.0 {
            Records::Postgres(db) => db.location(),
        }
    }

    /// Whether the connection ended (a new one is needed).
    pub fn is_closed(&self) -> bool {
        match &self.0 {
            Records::Postgres(db) => db.is_closed(),
        }
    }

    /// Writes `record` (and its subscriber rows anew), and says whether the record it replaced
    /// was live; seen by the others all at once or not at all.
    pub async fn refresh(&self, record: &InstanceRecord) -> Result<Refreshed, ChangeLogError> {
        self.refresh_with(record, None).await
    }

    /// [`InstanceRecords::refresh`], and, when `held` is given, this instance's reservation
    /// rows replaced by it at once (a serving standby's; `None` leaves them as they are).
    pub async fn refresh_with(
        &self,
        record: &InstanceRecord,
        held: Option<&[HeldReservation]>,
    ) -> Result<Refreshed, ChangeLogError> {
        match &self.0 {
            Records::Postgres(db) => db.refresh_with(record, held).await,
        }
    }

    /// Deletes the records of the instances that are gone, answering their ids.
    pub async fn sweep_gone(&self) -> Result<Vec<String>, ChangeLogError> {
        match &self.0 {
            Records::Postgres(db) => db.sweep_gone().await,
        }
    }

    /// Deletes `id`'s record (a graceful stop).
    pub async fn remove(&self, id: &InstanceId) -> Result<(), ChangeLogError> {
        match &self.0 {
            Records::Postgres(db) => db.remove(id).await,
        }
    }

    /// The instances not gone, by id.
    pub async fn instances(&self) -> Result<Vec<InstanceSeen>, ChangeLogError> {
        match &self.0 {
            Records::Postgres(db) => db.instances().await,
        }
    }

    /// Every recorded held reservation (`own`'s counted as not live) and every end.
    pub async fn reservation_records(
        &self,
        own: &str,
    ) -> Result<ReservationRecords, ChangeLogError> {
        match &self.0 {
            Records::Postgres(db) => db.reservation_records(own).await,
        }
    }

    /// The ends by subscription recorded for `tasks`.
    pub async fn ends_for(&self, tasks: &[&str]) -> Result<Vec<RecordedEnd>, ChangeLogError> {
        match &self.0 {
            Records::Postgres(db) => db.ends_for(tasks).await,
        }
    }

    /// Records an end by subscription (the same task and time twice is one end).
    pub async fn record_end(&self, end: &RecordedEnd) -> Result<(), ChangeLogError> {
        match &self.0 {
            Records::Postgres(db) => db.record_end(end).await,
        }
    }

    /// Forgets held reservations the owner wrote down as its orphans, and ends it applied.
    pub async fn forget(
        &self,
        held: &[RecordedReservation],
        ends: &[RecordedEnd],
    ) -> Result<(), ChangeLogError> {
        match &self.0 {
            Records::Postgres(db) => db.forget(held, ends).await,
        }
    }

    /// The shared state as the owner last wrote it.
    pub async fn view(&self) -> Result<ChangeDbView, ChangeLogError> {
        match &self.0 {
            Records::Postgres(db) => db.view().await,
        }
    }
}

/// The owner's commit notices on the shared change log, while the connection that hears them
/// lasts; only the newest is kept, so a follower busy elsewhere misses nothing by reading up to
/// it later.
pub struct CommitFeed(Feed);

enum Feed {
    Postgres(postgres::CommitNotices),
}

impl CommitFeed {
    /// Listens for the owner's commits on the shared change log at `url`, on the current
    /// runtime.
    pub async fn listen(url: &str) -> Result<CommitFeed, ChangeLogError> {
        Ok(CommitFeed(Feed::Postgres(
            postgres::CommitNotices::listen(url).await?,
        )))
    }

    /// The newest notice not yet seen (waiting for one); `None` once the connection ended.
    pub async fn next(&mut self) -> Option<Watermark> {
        match &mut self.0 {
            Feed::Postgres(n) => n.next().await,
        }
    }

    /// The newest notice not yet seen, if one came (without waiting).
    pub fn newest_now(&mut self) -> Option<Watermark> {
        match &mut self.0 {
            Feed::Postgres(n) => n.newest_now(),
        }
    }
}
