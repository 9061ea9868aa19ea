//! A subscriber, as the streamer sees it. The session (see [`super::session_messages`]) only writes frames
//! and reports acks; everything else about the subscriber lives here, owned by the streamer:
//!
//! - `watermark`: the last commit *sent*; a change is sent only if its watermark is above it, so
//!   catch-up and live changes can never duplicate a transaction;
//! - `position`: the last change sent, where a catch-up resumes (PROTOCOL.md §10.2);
//! - `acked`: the last commit acked (before any, the watermark it subscribed with);
//! - a backlog of live changes while it catches up from the change log;
//! - what it holds in memory (sent and not acked, plus its backlog), in changes and in bytes of
//!   payload, bounded by `--max-subscriber-queue-changes` and `--max-subscriber-queue-bytes`
//!   (PROTOCOL.md §10.2), and since when it waits;
//! - whether it is lagging on a tracked send (PROTOCOL.md §10.1), and whether it is required,
//!   never lagging (the backup replicator, PROTOCOL.md §10.3, in [`required`](super::required));
//! - message counts and sampled processing rate, for `/status` and flow-control logs.
//!
//! ### Why "sent and not acked" is what a subscriber holds
//! Frames handed to the session are written to its socket buffer, or buffered in the session
//! when the client stopped reading; only the client's ack proves they left the service. So the
//! changes sent and not yet acked, plus the backlog, are an upper bound of what the service
//! holds for one subscriber, whatever the socket does.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use actix::prelude::*;

use super::budget::Budget;
use super::change::{Change, Kind};
use super::frames::ToSession;
use super::frames::{FrameList, Outgoing, Token};
use super::shared::SharedFrames;
use crate::session_end::SessionId;
use crate::watermark::Watermark;

mod held_total;
mod status;

pub use held_total::HeldTotal;
pub use status::{Mode, Phase, SubscriberInfo};

/// The tracked send a subscriber is lagging on (PROTOCOL.md §10.1): another subscriber acked it, this
/// one has not.
#[derive(Debug, Clone)]
pub(super) struct Lag {
    /// The send's number ([`Token::Broadcast`]).
    pub(super) token: u64,
    pub(super) watermark: Watermark,
    /// When it began lagging (streamer milliseconds).
    pub(super) since_ms: f64,
}

/// What one subscriber may hold (PROTOCOL.md §10.2): `--max-subscriber-queue-changes` and
/// `--max-subscriber-queue-bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub changes: usize,
    pub bytes: usize,
}

/// The streamer's record of one subscriber.
pub struct Subscriber {
    pub(super) session_id: SessionId,
    pub(super) id: String,
    pub(super) mode: Mode,
    /// The `backup` it names with `mode=backup` (PROTOCOL.md §7.1); `None`: the only backup.
    pub(super) backup: Option<String>,
    /// The order in which subscribers asked to join: of two backup replicators of the same
    /// backup, the later replaces the earlier (PROTOCOL.md §7.1).
    pub(super) joined: u64,
    pub(super) protocol: u32,
    pub(super) session: Recipient<ToSession>,
    pub(super) phase: Phase,
    /// Last commit sent.
    pub(super) watermark: Watermark,
    /// The last change sent: (its transaction's watermark, its position in it).
    pub(super) position: (Watermark, i64),
    /// The last change sent was neither a commit nor a rollback: `position` is inside a
    /// transaction it has not been sent the end of.
    in_txn: bool,
    /// Set when it ran out of room in the middle of the current transaction: the rest of the
    /// transaction is not sent (nor backlogged), and at its end the subscriber reads it from
    /// the change log instead ([`Streamer::bound_queues`](super::Streamer)).
    pub(super) overflowed: bool,
    pub(super) lagging: Option<Lag>,
    /// Last commit acked.
    pub(super) acked: Watermark,
    /// Live changes received while catching up.
    pub(super) backlog: Vec<Arc<Change>>,
    /// Bytes of payload in `backlog`.
    backlog_bytes: u64,
    bounds: Bounds,
    /// Frames queued for this session alone in the current streamer turn.
    pub(super) outbox: Vec<Outgoing>,
    /// This turn's frames when they are a run of the turn's [`SharedFrames`] (`outbox` is
    /// then empty).
    follows: Option<Range<usize>>,
    pub(super) sent_messages: u64,
    pub(super) acked_messages: u64,
    /// Bytes of payload of the messages sent, and of those acked.
    sent_bytes: u64,
    acked_bytes: u64,
    /// (messages sent up to and including a flush, its time), for the flushes not wholly
    /// acked: the first says since when the oldest unacked change waits.
    sent_at: VecDeque<(u64, f64)>,
    /// Since when it catches up (streamer milliseconds), while it does.
    pub(super) behind_since: Option<f64>,
    /// Every this many messages, a frame asks the session to report its ack ([`Token::Progress`]),
    /// so that the streamer learns of acks even inside a long transaction.
    report_every: u64,
    samples: VecDeque<(f64, u64)>,
    /// Where what it holds is added up with the others' ([`Subscriber::share_total`]).
    total: HeldTotal,
    /// It takes the rest of the current transaction with a cohort (`cohort.rs`): what it is
    /// sent is counted when the cohort settles.
    pub(super) in_cohort: bool,
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
    /// Not sent for lack of room: it will be read from the change log (PROTOCOL.md §10.2).
    Overflowed,
}

/// Bytes a live subscriber keeps free for the `commit` or `rollback` that closes the
/// transaction it is in (sent even past its bounds, which it then stays within as long as that
/// message is no larger).
const CLOSING_RESERVE: usize = 256;

/// Watermark equality that first checks whether both are the very same text, as the changes of
/// one live transaction share theirs (`Arc<str>`'s own equality compares the bytes).
fn same(a: &Watermark, b: &Watermark) -> bool {
    std::ptr::eq(a.as_str(), b.as_str()) || a == b
}

impl Subscriber {
    /// `bounds`: what it may hold (PROTOCOL.md §10.2).
    pub fn new(
        session_id: SessionId,
        id: String,
        mode: Mode,
        protocol: u32,
        watermark: Watermark,
        session: Recipient<ToSession>,
        bounds: Bounds,
    ) -> Subscriber {
        Subscriber {
            session_id,
            id,
            mode,
            backup: None,
            joined: 0,
            protocol,
            session,
            phase: Phase::Validating,
            acked: watermark.clone(),
            position: (watermark.clone(), i64::MAX),
            in_txn: false,
            watermark,
            overflowed: false,
            lagging: None,
            backlog: Vec::new(),
            backlog_bytes: 0,
            bounds,
            outbox: Vec::new(),
            follows: None,
            sent_messages: 0,
            acked_messages: 0,
            sent_bytes: 0,
            acked_bytes: 0,
            sent_at: VecDeque::new(),
            behind_since: None,
            report_every: (bounds.changes as u64 / 4).max(1),
            samples: VecDeque::new(),
            total: HeldTotal::default(),
            in_cohort: false,
        }
    }

    /// The changes and bytes it may still be given, if it can take the rest of the
    /// transaction of `watermark` with a cohort (`cohort.rs`): live and not overflowed, of
    /// protocol 5 or more, inside that transaction, and every frame of the turn so far (the
    /// `shared_len` shared frames) its own.
    pub(super) fn cohort_room(
        &self,
        shared_len: usize,
        watermark: &Watermark,
    ) -> Option<(u64, u64)> {
        let current = self
            .follows
            .as_ref()
            .is_some_and(|run| run.end == shared_len);
        let fits = self.phase == Phase::Live
            && !self.overflowed
            && self.protocol >= 5
            && self.outbox.is_empty()
            && current
            && self.in_txn
            && same(&self.position.0, watermark);
        fits.then(|| {
            (
                (self.bounds.changes as u64).saturating_sub(self.held()),
                (self.bounds.bytes as u64).saturating_sub(self.held_bytes()),
            )
        })
    }

    /// Takes, as a member of a cohort (`cohort.rs`), the `queued` live changes of `bytes`
    /// bytes it queued since it formed, the last of them `last`: they are already in the
    /// turn's shared frames, right after its run, and in the held total.
    pub(super) fn settle_cohort(&mut self, queued: u64, bytes: u64, last: &Change) {
        self.sent_messages += queued;
        self.sent_bytes += bytes;
        if last.kind == Kind::Commit {
            self.watermark = last.watermark.clone();
        }
        self.position.1 = last.pos;
        self.in_txn = !matches!(last.kind, Kind::Commit | Kind::Rollback);
        if let Some(run) = &mut self.follows {
            run.end += queued as usize;
        }
    }

    /// Adds what it holds, from now on, to `total` (the streamer's, as it registers it).
    pub(super) fn share_total(&mut self, total: &HeldTotal) {
        let held = self.held_bytes();
        self.total.change(held, 0);
        total.change(0, held);
        self.total = total.clone();
    }

    /// Takes what it holds out of the shared total (as the streamer forgets it).
    pub(super) fn leave_total(&mut self) {
        let held = self.held_bytes();
        self.total.change(held, 0);
        self.total = HeldTotal::default();
        self.total.change(0, held);
    }

    /// Whether this subscriber takes part in live forwarding and broadcasts.
    pub fn is_active(&self) -> bool {
        matches!(self.phase, Phase::CatchingUp | Phase::Live)
    }

    /// Whether live changes still reach it (sent or backlogged): active and not overflowed in
    /// the current transaction.
    pub fn receives_live(&self) -> bool {
        self.is_active() && !self.overflowed
    }

    /// Hands a live change over: backlogged while catching up, otherwise sent if not filtered,
    /// as long as what it holds stays within its [`Bounds`] and `budget` (`--max-queued-bytes`)
    /// admits it (PROTOCOL.md §10.2). Out of room, it overflows:
    /// nothing more of the transaction reaches it live, and at the transaction's end it reads
    /// the rest from the change log ([`Streamer::bound_queues`](super::Streamer)). A live
    /// subscriber keeps one place for the `rollback` that must close a transaction it began
    /// (never stored, so it goes whatever the budget). What it admits is added to `budget`.
    /// Sent frames join this turn's [`SharedFrames`] when they can.
    #[inline]
    pub fn send_live(
        &mut self,
        change: &Arc<Change>,
        token: Option<Token>,
        shared: &mut SharedFrames,
        budget: &mut Budget,
    ) -> Delivery {
        let len = change.message.len();
        let delivery = self.admit_live(change, token, shared, budget);
        if matches!(delivery, Delivery::Sent | Delivery::Backlogged) {
            budget.add(len);
        }
        delivery
    }

    #[inline]
    fn admit_live(
        &mut self,
        change: &Arc<Change>,
        token: Option<Token>,
        shared: &mut SharedFrames,
        budget: &Budget,
    ) -> Delivery {
        let limit = self.bounds.changes as u64;
        let len = change.message.len();
        let admitted = budget.admits(len, self.held_bytes() == 0);
        match self.phase {
            Phase::CatchingUp => {
                if change.watermark <= self.watermark {
                    Delivery::Filtered
                } else if self.overflowed
                    || self.held() >= limit
                    || !self.has_bytes_for(len)
                    || !admitted
                {
                    self.overflowed = true;
                    Delivery::Overflowed
                } else {
                    self.backlog_bytes += len as u64;
                    self.total.change(0, len as u64);
                    self.backlog.push(change.clone());
                    Delivery::Backlogged
                }
            }
            Phase::Live if self.overflowed => {
                // The rollback of a transaction whose begin it got still closes it.
                if change.kind == Kind::Rollback && self.position.0 == change.watermark {
                    self.deliver(change, token, shared, true)
                } else {
                    Delivery::Overflowed
                }
            }
            Phase::Live => {
                let over = match change.kind {
                    Kind::Rollback => false,
                    // A commit past the budget is read from the change log like the rest.
                    Kind::Commit => !admitted,
                    _ => {
                        self.held() + 2 > limit
                            || !self.has_bytes_for(len + CLOSING_RESERVE)
                            || !admitted
                    }
                };
                if over {
                    self.overflowed = true;
                    Delivery::Overflowed
                } else {
                    self.deliver(change, token, shared, true)
                }
            }
            Phase::Validating | Phase::Queued => Delivery::Filtered,
        }
    }

    /// Sends a change of its own (catch-up or backlog) unless it is filtered.
    pub fn send(
        &mut self,
        change: &Change,
        token: Option<Token>,
        shared: &mut SharedFrames,
    ) -> Delivery {
        self.deliver(change, token, shared, false)
    }

    /// Sends `change` unless it is filtered: at or below the last commit sent, or unknown to
    /// the subscriber's protocol.
    ///
    /// ### Why the watermark comparison is skipped inside a transaction
    /// Comparing watermarks (strings) for every change and every subscriber showed in the
    /// profile. Once a change of a transaction was sent and its commit was not, the next
    /// change of the same transaction (the same watermark, usually the same shared text, so
    /// the equality is a pointer check) is above the last commit sent: only a sent commit
    /// moves that, and it would have ended the transaction here (a rollback ends it too).
    #[inline]
    fn deliver(
        &mut self,
        change: &Change,
        token: Option<Token>,
        shared: &mut SharedFrames,
        live: bool,
    ) -> Delivery {
        let inside = self.in_txn && same(&self.position.0, &change.watermark);
        if (!inside && change.watermark <= self.watermark) || (change.needs_v5 && self.protocol < 5)
        {
            return Delivery::Filtered;
        }
        let commit = if change.kind == Kind::Commit {
            self.watermark = change.watermark.clone();
            Some(&change.watermark)
        } else {
            None
        };
        if !inside {
            self.position.0 = change.watermark.clone();
        }
        self.position.1 = change.pos;
        self.in_txn = !matches!(change.kind, Kind::Commit | Kind::Rollback);
        self.queue(&change.message, commit, token, shared, live);
        Delivery::Sent
    }

    /// Queues a frame that is not a change (the initial `status`).
    pub fn send_frame(&mut self, message: Arc<str>, shared: &mut SharedFrames) {
        self.queue(&message, None, None, shared, false);
    }

    /// Queues one frame. A live frame (`live`) is taken from, or added to, the turn's shared
    /// frames as long as everything this subscriber got in the turn is a run of them
    /// (`follows`); the first frame that breaks the run (a change filtered for it alone, a
    /// frame of its own) copies the run into its own outbox, which takes the rest of the turn.
    /// A frame of its own asks for a progress report every `report_every` frames
    /// ([`Token::Progress`]); live frames carry the streamer's own marks
    /// ([`SharedFrames::progress_mark`]), the same for every subscriber.
    #[inline]
    fn queue(
        &mut self,
        message: &Arc<str>,
        commit: Option<&Watermark>,
        token: Option<Token>,
        shared: &mut SharedFrames,
        live: bool,
    ) {
        self.sent_messages += 1;
        let before = self.held_bytes();
        self.sent_bytes += message.len() as u64;
        self.total.change(before, self.held_bytes());
        if live && self.outbox.is_empty() {
            let frames = &mut shared.frames;
            let len = frames.len();
            let is_last = frames
                .last()
                .is_some_and(|l| Arc::ptr_eq(&l.message, message) && l.token == token);
            let run = self.follows.get_or_insert_with(|| {
                let start = if is_last { len - 1 } else { len };
                start..start
            });
            if run.end == len {
                frames.push(Outgoing {
                    message: message.clone(),
                    commit: commit.cloned(),
                    token,
                });
                run.end += 1;
                return;
            }
            if run.end + 1 == len && is_last {
                run.end += 1;
                return;
            }
        }
        if let Some(run) = self.follows.take() {
            self.outbox.extend_from_slice(&shared.frames[run]);
        }
        let token = token.or_else(|| {
            (!live && self.sent_messages % self.report_every == 0).then_some(Token::Progress)
        });
        self.outbox.push(Outgoing {
            message: message.clone(),
            commit: commit.cloned(),
            token,
        });
    }

    /// Hands what it was queued so far in this turn to the session, noting when (`now_ms`)
    /// for the lag (in the middle of a turn; [`Subscriber::flush_turn`] at its end).
    pub fn flush(&mut self, now_ms: f64, shared: &SharedFrames) {
        let frames = match self.follows.take() {
            Some(run) if !run.is_empty() => shared.frames[run].to_vec(),
            _ => std::mem::take(&mut self.outbox),
        };
        self.hand_over(now_ms, Arc::new(FrameList::new(frames)));
    }

    /// Hands the turn's frames to the session at the end of the turn: `batch` (the turn's
    /// shared frames) itself when it got every one of them, which is the common case.
    pub fn flush_turn(&mut self, now_ms: f64, batch: &Arc<FrameList>) {
        let frames = match self.follows.take() {
            Some(run) if run.start == 0 && run.end == batch.len() => batch.clone(),
            Some(run) if !run.is_empty() => Arc::new(FrameList::new(batch[run].to_vec())),
            _ => Arc::new(FrameList::new(std::mem::take(&mut self.outbox))),
        };
        self.hand_over(now_ms, frames);
    }

    fn hand_over(&mut self, now_ms: f64, frames: Arc<FrameList>) {
        if !frames.is_empty() {
            self.sent_at.push_back((self.sent_messages, now_ms));
            self.session.do_send(ToSession::Send(frames));
        }
    }

    /// Changes sent (handed to the session) and not yet acked.
    /// Whether an ack is sure to come: a commit it was sent is unacked. What is unacked otherwise
    /// is at most the start of a transaction, whose commit a client acking only at commits
    /// (PROTOCOL.md §5) waits for: no ack may come until more is sent.
    pub fn ack_to_come(&self) -> bool {
        self.in_flight() > 0 && self.watermark > self.acked
    }

    pub fn in_flight(&self) -> u64 {
        self.sent_messages.saturating_sub(self.acked_messages)
    }

    /// Bytes of payload sent (handed to the session) and not yet acked: what a catch-up's
    /// window counts (PROTOCOL.md §10.2).
    pub fn in_flight_bytes(&self) -> u64 {
        self.sent_bytes.saturating_sub(self.acked_bytes)
    }

    /// What the service holds for it: sent and not acked, and its backlog (PROTOCOL.md §10.2).
    pub fn held(&self) -> u64 {
        self.in_flight() + self.backlog.len() as u64
    }

    /// Bytes of payload it holds (the same changes as [`Subscriber::held`]): each shared
    /// change counts for every subscriber that holds it (PROTOCOL.md §10.2).
    pub fn held_bytes(&self) -> u64 {
        self.in_flight_bytes() + self.backlog_bytes
    }

    /// Whether one more payload of `len` bytes stays within its byte bound; one that holds
    /// nothing may take any payload, alone (PROTOCOL.md §10.2).
    fn has_bytes_for(&self, len: usize) -> bool {
        let held = self.held_bytes();
        held == 0 || held + len as u64 <= self.bounds.bytes as u64
    }

    /// How many more changes it may be given now, within its change bound.
    pub fn room(&self) -> usize {
        (self.bounds.changes as u64).saturating_sub(self.held()) as usize
    }

    /// How many more bytes of payload it may be given now: within its byte bound and what
    /// `global_room` (of `--max-queued-bytes`) leaves.
    pub fn byte_room(&self, global_room: u64) -> u64 {
        (self.bounds.bytes as u64)
            .saturating_sub(self.held_bytes())
            .min(global_room)
    }

    /// Forgets its backlog (read from the change log instead).
    pub(super) fn clear_backlog(&mut self) {
        self.backlog.clear();
        self.total.change(self.backlog_bytes, 0);
        self.backlog_bytes = 0;
    }

    /// Takes its backlog, to send it.
    pub(super) fn take_backlog(&mut self) -> Vec<Arc<Change>> {
        self.total.change(self.backlog_bytes, 0);
        self.backlog_bytes = 0;
        std::mem::take(&mut self.backlog)
    }

    /// Records a [`SessionProgress`].
    pub fn progress(
        &mut self,
        acked_messages: u64,
        acked_bytes: u64,
        acked_commit: Option<Watermark>,
    ) {
        self.acked_messages = self.acked_messages.max(acked_messages);
        let before = self.held_bytes();
        self.acked_bytes = self.acked_bytes.max(acked_bytes);
        self.total.change(before, self.held_bytes());
        while self
            .sent_at
            .front()
            .is_some_and(|&(upto, _)| upto <= self.acked_messages)
        {
            self.sent_at.pop_front();
        }
        if let Some(w) = acked_commit {
            if w > self.acked {
                self.acked = w;
            }
        }
    }
}
