//! The PostgreSQL engine's reader: catch-up reads on a connection of their own, so that a
//! subscriber reading far behind never holds up ingest. Each read is one statement on the
//! partitioned parent table, so it sees one consistent set of partitions even while a purge
//! drops some.

use std::sync::mpsc;

use log::warn;
use tokio::runtime::Runtime;
use tokio_postgres::{Client, Config};

use super::commands::ReadCommand;
use super::postgres::connect;
use super::postgres_schema::parse_watermark;
use super::{ChangeKind, ChangeLogError, StoredChange};

pub(super) fn run_reader(rt: Runtime, config: Config, rx: mpsc::Receiver<ReadCommand>) {
    let mut client: Option<Client> = None;
    while let Ok(cmd) = rx.recv() {
        let result = rt.block_on(async {
            // A lost connection is made anew at the next read: reads need no ownership.
            let c = match client.take().filter(|c| !c.is_closed()) {
                Some(c) => c,
                None => connect(&config).await?,
            };
            let r = read_range(&c, &cmd).await;
            client = Some(c);
            r
        });
        if let Err(e) = &result {
            warn!("change log read failed: {e}");
        }
        let _ = cmd.reply.send(result);
    }
}

async fn read_range(c: &Client, cmd: &ReadCommand) -> Result<Vec<StoredChange>, ChangeLogError> {
    let rows = c
        .query(
            "SELECT watermark, pos, kind, change FROM change_streamer.change_log
             WHERE (watermark, pos) > ($1, $2) AND watermark <= $3
             ORDER BY watermark, pos LIMIT $4",
            &[
                &cmd.after.0.as_str(),
                &cmd.after.1,
                &cmd.up_to.as_str(),
                &(cmd.limit as i64),
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
