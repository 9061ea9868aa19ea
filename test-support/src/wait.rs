//! Waiting in end-to-end tests for something the service does on its own time: poll a
//! condition until it holds, and fail, saying what was awaited, past a deadline.

use std::time::{Duration, Instant};

/// How often a condition is polled.
pub const POLL: Duration = Duration::from_millis(10);

/// How long [`crate::service::TestService::wait_status`] waits: generous, as it only matters
/// when the test fails, and the machine running the tests may be busy.
pub const STATUS_LIMIT: Duration = Duration::from_secs(20);

/// Polls `cond` every [`POLL`] until it holds; panics, naming `what`, after `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what}: not reached within {limit:?}"
        );
        actix_rt::time::sleep(POLL).await;
    }
}
