//! The PostgreSQL engine of the change log (PROTOCOL.md §14): the same commands as the SQLite engine,
//! served by a writer thread that owns the change DB and a reader thread, each with its own
//! single-threaded tokio runtime driving its own connection.
//!
//! Threads of their own, like the SQLite engine's, keep the handle the same (callers queue a
//! command and await its answer on whatever runtime they run) and keep a slow statement from
//! ever stalling the actors' runtime. The writer first becomes the owner
//! ([`crate::ownership`]): it tries the ownership lock every takeover interval until it holds
//! it, and only then creates the schema, loads the catalogue and answers commands. Once it
//! finds it no longer owns the change DB (the fence refused a write, its session ended, or the
//! idle check every takeover interval failed) it is deposed for good: it reports that on the
//! handle (`ChangeLog::deposed`), answers every later command with
//! [`ChangeLogError::NotOwner`] and never writes again.
//!
//! Files: [`connection`] (reaching the change DB), [`schema`] (tables and partitions),
//! [`state`] (the safety state's statements), [`writer`] (with [`group_statements`], what it
//! stores a commit group with), [`reader`] (with [`read_cache`], the reads it keeps),
//! [`records`]: the instance records (PROTOCOL.md §14.1), kept by every instance on a connection of its own,
//! apart from the writer and its fence; and what a standby that serves needs (PROTOCOL.md
//! §14.1): [`standby`], its read-only handle, and [`listen`], the owner's commit notices.

mod connection;
mod group_statements;
mod listen;
mod liveness;
mod read_cache;
mod reader;
mod records;
mod schema;
mod standby;
mod state;
mod writer;

use std::rc::Rc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use log::{error, info};
use tokio::sync::{oneshot, watch};
use tokio_postgres::{Client, Config};

// The change log's shared leaves, for this engine's files.
use super::{catalogue, commands, safety, txn_value, types};

use self::commands::{Ends, ReadCommand, Work, WriteCommand, WriteQueue, Writes};
use self::connection::{connect, named, redacted, runtime, with_causes, within, Bounds, Session};
pub use self::connection::{lease_for, set_lease, MIN_LEASE};
pub(super) use self::listen::CommitNotices;
use self::liveness::Probe;
pub(super) use self::records::InstanceDb;
use self::types::{ChangeLogError, SEGMENT_ROWS};
use self::writer::PgWriter;
use crate::clock::Clock;
use crate::ownership;
use crate::unreachable::Unreachable;

/// The channel on which the owner announces each commit group, with its last watermark
/// ([`listen`]).
pub(super) const COMMITS_CHANNEL: &str = "change_streamer_commits";

/// A standby's handle on the change DB at `url`: reads only ([`standby`]).
pub(super) fn open_standby(url: &str) -> Result<Ends, ChangeLogError> {
    standby::open(url)
}

/// How to reach and share a PostgreSQL change DB.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// The `postgres://` URL.
    pub url: String,
    /// How often a standby tries to become the owner, and an idle owner checks it still is.
    pub takeover_interval: Duration,
    pub segment_rows: u64,
    /// Stamps store times.
    pub clock: Clock,
    /// This instance's id in the instance records (PROTOCOL.md §14.1), so that a purge checks
    /// the records of the others only.
    pub instance: Option<String>,
}

impl PgOptions {
    pub fn new(url: impl Into<String>, takeover_interval: Duration) -> PgOptions {
        PgOptions {
            url: url.into(),
            takeover_interval,
            segment_rows: SEGMENT_ROWS,
            clock: Clock::System,
            instance: None,
        }
    }
}

/// Opens the change DB at `options.url` once this instance owns it: resolves only after this
/// instance took ownership (as a standby it tries every takeover interval) and loaded the
/// catalogue. Dropping the future gives up waiting.
pub(super) async fn open(options: PgOptions) -> Result<Ends, ChangeLogError> {
    let config: Config = options.url.parse()?;
    let location = redacted(&config);
    let (writes, wrx) = mpsc::channel();
    let (reads, rrx) = mpsc::channel();
    let (owner_tx, owner) = watch::channel(false);
    let (ready, ready_rx) = oneshot::channel();
    let engine = Engine {
        config,
        options,
        queue: WriteQueue::new(wrx),
        reads: rrx,
        ready,
        owner: owner_tx,
    };
    thread::Builder::new()
        .name("change-log-pg-writer".into())
        .spawn(move || run(engine))?;
    ready_rx.await.map_err(|_| ChangeLogError::Closed)??;
    Ok(Ends {
        writes: Writes::new(writes),
        reads,
        owner,
        location,
    })
}

/// What the writer thread needs to start.
struct Engine {
    config: Config,
    options: PgOptions,
    queue: WriteQueue,
    reads: mpsc::Receiver<ReadCommand>,
    /// Answered once this instance owns the change DB and serves commands.
    ready: oneshot::Sender<Result<(), ChangeLogError>>,
    owner: watch::Sender<bool>,
}

/// The writer thread: stand by until owner, then serve until deposed or every handle is gone.
fn run(engine: Engine) {
    let Engine {
        config,
        options,
        queue,
        reads,
        ready,
        owner,
    } = engine;
    let interval = options.takeover_interval;
    let Some((rt, writer)) = own(&config, options, reads, ready, owner) else {
        return;
    };
    serve(&rt, writer, queue, interval, &config);
}

/// Claims the change DB, loads its state and starts the reader thread; answers `ready` either
/// way. `None`: nobody waits for this instance to own the change DB any more, or it failed.
fn own(
    config: &Config,
    options: PgOptions,
    reads: mpsc::Receiver<ReadCommand>,
    ready: oneshot::Sender<Result<(), ChangeLogError>>,
    owner: watch::Sender<bool>,
) -> Option<(tokio::runtime::Runtime, PgWriter)> {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(ChangeLogError::Start(e)));
            return None;
        }
    };
    let interval = options.takeover_interval;
    // None: nobody waits for this instance to own the change DB any more.
    let client = rt.block_on(claim(&named(config, "writer"), interval, &ready))?;
    let probe = match rt.block_on(Probe::of(config, &client)) {
        Ok(p) => Rc::new(p),
        Err(e) => {
            let _ = ready.send(Err(e));
            return None;
        }
    };
    let loaded = PgWriter::load(
        client,
        probe.clone(),
        options.segment_rows,
        options.clock,
        owner,
        options.instance,
    );
    let writer = match rt.block_on(probe.heard(loaded)) {
        Ok(w) => w,
        Err(e) => {
            let _ = ready.send(Err(e));
            return None;
        }
    };
    let reader = runtime().and_then(|reader_rt| {
        let config = named(config, "reader");
        thread::Builder::new()
            .name("change-log-pg-reader".into())
            .spawn(move || reader::run(reader_rt, config, reads, reader::PurgeCheck::Owner))
    });
    if let Err(e) = reader {
        let _ = ready.send(Err(ChangeLogError::Start(e)));
        return None;
    }
    info!(
        "change DB {} owned: replicaVersion={:?} watermarks {:?}..{:?}, {} rows",
        redacted(config),
        writer.stats.replica_version,
        writer.stats.min_watermark,
        writer.stats.max_watermark,
        writer.stats.rows
    );
    writer.crown();
    ready.send(Ok(())).ok()?;
    Some((rt, writer))
}

/// Serves the queue as owner until deposed (then refuses what is left) or every handle is gone.
fn serve(
    rt: &tokio::runtime::Runtime,
    mut writer: PgWriter,
    mut queue: WriteQueue,
    interval: Duration,
    config: &Config,
) {
    // When the writer's session last spoke with the server: the server ends one it does not
    // hear from for the change DB lease (PROTOCOL.md §14.2), so an owner busy only with
    // commands answered from memory (stats, barriers) still checks every takeover interval.
    let mut heard = std::time::Instant::now();
    while let Some(work) = queue.next(Some(interval)) {
        let served = match work {
            Work::Appends(group, _) => {
                heard = std::time::Instant::now();
                rt.block_on(writer.append_group(group))
            }
            Work::Other(cmd) => rt.block_on(writer.serve(cmd)),
            Work::Idle => Ok(()),
        };
        let served = served.and_then(|()| {
            if heard.elapsed() < interval {
                return Ok(());
            }
            heard = std::time::Instant::now();
            idle_check(rt, &writer)
        });
        if served.is_err() {
            error!("deposed: stopped writing to change DB {}", redacted(config));
            writer.depose();
            drop(writer); // ends the session, and any lock it may still hold
            refuse_all(queue);
            // Every handle is gone: nothing of this ownership is left running.
            info!("deposed change log writer stopped");
            return;
        }
    }
    info!("change log writer stopped");
}

/// The idle check: `Err(())` once this writer cannot tell it still holds the ownership lock
/// (a silent change DB included).
fn idle_check(rt: &tokio::runtime::Runtime, writer: &PgWriter) -> Result<(), ()> {
    match rt.block_on(writer.still_owner()) {
        Ok(true) => Ok(()),
        Ok(false) => {
            error!("change DB: this instance no longer holds the ownership lock");
            Err(())
        }
        Err(e) => {
            error!("change DB: the idle check failed ({e}): this instance cannot tell it still owns the change DB");
            writer.depose();
            Err(())
        }
    }
}

/// Answers every command still to come with [`ChangeLogError::NotOwner`].
fn refuse_all(mut queue: WriteQueue) {
    while let Some(work) = queue.next(None) {
        let cmd = match work {
            Work::Appends(group, _) => {
                for (_, reply) in group {
                    let _ = reply.send(Err(ChangeLogError::NotOwner));
                }
                continue;
            }
            Work::Other(cmd) => cmd,
            Work::Idle => continue,
        };
        match cmd {
            WriteCommand::Append(_, r, _)
            | WriteCommand::Barrier(r)
            | WriteCommand::State(_, r) => {
                let _ = r.send(Err(ChangeLogError::NotOwner));
            }
            WriteCommand::Purge { reply, .. } => {
                let _ = reply.send(Err(ChangeLogError::NotOwner));
            }
            WriteCommand::Stats(r) => {
                let _ = r.send(Err(ChangeLogError::NotOwner));
            }
            WriteCommand::HasCommit(_, r) => {
                let _ = r.send(Err(ChangeLogError::NotOwner));
            }
            WriteCommand::LoadState(r) => {
                let _ = r.send(Err(ChangeLogError::NotOwner));
            }
        }
    }
}

/// Stands by until this session holds the ownership lock, trying every `interval` (and
/// connecting anew whenever the change DB cannot be reached). `None` once nobody waits.
async fn claim(
    config: &Config,
    interval: Duration,
    ready: &oneshot::Sender<Result<(), ChangeLogError>>,
) -> Option<Client> {
    let mut said_standby = false;
    // An outage is said once, not at every attempt (PROTOCOL.md §14.2).
    let mut unreachable = Unreachable::new("standby: owning the change DB");
    loop {
        match connect(config, Session::Writer).await {
            Ok(client) => loop {
                unreachable.answered();
                let bound = Bounds::current().call();
                match within(bound, ownership::try_acquire(&client)).await {
                    Ok(true) => return Some(client),
                    Ok(false) if !said_standby => {
                        info!(
                            "standby: change DB {} is owned by another instance; trying every {interval:?}",
                            redacted(config)
                        );
                        said_standby = true;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        let why = format!("trying to own it failed ({e})");
                        unreachable.failed(&why, &format!("connecting anew every {interval:?}"));
                        break;
                    }
                }
                if ready.is_closed() {
                    return None;
                }
                tokio::time::sleep(interval).await;
            },
            Err(e) => {
                let why = format!("{} unreachable ({})", redacted(config), with_causes(&e));
                unreachable.failed(&why, &format!("retrying every {interval:?}"));
            }
        }
        if ready.is_closed() {
            return None;
        }
        tokio::time::sleep(interval).await;
    }
}
