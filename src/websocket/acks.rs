//! `AckReport`: which of a subscriber's acks the streamer hears of, and when (PROTOCOL.md §5, §10):
//! acks of tracked frames at once; an acked commit, or the ack of everything written, at most
//! [`COMMIT_REPORT_DELAY`] later. Each report says how many messages and bytes of payload the
//! client acked, whatever their framing (one per frame, or several in a batched frame acked
//! cumulatively). The subscriber session uses it for its websocket; the benchmarks' in-process
//! sessions use the same one, so that they cost the streamer what real sessions do.

use std::collections::VecDeque;
use std::time::Duration;

use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{Batch, Outgoing, SessionProgress, Token};
use change_streamer_actors::watermark::Watermark;

/// How long an acked commit (or the ack of everything written) may wait before the streamer
/// hears of it, when no tracked frame was acked with it.
///
/// ### Why acked commits are reported late
/// Acks of tracked frames (flow control, catch-up batches, progress) are reported at once:
/// something waits on them. An acked commit only moves the subscriber's acked watermark, which
/// the purge rule and `/status` read, and neither needs it within milliseconds. Reporting every
/// one cost a message to the streamer per transaction per subscriber, each waking the
/// streamer's thread and making it poll its timers; reporting the newest of them once per
/// delay costs a few hundred per second per subscriber at most, whatever the rate.
///
/// ### Why the ack of everything written is reported too
/// The streamer counts what a subscriber holds from the acks it hears of. Without this report
/// a subscriber that acked every frame it got, none of them tracked or a commit (its first
/// `status` alone), would go on showing them pending (PROTOCOL.md §11).
pub const COMMIT_REPORT_DELAY: Duration = Duration::from_millis(5);

/// What the session does after an ack.
#[derive(Debug)]
pub enum AfterAck {
    /// Send this to the streamer now.
    Report(SessionProgress),
    /// Call [`AckReport::delay_passed`] after [`COMMIT_REPORT_DELAY`].
    ReportLater,
    /// Nothing to tell (or a report is already scheduled).
    Nothing,
}

/// Messages and bytes of payload written (or acked) so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Count {
    messages: u64,
    bytes: u64,
}

/// A written frame whose ack matters: its id, what acking it means, and what was written up to
/// and including it.
#[derive(Debug)]
struct Tracked {
    id: u64,
    commit: Option<Watermark>,
    token: Option<Token>,
    through: Count,
}

/// The frames of one subscription whose ack matters, what was written and acked, and the newest
/// acked commit the streamer has not heard of.
#[derive(Debug)]
pub struct AckReport {
    session_id: SessionId,
    tracked: VecDeque<Tracked>,
    /// The id of the last frame written.
    last_id: u64,
    written: Count,
    acked: Count,
    reported: Count,
    /// The newest acked commit the streamer has not heard of.
    unreported: Option<Watermark>,
    /// A report is scheduled.
    armed: bool,
}

impl AckReport {
    pub fn new(session_id: SessionId) -> AckReport {
        AckReport {
            session_id,
            tracked: VecDeque::new(),
            last_id: 0,
            written: Count::default(),
            acked: Count::default(),
            reported: Count::default(),
            unreported: None,
            armed: false,
        }
    }

    /// Frame `id` carrying `frame` was written to the client.
    pub fn sent(&mut self, id: u64, frame: &Outgoing) {
        self.last_id = id;
        self.written.messages += 1;
        self.written.bytes += frame.message.len() as u64;
        if frame.commit.is_some() || frame.token.is_some() {
            self.track(id, frame.commit.clone(), frame.token);
        }
    }

    /// Frame `id` carrying the messages of `batch` (a batched frame, PROTOCOL.md §5) was
    /// written. Its ack acks them all at once, so what it means is the batch's summary
    /// ([`Batch`]), summed once for every session that writes the list: a session's work per
    /// batched frame does not grow with the messages in it.
    pub fn sent_batch(&mut self, id: u64, batch: &Batch) {
        let messages = batch.frames.len() as u64;
        self.last_id = id;
        self.written.messages += messages;
        self.written.bytes += batch.bytes;
        for &token in &batch.tokens {
            self.track(id, None, Some(token));
        }
        if batch.commit.is_some() {
            self.track(id, batch.commit.clone(), None);
        }
    }

    fn track(&mut self, id: u64, commit: Option<Watermark>, token: Option<Token>) {
        self.tracked.push_back(Tracked {
            id,
            commit,
            token,
            through: self.written,
        });
    }

    /// The client acked every frame through `id`.
    pub fn acked(&mut self, id: u64) -> AfterAck {
        let mut tokens = Vec::new();
        while self.tracked.front().is_some_and(|t| t.id <= id) {
            if let Some(t) = self.tracked.pop_front() {
                if let Some(c) = t.commit {
                    self.unreported = Some(c);
                }
                tokens.extend(t.token);
                self.acked = t.through;
            }
        }
        if id == self.last_id {
            self.acked = self.written;
        }
        if !tokens.is_empty() {
            AfterAck::Report(self.progress(tokens))
        } else if self.has_news() && !self.armed {
            self.armed = true;
            AfterAck::ReportLater
        } else {
            AfterAck::Nothing
        }
    }

    /// [`COMMIT_REPORT_DELAY`] passed since [`AfterAck::ReportLater`]: the report of what was
    /// acked since the last one, unless a report since took it along.
    pub fn delay_passed(&mut self) -> Option<SessionProgress> {
        self.armed = false;
        self.has_news().then(|| self.progress(Vec::new()))
    }

    fn has_news(&self) -> bool {
        self.unreported.is_some() || self.acked != self.reported
    }

    /// What the client acked, with the tracked frames' `tokens` and the newest acked commit not
    /// yet reported.
    fn progress(&mut self, tokens: Vec<Token>) -> SessionProgress {
        self.reported = self.acked;
        SessionProgress {
            session_id: self.session_id,
            acked_messages: self.acked.messages,
            acked_bytes: self.acked.bytes,
            acked_commit: self.unreported.take(),
            tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    //! What the ack of a batched frame reports (PROTOCOL.md §5): every message in it, its last
    //! commit and its tokens, at once; an ack of a frame before it, only what came before.
    use std::sync::Arc;

    use change_streamer_actors::streamer::FrameList;

    use super::*;

    fn frame(text: &str, commit: Option<u64>, token: Option<Token>) -> Outgoing {
        Outgoing {
            message: Arc::from(text),
            commit: commit.map(Watermark::from_u64),
            token,
        }
    }

    #[test]
    fn the_ack_of_a_batched_frame_acks_all_its_messages_its_last_commit_and_its_tokens() {
        let list = FrameList::new(vec![
            frame("[1]", None, None),
            frame("[22]", Some(1), None),
            frame("[333]", None, Some(Token::Broadcast(4))),
            frame("[4444]", Some(2), None),
            frame("[5]", None, None),
        ]);
        let mut acks = AckReport::new(SessionId(9));
        acks.sent(1, &frame("[status]", None, None));
        let [batch] = list.batches() else {
            panic!("one batch")
        };
        acks.sent_batch(2, batch);
        // The status alone: neither tracked nor the last frame written, so no news yet.
        assert!(matches!(acks.acked(1), AfterAck::Nothing));
        let AfterAck::Report(p) = acks.acked(2) else {
            panic!("a tracked frame was acked")
        };
        assert_eq!(
            (p.acked_messages, p.acked_bytes),
            (6, 8 + 3 + 4 + 5 + 6 + 3)
        );
        assert_eq!(p.acked_commit, Some(Watermark::from_u64(2)));
        assert_eq!(p.tokens, [Token::Broadcast(4)]);
        assert!(matches!(acks.acked(2), AfterAck::Nothing));
    }
}
