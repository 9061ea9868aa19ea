//! When each transaction left for the service: written by the change source (one thread), read
//! by the subscriber threads on every commit they receive, for its latency. A table of
//! lazily allocated chunks of atomics, so that neither side ever takes a lock and a reader
//! never sees a half-grown vector; chunks are never freed or moved while the run lasts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Entries per chunk (512 KiB of atomics).
const CHUNK: usize = 1 << 16;
/// Chunks at most: 2^28 transactions, 3.7 hours at 20,000 txns/s; later ones are not timed.
const CHUNKS: usize = 1 << 12;

/// Nanoseconds after the run's start at which transaction number `i` (from the first) was
/// sent; 0 = not sent (yet).
pub struct SentTimes {
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
}

impl SentTimes {
    pub fn new() -> Self {
        SentTimes {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Notes that transaction `i` was sent `ns` after the start (a resend overwrites).
    pub fn set(&self, i: usize, ns: u64) {
        let Some(slot) = self.chunks.get(i / CHUNK) else {
            return;
        };
        let chunk = slot.get_or_init(|| (0..CHUNK).map(|_| AtomicU64::new(0)).collect());
        chunk[i % CHUNK].store(ns, Ordering::Release);
    }

    /// When transaction `i` was sent, if it was.
    pub fn get(&self, i: usize) -> Option<u64> {
        let chunk = self.chunks.get(i / CHUNK)?.get()?;
        Some(chunk[i % CHUNK].load(Ordering::Acquire)).filter(|&t| t > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn times_cross_chunks_and_threads() {
        let sent = Arc::new(SentTimes::new());
        let writer = {
            let sent = sent.clone();
            std::thread::spawn(move || {
                for i in CHUNK - 2..CHUNK + 2 {
                    sent.set(i, i as u64 + 1);
                }
            })
        };
        writer.join().unwrap();
        for i in CHUNK - 2..CHUNK + 2 {
            assert_eq!(sent.get(i), Some(i as u64 + 1));
        }
        assert_eq!(sent.get(CHUNK + 2), None);
        assert_eq!(sent.get(3 * CHUNK), None);
        // Past the table: not timed, and no panic.
        sent.set(CHUNK * CHUNKS, 5);
        assert_eq!(sent.get(CHUNK * CHUNKS), None);
    }
}
