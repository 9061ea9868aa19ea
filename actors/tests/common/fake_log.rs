//! `FakeLog`: the answer to a reservation's [`GetSnapshotBase`] in actor tests
//! of the [`ReservationActor`], fixed by the test: the replica version and the oldest watermark
//! the log can serve.
//!
//! [`ReservationActor`]: change_streamer_actors::reservation::ReservationActor

use actix::prelude::*;
use change_streamer_actors::changelog::LogRange;
use change_streamer_actors::streamer::{GetSnapshotBase, SnapshotBaseError};

/// Answers every [`GetSnapshotBase`] with the same state.
pub struct FakeLog {
    pub replica_version: &'static str,
    pub min_watermark: &'static str,
}

impl Actor for FakeLog {
    type Context = Context<Self>;
}

impl Handler<GetSnapshotBase> for FakeLog {
    type Result = Result<LogRange, SnapshotBaseError>;
    fn handle(&mut self, _: GetSnapshotBase, _: &mut Context<Self>) -> Self::Result {
        Ok(LogRange {
            replica_version: self.replica_version.into(),
            min_watermark: self.min_watermark.into(),
        })
    }
}
