//! What sits around the real backup-monitor actors in a replay, recording instead of acting:
//! the purge side, each reservation's websocket client, and a change log that answers the
//! status as the scenario plans it (or fails with the scenario's `changeLogStateError`, or holds
//! the answer until `releaseStatus`).

use std::collections::HashMap;

use actix::prelude::*;
use change_streamer_actors::changelog::{ChangeLogError, LogRange};
use change_streamer_actors::cleanup::ScheduleCleanup;
use change_streamer_actors::reservation::ReservationEvent;
use change_streamer_actors::streamer::{GetSnapshotBase, SnapshotBaseError};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::output::{emit, Out};

/// The purge side: records each scheduled cleanup.
pub struct CleanupRecorder(pub Out);
impl Actor for CleanupRecorder {
    type Context = Context<Self>;
}
impl Handler<ScheduleCleanup> for CleanupRecorder {
    type Result = ();
    fn handle(&mut self, m: ScheduleCleanup, _: &mut Context<Self>) {
        emit(
            &self.0,
            0,
            "cleanup",
            &[("watermark", json!(m.watermark.as_str()).to_string())],
        );
    }
}

/// A reservation's websocket client: records the status and the end.
pub struct SessionRecorder {
    pub out: Out,
    pub task: String,
    pub res: u64,
    pub closed: bool,
}
impl SessionRecorder {
    fn closed(&mut self, error: Value) {
        if !self.closed {
            self.closed = true;
            let fields = [
                ("taskID", json!(self.task).to_string()),
                ("res", self.res.to_string()),
                ("error", error.to_string()),
            ];
            emit(&self.out, self.res, "closed", &fields);
        }
    }
}
impl Actor for SessionRecorder {
    type Context = Context<Self>;
}
impl Handler<ReservationEvent> for SessionRecorder {
    type Result = ();
    fn handle(&mut self, ev: ReservationEvent, _: &mut Context<Self>) {
        if self.closed {
            return;
        }
        match ev {
            ReservationEvent::Status(s) => {
                let fields = [
                    ("taskID", json!(self.task).to_string()),
                    ("res", self.res.to_string()),
                    ("msg", s.to_message()),
                ];
                emit(&self.out, self.res, "status", &fields);
            }
            ReservationEvent::Failed(e) => self.closed(json!(e.to_string())),
            ReservationEvent::Closed(_) => self.closed(Value::Null),
        }
    }
}
/// The client dropped the connection.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Cancel;
impl Handler<Cancel> for SessionRecorder {
    type Result = ();
    fn handle(&mut self, _: Cancel, _: &mut Context<Self>) {
        self.closed(Value::Null);
    }
}

/// How the fake change log answers the next status request.
#[derive(Default, Clone)]
pub struct Plan {
    pub state: Option<LogRange>,
    /// The read fails with this text (the scenario's `changeLogStateError`): an engine's own
    /// failure, which the reservation's close says as it is (PROTOCOL.md §6.3), as the
    /// original closes with the rejection's message.
    pub error: Option<String>,
    pub defer_for: Option<u64>,
}

pub struct FakeChangeLog {
    pub default: LogRange,
    pub next: Plan,
    pub deferred: HashMap<u64, oneshot::Sender<()>>,
}
impl Actor for FakeChangeLog {
    type Context = Context<Self>;
}
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetPlan(pub Plan);
impl Handler<SetPlan> for FakeChangeLog {
    type Result = ();
    fn handle(&mut self, p: SetPlan, _: &mut Context<Self>) {
        self.next = p.0;
    }
}
#[derive(Message)]
#[rtype(result = "bool")]
pub struct ReleaseStatus(pub u64);
impl Handler<ReleaseStatus> for FakeChangeLog {
    type Result = bool;
    fn handle(&mut self, r: ReleaseStatus, _: &mut Context<Self>) -> bool {
        self.deferred.remove(&r.0).map(|tx| tx.send(())).is_some()
    }
}
impl Handler<GetSnapshotBase> for FakeChangeLog {
    type Result = ResponseFuture<Result<LogRange, SnapshotBaseError>>;
    fn handle(&mut self, _: GetSnapshotBase, _: &mut Context<Self>) -> Self::Result {
        let plan = std::mem::take(&mut self.next);
        let answer = match plan.error {
            Some(text) => Err(SnapshotBaseError::ChangeLog(ChangeLogError::Engine(
                text.into(),
            ))),
            None => Ok(plan.state.unwrap_or_else(|| self.default.clone())),
        };
        match plan.defer_for {
            None => Box::pin(async move { answer }),
            Some(res) => {
                let (tx, rx) = oneshot::channel();
                self.deferred.insert(res, tx);
                Box::pin(async move {
                    let _ = rx.await;
                    answer
                })
            }
        }
    }
}
