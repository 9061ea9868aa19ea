//! Flow control: the tracked send in flight and its release (SPEC §10).
//!
//! Forwarding is pipelined; about every [`StreamerConfig::flow_control_bytes`] of payload one
//! change is sent tracked, and the upstream client is told to wait for its release before
//! sending more. Release follows the consensus rule of [`Broadcast`]; a timer is armed for the
//! moment it is due, not a periodic tick.
//!
//! [`StreamerConfig::flow_control_bytes`]: super::StreamerConfig::flow_control_bytes

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use log::{debug, info};
use tokio::sync::oneshot;

use super::broadcast::{Broadcast, Release};
use super::change::Change;
use super::session::Token;
use super::subscriber::Delivery;
use super::Streamer;
use crate::session::SessionId;
use crate::watermark::Watermark;

/// The streamer's flow-control state.
#[derive(Default)]
pub(super) struct FlowControl {
    /// Payload bytes forwarded since the last tracked send.
    bytes_since_tracked: usize,
    /// The tracked send in flight, if any.
    tracked_send: Option<TrackedSend>,
    pub(super) tracked_sends: u64,
    pub(super) releases_all: u64,
    pub(super) releases_consensus: u64,
}

/// The tracked send in flight.
struct TrackedSend {
    broadcast: Broadcast,
    /// Its number, as in [`Token::Broadcast`].
    token: u64,
    watermark: Watermark,
    release: oneshot::Sender<()>,
    timer: Option<SpawnHandle>,
}

impl Streamer {
    /// Forwards one change to the active subscribers, tracked if the flow-control budget is
    /// spent. Returns the release receiver when the upstream must wait.
    pub(super) fn forward(
        &mut self,
        ctx: &mut Context<Self>,
        change: Change,
    ) -> Option<oneshot::Receiver<()>> {
        let change = Arc::new(change);
        self.flow.bytes_since_tracked += change.payload_len;
        let tracked = self.flow.bytes_since_tracked >= self.cfg.flow_control_bytes
            && self.flow.tracked_send.is_none();
        if !tracked {
            for sub in self.subscribers.values_mut() {
                sub.send_live(&change, None);
            }
            return None;
        }
        self.flow.bytes_since_tracked = 0;
        self.flow.tracked_sends += 1;
        let token = self.next_token();
        let now = self.now_ms();
        let active: Vec<SessionId> = self
            .subscribers
            .values()
            .filter(|s| s.is_active())
            .map(|s| s.session_id)
            .collect();
        let mut broadcast = Broadcast::new(active.iter().copied(), now);
        for sub in self.subscribers.values_mut() {
            if sub.send_live(&change, Some(Token::Broadcast(token))) != Delivery::Sent
                && sub.is_active()
            {
                broadcast.mark_completed(sub.session_id, now);
            }
        }
        if broadcast.is_done() {
            self.flow.releases_all += 1;
            return None;
        }
        let (tx, rx) = oneshot::channel();
        self.flow.tracked_send = Some(TrackedSend {
            broadcast,
            token,
            watermark: change.watermark.clone(),
            release: tx,
            timer: None,
        });
        self.arm_release_timer(ctx);
        Some(rx)
    }

    /// Arms (or re-arms) the timer for the consensus release of the current broadcast.
    fn arm_release_timer(&mut self, ctx: &mut Context<Self>) {
        let padding = self.cfg.padding_ms;
        let now = self.now_ms();
        let Some(cur) = self.flow.tracked_send.as_mut() else {
            return;
        };
        if let Some(t) = cur.timer.take() {
            ctx.cancel_future(t);
        }
        if let Some(at) = cur.broadcast.release_at(padding) {
            let wait = Duration::from_secs_f64(((at - now).max(0.0)) / 1000.0);
            cur.timer = Some(ctx.run_later(wait, |act, ctx| act.check_release(ctx)));
        }
    }

    fn check_release(&mut self, ctx: &mut Context<Self>) {
        let now = self.now_ms();
        let padding = self.cfg.padding_ms;
        let Some(cur) = self.flow.tracked_send.as_mut() else {
            return;
        };
        if cur.broadcast.check_progress(padding, now) {
            self.finish_broadcast();
        } else {
            self.arm_release_timer(ctx);
        }
    }

    fn finish_broadcast(&mut self) {
        let Some(cur) = self.flow.tracked_send.take() else {
            return;
        };
        let now = self.now_ms();
        match cur.broadcast.released() {
            Some(Release::Consensus) => {
                self.flow.releases_consensus += 1;
                let pending: Vec<String> = cur
                    .broadcast
                    .pending()
                    .filter_map(|k| self.subscribers.get(&k))
                    .map(|s| {
                        format!(
                            "{} (pending {}, {:.0}/s)",
                            s.id,
                            s.pending(),
                            s.process_rate()
                        )
                    })
                    .collect();
                info!(
                    "flow control: watermark={} released by consensus of {} after {:.1} ms; still pending: {}",
                    cur.watermark,
                    cur.broadcast.completed().len(),
                    cur.broadcast.elapsed_ms(now),
                    pending.join(", ")
                );
            }
            _ => {
                self.flow.releases_all += 1;
                debug!(
                    "flow control: watermark={} acked by all after {:.1} ms",
                    cur.watermark,
                    cur.broadcast.elapsed_ms(now)
                );
            }
        }
        let _ = cur.release.send(());
    }

    /// A subscriber finished the current broadcast (acked, closed).
    pub(super) fn broadcast_completed(
        &mut self,
        ctx: &mut Context<Self>,
        session_id: SessionId,
        token: Option<u64>,
    ) {
        let now = self.now_ms();
        let Some(cur) = self.flow.tracked_send.as_mut() else {
            return;
        };
        if token.is_some_and(|t| t != cur.token) {
            return;
        }
        if cur.broadcast.mark_completed(session_id, now) {
            self.finish_broadcast();
        } else {
            self.arm_release_timer(ctx);
        }
    }
}
