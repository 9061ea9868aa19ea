//! What the subscribers of one thread received: running counters the main thread reads at its
//! two snapshots ([`Counters`]), and the latencies and longest gap of the measured window,
//! kept inside the thread ([`Tally`]) and handed over once the run stops ([`Received`]), to
//! be merged with the other threads' before any percentile is taken.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::scan::Contents;

/// One counter alone on its cache lines, so that two threads' counters never share one.
#[repr(align(128))]
#[derive(Default)]
pub struct Line(AtomicU64);

impl Line {
    /// Adds `n`. Only the owning thread writes a counter, so a plain load and store do (no
    /// locked instruction on the hot path); the main thread's reads see a recent value.
    pub fn add(&self, n: u64) {
        self.0
            .store(self.0.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One thread's running counts, over all its subscribers.
pub struct Counters {
    /// Frames, messages (payloads), `data` changes and commits received.
    pub frames: Line,
    pub msgs: Line,
    pub changes: Line,
    pub commits: Line,
    /// `data` changes per service address (the index in `--service`'s list).
    pub service_changes: Box<[Line]>,
    /// Churning joiners (`--churn-subs`): subscribed, left when told, left having received no
    /// transaction; and the commits and `data` changes they received.
    pub churn_joins: Line,
    pub churn_leaves: Line,
    pub churn_empty: Line,
    pub churn_commits: Line,
    pub churn_changes: Line,
}

impl Counters {
    pub fn new(services: usize) -> Self {
        Counters {
            frames: Line::default(),
            msgs: Line::default(),
            changes: Line::default(),
            commits: Line::default(),
            service_changes: (0..services).map(|_| Line::default()).collect(),
            churn_joins: Line::default(),
            churn_leaves: Line::default(),
            churn_empty: Line::default(),
            churn_commits: Line::default(),
            churn_changes: Line::default(),
        }
    }
}

/// The counts of all threads at one instant, summed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub frames: u64,
    pub msgs: u64,
    pub changes: u64,
    pub commits: u64,
    pub service_changes: Vec<u64>,
    pub churn_joins: u64,
    pub churn_leaves: u64,
    pub churn_empty: u64,
    pub churn_commits: u64,
    pub churn_changes: u64,
}

impl Counts {
    pub fn sum(all: &[Arc<Counters>]) -> Self {
        let mut c = Counts::default();
        for t in all {
            c.frames += t.frames.get();
            c.msgs += t.msgs.get();
            c.changes += t.changes.get();
            c.commits += t.commits.get();
            c.churn_joins += t.churn_joins.get();
            c.churn_leaves += t.churn_leaves.get();
            c.churn_empty += t.churn_empty.get();
            c.churn_commits += t.churn_commits.get();
            c.churn_changes += t.churn_changes.get();
            if c.service_changes.len() < t.service_changes.len() {
                c.service_changes.resize(t.service_changes.len(), 0);
            }
            for (sum, n) in c.service_changes.iter_mut().zip(t.service_changes.iter()) {
                *sum += n.get();
            }
        }
        c
    }
}

/// One thread's subscribers' figures (`Rc`, that thread only: no locks).
pub struct Tally {
    pub counters: Arc<Counters>,
    /// Commit-to-receipt latencies (µs) inside the window, over all and per service address.
    latencies_us: RefCell<Vec<u32>>,
    service_latencies_us: Vec<RefCell<Vec<u32>>>,
    /// Longest receipt gap (µs) between two commits of one subscriber, inside the window.
    longest_gap_us: Cell<u64>,
    /// Light subscribers' (`--check-subs`) latencies (µs) of each frame's newest commit,
    /// inside the window: apart from the checked ones' per-commit `latencies_us`.
    light_latencies_us: RefCell<Vec<u32>>,
}

impl Tally {
    pub fn new(counters: Arc<Counters>) -> Self {
        let services = counters.service_changes.len();
        Tally {
            counters,
            latencies_us: RefCell::new(Vec::new()),
            service_latencies_us: (0..services).map(|_| RefCell::default()).collect(),
            longest_gap_us: Cell::new(0),
            light_latencies_us: RefCell::new(Vec::new()),
        }
    }

    /// What a light subscriber (`--check-subs`) read in one frame from service address
    /// `service`, counted as a checked one's messages are (one add per counter a frame).
    pub fn light_frame(&self, service: usize, got: &Contents) {
        let c = &self.counters;
        c.frames.add(1);
        c.msgs.add(got.msgs());
        c.changes.add(got.data);
        c.commits.add(got.commits);
        if let Some(s) = c.service_changes.get(service) {
            s.add(got.data);
        }
    }

    /// The latency of a frame's newest commit, read by a light subscriber.
    pub fn light_latency(&self, us: u32) {
        self.light_latencies_us.borrow_mut().push(us);
    }

    /// A `data` change from service address `service`.
    pub fn change(&self, service: usize) {
        self.counters.changes.add(1);
        if let Some(s) = self.counters.service_changes.get(service) {
            s.add(1);
        }
    }

    /// The commit-to-receipt latency of one transaction from service address `service`.
    pub fn latency(&self, service: usize, us: u32) {
        self.latencies_us.borrow_mut().push(us);
        if let Some(s) = self.service_latencies_us.get(service) {
            s.borrow_mut().push(us);
        }
    }

    pub fn gap(&self, us: u64) {
        self.longest_gap_us.set(self.longest_gap_us.get().max(us));
    }

    /// What was recorded so far, taken out (to cross to the main thread).
    pub fn take(&self) -> Received {
        Received {
            latencies_us: self.latencies_us.take(),
            service_latencies_us: self.service_latencies_us.iter().map(|l| l.take()).collect(),
            longest_gap_us: self.longest_gap_us.get(),
            light_latencies_us: self.light_latencies_us.take(),
        }
    }
}

/// The window's latencies and longest gap of one thread, or of several merged.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Received {
    pub latencies_us: Vec<u32>,
    pub service_latencies_us: Vec<Vec<u32>>,
    pub longest_gap_us: u64,
    pub light_latencies_us: Vec<u32>,
}

impl Received {
    /// The threads' figures as one: latencies pooled (percentiles come after), gap the longest.
    pub fn merge(parts: impl IntoIterator<Item = Received>) -> Self {
        let mut all = Received::default();
        for p in parts {
            all.latencies_us.extend(p.latencies_us);
            if all.service_latencies_us.len() < p.service_latencies_us.len() {
                all.service_latencies_us
                    .resize_with(p.service_latencies_us.len(), Vec::new);
            }
            for (sum, l) in all
                .service_latencies_us
                .iter_mut()
                .zip(p.service_latencies_us)
            {
                sum.extend(l);
            }
            all.longest_gap_us = all.longest_gap_us.max(p.longest_gap_us);
            all.light_latencies_us.extend(p.light_latencies_us);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_merge_into_one_report() {
        let (a, b) = (Arc::new(Counters::new(2)), Arc::new(Counters::new(2)));
        let (ta, tb) = (Tally::new(a.clone()), Tally::new(b.clone()));
        for (t, service, us, gap) in [(&ta, 0, 5, 7), (&ta, 1, 9, 3), (&tb, 1, 2, 11)] {
            t.counters.msgs.add(3);
            t.counters.frames.add(1);
            t.counters.commits.add(1);
            t.change(service);
            t.latency(service, us);
            t.gap(gap);
        }
        assert_eq!(
            Counts::sum(&[a, b]),
            Counts {
                frames: 3,
                msgs: 9,
                changes: 3,
                commits: 3,
                service_changes: vec![1, 2],
                ..Counts::default()
            }
        );
        let mut merged = Received::merge([ta.take(), tb.take()]);
        merged.latencies_us.sort_unstable();
        assert_eq!(
            merged,
            Received {
                latencies_us: vec![2, 5, 9],
                service_latencies_us: vec![vec![5], vec![9, 2]],
                longest_gap_us: 11,
                light_latencies_us: Vec::new(),
            }
        );
        // Taken out: a second take is empty.
        assert_eq!(ta.take().latencies_us, Vec::<u32>::new());
    }

    #[test]
    fn counters_of_different_threads_share_no_cache_line() {
        assert_eq!(std::mem::align_of::<Line>(), 128);
        assert_eq!(std::mem::size_of::<Line>(), 128);
    }
}
