//! The injected clock.
//!
//! Every rule of the backup monitor is a comparison of wall-clock times: a backup is due once
//! `backedUpAt <= now - cleanupDelay`, a reservation's held time is `now - start`. The actors
//! read "now" from a [`Clock`] handed to them at construction instead of calling
//! `SystemTime::now()` themselves, so tests (and the differential replay) can move time by hand
//! and replay the seed's scenarios to the millisecond without sleeping.
//!
//! Timers (the poll interval, the purge delay, the flow-control padding) run on the runtime's
//! clock (tokio time, through actix's `run_later`/`run_interval`), and the streamer's and
//! purger's "now" is read from the same clock (`tokio::time::Instant`): a test pauses it with
//! `tokio::time::pause()` and moves it with `advance()` instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of "now", in milliseconds since the unix epoch.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The machine's wall clock.
    #[default]
    System,
    /// A clock that only moves when told to; clones share the same time.
    Manual(Arc<AtomicI64>),
}

impl Clock {
    /// A manual clock starting at `start_ms`.
    pub fn manual(start_ms: i64) -> Clock {
        Clock::Manual(Arc::new(AtomicI64::new(start_ms)))
    }

    /// Milliseconds since the unix epoch.
    pub fn now_ms(&self) -> i64 {
        match self {
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
            Clock::Manual(t) => t.load(Ordering::SeqCst),
        }
    }

    /// Sets a manual clock; a no-op on the system clock.
    pub fn set_ms(&self, ms: i64) {
        if let Clock::Manual(t) = self {
            t.store(ms, Ordering::SeqCst);
        }
    }

    /// Moves a manual clock forward by `ms`; a no-op on the system clock.
    pub fn advance_ms(&self, ms: i64) {
        if let Clock::Manual(t) = self {
            t.fetch_add(ms, Ordering::SeqCst);
        }
    }
}

/// Formats unix milliseconds as an RFC 3339 UTC timestamp (`2025-04-24T00:00:00.000Z`).
pub fn format_rfc3339_ms(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, milli) = (
        rem / 3_600_000,
        (rem / 60_000) % 60,
        (rem / 1000) % 60,
        rem % 1000,
    );
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day), after Howard Hinnant's
/// well-known `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = Clock::manual(1000);
        let c2 = c.clone();
        assert_eq!(c.now_ms(), 1000);
        c2.advance_ms(500);
        assert_eq!(c.now_ms(), 1500);
        c.set_ms(7);
        assert_eq!(c2.now_ms(), 7);
    }

    #[test]
    fn formats_rfc3339() {
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_rfc3339_ms(1_745_452_800_000),
            "2025-04-24T00:00:00.000Z"
        );
        assert_eq!(
            format_rfc3339_ms(1_745_456_444_765),
            "2025-04-24T01:00:44.765Z"
        );
        assert_eq!(
            format_rfc3339_ms(951_782_400_000),
            "2000-02-29T00:00:00.000Z"
        );
    }
}
