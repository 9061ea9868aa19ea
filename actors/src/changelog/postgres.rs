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
//! handle ([`ChangeLog::deposed`](super::ChangeLog::deposed)), answers every later command
//! with [`ChangeLogError::NotOwner`] and never writes again.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use log::{error, info, warn};
use tokio::runtime::{Builder, Runtime};
use tokio::sync::{oneshot, watch};
use tokio_postgres::{Client, Config, NoTls};

use super::commands::{ReadCommand, Work, WriteCommand, WriteQueue};
use super::postgres_reader::run_reader;
use super::postgres_writer::PgWriter;
use super::{ChangeLogError, SEGMENT_ROWS};
use crate::clock::Clock;
use crate::ownership;

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
}

impl PgOptions {
    pub fn new(url: impl Into<String>, takeover_interval: Duration) -> PgOptions {
        PgOptions {
            url: url.into(),
            takeover_interval,
            segment_rows: SEGMENT_ROWS,
            clock: Clock::System,
        }
    }
}

/// The URL without its password, for logs and `/status`.
pub(super) fn redacted(config: &Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_default();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

pub(super) fn runtime() -> std::io::Result<Runtime> {
    Builder::new_current_thread().enable_all().build()
}

/// Connects and drives the connection on the current runtime.
pub(super) async fn connect(config: &Config) -> Result<Client, ChangeLogError> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            warn!("change DB connection ended: {e}");
        }
    });
    Ok(client)
}

/// What the writer thread needs to start.
pub(super) struct Engine {
    pub config: Config,
    pub options: PgOptions,
    pub queue: WriteQueue,
    pub reads: mpsc::Receiver<ReadCommand>,
    /// Answered once this instance owns the change DB and serves commands.
    pub ready: oneshot::Sender<Result<(), ChangeLogError>>,
    pub owner: watch::Sender<bool>,
}

/// The writer thread: stand by until owner, then serve until deposed or every handle is gone.
pub(super) fn run(engine: Engine) {
    let Engine {
        config,
        options,
        mut queue,
        reads,
        ready,
        owner,
    } = engine;
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(ChangeLogError::Write(e.to_string())));
            return;
        }
    };
    let interval = options.takeover_interval;
    let Some(client) = rt.block_on(claim(&config, interval, &ready)) else {
        return; // nobody waits for this instance to own the change DB any more
    };
    let loaded = PgWriter::load(client, options.segment_rows, options.clock, owner);
    let mut writer = match rt.block_on(loaded) {
        Ok(w) => w,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let reader = runtime().and_then(|reader_rt| {
        let config = config.clone();
        thread::Builder::new()
            .name("change-log-pg-reader".into())
            .spawn(move || run_reader(reader_rt, config, reads))
    });
    if let Err(e) = reader {
        let _ = ready.send(Err(ChangeLogError::Write(e.to_string())));
        return;
    }
    info!(
        "change DB {} owned: replicaVersion={:?} watermarks {:?}..{:?}, {} rows",
        redacted(&config),
        writer.stats.replica_version,
        writer.stats.min_watermark,
        writer.stats.max_watermark,
        writer.stats.rows
    );
    writer.crown();
    if ready.send(Ok(())).is_err() {
        return;
    }
    while let Some(work) = queue.next(Some(interval)) {
        let served = match work {
            Work::Appends(group, _) => rt.block_on(writer.append_group(group)),
            Work::Other(cmd) => rt.block_on(writer.serve(cmd)),
            Work::Idle => {
                if rt.block_on(writer.still_owner()) {
                    Ok(())
                } else {
                    error!("change DB: this instance no longer holds the ownership lock");
                    Err(())
                }
            }
        };
        if served.is_err() {
            error!(
                "deposed: stopped writing to change DB {}",
                redacted(&config)
            );
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

/// `e` and its causes: tokio-postgres says only "db error" and leaves the server's message to
/// its source.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

/// Stands by until this session holds the ownership lock, trying every `interval` (and
/// connecting anew whenever the change DB cannot be reached). `None` once nobody waits.
async fn claim(
    config: &Config,
    interval: Duration,
    ready: &oneshot::Sender<Result<(), ChangeLogError>>,
) -> Option<Client> {
    let mut said_standby = false;
    loop {
        match connect(config).await {
            Ok(client) => loop {
                match ownership::try_acquire(&client).await {
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
                        warn!("standby: trying to own the change DB failed: {e}");
                        break;
                    }
                }
                if ready.is_closed() {
                    return None;
                }
                tokio::time::sleep(interval).await;
            },
            Err(e) => warn!(
                "standby: change DB {} unreachable ({}); retrying in {interval:?}",
                redacted(config),
                with_causes(&e)
            ),
        }
        if ready.is_closed() {
            return None;
        }
        tokio::time::sleep(interval).await;
    }
}
