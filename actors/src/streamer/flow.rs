//! Flow control: the tracked send in flight and its release (PROTOCOL.md §10).
//!
//! Forwarding is pipelined; about every [`StreamerConfig::flow_control_bytes`] of payload the
//! next commit is sent tracked, and the upstream client is told to wait for its release before
//! sending more. Only a commit (PROTOCOL.md §10 "Only commits are tracked"): a client may ack
//! only at commits (§5), and would never ack a `begin` or `data` while the wait holds back its
//! transaction's commit. Release follows the consensus rule of [`Broadcast`]; an [`Alarm`] is set for
//! the moment it is due, not a periodic tick. The tracked send owns its alarm, so a send that
//! finishes takes its alarm with it (see `alarm.rs` for why timers are not `run_later`s here).
//!
//! ### Slow subscribers (PROTOCOL.md §10.1)
//! The consensus rule alone makes a stalled minority cost the others one padding at *every*
//! tracked send: with the default padding of 1 s and a tracked send every 64 KiB, ingest falls
//! to a crawl for everyone. So a subscriber that has not acked a tracked send that another has
//! acked is *lagging* on it, and counts as finished for every later tracked send: the minority
//! costs one padding, once. It stops lagging when it acks that send (acks come in order, so any
//! later tracked frame's ack says the same). One still lagging on the same send
//! `--slow-subscriber-grace-ms` after it began is evicted (close 1013); pings do not enter into
//! it, since only acks clear the lag. With two subscribers the majority is both, so the first
//! tracked send is held until the stalled one is evicted.
//!
//! ### The backup replicator (PROTOCOL.md §10.3)
//! A required subscriber ([`Subscriber::is_required`]) is never lagging, so never evicted, and
//! each tracked send sent to it waits for it ([`Broadcast::new`]): the purge cannot
//! pass what it has applied, so ingest goes at its pace. Its bounds of §10.2 hold as for any
//! other; past them it catches up from the change log, and tracked sends it is not sent do not
//! wait for it.
//!
//! [`Subscriber::is_required`]: super::subscriber::Subscriber::is_required
//!
//! ### The global budget (PROTOCOL.md §10.2)
//! Each subscriber's bounds keep what one costs; `--max-queued-bytes` keeps what all of them
//! together cost, checked at every admission ([`budget`](super::budget)).
//!
//! [`StreamerConfig::flow_control_bytes`]: super::StreamerConfig::flow_control_bytes

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::stall::{stage, ReportStalls, StallReport};
use log::{debug, info};
use tokio::sync::oneshot;

use super::broadcast::{Broadcast, Release};
use super::change::{Change, Kind};
use super::frames::Token;
use super::subscriber::{Delivery, Lag};
use super::Streamer;
use crate::alarm::Alarm;
use crate::session_end::{SessionEnd, SessionId};
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
    /// The one alarm for the earliest lag's grace period (PROTOCOL.md §10.1): one, not one per
    /// lag, since a healthy subscriber briefly lags on most tracked sends that another acks
    /// first.
    eviction_alarm: Option<Alarm>,
    /// The upstream reader waits while a tracked send is held (PROTOCOL.md §11.1).
    stall: StallReport,
}

/// The consensus release of the tracked send `token` may be due: its alarm rang.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct ReleaseDue {
    token: u64,
}

/// The earliest lag's grace period may have passed: its alarm rang.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct EvictionDue;

/// The tracked send in flight.
struct TrackedSend {
    broadcast: Broadcast,
    /// Its number, as in [`Token::Broadcast`].
    token: u64,
    watermark: Watermark,
    release: oneshot::Sender<()>,
    /// Set for the consensus release once a majority acked; dropped with the send.
    alarm: Option<Alarm>,
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
        let limit = self.cfg.max_queue_changes;
        let mut budget = self.keep_within_budget(change.message.len());
        self.flow.bytes_since_tracked += change.payload_len;
        // Only a commit is tracked (PROTOCOL.md §10): a client may ack only at commits (§5), so
        // the ack of a change inside a transaction may never come on its own.
        let tracked = change.kind == Kind::Commit
            && self.flow.bytes_since_tracked >= self.cfg.flow_control_bytes
            && self.flow.tracked_send.is_none();
        let every = (limit as u64 / 4).max(1);
        let progress = self.shared.progress_mark(every);
        if !tracked {
            if self.forward_in_cohort(&change, progress, &mut budget) {
                return None;
            }
            for sub in self.subscribers.values_mut() {
                sub.send_live(&change, progress, &mut self.shared, &mut budget);
            }
            self.form_cohort(&change);
            return None;
        }
        self.settle_cohort();
        self.flow.bytes_since_tracked = 0;
        self.flow.tracked_sends += 1;
        let token = self.next_token();
        let now = self.now_ms();
        let active = self.subscribers.values().filter(|s| s.is_active());
        let required: Vec<SessionId> = active
            .clone()
            .filter(|s| s.is_required())
            .map(|s| s.session_id)
            .collect();
        let mut broadcast = Broadcast::new(active.map(|s| s.session_id), required, now);
        for sub in self.subscribers.values_mut() {
            let token = Some(Token::Broadcast(token));
            let delivery = sub.send_live(&change, token, &mut self.shared, &mut budget);
            // A lagging subscriber counts as finished for every later tracked send.
            if (delivery != Delivery::Sent || sub.lagging.is_some()) && sub.is_active() {
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
            alarm: None,
        });
        self.set_release_alarm(ctx);
        self.flow.stall.pending();
        Some(rx)
    }

    /// Sets the alarm for the consensus release of the current broadcast, if it has a moment
    /// (a majority acked). Each later ack moves that moment later, never earlier, so an alarm
    /// already set is kept: when it rings early, [`Streamer::check_release`] sets the next one.
    /// One alarm per tracked send instead of one per ack.
    fn set_release_alarm(&mut self, ctx: &mut Context<Self>) {
        let padding = self.cfg.padding;
        let now = self.now_ms();
        let Some(cur) = self.flow.tracked_send.as_mut() else {
            return;
        };
        let Some(at) = cur.broadcast.release_at(padding) else {
            cur.alarm = None;
            return;
        };
        if cur.alarm.is_none() {
            let wait = Duration::from_secs_f64(((at - now).max(0.0)) / 1000.0);
            let due = ReleaseDue { token: cur.token };
            cur.alarm = Some(Alarm::after(wait, &ctx.address(), due));
        }
    }

    fn check_release(&mut self, ctx: &mut Context<Self>) {
        let now = self.now_ms();
        let padding = self.cfg.padding;
        let Some(cur) = self.flow.tracked_send.as_mut() else {
            return;
        };
        if cur.broadcast.check_progress(padding, now) {
            self.finish_broadcast();
        } else {
            self.set_release_alarm(ctx);
        }
    }

    fn finish_broadcast(&mut self) {
        let Some(cur) = self.flow.tracked_send.take() else {
            return;
        };
        self.flow.stall.idle();
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
                info!(watermark:% = cur.watermark;
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

    /// A subscriber acked the tracked send numbered `token`: it stops lagging on it or any
    /// earlier one; if it is the current send, it finished it, and every subscriber that has
    /// not begins lagging on it.
    pub(super) fn broadcast_acked(
        &mut self,
        ctx: &mut Context<Self>,
        session_id: SessionId,
        token: u64,
    ) {
        let now = self.now_ms();
        if let Some(sub) = self.subscribers.get_mut(&session_id) {
            if let Some(lag) = sub.lagging.take_if(|l| l.token <= token) {
                info!(subscriber:% = sub.id, watermark:% = lag.watermark;
                    "subscriber {} no longer lagging: acked watermark={} after {:.0} ms",
                    sub.id,
                    lag.watermark,
                    now - lag.since_ms
                );
            }
        }
        let Some(cur) = self.flow.tracked_send.as_ref() else {
            return;
        };
        if cur.token != token {
            return;
        }
        let (token, watermark) = (cur.token, cur.watermark.clone());
        let behind: Vec<SessionId> = cur
            .broadcast
            .pending()
            .filter(|&k| k != session_id)
            .collect();
        for k in behind {
            self.begin_lagging(ctx, k, token, &watermark, now);
        }
        self.broadcast_completed(ctx, session_id, Some(token));
    }

    /// `session_id` has not acked the tracked send `token` that another subscriber has: it is
    /// lagging on it from `now`, and is evicted if it still is after the grace period.
    fn begin_lagging(
        &mut self,
        ctx: &mut Context<Self>,
        session_id: SessionId,
        token: u64,
        watermark: &Watermark,
        now: f64,
    ) {
        let Some(sub) = self.subscribers.get_mut(&session_id) else {
            return;
        };
        // The backup replicator never lags (PROTOCOL.md §10.3).
        if sub.lagging.is_some() || sub.is_required() {
            return;
        }
        debug!("subscriber {} lagging on watermark={watermark}", sub.id);
        sub.lagging = Some(Lag {
            token,
            watermark: watermark.clone(),
            since_ms: now,
        });
        self.set_eviction_alarm(ctx);
    }

    /// Sets the eviction alarm for the end of the earliest lag's grace period, unless it is
    /// set already (it is set anew when it rings) or there is no grace (never evict).
    fn set_eviction_alarm(&mut self, ctx: &mut Context<Self>) {
        let Some(grace) = self.cfg.slow_grace else {
            return;
        };
        let grace = grace.as_secs_f64() * 1000.0;
        if self.flow.eviction_alarm.is_some() {
            return;
        }
        let Some(since) = self
            .subscribers
            .values()
            .filter_map(|s| s.lagging.as_ref().map(|l| l.since_ms))
            .min_by(f64::total_cmp)
        else {
            return;
        };
        let wait = (since + grace - self.now_ms()).max(0.0);
        let wait = Duration::from_secs_f64(wait / 1000.0);
        self.flow.eviction_alarm = Some(Alarm::after(wait, &ctx.address(), EvictionDue));
    }

    /// Evicts every subscriber that has been lagging on the same tracked send for the grace
    /// period (close 1013, PROTOCOL.md §10.1).
    fn evict_laggards(&mut self, ctx: &mut Context<Self>) {
        let now = self.now_ms();
        let Some(grace) = self.cfg.slow_grace else {
            return;
        };
        // Lags and alarms are timed in fractions of a millisecond apart: a half-millisecond margin
        // keeps a lag that is due from waiting for one more alarm.
        let grace = grace.as_secs_f64() * 1000.0 - 0.5;
        let due: Vec<(SessionId, String)> = self
            .subscribers
            .values()
            .filter_map(|s| {
                let lag = s.lagging.as_ref()?;
                (now - lag.since_ms >= grace).then(|| {
                    (
                        s.session_id,
                        format!(
                            "too slow: lagging {:.0} ms on watermark {}",
                            now - lag.since_ms,
                            lag.watermark
                        ),
                    )
                })
            })
            .collect();
        for (session_id, reason) in due {
            self.subscribers_evicted += 1;
            self.close_subscriber(ctx, session_id, SessionEnd::Evicted(reason));
        }
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
            self.set_release_alarm(ctx);
        }
    }
}

impl Handler<ReleaseDue> for Streamer {
    type Result = ();
    fn handle(&mut self, due: ReleaseDue, ctx: &mut Context<Self>) {
        let Some(cur) = self.flow.tracked_send.as_mut() else {
            return;
        };
        // An alarm of a send already finished was dropped with it; one that rang as it
        // finished may still arrive.
        if cur.token != due.token {
            return;
        }
        cur.alarm = None;
        self.check_release(ctx);
    }
}

impl Handler<EvictionDue> for Streamer {
    type Result = ();
    fn handle(&mut self, _: EvictionDue, ctx: &mut Context<Self>) {
        self.flow.eviction_alarm = None;
        self.evict_laggards(ctx);
        self.set_eviction_alarm(ctx);
    }
}

impl Handler<ReportStalls> for Streamer {
    type Result = ();
    fn handle(&mut self, msg: ReportStalls, _: &mut Context<Self>) {
        self.flow.stall = StallReport::to(&msg.watch, stage::UPSTREAM);
        self.flow.stall.idle();
    }
}
