//! Websocket session actors: one per connection, thin. They speak the wire (framing, liveness,
//! close codes) and hold a reservation ([`snapshot_socket`]) or a subscription ([`subscriber_socket`]); when
//! they stop, for any reason, they tell the actor that owns what they held.

pub mod acks;
pub mod framing;
pub mod progress;
pub mod raw_frames;
pub mod snapshot_socket;
pub mod subscriber_socket;

use std::time::Duration;

use actix::prelude::*;
use actix_web_actors::ws;
use change_streamer_actors::session_end::SessionEnd;
use log::info;

/// Closes the socket with the code and reason of `end`, then stops the session.
pub fn close<A>(ctx: &mut ws::WebsocketContext<A>, end: SessionEnd)
where
    A: Actor<Context = ws::WebsocketContext<A>>,
{
    let (code, reason) = end.close_frame();
    ctx.close(Some(ws::CloseReason {
        code: ws::CloseCode::from(code),
        description: Some(reason),
    }));
    ctx.stop();
}

/// Websocket liveness: every interval the server pings; a connection that sent neither a pong
/// nor a message since the previous ping is closed with 1001 `no pong for N ms` (PROTOCOL.md §5).
#[derive(Debug, Default)]
pub struct Liveness {
    heard: bool,
}

impl Liveness {
    /// Something (a pong, a message) came from the client.
    pub fn heard(&mut self) {
        self.heard = true;
    }
}

/// A session with [`Liveness`].
pub trait Live: Actor<Context = ws::WebsocketContext<Self>> {
    fn liveness(&mut self) -> &mut Liveness;
    /// Names the connection in logs.
    fn describe(&self) -> String;
}

/// Handles a client frame the way both sessions do: every frame counts as hearing from the
/// client; pings are answered; a close, a binary frame or a protocol error ends the session.
/// Returns the text of a text frame (an ack) for the session to check.
pub fn client_frame<A: Live>(
    act: &mut A,
    msg: Result<ws::Message, ws::ProtocolError>,
    ctx: &mut ws::WebsocketContext<A>,
) -> Option<bytestring::ByteString> {
    act.liveness().heard();
    match msg {
        Ok(ws::Message::Text(text)) => return Some(text),
        Ok(ws::Message::Ping(p)) => ctx.pong(&p),
        Ok(ws::Message::Pong(_)) | Ok(ws::Message::Nop) => {}
        Ok(ws::Message::Close(reason)) => {
            info!("{}: client closed ({reason:?})", act.describe());
            ctx.close(reason);
            ctx.stop();
        }
        Ok(ws::Message::Binary(_)) | Ok(ws::Message::Continuation(_)) => close(
            ctx,
            SessionEnd::Protocol("expected a text frame {\"ack\": n}".into()),
        ),
        Err(e) => {
            log::warn!("{}: websocket error: {e}", act.describe());
            close(ctx, SessionEnd::Protocol(e.to_string()));
        }
    }
    None
}

/// Starts the ping timer of a session. Runs in the session's own context, so only the session
/// itself can delay it, and it never does blocking work.
///
/// ### Why a chained timer that forgives its own lateness
/// A session runs inside its connection's HTTP task, which stops polling it while the socket's
/// write buffer is full: a large catch-up to a client on a busy machine can keep it from
/// running for longer than a ping interval. A periodic interval then fires its missed ticks
/// back to back (`actix`'s `run_interval` does): the first consumes what was heard, the second
/// finds nothing heard "since the previous ping", sent an instant before, and drops a client
/// that was acking all along. So each check arms the next one a whole interval later, and a
/// check that runs late (the session itself was held up) does not judge the client: it pings
/// and gives it a whole interval to answer. Everything the client sends (an ack as much as a
/// pong) counts as hearing from it ([`client_frame`]).
pub fn start_liveness<A: Live>(ctx: &mut ws::WebsocketContext<A>, interval: Duration) {
    let due = tokio::time::Instant::now() + interval;
    ctx.run_later(interval, move |act, ctx| {
        let late = tokio::time::Instant::now().saturating_duration_since(due);
        let heard = std::mem::take(&mut act.liveness().heard);
        if !heard && late < interval / 2 {
            info!(
                "{}: no pong or message for {} ms; closing the connection",
                act.describe(),
                interval.as_millis()
            );
            close(ctx, SessionEnd::NoPong(interval.as_millis() as u64));
            return;
        }
        if !heard {
            info!(
                "{}: liveness check ran {} ms late; pinging again before judging",
                act.describe(),
                late.as_millis()
            );
        }
        ctx.ping(b"");
        start_liveness(ctx, interval);
    });
}
