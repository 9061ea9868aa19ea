//! How a part that retries the change DB at its own pace says so (PROTOCOL.md §14.2): one
//! WARN when the failures begin, again at most every [`SAY_AGAIN_EVERY`] while they last, and
//! one INFO, with how long it lasted, when the change DB answers again. A part retries every
//! takeover interval or every poll, so an outage of an hour would otherwise be thousands of
//! identical lines; an outage is one event, and the log says it as one.
//!
//! Time is the runtime's (tokio's pausable clock), so a test moves it without sleeping.

use std::fmt::Display;
use std::time::Duration;

use log::{debug, error, info, warn};
use tokio::time::Instant;

use crate::changelog::types::ChangeLogError;

/// How often a failure that goes on is said again.
pub const SAY_AGAIN_EVERY: Duration = Duration::from_secs(60);

/// What [`Unreachable`] said of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    /// The first failure: a WARN.
    Began,
    /// A failure [`SAY_AGAIN_EVERY`] after the last one said: a WARN.
    Still,
    /// A failure said at debug level only.
    Quiet,
    /// The first success after failures: an INFO.
    Back,
    /// A failure that is not the change DB out of reach ([`Unreachable::failed_with`]): an
    /// ERROR, each time, and no outage begun or ended.
    Fault,
    /// A success while all is well: nothing.
    Nothing,
}

/// The failures of one part (`part` names it in each line) to reach the change DB.
#[derive(Debug)]
pub struct Unreachable {
    part: &'static str,
    /// When the failures began, while they last.
    since: Option<Instant>,
    /// When a failure was last said.
    said: Option<Instant>,
}

impl Unreachable {
    pub const fn new(part: &'static str) -> Unreachable {
        Unreachable {
            part,
            since: None,
            said: None,
        }
    }

    /// An attempt failed with `error`; `retry` says how the part goes on ("retrying every 1s").
    pub fn failed(&mut self, error: &dyn Display, retry: &str) -> Said {
        let now = Instant::now();
        let Some(since) = self.since else {
            self.since = Some(now);
            self.said = Some(now);
            warn!(
                "{}: {error}; {retry} (said again every {SAY_AGAIN_EVERY:?} while it lasts)",
                self.part
            );
            return Said::Began;
        };
        if self.said.is_none_or(|s| now - s >= SAY_AGAIN_EVERY) {
            self.said = Some(now);
            warn!(
                "{}: still failing after {:?}: {error}; {retry}",
                self.part,
                now - since
            );
            return Said::Still;
        }
        debug!("{}: {error}", self.part);
        Said::Quiet
    }

    /// An attempt failed with a change log's `error`: said as an outage ([`Unreachable::failed`])
    /// when it is the change DB out of reach ([`ChangeLogError::is_unreachable`]), else as an
    /// ERROR of its own each time, leaving the outage's state as it was (PROTOCOL.md §14.2).
    pub fn failed_with(&mut self, error: &ChangeLogError, retry: &str) -> Said {
        if error.is_unreachable() {
            return self.failed(error, retry);
        }
        error!("{}: {error}; {retry}", self.part);
        Said::Fault
    }

    /// An attempt succeeded.
    pub fn answered(&mut self) -> Said {
        match self.since.take() {
            Some(since) => {
                self.said = None;
                info!(
                    "{}: the change DB answers again, after {:?} of failures",
                    self.part,
                    since.elapsed()
                );
                Said::Back
            }
            None => Said::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_outage_is_said_once_again_every_minute_and_once_when_it_ends() {
        let mut u = Unreachable::new("test");
        assert_eq!(u.answered(), Said::Nothing);
        assert_eq!(u.failed(&"refused", "retrying"), Said::Began);
        let mut said = Vec::new();
        // A failure every second for 150 s.
        for _ in 0..150 {
            tokio::time::advance(Duration::from_secs(1)).await;
            said.push(u.failed(&"refused", "retrying"));
        }
        let loud: Vec<usize> = said
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != Said::Quiet)
            .map(|(i, _)| i + 1)
            .collect();
        assert_eq!(loud, vec![60, 120], "said again at 60 s and 120 s only");
        assert_eq!(said[59], Said::Still);
        assert_eq!(u.answered(), Said::Back);
        assert_eq!(u.answered(), Said::Nothing);
        // The next outage is a new event.
        assert_eq!(u.failed(&"refused", "retrying"), Said::Began);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fault_that_is_not_the_change_db_out_of_reach_is_said_each_time_and_is_no_outage() {
        let mut u = Unreachable::new("test");
        let corrupt = ChangeLogError::Corrupt("x".into());
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(1)).await;
            assert_eq!(u.failed_with(&corrupt, "retrying"), Said::Fault);
        }
        // No outage began, so none ends.
        assert_eq!(u.answered(), Said::Nothing);
        // A fault inside an outage neither ends it nor is silenced by it.
        assert_eq!(u.failed(&"refused", "retrying"), Said::Began);
        assert_eq!(u.failed_with(&corrupt, "retrying"), Said::Fault);
        assert_eq!(u.failed(&"refused", "retrying"), Said::Quiet);
        assert_eq!(u.answered(), Said::Back);
    }
}
