//! The commands both change-log engines serve, and the queue they take them from.
//!
//! A `ChangeLog` handle only queues commands on two channels: writes (and
//! everything that must see every write queued before it) to the engine's single writer, and
//! catch-up reads (and questions that need no write order, like the size on disk) to its
//! reader. The SQLite engine and the PostgreSQL engine serve the same commands with the same
//! answers; no caller learns which one it has.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::safety::{SafetyState, StateChange};
use super::types::{
    LogStats, PendingChunk, PurgeGate, PurgeOutcome, Reply, StoredChange, Transaction,
};
use crate::stall::StallReport;
use crate::watermark::Watermark;

/// How many queued appends at most share one database transaction.
const MAX_GROUP: usize = 512;

pub(super) enum WriteCommand {
    /// A transaction to store, and when it was queued (the SQLite writer tells load from a
    /// caller answering its last reply by it).
    Append(Transaction, Reply<()>, Instant),
    /// A chunk of an open transaction to store pending (PROTOCOL.md §3.0).
    Pending(PendingChunk, Reply<()>),
    /// Deletes every pending row: the open transaction was rolled back or cut off.
    DropPending(Reply<()>),
    Purge {
        before: Watermark,
        /// Only rows stored at or before this time (unix ms) may go; `None`: any age.
        stored_by_ms: Option<i64>,
        /// The subscriber rules to check in the purging transaction; `None`: none.
        gate: Option<PurgeGate>,
        reply: Reply<PurgeOutcome>,
    },
    Stats(Reply<LogStats>),
    HasCommit(Watermark, Reply<bool>),
    Barrier(Reply<()>),
    State(StateChange, Reply<()>),
    LoadState(Reply<SafetyState>),
    /// From now on the writer's queue tells the stall watch when work waits on the writer and
    /// when it is done (PROTOCOL.md §11.1); taken by [`WriteQueue::next`], never served.
    ReportStalls(StallReport),
}

/// A catch-up read: up to `limit` stored changes after `after` (exclusive) and at or below
/// `up_to`, in order, and no more once they reach `max_bytes` of downstream messages
/// ([`StoredChange::message_len`]; the change that reaches it is the last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RangeQuery {
    pub after: (Watermark, i64),
    pub up_to: Watermark,
    pub limit: usize,
    pub max_bytes: usize,
}

/// A read's answer as it is read: its rows, and whether its limits are reached.
pub(super) struct ReadRows {
    pub rows: Vec<StoredChange>,
    bytes: usize,
    limit: usize,
    max_bytes: usize,
}

impl ReadRows {
    pub fn new(query: &RangeQuery) -> ReadRows {
        ReadRows {
            rows: Vec::with_capacity(query.limit.min(4096)),
            bytes: 0,
            limit: query.limit,
            max_bytes: query.max_bytes,
        }
    }

    /// The query's limit in changes or in bytes is reached: nothing more is read.
    pub fn full(&self) -> bool {
        self.rows.len() >= self.limit || self.bytes >= self.max_bytes
    }

    /// The changes the limit in changes still leaves.
    pub fn left(&self) -> usize {
        self.limit.saturating_sub(self.rows.len())
    }

    /// The bytes the byte limit still leaves.
    pub fn bytes_left(&self) -> usize {
        self.max_bytes.saturating_sub(self.bytes)
    }

    pub fn push(&mut self, change: StoredChange) {
        self.bytes += change.message_len();
        self.rows.push(change);
    }
}

pub(super) enum ReadCommand {
    Range(RangeQuery, Reply<Vec<StoredChange>>),
    /// The bytes the change log takes on disk.
    Size(Reply<u64>),
    /// From now on the reader's queue tells the stall watch when reads wait on the reader
    /// (PROTOCOL.md §11.1); taken by [`ReadQueue::recv`], never served.
    ReportStalls(StallReport),
}

/// The reader's end of the read channel. It reports the reader as stage `catchup` (PROTOCOL.md
/// §11.1): pending from the moment it hands out a read, progress each time the reader comes
/// back for more, idle while the channel is empty.
pub(super) struct ReadQueue {
    rx: mpsc::Receiver<ReadCommand>,
    stall: StallReport,
}

impl ReadQueue {
    pub(super) fn new(rx: mpsc::Receiver<ReadCommand>) -> ReadQueue {
        ReadQueue {
            rx,
            stall: StallReport::default(),
        }
    }

    /// The next read, waiting until one comes; `None` once every handle is gone.
    pub(super) fn recv(&mut self) -> Option<ReadCommand> {
        self.stall.progress();
        loop {
            let cmd = match self.rx.try_recv() {
                Ok(c) => c,
                Err(mpsc::TryRecvError::Disconnected) => return None,
                Err(mpsc::TryRecvError::Empty) => {
                    self.stall.idle();
                    self.rx.recv().ok()?
                }
            };
            match cmd {
                ReadCommand::ReportStalls(report) => self.stall = report,
                cmd => {
                    self.stall.pending();
                    return Some(cmd);
                }
            }
        }
    }
}

/// The sending side of an engine's write queue. An engine whose writer waits out a commit window between
/// appends (SQLite's group commit) gives the writer's thread, so that every command but an
/// append ends that wait: a purge or a barrier is not held back by a window meant for appends.
#[derive(Clone)]
pub(super) struct Writes {
    tx: mpsc::Sender<WriteCommand>,
    windowed_writer: Option<thread::Thread>,
}

impl Writes {
    /// A queue whose writer takes each command as it arrives.
    pub fn new(tx: mpsc::Sender<WriteCommand>) -> Writes {
        Writes {
            tx,
            windowed_writer: None,
        }
    }

    /// A queue whose writer, on `thread`, may be sleeping out a commit window.
    pub fn windowed(tx: mpsc::Sender<WriteCommand>, thread: thread::Thread) -> Writes {
        Writes {
            tx,
            windowed_writer: Some(thread),
        }
    }

    /// Queues `cmd`; `false` once the writer is gone.
    pub fn send(&self, cmd: WriteCommand) -> bool {
        let append = matches!(cmd, WriteCommand::Append(..));
        let queued = self.tx.send(cmd).is_ok();
        if let Some(writer) = self.windowed_writer.as_ref().filter(|_| !append) {
            writer.unpark();
        }
        queued
    }
}

/// What an engine hands the `ChangeLog` handle once it serves commands.
pub(super) struct Ends {
    pub writes: Writes,
    pub reads: mpsc::Sender<ReadCommand>,
    /// Whether this instance owns the change log.
    pub owner: watch::Receiver<bool>,
    /// The SQLite file, or the change DB's URL without its password, for logs.
    pub location: String,
}

/// What the writer does next.
pub(super) enum Work {
    /// Appends queued one after the other, to commit in one transaction (group commit): the
    /// fsync that makes them durable is paid once, and each caller is still answered only once
    /// its transaction is durable. With when the first of them was queued.
    Appends(Vec<(Transaction, Reply<()>)>, Instant),
    Other(WriteCommand),
    /// Nothing came within the wait (only with a timeout).
    Idle,
}

/// The writer's end of the write channel, with the one command read past a group of appends.
///
/// It reports the writer as stage `writer` (PROTOCOL.md §11.1): pending from the moment it hands
/// out work, progress each time the writer comes back for more, idle while it waits on an empty
/// channel.
pub(super) struct WriteQueue {
    rx: mpsc::Receiver<WriteCommand>,
    next: Option<WriteCommand>,
    stall: StallReport,
}

impl WriteQueue {
    pub(super) fn new(rx: mpsc::Receiver<WriteCommand>) -> WriteQueue {
        WriteQueue {
            rx,
            next: None,
            stall: StallReport::default(),
        }
    }

    /// The next piece of work, waiting at most `timeout` (`None`: until one comes); `None` once
    /// every handle is gone. Coming back for it means the work handed out before is done.
    pub(super) fn next(&mut self, timeout: Option<Duration>) -> Option<Work> {
        self.stall.progress();
        let cmd = loop {
            match self.command(timeout)? {
                Ok(WriteCommand::ReportStalls(report)) => self.stall = report,
                Ok(cmd) => break cmd,
                // The writer's periodic work (the change DB's ownership check) is work too.
                Err(idle) => {
                    self.stall.pending();
                    return Some(idle);
                }
            }
        };
        self.stall.pending();
        self.group(cmd)
    }

    /// The next command, or [`Work::Idle`] once `timeout` passed without one; idle while the
    /// channel is empty.
    fn command(&mut self, timeout: Option<Duration>) -> Option<Result<WriteCommand, Work>> {
        if let Some(c) = self.next.take() {
            return Some(Ok(c));
        }
        match self.rx.try_recv() {
            Ok(c) => return Some(Ok(c)),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) => self.stall.idle(),
        }
        Some(match timeout {
            None => Ok(self.rx.recv().ok()?),
            Some(t) => match self.rx.recv_timeout(t) {
                Ok(c) => Ok(c),
                Err(RecvTimeoutError::Timeout) => Err(Work::Idle),
                Err(RecvTimeoutError::Disconnected) => return None,
            },
        })
    }

    /// `cmd`, with the appends queued right behind it when it is one.
    fn group(&mut self, cmd: WriteCommand) -> Option<Work> {
        let WriteCommand::Append(txn, reply, queued) = cmd else {
            return Some(Work::Other(cmd));
        };
        let mut group = vec![(txn, reply)];
        while group.len() < MAX_GROUP {
            match self.rx.try_recv() {
                Ok(WriteCommand::Append(t, r, _)) => group.push((t, r)),
                Ok(other) => {
                    self.next = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        Some(Work::Appends(group, queued))
    }
}
