//! `SubscriberSession`: the websocket of one `/changes` subscription (PROTOCOL.md §7).
//!
//! On start it asks the [`Streamer`] to subscribe it. Refused with error type 1 or 2, it sends
//! the `error` frame and closes (1000) once that frame is acked, or after one ping interval
//! without the ack. Accepted, it writes the frames the streamer hands it ([`ToSession`]) and
//! reports acks that matter back ([`SessionProgress`]): tracked frames at once, acked commits
//! and the ack of everything written at most [`COMMIT_REPORT_DELAY`] later ([`AckReport`]).
//! With `wsBatched=true` (PROTOCOL.md §5) a list of several frames goes out as batched frames
//! (`{"batch":[…],"id":n}`, cut and joined once for every session by [`FrameList::batches`]),
//! a single frame as `{"msg":…,"id":n}`, and acks are cumulative. An accepted `initial=true` subscription of a task
//! ends that task's snapshot reservation, the one kind of end that may grow the cleanup delay.
//! Its `stopped` tells the streamer it is gone, so it no longer holds back a broadcast or a
//! purge.
//!
//! [`Streamer`]: change_streamer_actors::streamer::Streamer
//! [`SessionProgress`]: change_streamer_actors::streamer::SessionProgress

use std::time::Duration;

use actix::prelude::*;
use actix_web_actors::ws;
use bytestring::ByteString;
use change_streamer_actors::reservation::EndBySubscription;
use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_actors::streamer::{FrameList, Mode, SessionGone, ToSession};
use change_streamer_actors::streamer::{Streamer, Subscribe, SubscribeError};
use change_streamer_actors::watermark::Watermark;
use log::{info, warn};

use super::acks::{AckReport, AfterAck, COMMIT_REPORT_DELAY};
use super::framing::{decimal, Framing};
use super::raw_frames::RawFrames;
use super::{client_frame, close, start_liveness, Live, Liveness};

/// The checked query parameters of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionParams {
    pub protocol: u32,
    pub id: String,
    pub task_id: Option<String>,
    pub mode: Mode,
    /// `backup`, with `mode=backup` only: the backup it feeds (PROTOCOL.md §7.1); `None` for
    /// the only one.
    pub backup: Option<String>,
    pub replica_version: String,
    pub watermark: Watermark,
    pub initial: bool,
    /// `wsBatched=true`: batched frames and cumulative acks (PROTOCOL.md §5).
    pub batched: bool,
}

pub struct SubscriberSession {
    session_id: SessionId,
    params: SubscriptionParams,
    streamer: Addr<Streamer>,
    reservations: Option<Recipient<EndBySubscription>>,
    ping_interval: Duration,
    framing: Framing,
    liveness: Liveness,
    /// Which acks the streamer hears of, and when.
    acks: AckReport,
    /// Set while an error frame waits for its ack before the close.
    error_frame: Option<u64>,
    /// Where each frame of the batch being written ends (kept to reuse its allocation).
    ends: Vec<usize>,
    /// Where a batched subscription's frames go ([`RawFrames`]).
    raw: RawFrames,
}

/// `{"msg":` + `,"id":` + up to 20 digits + `}`.
/// `{"batch":[` + `],"id":` is a little longer.
const FRAME_OVERHEAD: usize = 40;

impl SubscriberSession {
    pub fn new(
        params: SubscriptionParams,
        streamer: Addr<Streamer>,
        reservations: Option<Recipient<EndBySubscription>>,
        ping_interval: Duration,
    ) -> Self {
        let session_id = SessionId::next();
        let batched = params.batched;
        SubscriberSession {
            session_id,
            params,
            streamer,
            reservations,
            ping_interval,
            framing: if batched {
                Framing::cumulative()
            } else {
                Framing::default()
            },
            liveness: Liveness::default(),
            acks: AckReport::new(session_id),
            error_frame: None,
            ends: Vec::new(),
            raw: RawFrames::default(),
        }
    }

    /// Where the session queues its frames besides its context: the response body must also
    /// yield them ([`with_raw_frames`](super::raw_frames::with_raw_frames)).
    pub fn raw_frames(&self) -> RawFrames {
        self.raw.clone()
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

    /// Writes a list of frames. Batched, the list goes out as its [`FrameList::batches`], each
    /// of one payload as a plain `msg` frame, as [`RawFrames`]: the payload text shared by
    /// every session, only the frame's header, prefix and id its own. One frame at a time,
    /// they are framed into one buffer, and each frame handed to the websocket is a slice of
    /// it: one allocation per list instead of several per frame.
    fn write(&mut self, frames: &FrameList, ctx: &mut ws::WebsocketContext<Self>) {
        if self.params.batched {
            let batches = frames.batches();
            let mut raw = self.raw.writer(batches.len());
            for batch in batches {
                let id = self.framing.next_id();
                let head: &[u8] = match batch.frames.len() {
                    1 => b"{\"msg\":",
                    _ => b"{\"batch\":[",
                };
                let mut tail = [0u8; 32];
                let tail = id_tail(batch.frames.len() > 1, id, &mut tail);
                raw.text_frame(head, &batch.payloads, tail);
                self.acks.sent_batch(id, batch);
            }
            raw.finish();
            return;
        }
        let size = frames
            .iter()
            .map(|f| f.message.len() + FRAME_OVERHEAD)
            .sum();
        let mut text = String::with_capacity(size);
        self.ends.clear();
        for f in frames.iter() {
            let id = self.framing.frame_into(&f.message, &mut text);
            self.ends.push(text.len());
            self.acks.sent(id, f);
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
        match self.acks.acked(id) {
            AfterAck::Report(progress) => self.streamer.do_send(progress),
            AfterAck::ReportLater => {
                ctx.run_later(COMMIT_REPORT_DELAY, |act, _| {
                    if let Some(progress) = act.acks.delay_passed() {
                        act.streamer.do_send(progress);
                    }
                });
            }
            AfterAck::Nothing => {}
        }
    }
}

/// What closes a frame of id `id`: `],"id":n}` after a batch's payloads, `,"id":n}` after one
/// message (PROTOCOL.md §5).
fn id_tail(batch: bool, id: u64, out: &mut [u8; 32]) -> &[u8] {
    let open: &[u8] = if batch { b"],\"id\":" } else { b",\"id\":" };
    let mut digits = [0u8; 20];
    let digits = decimal(id, &mut digits);
    let len = open.len() + digits.len() + 1;
    out[..open.len()].copy_from_slice(open);
    out[open.len()..len - 1].copy_from_slice(digits);
    out[len - 1] = b'}';
    &out[..len]
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
            backup: p.backup.clone(),
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
                        info!(task:% = task; "initial subscription of task {task} ends its snapshot reservation");
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
