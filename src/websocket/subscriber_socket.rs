//! `SubscriberSession`: the websocket of one `/changes` subscription (PROTOCOL.md §7).
//!
//! On start it asks the [`Streamer`] to subscribe it. Refused with error type 1 or 2, it sends
//! the `error` frame and closes (1000) once that frame is acked, or after one ping interval
//! without the ack. Accepted, it writes the frames the streamer hands it ([`ToSession`]) and
//! reports acks that matter back ([`SessionProgress`]): tracked frames at once, acked commits
//! at most [`COMMIT_REPORT_DELAY`] later. An accepted `initial=true` subscription of a task
//! ends that task's snapshot reservation, the one kind of end that may grow the cleanup delay.
//! Its `stopped` tells the streamer it is gone, so it no longer holds back a broadcast or a
//! purge.
//!
//! [`Streamer`]: change_streamer_actors::streamer::Streamer

use std::collections::VecDeque;
use std::time::Duration;

use actix::prelude::*;
use actix_web_actors::ws;
use bytestring::ByteString;
use change_streamer_actors::reservation::{EndBySubscription, ReservationActor};
use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_actors::streamer::{
    Mode, Outgoing, SessionGone, SessionProgress, ToSession, Token,
};
use change_streamer_actors::streamer::{Streamer, Subscribe, SubscribeError};
use change_streamer_actors::watermark::Watermark;
use log::{info, warn};

use super::framing::Framing;
use super::{client_frame, close, start_liveness, Live, Liveness};

/// The checked query parameters of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionParams {
    pub protocol: u32,
    pub id: String,
    pub task_id: Option<String>,
    pub mode: Mode,
    pub replica_version: String,
    pub watermark: Watermark,
    pub initial: bool,
}

pub struct SubscriberSession {
    session_id: SessionId,
    params: SubscriptionParams,
    streamer: Addr<Streamer>,
    reservations: Option<Addr<ReservationActor>>,
    ping_interval: Duration,
    framing: Framing,
    liveness: Liveness,
    /// Frames whose ack matters: (id, commit watermark, token).
    tracked: VecDeque<(u64, Option<Watermark>, Option<Token>)>,
    /// Set while an error frame waits for its ack before the close.
    error_frame: Option<u64>,
    /// The newest acked commit the streamer has not heard of: (the ack's id, its watermark).
    unreported: Option<(u64, Watermark)>,
    /// A report of `unreported` is scheduled ([`COMMIT_REPORT_DELAY`]).
    report_armed: bool,
    /// Where each frame of the batch being written ends (kept to reuse its allocation).
    ends: Vec<usize>,
}

/// How long an acked commit may wait before the streamer hears of it, when no tracked frame
/// was acked with it.
///
/// ### Why acked commits are reported late
/// Acks of tracked frames (flow control, catch-up batches, progress) are reported at once:
/// something waits on them. An acked commit only moves the subscriber's acked watermark, which
/// the purge rule and `/status` read, and neither needs it within milliseconds. Reporting every
/// one cost a message to the streamer per transaction per subscriber, each waking the
/// streamer's thread and making it poll its timers; reporting the newest of them once per
/// delay costs a few hundred per second per subscriber at most, whatever the rate.
const COMMIT_REPORT_DELAY: Duration = Duration::from_millis(5);

/// `{"msg":` + `,"id":` + up to 20 digits + `}`.
const FRAME_OVERHEAD: usize = 34;

impl SubscriberSession {
    pub fn new(
        params: SubscriptionParams,
        streamer: Addr<Streamer>,
        reservations: Option<Addr<ReservationActor>>,
        ping_interval: Duration,
    ) -> Self {
        SubscriberSession {
            session_id: SessionId::next(),
            params,
            streamer,
            reservations,
            ping_interval,
            framing: Framing::default(),
            liveness: Liveness::default(),
            tracked: VecDeque::new(),
            error_frame: None,
            ends: Vec::new(),
            unreported: None,
            report_armed: false,
        }
    }

    fn refused(&mut self, e: SubscribeError, ctx: &mut ws::WebsocketContext<Self>) {
        let Some(error_type) = e.error_type() else {
            close(ctx, SessionEnd::Unavailable(e.to_string()));
            return;
        };
        let msg = serde_json::json!(["error", {"type": error_type, "message": e.to_string()}]);
        let (id, frame) = self.framing.frame(&msg.to_string());
        ctx.text(frame);
        self.error_frame = Some(id);
        ctx.run_later(self.ping_interval, |_, ctx| {
            close(ctx, SessionEnd::ErrorNotAcked);
        });
    }

    /// Writes a batch of frames. They are framed into one buffer, and each frame handed to
    /// the websocket is a slice of it: one allocation per batch instead of several per frame.
    fn write(&mut self, frames: &[Outgoing], ctx: &mut ws::WebsocketContext<Self>) {
        let size = frames
            .iter()
            .map(|f| f.message.len() + FRAME_OVERHEAD)
            .sum();
        let mut text = String::with_capacity(size);
        self.ends.clear();
        for f in frames {
            let id = self.framing.frame_into(&f.message, &mut text);
            self.ends.push(text.len());
            if f.commit.is_some() || f.token.is_some() {
                self.tracked.push_back((id, f.commit.clone(), f.token));
            }
        }
        let all = ByteString::from(text);
        let mut start = 0;
        for &end in &self.ends {
            ctx.text(all.slice_ref(&all[start..end]));
            start = end;
        }
    }

    fn on_ack(&mut self, id: u64, ctx: &mut ws::WebsocketContext<Self>) {
        if self.error_frame.is_some_and(|e| id >= e) {
            close(ctx, SessionEnd::ErrorAcked);
            return;
        }
        let mut tokens = Vec::new();
        while self.tracked.front().is_some_and(|(t, _, _)| *t <= id) {
            if let Some((_, c, t)) = self.tracked.pop_front() {
                if let Some(c) = c {
                    self.unreported = Some((id, c));
                }
                tokens.extend(t);
            }
        }
        if !tokens.is_empty() {
            self.report(id, tokens);
        } else if self.unreported.is_some() && !self.report_armed {
            self.report_armed = true;
            ctx.run_later(COMMIT_REPORT_DELAY, |act, _| {
                act.report_armed = false;
                if let Some((id, _)) = act.unreported {
                    act.report(id, Vec::new());
                }
            });
        }
    }

    /// Tells the streamer the client acked through `acked`, with the tracked frames' `tokens`
    /// and the newest acked commit not yet reported.
    fn report(&mut self, acked: u64, tokens: Vec<Token>) {
        self.streamer.do_send(SessionProgress {
            session_id: self.session_id,
            acked_messages: acked,
            acked_commit: self.unreported.take().map(|(_, c)| c),
            tokens,
        });
    }
}

impl Live for SubscriberSession {
    fn liveness(&mut self) -> &mut Liveness {
        &mut self.liveness
    }
    fn describe(&self) -> String {
        format!(
            "subscriber {} (session {})",
            self.params.id, self.session_id
        )
    }
}

impl Actor for SubscriberSession {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.liveness.heard();
        start_liveness(ctx, self.ping_interval);
        let p = &self.params;
        let subscribe = Subscribe {
            session_id: self.session_id,
            id: p.id.clone(),
            mode: p.mode,
            protocol: p.protocol,
            replica_version: p.replica_version.clone(),
            watermark: p.watermark.clone(),
            session: ctx.address().recipient(),
        };
        self.streamer
            .send(subscribe)
            .into_actor(self)
            .map(|res, act, ctx| match res {
                Err(e) => close(
                    ctx,
                    SessionEnd::Unavailable(format!("streamer unavailable: {e}")),
                ),
                Ok(Err(e)) => act.refused(e, ctx),
                Ok(Ok(())) => {
                    if let (true, Some(task), Some(res)) =
                        (act.params.initial, &act.params.task_id, &act.reservations)
                    {
                        info!("initial subscription of task {task} ends its snapshot reservation");
                        res.do_send(EndBySubscription {
                            task_id: task.clone(),
                        });
                    }
                }
            })
            .spawn(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.streamer.do_send(SessionGone {
            session_id: self.session_id,
        });
    }
}

impl Handler<ToSession> for SubscriberSession {
    type Result = ();
    fn handle(&mut self, msg: ToSession, ctx: &mut Self::Context) {
        match msg {
            ToSession::Send(frames) => self.write(&frames, ctx),
            ToSession::Close(end) => close(ctx, end),
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for SubscriberSession {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        if let Some(text) = client_frame(self, msg, ctx) {
            match self.framing.ack(&text) {
                Ok(id) => self.on_ack(id, ctx),
                Err(e) => {
                    warn!("{}: {e}", self.describe());
                    close(ctx, SessionEnd::Protocol(e.to_string()));
                }
            }
        }
    }
}
