//! Is the change source still there? The service's pings and its judgement of silence on one
//! connection (PROTOCOL.md §4, "Liveness").
//!
//! Every ping interval the connection is checked: nothing heard from the source (no pong, no
//! frame of any kind) for two intervals is a silence that ends it; otherwise a ping goes out.
//! Only time spent reading counts: the session calls [`Liveness::resumed`] when it reads again
//! after a pause of its own (a tracked send waiting, a batch handed over), so that a pause is
//! never taken for the source's silence. A check that runs more than an interval late (the
//! service itself held up) pings and gives the source another interval instead of judging it,
//! as §5 does for subscribers.
//!
//! The clock is tokio's (`tokio::time::Instant`), so a test that pauses time drives it.

use std::time::Duration;

use tokio::time::Instant;

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Heard from within two intervals: send a ping.
    Ping,
    /// Nothing heard for this long (at least two intervals): end the connection.
    Silent(Duration),
}

/// One connection's liveness state.
#[derive(Debug)]
pub struct Liveness {
    interval: Duration,
    /// When something last arrived from the source, or reading last resumed.
    heard: Instant,
    /// When the next check is due.
    due: Instant,
}

impl Liveness {
    /// A connection that has just been made: the first check is one interval away.
    pub fn new(interval: Duration) -> Liveness {
        let now = Instant::now();
        Liveness {
            interval,
            heard: now,
            due: now + interval,
        }
    }

    /// Something arrived from the source.
    pub fn heard(&mut self) {
        self.heard = Instant::now();
    }

    /// Reading resumes after a pause of the service's own: the silence counts from now.
    pub fn resumed(&mut self) {
        self.heard = Instant::now();
    }

    /// When the next check is due (for `sleep_until`).
    pub fn due(&self) -> Instant {
        self.due
    }

    /// The longest a write to the source may take, and a connect: two intervals.
    pub fn limit(&self) -> Duration {
        self.interval * 2
    }

    /// How long nothing has been heard.
    pub fn silence(&self) -> Duration {
        Instant::now().saturating_duration_since(self.heard)
    }

    /// The check due now; schedules the next one an interval on.
    pub fn check(&mut self) -> Check {
        let now = Instant::now();
        let late = now.saturating_duration_since(self.due);
        self.due = now + self.interval;
        if late > self.interval {
            // Held up ourselves: give the source another interval from now.
            self.heard = self.heard.max(now - self.interval);
        }
        let silence = now.saturating_duration_since(self.heard);
        if silence >= self.limit() {
            Check::Silent(silence)
        } else {
            Check::Ping
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const I: Duration = Duration::from_millis(100);

    #[tokio::test(start_paused = true)]
    async fn nothing_heard_for_two_intervals_is_a_silence() {
        let mut l = Liveness::new(I);
        tokio::time::sleep_until(l.due()).await;
        assert_eq!(l.check(), Check::Ping);
        tokio::time::sleep_until(l.due()).await;
        assert_eq!(l.check(), Check::Silent(I * 2));
    }

    #[tokio::test(start_paused = true)]
    async fn anything_heard_between_checks_keeps_it_alive() {
        let mut l = Liveness::new(I);
        for _ in 0..10 {
            tokio::time::sleep_until(l.due()).await;
            assert_eq!(l.check(), Check::Ping);
            l.heard();
        }
        tokio::time::sleep_until(l.due()).await;
        assert_eq!(l.check(), Check::Ping);
        tokio::time::sleep_until(l.due()).await;
        assert!(matches!(l.check(), Check::Silent(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_of_the_service_is_not_the_sources_silence() {
        let mut l = Liveness::new(I);
        // Not reading for five intervals (a tracked send waiting), then reading again.
        tokio::time::sleep(I * 5).await;
        l.resumed();
        tokio::time::sleep(I / 2).await;
        assert_eq!(l.check(), Check::Ping);
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_check_pings_and_gives_another_interval() {
        let mut l = Liveness::new(I);
        tokio::time::sleep(I * 4).await;
        assert_eq!(l.check(), Check::Ping, "three intervals late: not judged");
        tokio::time::sleep_until(l.due()).await;
        assert_eq!(l.check(), Check::Silent(I * 2));
    }
}
