//! What `/status` shows of a subscriber: its mode and phase, its row of `subscribers` (with the
//! tracked send it lags on, and whether it is required), and the figures that row is made of — what it holds, how long its
//! oldest unacked change has waited, and its sampled processing rate.

use serde::Serialize;

use super::Subscriber;
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
    /// Changes sent or queued for it and not yet acked (its backlog included).
    pub pending: u64,
    /// Bytes of payload of those changes (PROTOCOL.md §10.2).
    pub queued_bytes: u64,
    /// How long the oldest change it has not acked has waited for it: since it was sent, or
    /// since its catch-up began; 0 when it has nothing pending.
    pub lag_seconds: f64,
    /// The tracked send it is lagging on (PROTOCOL.md §10.1), if any.
    pub lagging: Option<LagInfo>,
    pub process_rate: f64,
    /// The backup replicator: flow control waits for it, it is never evicted (PROTOCOL.md
    /// §10.3).
    pub required: bool,
}

/// A lagging subscriber's tracked send, as shown in `/status`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LagInfo {
    pub watermark: Watermark,
    pub ms: u64,
}

const MAX_SAMPLES: usize = 10;

impl Subscriber {
    pub fn pending(&self) -> u64 {
        self.held()
    }

    /// Milliseconds the oldest change it has not acked has waited for it (see
    /// [`SubscriberInfo::lag_seconds`]).
    pub fn lag_ms(&self, now_ms: f64) -> f64 {
        let oldest_sent = self.sent_at.front().map(|&(_, t)| t);
        match (oldest_sent, self.behind_since) {
            (Some(a), Some(b)) => now_ms - a.min(b),
            (Some(t), None) | (None, Some(t)) => now_ms - t,
            (None, None) => 0.0,
        }
        .max(0.0)
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

    pub fn info(&self, now_ms: f64) -> SubscriberInfo {
        SubscriberInfo {
            id: self.id.clone(),
            mode: self.mode,
            protocol: self.protocol,
            phase: self.phase,
            watermark: self.watermark.clone(),
            acked: self.acked.clone(),
            pending: self.pending(),
            queued_bytes: self.held_bytes(),
            lag_seconds: (self.lag_ms(now_ms)).round() / 1000.0,
            lagging: self.lagging.as_ref().map(|l| LagInfo {
                watermark: l.watermark.clone(),
                ms: (now_ms - l.since_ms).max(0.0) as u64,
            }),
            process_rate: (self.process_rate() * 10.0).round() / 10.0,
            required: self.is_required(),
        }
    }
}
