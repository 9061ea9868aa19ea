//! The SQLite writer's pending rows: an open transaction stored as it arrives (PROTOCOL.md
//! §3.0 "an open transaction is stored as it arrives").
//!
//! A chunk of an open transaction is written, in its own SQLite transaction, into
//! `pending_txn` (the same row layout as a segment's: a run of about `CHUNK_BYTES` of changes
//! per row, packed). No reader, purge or restart reads that table. The transaction's commit
//! ([`Writer::move_pending`], inside the commit group's transaction) checks that every change
//! it counts as pending is there, copies the rows into its segment with their store time and
//! deletes them, so the whole transaction becomes visible in the one commit that makes it
//! durable. Whatever pending rows are left (a rollback, a lost connection, a `kill -9`) are
//! deleted at the next start, at a rollback, and by the first chunk of the next transaction.

use log::{info, warn};
use rusqlite::params;

use super::super::txn_value::{chunks, encode, pack};
use super::super::types::{ChangeLogError, PendingChunk, Transaction};
use super::{Writer, BODY_KEPT};

/// A store error carrying a message of ours (SQLite's error type has no variant for one).
fn refused(e: ChangeLogError) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(e))
}

impl Writer {
    /// Deletes every pending row; answers how many there were.
    pub(super) fn clear_pending(&mut self) -> Result<usize, rusqlite::Error> {
        self.conn
            .prepare_cached("DELETE FROM pending_txn")?
            .execute([])
    }

    /// Deletes what an interrupted transaction left at the last stop, at start.
    pub(super) fn clear_pending_at_start(&mut self) -> Result<(), ChangeLogError> {
        let n = self.clear_pending()?;
        if n > 0 {
            info!("deleted {n} pending row(s) of a transaction interrupted before its commit (PROTOCOL.md §3.0)");
        }
        Ok(())
    }

    /// Stores `chunk` pending, in a transaction of its own; the chunk at position 0 first
    /// deletes any pending rows left by an interrupted transaction.
    pub(super) fn store_pending(&mut self, chunk: &PendingChunk) -> Result<(), ChangeLogError> {
        let tx = self.conn.transaction()?;
        if chunk.first_pos == 0 {
            let n = tx.prepare_cached("DELETE FROM pending_txn")?.execute([])?;
            if n > 0 {
                warn!("deleted {n} pending row(s) left by an interrupted transaction before storing watermark={}", chunk.watermark);
            }
        }
        {
            let mut insert = tx.prepare_cached(
                "INSERT OR REPLACE INTO pending_txn (watermark, first_pos, changes, body)
                 VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (rel, run) in chunks(&chunk.changes) {
                encode(run, &mut self.body)?;
                pack(&self.body, &mut self.packed);
                insert.execute(params![
                    chunk.watermark.as_str(),
                    chunk.first_pos + rel,
                    run.len() as i64,
                    self.packed.as_slice()
                ])?;
            }
        }
        tx.commit()?;
        self.trim_buffers();
        Ok(())
    }

    /// Moves the pending rows of `txn` into segment table `table`, stored at `stored_ms`, and
    /// deletes every pending row: inside the commit group's transaction. Refused if fewer than
    /// `txn.pending` changes are pending (a chunk's write failed): nothing of the group is then
    /// stored.
    pub(super) fn move_pending(
        &mut self,
        txn: &Transaction,
        table: &str,
        stored_ms: i64,
    ) -> Result<(), rusqlite::Error> {
        if txn.pending == 0 {
            return Ok(());
        }
        let w = txn.watermark.as_str();
        let held: i64 = self
            .conn
            .prepare_cached(
                "SELECT COALESCE(SUM(changes), 0) FROM pending_txn WHERE watermark = ?1 AND first_pos < ?2",
            )?
            .query_row(params![w, txn.pending as i64], |r| r.get(0))?;
        if held != txn.pending as i64 {
            return Err(refused(ChangeLogError::Corrupt(format!(
                "transaction {w}: {held} of its {} pending changes are stored (a chunk's write failed); not stored",
                txn.pending
            ))));
        }
        self.conn
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO {table} (watermark, first_pos, changes, body, stored_ms)
                 SELECT watermark, first_pos, changes, body, ?2 FROM pending_txn
                 WHERE watermark = ?1 ORDER BY first_pos"
            ))?
            .execute(params![w, stored_ms])?;
        self.clear_pending()?;
        Ok(())
    }

    /// Drops the row buffers grown past [`BODY_KEPT`] by a large run.
    pub(super) fn trim_buffers(&mut self) {
        if self.body.capacity() > BODY_KEPT {
            self.body = Vec::new();
        }
        if self.packed.capacity() > BODY_KEPT {
            self.packed = Vec::new();
        }
    }
}
