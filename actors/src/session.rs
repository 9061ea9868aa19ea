//! What the actors know of a websocket session: the number that names it ([`SessionId`]).
//!
//! Sessions live in the service; the actors that own their state (the streamer, the
//! reservations) know a session only by this number and by the recipient it handed them. A
//! session's later messages name its own number, so a stale session can never act on state that
//! has passed to a newer one.

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
