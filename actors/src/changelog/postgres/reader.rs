//! The PostgreSQL engine's reader: catch-up reads on a connection of their own, so that a
//! subscriber reading far behind never holds up ingest, and the change log's size on disk.
//!
//! ### One snapshot, the partitions themselves
//! Each read is one `REPEATABLE READ` read-only transaction: the segment catalogue, then the
//! rows of the partitions it lists as overlapping the range, in segment order. One snapshot
//! makes the catalogue and the rows agree (the owner updates both in the transaction that
//! stores a commit group), so a purge that commits during the read cannot cut a gap into it.
//! Reading each partition (`txn_log_<id>`, or `change_log_<id>` of an older segment) by a
//! statement prepared once per connection,
//! rather than the partitioned parent, is what keeps a read cheap however long the log: a
//! statement on the parent is planned over every partition (milliseconds at 65 partitions)
//! and waits for the owner's transaction that creates a partition (it locks the parent). The
//! begin and the catalogue's statement travel together, and so do the last partition's
//! read and the commit: two round trips for a read within one segment.
//!
//! A partition the snapshot still lists can be dropped by a purge before the read reaches it
//! (dropping needs no lock the snapshot holds): that read fails as an undefined table and is
//! made again, in a new snapshot that no longer lists it.
//!
//! ### Transaction rows, fetched by the changes they hold
//! A read's limit counts changes, and a row of `txn_log` holds a transaction's (a dozen, or
//! one). So its rows are fetched in steps sized by the changes per row seen so far
//! ([`Conn::changes_per_row`]), each step from after the last row of the one before, in the same
//! snapshot, until the limit is reached or the range ends: asking for `limit` rows would read
//! up to a dozen times what is needed, asking for too few costs one more round trip. The
//! commit travels with a step only when that step asks for as many rows as changes are left
//! (it cannot be followed by another).
//!
//! A read's byte limit (a catch-up's window, [`ChangeLog::read`]) caps each step too, by the
//! bytes per row seen so far ([`Conn::bytes_per_row`]), so a first read as large as a window of
//! large transactions does not fetch thousands of rows to send a few. A partition of a row per
//! change (older segments) is fetched in one query, its rows taken until the limit.
//!
//! [`ChangeLog::read`]: super::super::ChangeLog::read

use std::collections::HashMap;
use std::sync::{mpsc, Arc};

use log::warn;
use tokio::runtime::Runtime;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, Statement};

use super::commands::{RangeQuery, ReadCommand, ReadRows};
use super::connection::{connect, within, Bounds, Session};
use super::read_cache::ReadCache;
use super::schema::{parse_watermark, Layout};
use super::txn_value::{append_row, unpack, TxnRow};
use super::types::{ChangeKind, ChangeLogError, Reply, StoredChange};
use crate::unreachable::Unreachable;

/// Whether a reader checks that nothing it read past was purged: a standby's must (its
/// subscribers are protected only by its record, which can lapse: PROTOCOL.md §14.1); the
/// owner's need not (its streamer holds its own subscribers' floor in the purge's turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PurgeCheck {
    Owner,
    Standby,
}

/// How many times a read is made again after a partition it was to read was dropped.
const DROPPED_RETRIES: usize = 3;

/// Serves `rx` on its own connection to the change DB until every handle is gone. A read the
/// change DB does not answer within the bound (PROTOCOL.md §14.2, a silent change DB) fails
/// with [`ChangeLogError::Silent`], and its connection is given up.
pub(super) fn run(rt: Runtime, config: Config, rx: mpsc::Receiver<ReadCommand>, check: PurgeCheck) {
    let mut conn: Option<Conn> = None;
    let mut cache = ReadCache::default();
    // An outage is said once, not at every read (PROTOCOL.md §14.2).
    let mut unreachable = Unreachable::new("change log reads");
    while let Ok(cmd) = rx.recv() {
        // A lost connection is made anew at the next read: reads need no ownership.
        let mut c = match conn.take().filter(|c| !c.client.is_closed()) {
            Some(c) => c,
            None => match rt.block_on(within(Bounds::current().call(), Conn::open(&config))) {
                Ok(c) => c,
                Err(e) => {
                    let _ = match cmd {
                        ReadCommand::Range(_, reply) => answer(reply, Err(e), &mut unreachable),
                        ReadCommand::Size(reply) => answer(reply, Err(e), &mut unreachable),
                    };
                    continue;
                }
            },
        };
        let bound = Bounds::current().call();
        let silent = match cmd {
            ReadCommand::Range(query, reply) => {
                let read = rt.block_on(within(bound, c.read(&mut cache, &query, check)));
                answer(reply, read, &mut unreachable)
            }
            ReadCommand::Size(reply) => {
                let size = rt.block_on(within(bound, disk_bytes(&c.client)));
                answer(reply, size, &mut unreachable)
            }
        };
        if !silent {
            conn = Some(c);
        }
    }
}

/// Sends `result`, saying in the log why it failed if it did: a failure to reach the change DB
/// once per outage (`unreachable`), a read past a purge each time as a WARN, any other fault
/// each time as an ERROR (PROTOCOL.md §14.2). `true` if the change DB did not answer in time.
fn answer<T>(
    reply: Reply<T>,
    result: Result<T, ChangeLogError>,
    unreachable: &mut Unreachable,
) -> bool {
    let silent = matches!(result, Err(ChangeLogError::Silent(_)));
    match &result {
        Err(e @ ChangeLogError::PurgedPast { .. }) => warn!("change log read failed: {e}"),
        Err(e) => {
            unreachable.failed_with(e, "trying again at the next read");
        }
        Ok(_) => {
            unreachable.answered();
        }
    }
    let _ = reply.send(result);
    silent
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

/// [`ChangeLogError::PurgedPast`] if `oldest`, the oldest watermark stored, is past where
/// `query` reads from. A read from the very start (`pos` < 0) cannot have missed anything.
fn purged_past(query: &RangeQuery, oldest: Option<String>) -> Result<(), ChangeLogError> {
    let after = &query.after;
    if after.1 < 0 {
        return Ok(());
    }
    match oldest.map(parse_watermark).transpose()? {
        Some(oldest) if oldest > after.0 => Err(ChangeLogError::PurgedPast {
            after: after.0.clone(),
            oldest,
        }),
        _ => Ok(()),
    }
}

/// Runs a read's `statement`, sending the read-only transaction's commit with it if `end`
/// (then `open` goes false): one round trip for the last statement of a read.
async fn fetch(
    c: &Client,
    statement: &Statement,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    end: bool,
    open: &mut bool,
) -> Result<Vec<tokio_postgres::Row>, ChangeLogError> {
    if !end {
        return Ok(c.query(statement, params).await?);
    }
    *open = false;
    let (rows, _) = tokio::try_join!(c.query(statement, params), c.batch_execute("COMMIT"))?;
    Ok(rows)
}

/// The reader's connection and the statements prepared on it.
struct Conn {
    client: Client,
    /// The oldest watermark stored, and the oldest segment's id.
    oldest: Statement,
    /// The same, and the ids of the segments whose watermarks overlap `[$1, $2]`, in order:
    /// one row.
    catalogue: Statement,
    /// Each partition's read, prepared at its first read; forgotten once the catalogue no
    /// longer lists it.
    partitions: HashMap<i64, Statement>,
    /// The changes per row of `txn_log` the last step read, at least 1: how many rows the next
    /// step asks for (see the module documentation).
    changes_per_row: usize,
    /// The bytes of downstream messages per row of `txn_log` the last step read; 0 before any.
    bytes_per_row: usize,
}

impl Conn {
    async fn open(config: &Config) -> Result<Conn, ChangeLogError> {
        let client = connect(config, Session::Other).await?;
        let oldest = client
            .prepare("SELECT MIN(min_watermark), MIN(id) FROM change_streamer.segments")
            .await?;
        let catalogue = client
            .prepare(
                "SELECT o.oldest, o.first, COALESCE(r.ids, '{}'), COALESCE(r.layouts, '{}')
                 FROM (SELECT MIN(min_watermark) AS oldest, MIN(id) AS first
                       FROM change_streamer.segments) AS o,
                      (SELECT array_agg(id ORDER BY id) AS ids,
                              array_agg(layout ORDER BY id) AS layouts
                       FROM change_streamer.segments
                       WHERE max_watermark >= $1 AND min_watermark <= $2) AS r",
            )
            .await?;
        Ok(Conn {
            client,
            oldest,
            catalogue,
            partitions: HashMap::new(),
            changes_per_row: 1,
            bytes_per_row: 0,
        })
    }

    /// `query`'s rows, from a read kept in `cache` if one holds them ([`super::read_cache`]),
    /// else from the change DB (and then kept). Answered from memory, a standby's read still
    /// checks that nothing was purged past its position.
    async fn read(
        &mut self,
        cache: &mut ReadCache,
        query: &RangeQuery,
        check: PurgeCheck,
    ) -> Result<Vec<StoredChange>, ChangeLogError> {
        if let Some(rows) = cache.answer(query) {
            if check == PurgeCheck::Standby {
                let oldest = self.client.query_one(&self.oldest, &[]).await?;
                purged_past(query, oldest.get(0))?;
            }
            return Ok(rows);
        }
        let rows = self.read_range(query, check).await?;
        cache.keep(query, &rows);
        Ok(rows)
    }

    /// The rows after `query.after` up to `query.up_to`, at most `query.limit` (see the
    /// module documentation). With [`PurgeCheck::Standby`], first the oldest watermark stored:
    /// if it is past `after`, rows were purged that this reader has not read, and the read
    /// fails with [`ChangeLogError::PurgedPast`]. A read from the very start (`pos` < 0)
    /// cannot have missed anything.
    async fn read_range(
        &mut self,
        query: &RangeQuery,
        check: PurgeCheck,
    ) -> Result<Vec<StoredChange>, ChangeLogError> {
        let mut retries = 0;
        loop {
            let mut open = true;
            let read = self.read_in_snapshot(query, check, &mut open).await;
            if open {
                // Read-only: ending it either way loses nothing.
                let _ = self.client.batch_execute("ROLLBACK").await;
            }
            match read {
                Err(ChangeLogError::Postgres(e))
                    if e.code() == Some(&SqlState::UNDEFINED_TABLE)
                        && retries < DROPPED_RETRIES =>
                {
                    retries += 1;
                }
                read => return read,
            }
        }
    }

    /// One snapshot's read; `open` goes false once the transaction's end was sent.
    async fn read_in_snapshot(
        &mut self,
        query: &RangeQuery,
        check: PurgeCheck,
        open: &mut bool,
    ) -> Result<Vec<StoredChange>, ChangeLogError> {
        let RangeQuery { after, up_to, .. } = query;
        let c = &self.client;
        let (from, to) = (after.0.as_str(), up_to.as_str());
        let range: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&from, &to];
        let (_, catalogue) = tokio::try_join!(
            c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
            c.query_one(&self.catalogue, &range),
        )?;
        let oldest_id: Option<i64> = catalogue.get(1);
        self.partitions
            .retain(|id, _| oldest_id.is_some_and(|o| *id >= o));
        if check == PurgeCheck::Standby {
            purged_past(query, catalogue.get(0))?;
        }
        let ids: Vec<i64> = catalogue.get(2);
        let layouts: Vec<i16> = catalogue.get(3);
        let mut out = ReadRows::new(query);
        for (i, (id, layout)) in ids.iter().zip(layouts).enumerate() {
            let layout = Layout::from_column(layout)?;
            let statement = self.partition(*id, layout).await?;
            let last = i + 1 == ids.len();
            match layout {
                Layout::RowPerChange => {
                    self.read_changes(&statement, query, last, open, &mut out)
                        .await?
                }
                Layout::RowPerTransaction => {
                    self.read_transactions(&statement, query, last, open, &mut out)
                        .await?
                }
            }
            if out.full() {
                break;
            }
        }
        Ok(out.rows)
    }

    /// Appends the rows of a partition of [`Layout::RowPerChange`] after `query.after`, at most
    /// what the limits leave; with the commit if `last`.
    async fn read_changes(
        &self,
        statement: &Statement,
        query: &RangeQuery,
        last: bool,
        open: &mut bool,
        out: &mut ReadRows,
    ) -> Result<(), ChangeLogError> {
        let c = &self.client;
        let (after, up_to) = (&query.after, &query.up_to);
        let left = out.left() as i64;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&after.0.as_str(), &after.1, &up_to.as_str(), &left];
        for r in fetch(c, statement, &params, last, open).await? {
            if out.full() {
                break;
            }
            let kind: String = r.get(2);
            out.push(StoredChange {
                watermark: parse_watermark(r.get(0))?,
                pos: r.get(1),
                kind: ChangeKind::parse(&kind).ok_or(ChangeLogError::Corrupt(kind))?,
                json: Arc::from(r.get::<_, &str>(3)),
            });
        }
        Ok(())
    }

    /// Appends the changes after `query.after` of a partition of [`Layout::RowPerTransaction`],
    /// until the limit, in steps (see the module documentation); with the commit if `last` and
    /// a step cannot be followed by another.
    async fn read_transactions(
        &mut self,
        statement: &Statement,
        query: &RangeQuery,
        last: bool,
        open: &mut bool,
        out: &mut ReadRows,
    ) -> Result<(), ChangeLogError> {
        let (mut from, up_to) = (query.after.clone(), query.up_to.as_str());
        let mut scratch = Vec::new();
        loop {
            let left = out.left();
            let by_changes = left.div_ceil(self.changes_per_row).max(1);
            let by_bytes = match self.bytes_per_row {
                0 => usize::MAX,
                b => out.bytes_left().div_ceil(b).max(1),
            };
            let step = by_changes.min(by_bytes);
            let rows = step as i64;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                [&from.0.as_str(), &from.1, &up_to, &rows];
            let ends = last && step >= left;
            let got = fetch(&self.client, statement, &params, ends, open).await?;
            let (mut changes, mut read, mut bytes) = (0usize, 0usize, 0usize);
            for r in &got {
                let w: &str = r.get(0);
                let first_pos: i64 = r.get(1);
                let count: i64 = r.get(2);
                let watermark = parse_watermark(w.to_string())?;
                let body = unpack(r.get(3), &mut scratch, w)?;
                let row = TxnRow {
                    watermark: &watermark,
                    w,
                    first_pos,
                    count,
                    body,
                };
                let before = out.rows.len();
                append_row(row, &query.after, out)?;
                bytes += out.rows[before..]
                    .iter()
                    .map(StoredChange::message_len)
                    .sum::<usize>();
                changes += count as usize;
                read += 1;
                from = (watermark, first_pos + count - 1);
            }
            if let Some(per_row) = changes.checked_div(read) {
                self.changes_per_row = per_row.max(1);
                self.bytes_per_row = (bytes / read).max(1);
            }
            if out.full() || got.len() < step || !*open {
                return Ok(());
            }
        }
    }

    /// Segment `id`'s read statement, prepared at its first use. Its parameters: after which
    /// `(watermark, pos)`, up to which watermark, how many rows.
    async fn partition(&mut self, id: i64, layout: Layout) -> Result<Statement, ChangeLogError> {
        if let Some(s) = self.partitions.get(&id) {
            return Ok(s.clone());
        }
        let table = layout.partition(id);
        let sql = match layout {
            Layout::RowPerChange => format!(
                "SELECT watermark, pos, kind, change FROM {table}
                 WHERE (watermark, pos) > ($1, $2) AND watermark <= $3
                 ORDER BY watermark, pos LIMIT $4"
            ),
            // A row ending at or before `after` is passed over; the range on `watermark` is
            // what the index is scanned by.
            Layout::RowPerTransaction => format!(
                "SELECT watermark, first_pos, changes, body FROM {table}
                 WHERE watermark >= $1 AND watermark <= $3
                   AND (watermark > $1 OR first_pos + changes - 1 > $2)
                 ORDER BY watermark, first_pos LIMIT $4"
            ),
        };
        let s = self.client.prepare(&sql).await?;
        self.partitions.insert(id, s.clone());
        Ok(s)
    }
}
