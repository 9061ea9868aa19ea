//! Websocket session actors: one per connection, thin. They speak the wire (framing, liveness,
//! close codes) and hold a reservation ([`snapshot`]) or a subscription ([`subscriber`]); when
//! they stop, for any reason, they tell the actor that owns what they held.

pub mod framing;
pub mod snapshot;
pub mod subscriber;

use std::time::Duration;

use actix::prelude::*;
use actix_web_actors::ws;
use log::info;

/// Close codes (SPEC §5).
pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_GOING_AWAY: u16 = 1001;
pub const CLOSE_PROTOCOL_ERROR: u16 = 1002;
pub const CLOSE_INTERNAL_ERROR: u16 = 1011;

/// Close reasons are at most 123 bytes (the close frame's payload limit less the code).
pub const MAX_REASON: usize = 123;

/// Cuts `reason` to [`MAX_REASON`] bytes at a character boundary.
pub fn truncate_reason(reason: &str) -> String {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_string()
}

/// Closes the socket with `code` and `reason`, then stops the session.
pub fn close<A>(ctx: &mut ws::WebsocketContext<A>, code: u16, reason: &str)
where
    A: Actor<Context = ws::WebsocketContext<A>>,
{
    ctx.close(Some(ws::CloseReason {
        code: ws::CloseCode::from(code),
        description: Some(truncate_reason(reason)),
    }));
    ctx.stop();
}

/// Websocket liveness: every interval the server pings; a connection that sent neither a pong
/// nor a message since the previous ping is dropped.
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
            CLOSE_PROTOCOL_ERROR,
            "expected a text frame {\"ack\": n}",
        ),
        Err(e) => {
            log::warn!("{}: websocket error: {e}", act.describe());
            close(ctx, CLOSE_PROTOCOL_ERROR, &e.to_string());
        }
    }
    None
}

/// Starts the ping timer of a session. Runs in the session's own context, so only the session
/// itself can delay it, and it never does blocking work.
pub fn start_liveness<A: Live>(ctx: &mut ws::WebsocketContext<A>, interval: Duration) {
    // The connection just opened: that counts as hearing from it.
    ctx.run_interval(interval, move |act, ctx| {
        if !std::mem::take(&mut act.liveness().heard) {
            info!(
                "{}: no pong or message for {} ms; dropping the connection",
                act.describe(),
                interval.as_millis()
            );
            ctx.stop();
            return;
        }
        ctx.ping(b"");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_reasons_are_cut_to_123_bytes_at_a_character_boundary() {
        assert_eq!(truncate_reason("short"), "short");
        let long = "é".repeat(100); // 200 bytes
        let cut = truncate_reason(&long);
        assert!(
            cut.len() <= MAX_REASON && cut.len() >= MAX_REASON - 1,
            "{}",
            cut.len()
        );
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
