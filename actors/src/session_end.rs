//! What the actors know of a websocket session: the number that names it ([`SessionId`]) and
//! why it ends ([`SessionEnd`]).
//!
//! Sessions live in the service; the actors that own their state (the streamer, the
//! reservations) know a session only by this number and by the recipient it handed them. A
//! session's later messages name its own number, so a stale session can never act on state that
//! has passed to a newer one.
//!
//! Every close, whoever decides it (the reservations, the streamer, the session itself), is a
//! [`SessionEnd`]; its close code and reason (PROTOCOL.md §5) are written in one place,
//! [`SessionEnd::close_frame`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A process-unique session number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

impl SessionId {
    /// The next unused session number.
    pub fn next() -> SessionId {
        SessionId(NEXT_SESSION.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a session's socket closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// A newer reservation of the same task took over (1000).
    Replaced,
    /// A newer backup replicator of the same backup took over (1000, PROTOCOL.md §7.1).
    BackupReplaced,
    /// The task subscribed with `initial=true`, which ends its reservation (1000).
    EndedBySubscription,
    /// A refused subscription's `error` frame was acked (1000).
    ErrorAcked,
    /// A refused subscription's `error` frame was not acked within a ping interval (1000).
    ErrorNotAcked,
    /// The service is stopping (1001).
    ServiceStop,
    /// Liveness (PROTOCOL.md §5): nothing, not even a pong, came from the client for a whole
    /// ping interval of this many ms (1001: reconnect).
    NoPong(u64),
    /// The client broke the protocol: a bad ack, a binary frame, a websocket error (1002).
    Protocol(String),
    /// The service cannot serve the session: the change log is not initialized or cannot
    /// answer, the streamer is gone (1011).
    Unavailable(String),
    /// A slow subscriber, lagging on a tracked send longer than `--slow-subscriber-grace-ms`,
    /// is evicted (1013, PROTOCOL.md §10.1); it may reconnect and catch up from the change log.
    Evicted(String),
}

/// Close reasons are at most 123 bytes (the close frame's payload limit less the code).
pub const MAX_REASON: usize = 123;

impl SessionEnd {
    /// The close code (PROTOCOL.md §5).
    pub fn code(&self) -> u16 {
        match self {
            SessionEnd::Replaced
            | SessionEnd::BackupReplaced
            | SessionEnd::EndedBySubscription
            | SessionEnd::ErrorAcked
            | SessionEnd::ErrorNotAcked => 1000,
            SessionEnd::ServiceStop | SessionEnd::NoPong(_) => 1001,
            SessionEnd::Protocol(_) => 1002,
            SessionEnd::Unavailable(_) => 1011,
            SessionEnd::Evicted(_) => 1013,
        }
    }

    /// The close code and the reason, cut to [`MAX_REASON`] bytes at a character boundary.
    pub fn close_frame(&self) -> (u16, String) {
        let reason = match self {
            SessionEnd::Replaced => "replaced by a newer reservation of the same task",
            SessionEnd::BackupReplaced => {
                "replaced by a newer backup replicator of the same backup"
            }
            SessionEnd::EndedBySubscription => "reservation ended: the task subscribed",
            SessionEnd::ErrorAcked => "error acknowledged",
            SessionEnd::ErrorNotAcked => "error sent; no ack",
            SessionEnd::ServiceStop => "service stopping",
            SessionEnd::NoPong(ms) => return (self.code(), format!("no pong for {ms} ms")),
            SessionEnd::Protocol(why) | SessionEnd::Unavailable(why) | SessionEnd::Evicted(why) => {
                why
            }
        };
        (self.code(), truncate_reason(reason).to_string())
    }
}

/// `text` cut to [`MAX_REASON`] bytes at a character boundary.
pub fn truncate_reason(text: &str) -> &str {
    let mut end = text.len().min(MAX_REASON);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_reasons_are_cut_to_123_bytes_at_a_character_boundary() {
        assert_eq!(
            SessionEnd::Protocol("short".into()).close_frame(),
            (1002, "short".to_string())
        );
        let long = "é".repeat(100); // 200 bytes
        let (code, cut) = SessionEnd::Unavailable(long).close_frame();
        assert_eq!(code, 1011);
        assert!(
            cut.len() <= MAX_REASON && cut.len() >= MAX_REASON - 1,
            "{}",
            cut.len()
        );
        assert!(cut.chars().all(|c| c == 'é'));
    }

    #[test]
    fn an_evicted_slow_subscriber_is_closed_with_1013() {
        let end = SessionEnd::Evicted("too slow: lagging 30000 ms on watermark 0a".into());
        assert_eq!(
            end.close_frame(),
            (
                1013,
                "too slow: lagging 30000 ms on watermark 0a".to_string()
            )
        );
    }
}
