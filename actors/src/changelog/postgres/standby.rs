//! The PostgreSQL engine at a standby (PROTOCOL.md §14.1): the change log as an instance that
//! does not own the change DB reads it, so that it can serve subscribers from it.
//!
//! A standby never writes the change log: what its streamer forwards is already durable there,
//! written by the owner. So its handle answers the questions a streamer asks (the stats, whether
//! a commit is stored, the durability barrier, which holds at once: every row a standby can
//! read is committed) and refuses every write with [`ChangeLogError::NotOwner`]; the owner
//! flag stays false. Two threads, like the owner's engine: one answers the write channel's
//! questions, the other is the same reader the owner has ([`super::reader`]), each on its own
//! connection, made anew after a failure.

use std::sync::mpsc;
use std::thread;

use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio_postgres::{Client, Config};

use super::commands::{Ends, WriteCommand, Writes};
use super::connection::{connect, named, redacted, runtime, within, Bounds, Session};
use super::reader::{self, PurgeCheck};
use super::safety::SafetyState;
use super::schema;
use super::state;
use super::types::{ChangeLogError, LogStats, Reply};
use crate::unreachable::Unreachable;
use crate::watermark::Watermark;

/// A standby's handle on the change DB at `url` (see the module documentation). Returns at
/// once: the change DB need not be reachable yet, nor its tables created.
pub(super) fn open(url: &str) -> Result<Ends, ChangeLogError> {
    let config: Config = url.parse()?;
    let location = redacted(&config);
    let (writes, wrx) = mpsc::channel();
    let (reads, rrx) = mpsc::channel();
    let (_, owner) = watch::channel(false);
    let reader_rt = runtime()?;
    let reader_config = named(&config, "standby-reader");
    thread::Builder::new()
        .name("change-log-pg-standby-reader".into())
        .spawn(move || reader::run(reader_rt, reader_config, rrx, PurgeCheck::Standby))?;
    let rt = runtime()?;
    thread::Builder::new()
        .name("change-log-pg-standby".into())
        .spawn(move || answer_questions(rt, named(&config, "standby"), wrx))?;
    Ok(Ends {
        writes: Writes::new(writes),
        reads,
        owner,
        location,
    })
}

/// Serves the write channel of a standby until every handle is gone.
fn answer_questions(rt: Runtime, config: Config, rx: mpsc::Receiver<WriteCommand>) {
    let mut client: Option<Client> = None;
    // An outage is said once, not at every question (PROTOCOL.md §14.2).
    let mut unreachable = Unreachable::new("standby: reading the change DB");
    while let Ok(cmd) = rx.recv() {
        let refuse = |reply: Reply<()>| {
            let _ = reply.send(Err(ChangeLogError::NotOwner));
        };
        match cmd {
            WriteCommand::Append(_, reply, _) | WriteCommand::State(_, reply) => refuse(reply),
            WriteCommand::Purge { reply, .. } => {
                let _ = reply.send(Err(ChangeLogError::NotOwner));
            }
            WriteCommand::Barrier(reply) => {
                let _ = reply.send(Ok(()));
            }
            WriteCommand::Stats(reply) => {
                let answer = with_client(&rt, &config, &mut client, |c| async move {
                    stats(&c).await.map(|s| (c, s))
                });
                send(reply, answer, &mut unreachable);
            }
            WriteCommand::HasCommit(w, reply) => {
                let answer = with_client(&rt, &config, &mut client, |c| async move {
                    has_commit(&c, &w).await.map(|s| (c, s))
                });
                send(reply, answer, &mut unreachable);
            }
            WriteCommand::LoadState(reply) => {
                let answer = with_client(&rt, &config, &mut client, |c| async move {
                    load_state(&c).await.map(|s| (c, s))
                });
                send(reply, answer, &mut unreachable);
            }
        }
    }
}

/// Runs `ask` on the connection (made anew if there is none or it ended), keeping it for the
/// next question if the answer came: within the bound (PROTOCOL.md §14.2, a silent change DB),
/// else the connection is given up.
fn with_client<T, F>(
    rt: &Runtime,
    config: &Config,
    client: &mut Option<Client>,
    ask: impl FnOnce(Client) -> F,
) -> Result<T, ChangeLogError>
where
    F: std::future::Future<Output = Result<(Client, T), ChangeLogError>>,
{
    let asked = async {
        let c = match client.take().filter(|c| !c.is_closed()) {
            Some(c) => c,
            None => connect(config, Session::Other).await?,
        };
        let (c, answer) = ask(c).await?;
        *client = Some(c);
        Ok::<T, ChangeLogError>(answer)
    };
    rt.block_on(within(Bounds::current().call(), asked))
}

fn send<T>(reply: Reply<T>, answer: Result<T, ChangeLogError>, unreachable: &mut Unreachable) {
    match &answer {
        Ok(_) => unreachable.answered(),
        Err(e) => unreachable.failed_with(e, "trying again at the next question"),
    };
    let _ = reply.send(answer);
}

/// Whether the owner created the change log's tables yet.
async fn created(c: &Client) -> Result<bool, ChangeLogError> {
    Ok(c.query_one(
        "SELECT to_regclass('change_streamer.reservations') IS NOT NULL",
        &[],
    )
    .await?
    .get(0))
}

/// What the change log holds, as the owner last committed it; empty before its tables exist.
async fn stats(c: &Client) -> Result<LogStats, ChangeLogError> {
    if !created(c).await? {
        return Ok(LogStats::default());
    }
    Ok(schema::read_stats(c).await?.0)
}

/// Whether `w` is the commit watermark of a stored transaction.
async fn has_commit(c: &Client, w: &Watermark) -> Result<bool, ChangeLogError> {
    if !created(c).await? {
        return Ok(false);
    }
    // One index probe per partition (the log is partitioned by segment, not watermark): a
    // transaction row is a whole transaction, its commit included; an older segment's commit
    // is a row of its own. An owner of a build before transaction rows has no `txn_log`.
    let has_txn_log: bool = c
        .query_one(
            "SELECT to_regclass('change_streamer.txn_log') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    let sql = if has_txn_log {
        "SELECT 1 FROM change_streamer.txn_log WHERE watermark = $1
         UNION ALL
         SELECT 1 FROM change_streamer.change_log WHERE watermark = $1 AND kind = 'commit'
         LIMIT 1"
    } else {
        "SELECT 1 FROM change_streamer.change_log
         WHERE watermark = $1 AND kind = 'commit' LIMIT 1"
    };
    let row = c.query_opt(sql, &[&w.as_str()]).await?;
    Ok(row.is_some())
}

async fn load_state(c: &Client) -> Result<SafetyState, ChangeLogError> {
    if !created(c).await? {
        return Ok(SafetyState::default());
    }
    state::load(c).await
}
