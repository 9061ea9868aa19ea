//! The PostgreSQL writer's pending rows: an open transaction stored as it arrives (PROTOCOL.md
//! §3.0 "an open transaction is stored as it arrives").
//!
//! A chunk of an open transaction is written, in a fenced transaction of its own, into
//! `change_streamer.pending_txn` (the layout of a `txn_log` row: a run of about `CHUNK_BYTES`
//! of changes, packed). No reader, standby follower, purge or restart reads that table. The
//! transaction's commit ([`PgWriter::move_pending`], inside the commit group's transaction,
//! after the fence) checks that every change it counts as pending is there, copies the rows
//! into `txn_log` in its segment with their store time, and deletes them, so the whole
//! transaction becomes visible, and is announced to standbys, in the one commit that makes it
//! durable. Pending rows left by an interrupted transaction (a rollback, a lost connection, a
//! `kill -9`, a takeover) are deleted when a writer takes ownership, at a rollback, and by the
//! first chunk of the next transaction.

use log::{info, warn};
use tokio_postgres::Client;

use super::super::txn_value::{chunks, encode, pack};
use super::super::types::{ChangeLogError, PendingChunk, Transaction};
use super::{fenced, PgWriter};

/// Deletes what an interrupted transaction left, as a writer takes ownership.
pub(super) async fn clear_at_start(client: &Client) -> Result<(), ChangeLogError> {
    let n = client
        .execute("DELETE FROM change_streamer.pending_txn", &[])
        .await?;
    if n > 0 {
        info!("deleted {n} pending row(s) of a transaction interrupted before its commit (PROTOCOL.md §3.0)");
    }
    Ok(())
}

impl PgWriter {
    /// Stores `chunk` pending, in a fenced transaction of its own; the chunk at position 0
    /// first deletes any pending rows left by an interrupted transaction.
    pub(super) async fn store_pending(
        &mut self,
        chunk: &PendingChunk,
    ) -> Result<(), ChangeLogError> {
        let mut positions = Vec::new();
        let mut counts = Vec::new();
        let mut bodies = Vec::new();
        let mut plain = Vec::new();
        for (rel, run) in chunks(&chunk.changes) {
            encode(run, &mut plain)?;
            let mut body = Vec::new();
            pack(&plain, &mut body);
            positions.push(chunk.first_pos + rel);
            counts.push(run.len() as i64);
            bodies.push(body);
        }
        let tx = fenced(&mut self.client).await?;
        if chunk.first_pos == 0 {
            let n = tx
                .execute("DELETE FROM change_streamer.pending_txn", &[])
                .await?;
            if n > 0 {
                warn!("deleted {n} pending row(s) left by an interrupted transaction before storing watermark={}", chunk.watermark);
            }
        }
        tx.execute(
            "INSERT INTO change_streamer.pending_txn (watermark, first_pos, changes, body)
             SELECT $1::text, p, n, b FROM unnest($2::int8[], $3::int8[], $4::bytea[]) AS t(p, n, b)
             ON CONFLICT (watermark, first_pos) DO UPDATE
             SET changes = excluded.changes, body = excluded.body",
            &[&chunk.watermark.as_str(), &positions, &counts, &bodies],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Deletes every pending row (the open transaction was rolled back or cut off).
    pub(super) async fn drop_pending(&mut self) -> Result<(), ChangeLogError> {
        let tx = fenced(&mut self.client).await?;
        tx.execute("DELETE FROM change_streamer.pending_txn", &[])
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Moves the pending rows of `txn` into `txn_log` as segment `segment`'s, stored at
/// `stored_ms`, and deletes every pending row: inside the commit group's transaction, after its
/// fence. Refused if fewer than `txn.pending` changes are pending (a chunk's write failed):
/// nothing of the group is then stored.
pub(super) async fn move_pending(
    c: &Client,
    txn: &Transaction,
    segment: i64,
    stored_ms: i64,
) -> Result<(), ChangeLogError> {
    let w = txn.watermark.as_str();
    let pending = txn.pending as i64;
    let held: i64 = c
        .query_one(
            "SELECT COALESCE(SUM(changes), 0)::int8 FROM change_streamer.pending_txn
             WHERE watermark = $1 AND first_pos < $2",
            &[&w, &pending],
        )
        .await?
        .get(0);
    if held != pending {
        return Err(ChangeLogError::Corrupt(format!(
            "transaction {w}: {held} of its {pending} pending changes are stored (a chunk's write failed); not stored"
        )));
    }
    c.execute(
        "INSERT INTO change_streamer.txn_log
             (segment, watermark, first_pos, changes, body, stored_ms)
         SELECT $1::int8, watermark, first_pos, changes, body, $3::int8
         FROM change_streamer.pending_txn WHERE watermark = $2",
        &[&segment, &w, &stored_ms],
    )
    .await?;
    c.execute("DELETE FROM change_streamer.pending_txn", &[])
        .await?;
    Ok(())
}
