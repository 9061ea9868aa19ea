//! The streamer's conversation with each subscriber's websocket session.
//!
//! The session is a thin wire adapter: it writes the frames it is given ([`ToSession`]), numbers
//! them, and reports acks back ([`SessionProgress`]) only when they matter: at once when a
//! tracked message was acked (a broadcast waits on it, or the streamer asked to hear of it, to
//! bound what the subscriber holds and to reopen a catch-up's window), and within a few milliseconds
//! when a commit was acked (the subscriber's acked watermark moved, which the purge rule and
//! `/status` read; the newest of the commits acked meanwhile). When it stops, for any reason,
//! it says so ([`SessionGone`]), so it no longer holds back a broadcast or a purge.

use actix::prelude::*;
use log::info;

use super::frames::Token;
use super::Streamer;
use crate::session_end::SessionId;
use crate::watermark::Watermark;

/// From a session to the streamer: the client acked through message `acked_messages`.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct SessionProgress {
    pub session_id: SessionId,
    /// How many of the messages handed to the session ([`Outgoing`]s, the first `status`
    /// included) the client has acked in all, whatever their framing.
    pub acked_messages: u64,
    /// Bytes of payload ([`Outgoing::message`]) of those messages.
    pub acked_bytes: u64,
    /// The newest commit watermark among the frames acked, if any.
    pub acked_commit: Option<Watermark>,
    /// Tokens of tracked frames acked.
    pub tokens: Vec<Token>,
}

/// From a session to the streamer: the session stopped (any reason).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct SessionGone {
    pub session_id: SessionId,
}

impl Handler<SessionProgress> for Streamer {
    type Result = ();
    fn handle(&mut self, p: SessionProgress, ctx: &mut Context<Self>) {
        let Some(sub) = self.subscribers.get_mut(&p.session_id) else {
            return;
        };
        let before = sub.acked.clone();
        sub.progress(p.acked_messages, p.acked_bytes, p.acked_commit);
        self.backup_acks.tell(sub, &before);
        for token in p.tokens {
            match token {
                Token::Broadcast(n) => self.broadcast_acked(ctx, p.session_id, n),
                Token::Progress => {}
            }
        }
        // The acks made room in its window: a catch-up reads on; and in the budget: the
        // catch-ups waiting for it read on (PROTOCOL.md §10.2).
        self.read_catchup_on_ack(ctx, p.session_id);
        self.read_waiting_catchups(ctx);
    }
}

impl Handler<SessionGone> for Streamer {
    type Result = ();
    fn handle(&mut self, g: SessionGone, ctx: &mut Context<Self>) {
        if let Some(sub) = self.remove_subscriber(ctx, g.session_id) {
            info!(subscriber:% = sub.id, watermark:% = sub.acked;
                "subscriber {} left at acked watermark={}",
                sub.id, sub.acked
            );
        }
    }
}
