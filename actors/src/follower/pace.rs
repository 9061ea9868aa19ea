//! How often a follower reads the owner's commits (PROTOCOL.md §14.1, "reads paced"): a read
//! starts at once when the last began [`READ_GAP`] ago or more, else once that gap is over,
//! taking every commit announced meanwhile. So a standby costs the change DB (on the owner's
//! host) at most one read per gap however many commit groups the owner stores, instead of one
//! per group (two statements and a snapshot each), for at most one gap of latency; a commit
//! after a quiet spell is read at once.

use std::time::Duration;

use tokio::time::Instant;

/// The least time between the starts of two reads of the owner's new commits.
pub const READ_GAP: Duration = Duration::from_millis(5);

/// When the follower last began reading new commits.
#[derive(Debug)]
pub struct ReadPace {
    gap: Duration,
    last: Option<Instant>,
}

impl ReadPace {
    pub fn new(gap: Duration) -> ReadPace {
        ReadPace { gap, last: None }
    }

    /// The earliest a read may begin, asked at `now`: `now` itself once the last read began a
    /// gap ago or more.
    pub fn next_read(&self, now: Instant) -> Instant {
        self.last.map_or(now, |last| (last + self.gap).max(now))
    }

    /// A read begins at `now`.
    pub fn reading(&mut self, now: Instant) {
        self.last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GAP: Duration = READ_GAP;

    #[test]
    fn reads_of_the_owners_commits_are_at_least_a_read_gap_apart() {
        let t0 = Instant::now();
        let mut pace = ReadPace::new(GAP);
        assert_eq!(pace.next_read(t0), t0, "the first read waits for nothing");
        pace.reading(t0);
        // Commits announced 1 ms and 4 ms later are read together, one gap after the first.
        let ms = Duration::from_millis;
        assert_eq!(pace.next_read(t0 + ms(1)), t0 + GAP);
        assert_eq!(pace.next_read(t0 + ms(4)), t0 + GAP);
        pace.reading(t0 + GAP);
        assert_eq!(pace.next_read(t0 + GAP + ms(1)), t0 + GAP * 2);
    }

    #[test]
    fn a_commit_after_a_quiet_spell_is_read_at_once() {
        let t0 = Instant::now();
        let mut pace = ReadPace::new(GAP);
        pace.reading(t0);
        let later = t0 + GAP + Duration::from_millis(30);
        assert_eq!(pace.next_read(later), later);
        assert_eq!(
            pace.next_read(t0 + GAP),
            t0 + GAP,
            "exactly a gap on: at once"
        );
    }
}
