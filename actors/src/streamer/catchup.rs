//! Catch-up: a subscriber reading the stored transactions it missed, streamed within a window
//! of unacked bytes, until it reaches what it gets live (PROTOCOL.md §5, §7, §10.2); and the way
//! back to catch-up for one that holds too much.
//!
//! ### A window, not stop-and-wait (PROTOCOL.md §10.2)
//! A catch-up keeps reading and sending while the payload it sent and the client has not acked
//! is under `--catchup-window-bytes`: every ack the session reports makes room, without waiting
//! for the ack of any particular frame. So a client that acks late, or only at commits,
//! still gets a continuous stream, paced by the window and not by round trips. Each read is
//! followed at once by the next while a row of the usual size fits; once the window is full,
//! an ack report reads on when a quarter of the window is free, or, when every commit sent is
//! acked (what is unacked may be the start of a transaction whose commit the client waits
//! for), whenever a row fits ([`Streamer::read_catchup_on_ack`]). Each read is limited in bytes
//! to the room left (the change log's readers stop there, [`ChangeLog::read_within`]), so every
//! read, the first included, is as large as the window allows whatever the size of the rows;
//! the size of the rows read before (this subscriber's, else the last catch-up's of any
//! subscriber) only says whether the room is worth a read while an ack is to come. The last
//! frame of each read asks the session to report its ack at once ([`Token::Progress`]), so the
//! window reopens as soon as the client has read it.
//!
//! [`ChangeLog::read_within`]: crate::changelog::ChangeLog::read_within
//!
//! ### Back to catch-up when it holds too much (PROTOCOL.md §10.2)
//! What the service holds for a subscriber (sent and not acked, and its backlog) stays within
//! `--max-subscriber-queue-changes` and `--max-subscriber-queue-bytes`, and all subscribers
//! together within `--max-queued-bytes`. Catch-up reads only as many rows as there is room for
//! (in the window and in those bounds), sends only as many bytes, and reads on as acks make
//! room. A live subscriber that runs out of room in the middle of a
//! transaction gets nothing more of it; at the transaction's end it goes back to catch-up from
//! the last change it was sent (its *position*), so the change log supplies the rest. A
//! backlog that runs out of room is dropped whole at the transaction's end and the catch-up's
//! target moves up to read it from storage. Either way nothing is skipped (the position and
//! the target cover it) and nothing repeats (a change is sent only past the last commit sent).

use actix::prelude::*;
use log::info;

use super::budget::Budget;
use super::change::Change;
use super::frames::Token;
use super::shared::SharedFrames;
use super::subscriber::{Phase, Subscriber};
use super::Streamer;
use crate::changelog::StoredChange;
use crate::session_end::{SessionEnd, SessionId};
use crate::watermark::Watermark;

/// With an ack to come, a read waits until this share of the window is free.
const READ_WHEN_FREE: u64 = 4;

/// Where a catch-up stands.
pub(super) struct Catchup {
    after: (Watermark, i64),
    pub(super) up_to: Watermark,
    /// A read (or its durability barrier) is out.
    pub(super) reading: bool,
    /// `up_to` moved past what the last barrier covered: wait for durability before reading.
    needs_barrier: bool,
    /// Mean bytes of a message of the last read, to size the next one; `None` before any.
    row_bytes: Option<u64>,
}

impl Catchup {
    /// Reads the stored transactions after `after` up to `up_to`, once they are durable.
    pub(super) fn new(after: (Watermark, i64), up_to: Watermark) -> Catchup {
        Catchup {
            after,
            up_to,
            reading: false,
            // Everything up to `up_to` was queued on the change log before this point: the
            // first read waits until it is durable.
            needs_barrier: true,
            row_bytes: None,
        }
    }
}

impl Streamer {
    /// Reads the next catch-up batch, after a durability barrier when the target moved, and
    /// only as many rows as the window and the subscriber's bounds have room for; with too
    /// little room, the acks that make some call it again
    /// ([`SessionProgress`](super::SessionProgress)).
    pub(super) fn read_catchup(&mut self, ctx: &mut Context<Self>, session_id: SessionId) {
        let budget = self.budget();
        let at_boundary = self.txn.is_none();
        let last_commit = self.last_commit.clone();
        let window = self.cfg.catchup_window_bytes as u64;
        let known_row_bytes = self.catchup_row_bytes;
        let (Some(sub), Some(c)) = (
            self.subscribers.get_mut(&session_id),
            self.catchup.get_mut(&session_id),
        ) else {
            return;
        };
        if c.reading {
            return;
        }
        // Out of room in its bounds or in the budget (`--max-queued-bytes`), with a backlog
        // and no ack sure to come to make more: read the backlog's transactions from storage
        // instead, rather than wait for the next upstream transaction to overflow it.
        let full = sub.room() == 0 || sub.byte_room(budget.room()) == 0;
        if full && !sub.ack_to_come() && !sub.backlog.is_empty() && at_boundary {
            if let Some(last) = last_commit {
                drop_backlog(sub, c, last);
            }
        }
        if std::mem::take(&mut c.needs_barrier) {
            c.reading = true;
            let barrier = self.log.barrier();
            ctx.spawn(
                barrier
                    .into_actor(self)
                    .map(move |res, act, ctx| match res {
                        Ok(()) => {
                            if let Some(c) = act.catchup.get_mut(&session_id) {
                                c.reading = false;
                            }
                            act.read_catchup(ctx, session_id)
                        }
                        Err(e) => act.catchup_failed(ctx, session_id, e.to_string()),
                    }),
            );
            return;
        }
        let room = sub.room();
        let byte_room = window_room(sub, window, budget.room());
        // With no byte room, one that holds nothing may still take one change while the
        // budget is within its bound (PROTOCOL.md §10.2); otherwise acks make room.
        if room == 0 || (byte_room == 0 && !(sub.held_bytes() == 0 && budget.within())) {
            return;
        }
        let row_bytes = c.row_bytes.or(known_row_bytes);
        if sub.ack_to_come() && row_bytes.is_some_and(|size| byte_room < size) {
            // No room for a row of the usual size: the ack of a commit in flight makes more.
            // With none to come (what is unacked is the start of a transaction, whose commit a
            // client acking only at commits waits for), a row is read: it may well fit.
            return;
        }
        c.reading = true;
        let up_to = c.up_to.clone();
        // As much as the room allows, in bytes of messages (at least one change).
        let max_bytes = usize::try_from(byte_room.max(1)).unwrap_or(usize::MAX);
        let read = self.log.read_within(
            c.after.clone(),
            up_to.clone(),
            self.cfg.catchup_batch.min(room),
            max_bytes,
        );
        ctx.spawn(read.into_actor(self).map(move |res, act, ctx| match res {
            Ok(rows) => act.send_catchup(ctx, session_id, rows, up_to),
            Err(e) => act.catchup_failed(ctx, session_id, e.to_string()),
        }));
    }

    /// An ack report made room in the window of `session_id`'s catch-up, if it has one: it reads
    /// on once the room is worth a read (a read of a few rows costs about as much as a large
    /// one): a quarter of the window, or any room when no commit it was sent waits for its ack
    /// (what is unacked may then be the start of a transaction whose commit a client acking
    /// only at commits waits for, and no ack would come).
    pub(super) fn read_catchup_on_ack(&mut self, ctx: &mut Context<Self>, session_id: SessionId) {
        // Every live subscriber's ack comes here: the budget's sum over every subscriber only
        // for the ones catching up.
        if !self.catchup.contains_key(&session_id) {
            return;
        }
        let global_room = self.budget().room();
        let window = self.cfg.catchup_window_bytes as u64;
        let (Some(sub), Some(c)) = (
            self.subscribers.get(&session_id),
            self.catchup.get(&session_id),
        ) else {
            return;
        };
        let little = window_room(sub, window, global_room) < window / READ_WHEN_FREE;
        if c.reading || (little && sub.ack_to_come()) {
            return;
        }
        self.read_catchup(ctx, session_id);
    }

    fn catchup_failed(&mut self, ctx: &mut Context<Self>, session_id: SessionId, e: String) {
        self.close_subscriber(
            ctx,
            session_id,
            SessionEnd::Unavailable(format!("catch-up failed: {e}")),
        );
    }

    /// Keeps what subscribers hold within [`StreamerConfig::max_queue_changes`] at a
    /// transaction boundary (see the module documentation): a live subscriber that overflowed
    /// in the transaction just ended goes back to catch-up from its position; a catching-up
    /// one whose backlog overflowed drops it and reads up to the last commit instead.
    ///
    /// [`StreamerConfig::max_queue_changes`]: super::StreamerConfig::max_queue_changes
    pub(super) fn bound_queues(&mut self, ctx: &mut Context<Self>) {
        let Some(last) = self.last_commit.clone() else {
            return;
        };
        let now = self.now_ms();
        let mut read = Vec::new();
        for sub in self.subscribers.values_mut() {
            if !std::mem::take(&mut sub.overflowed) {
                continue;
            }
            match sub.phase {
                Phase::Live if sub.position.0 <= last => {
                    info!(subscriber:% = sub.id, watermark:% = sub.position.0;
                        "subscriber {} holds {} unacked change(s); reading from the change log after watermark={} pos={} up to {last}",
                        sub.id,
                        sub.held(),
                        sub.position.0,
                        sub.position.1
                    );
                    sub.phase = Phase::CatchingUp;
                    sub.behind_since = Some(now);
                    sub.flush(now, &self.shared);
                    self.catchup.insert(
                        sub.session_id,
                        Catchup::new(sub.position.clone(), last.clone()),
                    );
                    read.push(sub.session_id);
                }
                Phase::CatchingUp => {
                    if let Some(c) = self.catchup.get_mut(&sub.session_id) {
                        drop_backlog(sub, c, last.clone());
                        read.push(sub.session_id);
                    }
                }
                // A live subscriber whose transaction was rolled back missed nothing stored.
                _ => {}
            }
        }
        for session_id in read {
            self.read_catchup(ctx, session_id);
        }
    }

    /// Sends a catch-up batch, its last frame asking for a report of its ack, and reads on
    /// while the window has room; an empty read ends the catch-up: the backlog follows, then
    /// live changes.
    fn send_catchup(
        &mut self,
        ctx: &mut Context<Self>,
        session_id: SessionId,
        mut rows: Vec<StoredChange>,
        read_up_to: Watermark,
    ) {
        let now = self.now_ms();
        let budget = self.budget();
        let window = self.cfg.catchup_window_bytes as u64;
        let last_commit = self.last_commit.clone().filter(|_| self.txn.is_none());
        let (Some(sub), Some(c)) = (
            self.subscribers.get_mut(&session_id),
            self.catchup.get_mut(&session_id),
        ) else {
            return;
        };
        c.reading = false;
        if rows.is_empty() && c.up_to != read_up_to {
            // The target moved while this read was out: read on.
            self.read_catchup(ctx, session_id);
            return;
        }
        if rows.is_empty() {
            self.catchup.remove(&session_id);
            go_live(sub, &mut self.shared, now);
            return;
        }
        // The backlog may have grown while the read was out: send only what there is room for,
        // in changes and in bytes (the rest is read again); one change larger than the byte
        // room still goes alone to a subscriber that holds nothing.
        let room = sub.room();
        if room == 0 {
            self.read_catchup(ctx, session_id);
            return;
        }
        rows.truncate(room);
        let read_bytes: usize = rows.iter().map(StoredChange::message_len).sum();
        let row_bytes = (read_bytes / rows.len().max(1)) as u64;
        c.row_bytes = Some(row_bytes);
        self.catchup_row_bytes = Some(row_bytes);
        let taken = send_rows(sub, &rows, window, budget, &mut self.shared);
        if taken == 0 {
            // No room for the next change. With no ack sure to come, none will make some: its
            // backlog, if it has one, is read from the change log instead (at a transaction
            // boundary; inside one, the backlog overflows and is dropped at its end).
            // Otherwise the acks that make room read on (its own, or, for the budget, anyone's).
            if let (false, false, Some(last)) =
                (sub.ack_to_come(), sub.backlog.is_empty(), last_commit)
            {
                drop_backlog(sub, c, last);
                self.read_catchup(ctx, session_id);
            }
            return;
        }
        if let Some(last) = rows.get(taken - 1) {
            c.after = (last.watermark.clone(), last.pos);
        }
        // The read's last frame asks for a report of its ack: the window reopens with it.
        if let Some(last) = sub.outbox.last_mut() {
            last.token = last.token.or(Some(Token::Progress));
        }
        sub.flush(now, &self.shared);
        self.note_queued_peak();
        self.read_catchup(ctx, session_id);
    }
}

/// The bytes a catch-up may send a subscriber now: what the window leaves of its unacked
/// payload, within its byte bound and what `global_room` (of `--max-queued-bytes`) leaves
/// (PROTOCOL.md §10.2).
fn window_room(sub: &Subscriber, window: u64, global_room: u64) -> u64 {
    window
        .saturating_sub(sub.in_flight_bytes())
        .min(sub.byte_room(global_room))
}

/// Caught up: the backlog follows, then live changes.
fn go_live(sub: &mut Subscriber, shared: &mut SharedFrames, now: f64) {
    let backlog = sub.take_backlog();
    for change in &backlog {
        sub.send(change, None, shared);
    }
    sub.phase = Phase::Live;
    sub.behind_since = None;
    info!(subscriber:% = sub.id, watermark:% = sub.watermark;
        "subscriber {} caught up to watermark={}; {} live change(s) from its backlog",
        sub.id,
        sub.watermark,
        backlog.len()
    );
    sub.flush(now, shared);
}

/// Sends `rows` in order while the window's room (within its byte bound and what `budget`,
/// `--max-queued-bytes`, leaves) lasts; one change larger than that still goes alone to a
/// subscriber that holds nothing, while the budget is within its bound (PROTOCOL.md §10.2).
/// Answers how many rows were taken (sent, or filtered for the subscriber).
fn send_rows(
    sub: &mut Subscriber,
    rows: &[StoredChange],
    window: u64,
    budget: Budget,
    shared: &mut SharedFrames,
) -> usize {
    let holds_nothing = sub.held_bytes() == 0 && budget.within();
    let mut bytes_left = window_room(sub, window, budget.room());
    let mut taken = 0;
    for row in rows {
        let change = Change::from_stored(row);
        let len = change.message.len() as u64;
        if len > bytes_left && !(holds_nothing && taken == 0) {
            break;
        }
        bytes_left = bytes_left.saturating_sub(len);
        taken += 1;
        sub.send(&change, None, shared);
    }
    taken
}

/// Drops a catching-up subscriber's backlog: its transactions, all committed up to `last` and
/// queued on the change log, are read from there instead.
fn drop_backlog(sub: &mut Subscriber, c: &mut Catchup, last: Watermark) {
    info!(subscriber:% = sub.id, watermark:% = last;
        "subscriber {} is still catching up with {} live change(s) waiting; reading them from the change log instead (up to watermark={last})",
        sub.id,
        sub.backlog.len()
    );
    sub.clear_backlog();
    c.up_to = last;
    c.needs_barrier = true;
}
