//! The open transaction stored as it arrives, and how far the change log's writer may fall
//! behind ingest (PROTOCOL.md §3.0 "an open transaction is stored as it arrives").
//!
//! The changes of the open transaction wait in [`Txn`](super::ingest::Txn) only until
//! [`StreamerConfig::txn_chunk_changes`] of them or [`StreamerConfig::txn_chunk_bytes`] of
//! their text do; they are then queued on the change log as a pending chunk
//! ([`ChangeLog::store_pending`], invisible to every reader), and the commit's append counts
//! them ([`Transaction::pending`](crate::changelog::Transaction::pending)) and makes them
//! visible with it. A rollback or a lost connection deletes them ([`ChangeLog::drop_pending`]).
//!
//! ### The writer is never more than one mark behind
//! Writes to the change log are queued, not awaited, so that ingest and storage overlap. What
//! they carry is held until written, so it is bounded: after every
//! [`StreamerConfig::txn_chunk_bytes`] of changes queued (pending chunks and appends alike) a
//! *mark* is set, a barrier on the change log, and the upstream client is released only once
//! the mark before it is passed ([`WritePace`]). So at most about two marks' worth of changes
//! wait for the writer, whatever the size of a transaction, while one is written and the next
//! fills; transactions of ordinary size still share commit groups.
//!
//! [`StreamerConfig::txn_chunk_changes`]: super::StreamerConfig::txn_chunk_changes
//! [`StreamerConfig::txn_chunk_bytes`]: super::StreamerConfig::txn_chunk_bytes
//! [`ChangeLog::store_pending`]: crate::changelog::ChangeLog::store_pending
//! [`ChangeLog::drop_pending`]: crate::changelog::ChangeLog::drop_pending

use log::{debug, error, info, warn};
use tokio::sync::oneshot;

use super::ingest::Txn;
use super::Streamer;
use crate::changelog::PendingChunk;

/// The bytes queued on the change log since the last mark, and that mark.
#[derive(Default)]
pub(super) struct WritePace {
    unmarked_bytes: usize,
    /// Resolves once every write queued before the last mark is durable.
    mark: Option<oneshot::Receiver<()>>,
}

impl Streamer {
    /// Counts `bytes` just queued on the change log; past [`StreamerConfig::txn_chunk_bytes`]
    /// since the last mark, sets a new one and returns the one before it: the upstream client
    /// waits for it before sending more.
    ///
    /// [`StreamerConfig::txn_chunk_bytes`]: super::StreamerConfig::txn_chunk_bytes
    pub(super) fn write_mark(&mut self, bytes: usize) -> Option<oneshot::Receiver<()>> {
        let pace = &mut self.write_pace;
        pace.unmarked_bytes += bytes;
        if pace.unmarked_bytes < self.cfg.txn_chunk_bytes {
            return None;
        }
        pace.unmarked_bytes = 0;
        let barrier = self.log.barrier();
        let (tx, rx) = oneshot::channel();
        actix::spawn(async move {
            // A failed write is answered to its own caller; the mark only paces.
            let _ = barrier.await;
            let _ = tx.send(());
        });
        pace.mark.replace(rx)
    }

    /// Whether the open transaction's waiting changes make a chunk to store.
    pub(super) fn chunk_full(&self) -> bool {
        self.txn.as_ref().is_some_and(|t| {
            t.changes.len() >= self.cfg.txn_chunk_changes.max(1)
                || t.bytes >= self.cfg.txn_chunk_bytes
        })
    }

    /// Queues the changes of the open transaction waiting in it as a pending chunk; returns
    /// the release the pace asks for ([`Streamer::write_mark`]). A following standby stores
    /// nothing: it only counts them.
    pub(super) fn store_chunk(&mut self) -> Option<oneshot::Receiver<()>> {
        let t = self.txn.as_mut()?;
        let changes = std::mem::take(&mut t.changes);
        let bytes = std::mem::take(&mut t.bytes);
        let first_pos = t.stored as i64;
        t.stored += changes.len() as u64;
        if self.follows.is_some() {
            return None;
        }
        let (watermark, n) = (t.watermark.clone(), changes.len());
        let written = self.log.store_pending(PendingChunk {
            watermark: watermark.clone(),
            first_pos,
            changes,
        });
        actix::spawn(async move {
            let end = first_pos + n as i64;
            match written.await {
                Ok(()) => debug!(
                    "stored pending changes {first_pos}..{end} of transaction watermark={watermark}"
                ),
                // Its commit will be refused by the change log (PROTOCOL.md §3.0).
                Err(e) => error!(watermark:% = watermark;
                    "storing pending changes {first_pos}..{end} of transaction watermark={watermark} failed: {e}"
                ),
            }
        });
        self.write_mark(bytes.max(self.cfg.txn_chunk_bytes))
    }

    /// Deletes the pending rows of `txn`, rolled back or cut off (PROTOCOL.md §3.0).
    pub(super) fn drop_pending(&self, txn: &Txn) {
        if txn.stored == 0 || txn.replay || self.follows.is_some() {
            return;
        }
        let dropped = self.log.drop_pending();
        let watermark = txn.watermark.clone();
        actix::spawn(async move {
            match dropped.await {
                Ok(()) => {
                    info!(watermark:% = watermark; "deleted the pending rows of transaction watermark={watermark}")
                }
                Err(e) => warn!(watermark:% = watermark;
                    "deleting the pending rows of transaction watermark={watermark} failed: {e} (the next transaction's first chunk, or the next start, deletes them)"
                ),
            }
        });
    }
}
