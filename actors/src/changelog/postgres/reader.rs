//! The PostgreSQL engine's reader: catch-up reads on a connection of their own, so that a
//! subscriber reading far behind never holds up ingest, and the change log's size on disk.
//! Each read is one statement on the partitioned parent table, so it sees one consistent set
//! of partitions even while a purge drops some.

use std::sync::mpsc;

use log::warn;
use tokio::runtime::Runtime;
use tokio_postgres::{Client, Config};

use super::commands::{RangeQuery, ReadCommand};
use super::connection::connect;
use super::schema::parse_watermark;
use super::types::{ChangeKind, ChangeLogError, Reply, StoredChange};

/// Whether a reader checks that nothing it read past was purged: a standby's must (its
/// subscribers are protected only by its record, which can lapse: PROTOCOL.md §14.1); the
/// owner's need not (its streamer holds its own subscribers' floor in the purge's turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PurgeCheck {
    Owner,
    Standby,
}

/// Serves `rx` on its own connection to the change DB until every handle is gone.
pub(super) fn run(rt: Runtime, config: Config, rx: mpsc::Receiver<ReadCommand>, check: PurgeCheck) {
    let mut client: Option<Client> = None;
    while let Ok(cmd) = rx.recv() {
        // A lost connection is made anew at the next read: reads need no ownership.
        let c = match client.take().filter(|c| !c.is_closed()) {
            Some(c) => c,
            None => match rt.block_on(connect(&config)) {
                Ok(c) => c,
                Err(e) => {
                    match cmd {
                        ReadCommand::Range(_, reply) => answer(reply, Err(e)),
                        ReadCommand::Size(reply) => answer(reply, Err(e)),
                    }
                    continue;
                }
            },
        };
        match cmd {
            ReadCommand::Range(query, reply) => {
                answer(reply, rt.block_on(read_range(&c, &query, check)))
            }
            ReadCommand::Size(reply) => answer(reply, rt.block_on(disk_bytes(&c))),
        }
        client = Some(c);
    }
}

/// Sends `result`, saying in the log why it failed if it did.
fn answer<T>(reply: Reply<T>, result: Result<T, ChangeLogError>) {
    if let Err(e) = &result {
        warn!("change log read failed: {e}");
    }
    let _ = reply.send(result);
}

/// The bytes of every table of the change DB's schema, with its indexes and TOAST: the change
/// log's partitions (the parent itself holds no rows), its catalogue, the replication state
/// and the safety state, as the SQLite engine's file holds them all.
async fn disk_bytes(c: &Client) -> Result<u64, ChangeLogError> {
    let row = c
        .query_one(
            "SELECT COALESCE(SUM(pg_total_relation_size(t.oid)), 0)::int8
             FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace
             WHERE n.nspname = 'change_streamer' AND t.relkind = 'r'",
            &[],
        )
        .await?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// The rows after `query.after` up to `query.up_to`. With [`PurgeCheck::Standby`], then the
/// oldest watermark stored: if it is past `after`, the rows read may have a gap (a purge went
/// past the reader), whether that purge committed before the read or just after it (the check
/// comes second, so it errs on the side of an error). A read from the very start (`pos` < 0)
/// cannot have missed anything.
async fn read_range(
    c: &Client,
    query: &RangeQuery,
    check: PurgeCheck,
) -> Result<Vec<StoredChange>, ChangeLogError> {
    let rows = read_rows(c, query).await?;
    if check == PurgeCheck::Standby && query.after.1 >= 0 {
        let oldest: Option<String> = c
            .query_one(
                "SELECT MIN(min_watermark) FROM change_streamer.segments",
                &[],
            )
            .await?
            .get(0);
        if let Some(oldest) = oldest.map(parse_watermark).transpose()? {
            if oldest > query.after.0 {
                return Err(ChangeLogError::PurgedPast {
                    after: query.after.0.clone(),
                    oldest,
                });
            }
        }
    }
    Ok(rows)
}

async fn read_rows(c: &Client, query: &RangeQuery) -> Result<Vec<StoredChange>, ChangeLogError> {
    let RangeQuery {
        after,
        up_to,
        limit,
    } = query;
    let rows = c
        .query(
            "SELECT watermark, pos, kind, change FROM change_streamer.change_log
             WHERE (watermark, pos) > ($1, $2) AND watermark <= $3
             ORDER BY watermark, pos LIMIT $4",
            &[
                &after.0.as_str(),
                &after.1,
                &up_to.as_str(),
                &(*limit as i64),
            ],
        )
        .await?;
    rows.into_iter()
        .map(|r| {
            let kind: String = r.get(2);
            Ok(StoredChange {
                watermark: parse_watermark(r.get(0))?,
                pos: r.get(1),
                kind: ChangeKind::parse(&kind).ok_or(ChangeLogError::Corrupt(kind))?,
                json: r.get(3),
            })
        })
        .collect()
}
