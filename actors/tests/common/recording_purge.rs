//! `RecordingPurge`: the purge side of the [`CleanupActor`] in actor tests. It records the
//! watermark of every [`ScheduleCleanup`] it is told, for a test to read by message ([`Take`])
//! or through the shared list ([`RecordingPurge::scheduled`]).
//!
//! [`CleanupActor`]: change_streamer_actors::cleanup::CleanupActor

use std::sync::{Arc, Mutex};

use actix::prelude::*;
use change_streamer_actors::cleanup::ScheduleCleanup;

/// Records what the purge side is told.
#[derive(Default)]
pub struct RecordingPurge(Arc<Mutex<Vec<String>>>);

impl RecordingPurge {
    /// The list the watermarks are recorded in, read without a message (a test that polls it
    /// while the actor system runs).
    pub fn scheduled(&self) -> Arc<Mutex<Vec<String>>> {
        self.0.clone()
    }
}

impl Actor for RecordingPurge {
    type Context = Context<Self>;
}

impl Handler<ScheduleCleanup> for RecordingPurge {
    type Result = ();
    fn handle(&mut self, m: ScheduleCleanup, _: &mut Context<Self>) {
        self.0.lock().unwrap().push(m.watermark.to_string());
    }
}

/// The watermarks scheduled since the last `Take`, oldest first.
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct Take;

impl Handler<Take> for RecordingPurge {
    type Result = Vec<String>;
    fn handle(&mut self, _: Take, _: &mut Context<Self>) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}
