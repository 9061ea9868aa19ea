//! `AckReport`: which of a subscriber's acks the streamer hears of, and when (PROTOCOL.md §5, §10):
//! acks of tracked frames at once, an acked commit alone at most [`COMMIT_REPORT_DELAY`] later.
//! The subscriber session uses it for its websocket; the benchmarks' in-process sessions use the
//! same one, so that they cost the streamer what real sessions do.

use std::collections::VecDeque;
use std::time::Duration;

use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{Outgoing, SessionProgress, Token};
use change_streamer_actors::watermark::Watermark;

/// How long an acked commit may wait before the streamer hears of it, when no tracked frame
/// was acked with it.
///
/// ### Why acked commits are reported late
/// Acks of tracked frames (flow control, catch-up batches, progress) are reported at once:
/// something waits on them. An acked commit only moves the subscriber's acked watermark, which
/// the purge rule and `/status` read, and neither needs it within milliseconds. Reporting every
/// one cost a message to the streamer per transaction per subscriber, each waking the
/// streamer's thread and making it poll its timers; reporting the newest of them once per
/// delay costs a few hundred per second per subscriber at most, whatever the rate.
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

/// The frames of one subscription whose ack matters, and the newest acked commit the streamer
/// has not heard of.
#[derive(Debug)]
pub struct AckReport {
    session_id: SessionId,
    /// Frames whose ack matters: (id, commit watermark, token).
    tracked: VecDeque<(u64, Option<Watermark>, Option<Token>)>,
    /// The newest acked commit the streamer has not heard of: (the ack's id, its watermark).
    unreported: Option<(u64, Watermark)>,
    /// A report of `unreported` is scheduled.
    armed: bool,
}

impl AckReport {
    pub fn new(session_id: SessionId) -> AckReport {
        AckReport {
            session_id,
            tracked: VecDeque::new(),
            unreported: None,
            armed: false,
        }
    }

    /// Frame `id` carrying `frame` was written to the client.
    pub fn sent(&mut self, id: u64, frame: &Outgoing) {
        if frame.commit.is_some() || frame.token.is_some() {
            self.tracked
                .push_back((id, frame.commit.clone(), frame.token));
        }
    }

    /// The client acked every frame through `id`.
    pub fn acked(&mut self, id: u64) -> AfterAck {
        let mut tokens = Vec::new();
        while self.tracked.front().is_some_and(|(t, _, _)| *t <= id) {
            if let Some((_, c, t)) = self.tracked.pop_front() {
                if let Some(c) = c {
                    self.unreported = Some((id, c));
                }
                tokens.extend(t);
            }
        }
        if !tokens.is_empty() {
            AfterAck::Report(self.progress(id, tokens))
        } else if self.unreported.is_some() && !self.armed {
            self.armed = true;
            AfterAck::ReportLater
        } else {
            AfterAck::Nothing
        }
    }

    /// [`COMMIT_REPORT_DELAY`] passed since [`AfterAck::ReportLater`]: the report of the newest
    /// acked commit, unless a report since took it along.
    pub fn delay_passed(&mut self) -> Option<SessionProgress> {
        self.armed = false;
        let (id, _) = self.unreported.as_ref()?;
        let id = *id;
        Some(self.progress(id, Vec::new()))
    }

    /// The client acked through `acked`, with the tracked frames' `tokens` and the newest acked
    /// commit not yet reported.
    fn progress(&mut self, acked: u64, tokens: Vec<Token>) -> SessionProgress {
        SessionProgress {
            session_id: self.session_id,
            acked_messages: acked,
            acked_commit: self.unreported.take().map(|(_, c)| c),
            tokens,
        }
    }
}
