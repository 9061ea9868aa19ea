//! What the soak checks on every subscriber's stream (PROTOCOL.md §7): after subscribing at
//! watermark `W`, every later transaction exactly once, in order, whole (its `begin`, the
//! [`rows`] inserts the source sent, its `commit`); a live transaction may end in a `rollback`
//! and then comes again. Gaps, duplicates and malformed transactions are counted, never fatal,
//! so the soak runs on and reports them.

use std::cell::Cell;

use change_streamer_test_support::upstream::insert;
use serde_json::Value;

use crate::source::{num, rows};

/// Totals over every stream the soak read.
#[derive(Default)]
pub struct Tally {
    /// Transactions received whole (resumed ones counted again).
    pub commits: Cell<u64>,
    /// Transactions missing: a `begin` above the next one expected (the count skipped).
    pub gaps: Cell<u64>,
    /// Transactions received again on the same stream: a `begin` at or below the last commit.
    pub duplicates: Cell<u64>,
    /// Transactions whose inserts or watermarks were not what the source sent.
    pub malformed: Cell<u64>,
    /// The first few problems, for the report.
    pub first_problems: std::cell::RefCell<Vec<String>>,
}

impl Tally {
    fn problem(&self, what: &Cell<u64>, n: u64, text: String) {
        what.set(what.get() + n);
        let mut p = self.first_problems.borrow_mut();
        if p.len() < 20 {
            log::error!("{text}");
            p.push(text);
        }
    }
}

/// One stream's state: the next transaction it must see and the one open.
pub struct StreamCheck {
    pub who: String,
    /// The last commit received (the subscribe watermark before any).
    pub last: u64,
    open: Option<(u64, u64)>,
}

impl StreamCheck {
    pub fn new(who: String, from: u64) -> StreamCheck {
        StreamCheck {
            who,
            last: from,
            open: None,
        }
    }

    /// Checks one payload; returns the commit's watermark when it ends a transaction.
    pub fn feed(&mut self, p: &Value, tally: &Tally) -> Option<u64> {
        match p[0].as_str() {
            Some("status") => None,
            Some("begin") => {
                self.begin(p, tally);
                None
            }
            Some("data") => {
                self.data(p, tally);
                None
            }
            Some("rollback") => {
                self.open = None;
                None
            }
            Some("commit") => self.commit(p, tally),
            _ => {
                let who = &self.who;
                tally.problem(&tally.malformed, 1, format!("{who}: unexpected {p}"));
                None
            }
        }
    }

    /// A `begin`: the next transaction after the last commit, none open.
    fn begin(&mut self, p: &Value, tally: &Tally) {
        let who = &self.who;
        let b = p[2]["commitWatermark"].as_str().and_then(num);
        let Some(b) = b else {
            tally.problem(
                &tally.malformed,
                1,
                format!("{who}: begin without watermark: {p}"),
            );
            return;
        };
        if self.open.is_some() {
            tally.problem(
                &tally.malformed,
                1,
                format!("{who}: begin {b} inside a transaction"),
            );
        }
        if b <= self.last {
            tally.problem(
                &tally.duplicates,
                1,
                format!("{who}: begin {b} after commit {} (duplicate)", self.last),
            );
        } else if b > self.last + 1 {
            tally.problem(
                &tally.gaps,
                b - self.last - 1,
                format!("{who}: begin {b} after commit {} (gap)", self.last),
            );
        }
        self.open = Some((b, 0));
    }

    /// A `data`: the open transaction's next insert, as the source sent it.
    fn data(&mut self, p: &Value, tally: &Tally) {
        let who = &self.who;
        match &mut self.open {
            Some((b, seen)) => {
                let want: Value =
                    serde_json::from_str(&insert(*b * 1000 + *seen)).unwrap_or_default();
                if p[1] != want {
                    tally.problem(
                        &tally.malformed,
                        1,
                        format!("{who}: txn {b} change {seen} is {}", p[1]),
                    );
                }
                *seen += 1;
            }
            None => tally.problem(
                &tally.malformed,
                1,
                format!("{who}: data outside a transaction"),
            ),
        }
    }

    /// A `commit`: the open transaction's, with all its rows; its watermark.
    fn commit(&mut self, p: &Value, tally: &Tally) -> Option<u64> {
        let who = &self.who;
        let c = p[2]["watermark"].as_str().and_then(num);
        match (self.open.take(), c) {
            (Some((b, seen)), Some(c)) if b == c => {
                if seen != rows(c) {
                    tally.problem(
                        &tally.malformed,
                        1,
                        format!("{who}: txn {c} had {seen} of {} changes", rows(c)),
                    );
                }
                self.last = self.last.max(c);
                tally.commits.set(tally.commits.get() + 1);
                Some(c)
            }
            (open, _) => {
                tally.problem(
                    &tally.malformed,
                    1,
                    format!("{who}: commit {p} with open {open:?}"),
                );
                None
            }
        }
    }
}
