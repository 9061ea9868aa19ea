//! What the instances sharing a change DB record of their reservations there (PROTOCOL.md §14.1),
//! so that a reservation held at a standby pauses the owner's cleanup like one held at the
//! owner, and an end by subscription at any instance reaches whoever holds the socket.
//!
//! Two kinds of rows, both written through the instances' unfenced record connections
//! (`changelog/postgres/records.rs`):
//! - **Held reservations** (`instance_reservations`): a serving standby's refresh replaces its
//!   rows whole ([`HeldReservation`]: task, start). The owner reads them at each backup poll
//!   ([`ReservationRecords`]); rows of an instance that is gone stay until the owner has
//!   written them down as its own orphans (PROTOCOL.md §13).
//! - **Ends by subscription** (`reservation_ends`, [`RecordedEnd`]): an accepted `initial=true`
//!   subscription at any instance records (task, when). The instance holding that task's
//!   socket learns it at its next refresh ([`EndedElsewhere`]), fills in the start it held
//!   (so the growth is known even once its row is gone) and closes the socket with 1000; the
//!   owner grows the cleanup delay from the start at its next poll, and forgets the end once
//!   no live instance records the task any more.
//!
//! Times are unix milliseconds of each instance's clock: the held time of a reservation
//! started at one instance and ended at another assumes their clocks agree (as backup times
//! already do).

use actix::prelude::*;

/// A reservation a socket of this instance holds, as its record shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldReservation {
    pub task_id: String,
    /// When it opened (unix ms).
    pub started_ms: i64,
}

/// A held reservation as the owner reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedReservation {
    pub instance: String,
    pub task_id: String,
    pub started_ms: i64,
    /// Its instance is not gone (and is not the reading owner itself).
    pub live: bool,
}

/// An end by subscription, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEnd {
    pub task_id: String,
    /// When the subscription was accepted (unix ms).
    pub ended_ms: i64,
    /// The start of the reservation it ended, once the instance that held it filled it in
    /// (or the ending instance held it itself).
    pub started_ms: Option<i64>,
}

impl RecordedEnd {
    /// Whether this end ends a reservation that started at `started_ms` (one opened after
    /// the subscription is a new restore).
    pub fn ends(&self, started_ms: i64) -> bool {
        started_ms <= self.ended_ms
    }
}

/// Everything the owner reads at a poll: every recorded held reservation and every end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReservationRecords {
    pub held: Vec<RecordedReservation>,
    pub ends: Vec<RecordedEnd>,
}

/// Asks the holder of this instance's reservations which reservations its sockets hold
/// (orphans excluded), for the instance's record.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Vec<HeldReservation>")]
pub struct ListHeld;

/// These tasks subscribed (`initial=true`) at some instance, at these times: the reservations
/// they end close with 1000 (the instance's refresh found them recorded).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct EndedElsewhere(pub Vec<RecordedEnd>);

/// What the instance recorder asks of the actor holding this instance's reservations.
#[derive(Clone)]
pub struct ReservationHolder {
    pub list: Recipient<ListHeld>,
    pub ended: Recipient<EndedElsewhere>,
    /// Its reservations are written as rows of the record (a serving standby's); the owner's
    /// are its safety state's already, and only counted.
    pub record_rows: bool,
}
