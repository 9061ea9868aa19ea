//! The follower: a serving standby's stand-in for the upstream client (PROTOCOL.md §14.1). It
//! feeds the standby's [`Streamer`] the transactions the owner stores in the shared change DB,
//! in order, so that the standby's subscribers get them live exactly as the owner's get them
//! from upstream, while only the owner ingests.
//!
//! ### Reading what the owner committed
//! The owner announces each commit group's last watermark ([`CommitFeed`]); the follower
//! reads the rows after the last one it handed on, up to the newest watermark announced, at
//! most once per [`READ_GAP`] ([`pace`]: what a standby costs the change DB on the owner's
//! host is one read per gap, not one per commit group), and passes them to the
//! streamer as upstream messages ([`UpstreamBatch`]) of a streamer that forwards without storing
//! ([`Streamer::following`]). Notices only say *when* to read: at every [`POLL_EVERY`], and
//! whenever its listening connection is made anew, it also asks the change DB what its newest
//! commit is, so a lost notice costs at most that much latency, never a transaction. Rows are
//! read in the order they were stored, a transaction's rows committed together, so what it
//! hands on is whole transactions with no gap and no duplicate.
//!
//! ### The owner never waits for a standby
//! Flow control stays within the instance: a tracked send makes the follower wait for its
//! release before it reads on, as the upstream client does, but what the owner ingests is
//! already durable, so the owner goes on at its own pace and the standby catches up from the
//! change DB.
//!
//! ### At a takeover
//! The follower is stopped where it stands; the streamer, told to ingest (`streamer::Ingest`),
//! has its subscribers read whatever it had not been handed yet from the change log, so the
//! takeover waits for no read.
//!
//! ### A purge past the follower
//! The owner's purge never passes a subscriber this standby records (PROTOCOL.md §14.1), and the
//! follower is ahead of all of them. With no subscriber, the owner may purge past the follower;
//! and a standby cut off from the change DB for longer than it takes to be gone no longer holds
//! anything back. Both show as a follower position older than the oldest row stored: it then
//! closes whatever subscribers the standby has (they reconnect and catch up from the change DB,
//! or learn that their watermark is too old) and goes on from the newest commit ([`Rebase`]).
//! Its reads find it out themselves: a standby's read fails with
//! [`ChangeLogError::PurgedPast`] when the oldest row stored is past where it read from.
//!
//! ### Stage `follower` of the standby's stall watch
//! It reports as stage `follower` (PROTOCOL.md §11.1) through a [`StallReport`]: pending from the
//! moment it asks the change DB anything (listening, its poll of the newest commit, a read) or
//! learns of a commit it has not handed on; progress at each read answered and each batch its
//! streamer takes; idle once an answered question shows it handed on every commit it knows of.
//! A question that fails or times out is no progress: a silent change DB is a stalled follower
//! once `--stall-alarm-ms` passed, whatever the change DB's timeouts (§14.2).

mod pace;

use std::time::Duration;

use actix::prelude::*;
use log::{error, info, warn};
use tokio::sync::oneshot;

use crate::changelog::{ChangeKind, ChangeLog, ChangeLogError, CommitFeed, LogStats, StoredChange};
use crate::stall::StallReport;
use crate::streamer::{Rebase, Streamer, UpstreamBatch};
use crate::unreachable::Unreachable;
use crate::upstream::protocol::UpstreamMessage;
use crate::watermark::Watermark;

use self::pace::ReadPace;
pub use self::pace::READ_GAP;

/// How often the follower asks the change DB for its newest commit, notices or not.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// Rows read at a time.
const READ_ROWS: usize = 2000;

/// The running follower.
pub struct FollowerHandle {
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<()>>,
}

impl FollowerHandle {
    /// Stops reading and waits for the task to end. What the streamer had not been handed yet
    /// its subscribers read from the change log (a takeover: `streamer::Ingest`).
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            let _ = d.await;
        }
    }
}

/// Starts following the change DB at `url` on the current actix runtime, through `log` (a
/// standby's handle on it), feeding `streamer`, from after `last_commit`: the newest commit the
/// streamer knew when it started.
pub fn start(
    url: String,
    log: ChangeLog,
    streamer: Addr<Streamer>,
    last_commit: Option<Watermark>,
) -> FollowerHandle {
    start_reporting(url, log, streamer, last_commit, StallReport::default())
}

/// [`start`], reporting to a stall watch as `stall` says (stage `follower`, PROTOCOL.md §11.1).
pub fn start_reporting(
    url: String,
    log: ChangeLog,
    streamer: Addr<Streamer>,
    last_commit: Option<Watermark>,
    stall: StallReport,
) -> FollowerHandle {
    let (stop_tx, stop_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    actix_rt::spawn(async move {
        let follower = Follower {
            url,
            log,
            streamer,
            at: Position::after(last_commit),
            newest: None,
            unreachable: Unreachable::new("follower: reading the change DB"),
            stall,
        };
        follower.run(stop_rx).await;
        let _ = done_tx.send(());
    });
    FollowerHandle {
        stop: Some(stop_tx),
        done: Some(done_rx),
    }
}

/// Where the follower stands in the change log.
#[derive(Debug, Clone)]
struct Position {
    /// The last row handed to the streamer, `(watermark, pos)`.
    after: (Watermark, i64),
    /// The last commit handed on (where a transaction cut short is read again from).
    last_commit: Option<Watermark>,
    /// The last row handed on was not a commit: the rest of its transaction is still to come.
    in_txn: bool,
}

impl Position {
    fn after(last_commit: Option<Watermark>) -> Position {
        Position {
            after: Self::past(last_commit.as_ref()),
            last_commit,
            in_txn: false,
        }
    }

    /// The position just past commit `w`'s rows (before every row with no commit).
    fn past(w: Option<&Watermark>) -> (Watermark, i64) {
        match w {
            Some(w) => (w.clone(), i64::MAX),
            None => (Watermark::from_u64(0), -1),
        }
    }

    /// Whether the change DB holds rows past this position, up to `newest`.
    fn behind(&self, newest: Option<&Watermark>) -> bool {
        newest.is_some_and(|n| *n > self.after.0 || self.in_txn)
    }
}

/// Why following stopped for now.
enum Pause {
    /// Asked to stop, or the streamer is gone: the follower ends.
    End,
    /// Reading failed: try again at the next poll.
    Retry,
}

struct Follower {
    url: String,
    log: ChangeLog,
    streamer: Addr<Streamer>,
    at: Position,
    /// The newest commit known to be durable in the change DB.
    newest: Option<Watermark>,
    /// Its reads' failures, said once per outage (PROTOCOL.md §14.2).
    unreachable: Unreachable,
    /// Its reports to the standby's stall watch (see the module documentation).
    stall: StallReport,
}

impl Follower {
    /// Follows until asked to stop or the streamer is gone.
    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        info!(
            "following the owner's commits in change DB {} after watermark={:?}",
            self.log.location(),
            self.at.last_commit
        );
        let mut notices: Option<CommitFeed> = None;
        let mut said_unreachable = false;
        let mut poll = actix_rt::time::interval(POLL_EVERY);
        let mut pace = ReadPace::new(READ_GAP);
        loop {
            if notices.is_none() {
                self.stall.pending();
                let listened = tokio::select! {
                    _ = &mut stop => return,
                    listened = CommitFeed::listen(&self.url) => listened,
                };
                match listened {
                    Ok(n) => {
                        notices = Some(n);
                        said_unreachable = false;
                        // Notices sent before this connection listened were missed.
                        if self.check(&mut stop).await.is_err() {
                            return;
                        }
                    }
                    Err(e) if !said_unreachable => {
                        warn!("follower: cannot listen for the owner's commits (polling every {POLL_EVERY:?} meanwhile): {e}");
                        said_unreachable = true;
                    }
                    Err(_) => {}
                }
            }
            if self.at.behind(self.newest.as_ref()) {
                // Reads paced (PROTOCOL.md §14.1): up to the newest commit announced by then.
                let at = pace.next_read(actix_rt::time::Instant::now());
                if at > actix_rt::time::Instant::now() {
                    tokio::select! {
                        _ = &mut stop => return,
                        _ = actix_rt::time::sleep_until(at) => {}
                    }
                    if let Some(n) = notices.as_mut() {
                        self.saw(n.newest_now());
                    }
                }
                pace.reading(actix_rt::time::Instant::now());
            }
            match self.catch_up(&mut stop).await {
                Ok(()) | Err(Pause::Retry) => {}
                Err(Pause::End) => return,
            }
            let notice = async {
                match notices.as_mut() {
                    Some(n) => n.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stop => return,
                w = notice => match w {
                    Some(w) => self.saw(Some(w)),
                    None => {
                        warn!("follower: the listening connection ended; listening anew");
                        notices = None;
                    }
                },
                _ = poll.tick() => {
                    if self.check(&mut stop).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// `w` is durable in the change DB.
    fn saw(&mut self, w: Option<Watermark>) {
        if w > self.newest {
            self.newest = w;
        }
    }

    /// Asks the change DB for its range: the newest commit, and whether a purge went past
    /// this follower (see the module documentation).
    async fn check(&mut self, stop: &mut oneshot::Receiver<()>) -> Result<(), ()> {
        self.stall.pending();
        let stats = tokio::select! {
            _ = &mut *stop => return Err(()),
            stats = self.log.stats() => stats,
        };
        match stats {
            Ok(stats) => {
                self.unreachable.answered();
                self.saw(stats.max_watermark.clone());
                self.rebase_if_purged_past(&stats).await?;
                self.idle_if_caught_up();
                Ok(())
            }
            Err(e) => {
                self.unreachable
                    .failed_with(&e, "asking its range again at the next poll");
                Ok(())
            }
        }
    }

    async fn rebase_if_purged_past(&mut self, stats: &LogStats) -> Result<(), ()> {
        let (Some(min), Some(max)) = (&stats.min_watermark, &stats.max_watermark) else {
            return Ok(());
        };
        let passed = match &self.at.last_commit {
            Some(last) => last < min,
            // Nothing handed on yet: rows were purged before this follower read any.
            None => stats.replica_version.as_ref() < Some(min),
        };
        if !passed {
            return Ok(());
        }
        warn!(watermark:% = max;
            "follower: the change log was purged past watermark={:?} (oldest row now watermark={min}); going on from watermark={max}",
            self.at.last_commit
        );
        let rebase = Rebase {
            last_commit: max.clone(),
        };
        if self.streamer.send(rebase).await.is_err() {
            return Err(());
        }
        self.at = Position::after(Some(max.clone()));
        Ok(())
    }

    /// An answered question showed it handed on every commit it knows of: nothing waits on it
    /// (PROTOCOL.md §11.1).
    fn idle_if_caught_up(&self) {
        if !self.at.behind(self.newest.as_ref()) {
            self.stall.idle();
        }
    }

    /// Hands the streamer every row up to the newest known commit. Idle once a read shows it
    /// did; having asked nothing, it leaves the stage as it was (pending after a failed check).
    async fn catch_up(&mut self, stop: &mut oneshot::Receiver<()>) -> Result<(), Pause> {
        let mut answered = false;
        while self.at.behind(self.newest.as_ref()) {
            let Some(up_to) = self.newest.clone() else {
                return Ok(());
            };
            self.stall.pending();
            let read = self.log.read(self.at.after.clone(), up_to, READ_ROWS);
            let rows = tokio::select! {
                _ = &mut *stop => return Err(Pause::End),
                rows = read => rows,
            };
            let rows = match rows {
                Ok(rows) => rows,
                Err(ChangeLogError::PurgedPast { .. }) => {
                    // Where it stood is gone: the check rebases.
                    return match self.check(stop).await {
                        Ok(()) => Err(Pause::Retry),
                        Err(()) => Err(Pause::End),
                    };
                }
                Err(e) => {
                    self.unreachable
                        .failed_with(&e, "reading again at the next poll");
                    return Err(Pause::Retry);
                }
            };
            if rows.is_empty() {
                // The newest commit's rows are not there: it was purged (the next check
                // rebases) or the notice was ahead of what this connection sees yet.
                return Ok(());
            }
            self.stall.progress();
            answered = true;
            self.hand_on(rows, stop).await?;
        }
        if answered {
            self.idle_if_caught_up();
        }
        Ok(())
    }

    /// Passes `rows` to the streamer, waiting out each tracked send's release. The position
    /// moves with every message the streamer took, so that wherever it stops (a stop while a
    /// tracked send waits) reading on starts with the first message not taken.
    async fn hand_on(
        &mut self,
        rows: Vec<StoredChange>,
        stop: &mut oneshot::Receiver<()>,
    ) -> Result<(), Pause> {
        let mut positions = Vec::with_capacity(rows.len());
        let mut messages = Vec::with_capacity(rows.len());
        for row in rows {
            positions.push((row.watermark.clone(), row.pos, row.kind));
            messages.push(message(row));
        }
        let mut positions = positions.into_iter();
        while !messages.is_empty() {
            let sent = self.streamer.send(UpstreamBatch(messages));
            let reply = tokio::select! {
                _ = &mut *stop => return Err(Pause::End),
                reply = sent => reply,
            };
            let reply = match reply {
                Ok(Ok(reply)) => reply,
                Ok(Err(violation)) => {
                    // Stored transactions are whole: this is a corrupt change log. The
                    // streamer rolled the transaction back; read it again from its start.
                    error!(
                        "follower: the change DB's rows broke a transaction's rules: {violation}"
                    );
                    self.at = Position::after(self.at.last_commit.clone());
                    return Err(Pause::Retry);
                }
                Err(_) => return Err(Pause::End), // the streamer stopped
            };
            self.stall.progress();
            for (watermark, pos, kind) in positions.by_ref().take(reply.consumed) {
                self.at.in_txn = kind != ChangeKind::Commit;
                if !self.at.in_txn {
                    self.at.last_commit = Some(watermark.clone());
                }
                self.at.after = (watermark, pos);
            }
            messages = reply.rest;
            if let Some(release) = reply.release {
                tokio::select! {
                    _ = &mut *stop => return Err(Pause::End),
                    _ = release => {}
                }
                self.stall.progress();
            }
        }
        Ok(())
    }
}

/// A stored row as the upstream message it was.
fn message(row: StoredChange) -> UpstreamMessage {
    match row.kind {
        ChangeKind::Begin => UpstreamMessage::Begin {
            payload: row.json.to_string(),
            commit_watermark: row.watermark,
            skip_ack: true,
        },
        ChangeKind::Data => UpstreamMessage::Data {
            payload: row.json.to_string(),
        },
        ChangeKind::Commit => UpstreamMessage::Commit {
            payload: row.json.to_string(),
            watermark: row.watermark,
        },
    }
}
