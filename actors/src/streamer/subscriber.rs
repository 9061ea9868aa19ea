//! A subscriber, as the streamer sees it. The session (see [`super::session`]) only writes frames
//! and reports acks; everything else about the subscriber lives here, owned by the streamer:
//!
//! - `watermark`: the last commit *sent*; a change is sent only if its watermark is above it, so
//!   catch-up and live changes can never duplicate a transaction;
//! - `acked`: the last commit acked (before any, the watermark it subscribed with);
//! - a backlog of live changes while it catches up from the change log;
//! - message counts and sampled processing rate, for `/status` and flow-control logs.

use std::collections::VecDeque;
use std::sync::Arc;

use actix::prelude::*;
use serde::Serialize;

use super::change::{Change, Kind};
use super::session::{Outgoing, ToSession, Token};
use crate::session::SessionId;
use crate::watermark::Watermark;

/// `mode=backup` or anything else (`serving`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Serving,
    Backup,
}

impl Mode {
    pub fn parse(s: Option<&str>) -> Mode {
        if s == Some("backup") {
            Mode::Backup
        } else {
            Mode::Serving
        }
    }
}

/// Where a subscriber stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// Its watermark is being checked against the change log.
    Validating,
    /// Checked; waiting for the transaction in progress to end before joining.
    Queued,
    /// Reading the change log; live changes go to its backlog.
    CatchingUp,
    /// Receiving live changes.
    Live,
}

/// A row of `/status`'s `subscribers`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SubscriberInfo {
    pub id: String,
    pub mode: Mode,
    pub protocol: u32,
    pub phase: Phase,
    pub watermark: Watermark,
    pub acked: Watermark,
    pub pending: u64,
    pub process_rate: f64,
}

/// The streamer's record of one subscriber.
pub struct Subscriber {
    pub(super) session_id: SessionId,
    pub(super) id: String,
    pub(super) mode: Mode,
    pub(super) protocol: u32,
    pub(super) session: Recipient<ToSession>,
    pub(super) phase: Phase,
    /// Last commit sent.
    pub(super) watermark: Watermark,
    /// Last commit acked.
    pub(super) acked: Watermark,
    /// Live changes received while catching up.
    pub(super) backlog: Vec<Arc<Change>>,
    /// Frames queued for this session alone in the current streamer turn.
    pub(super) outbox: Vec<Outgoing>,
    pub(super) sent_messages: u64,
    pub(super) acked_messages: u64,
    samples: VecDeque<(f64, u64)>,
}

/// What happened to a change handed to a subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Queued for the session.
    Sent,
    /// Not for this subscriber (already has it, or its protocol does not know it).
    Filtered,
    /// Kept in the backlog until catch-up ends.
    Backlogged,
}

const MAX_SAMPLES: usize = 10;

impl Subscriber {
    pub fn new(
        session_id: SessionId,
        id: String,
        mode: Mode,
        protocol: u32,
        watermark: Watermark,
        session: Recipient<ToSession>,
    ) -> Subscriber {
        Subscriber {
            session_id,
            id,
            mode,
            protocol,
            session,
            phase: Phase::Validating,
            acked: watermark.clone(),
            watermark,
            backlog: Vec::new(),
            outbox: Vec::new(),
            sent_messages: 0,
            acked_messages: 0,
            samples: VecDeque::new(),
        }
    }

    /// Whether this subscriber takes part in live forwarding and broadcasts.
    pub fn is_active(&self) -> bool {
        matches!(self.phase, Phase::CatchingUp | Phase::Live)
    }

    /// Hands a live change over: backlogged while catching up, otherwise sent if not filtered.
    pub fn send_live(&mut self, change: &Arc<Change>, token: Option<Token>) -> Delivery {
        match self.phase {
            Phase::CatchingUp => {
                if change.watermark > self.watermark {
                    self.backlog.push(change.clone());
                    Delivery::Backlogged
                } else {
                    Delivery::Filtered
                }
            }
            Phase::Live => self.send(change, token),
            Phase::Validating | Phase::Queued => Delivery::Filtered,
        }
    }

    /// Sends a change (catch-up, backlog or live) unless it is filtered.
    pub fn send(&mut self, change: &Change, token: Option<Token>) -> Delivery {
        if change.watermark <= self.watermark || (change.needs_v5 && self.protocol < 5) {
            return Delivery::Filtered;
        }
        let commit = if change.kind == Kind::Commit {
            self.watermark = change.watermark.clone();
            Some(change.watermark.clone())
        } else {
            None
        };
        self.outbox.push(Outgoing {
            message: change.message.clone(),
            commit,
            token,
        });
        self.sent_messages += 1;
        Delivery::Sent
    }

    /// Queues a frame that is not a change (the initial `status`).
    pub fn send_frame(&mut self, message: Arc<str>) {
        self.outbox.push(Outgoing {
            message,
            commit: None,
            token: None,
        });
        self.sent_messages += 1;
    }

    /// Hands the outbox to the session.
    pub fn flush(&mut self) {
        if !self.outbox.is_empty() {
            let frames = std::mem::take(&mut self.outbox);
            self.session.do_send(ToSession::Send(frames));
        }
    }

    /// Records a [`SessionProgress`].
    pub fn progress(&mut self, acked_messages: u64, acked_commit: Option<Watermark>) {
        self.acked_messages = self.acked_messages.max(acked_messages);
        if let Some(w) = acked_commit {
            if w > self.acked {
                self.acked = w;
            }
        }
    }

    pub fn pending(&self) -> u64 {
        self.sent_messages.saturating_sub(self.acked_messages) + self.backlog.len() as u64
    }

    /// Keeps the last few (time, processed) samples for the processing rate.
    pub fn sample(&mut self, now_ms: f64) {
        while self.samples.len() >= MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((now_ms, self.acked_messages));
    }

    /// Messages acked per second over the sampled window.
    pub fn process_rate(&self) -> f64 {
        match (self.samples.front(), self.samples.back()) {
            (Some(&(t0, p0)), Some(&(t1, p1))) if t1 > t0 => (p1 - p0) as f64 * 1000.0 / (t1 - t0),
            _ => 0.0,
        }
    }

    pub fn info(&self) -> SubscriberInfo {
        SubscriberInfo {
            id: self.id.clone(),
            mode: self.mode,
            protocol: self.protocol,
            phase: self.phase,
            watermark: self.watermark.clone(),
            acked: self.acked.clone(),
            pending: self.pending(),
            process_rate: (self.process_rate() * 10.0).round() / 10.0,
        }
    }
}
