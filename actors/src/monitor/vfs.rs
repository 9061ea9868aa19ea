//! The VFS source (PROTOCOL.md §8.1b): the backed-up watermark read out of the backup itself
//! through stock litestream 0.5's VFS, one sample of replica [`VFS_REPLICA`] per poll.

use actix::prelude::*;
use log::{debug, warn};

use super::{MonitorActor, Observed, PollOutcome, VFS_REPLICA};
use crate::litestream::BackupSample;
use crate::reservation::BackupRead;
use crate::vfs::{BackupReading, VfsError, VfsReader, VfsSource};
use crate::watermark::Watermark;

impl MonitorActor {
    /// PROTOCOL.md §8.1b: one read of the backup through the VFS reader, bounded by the timeout (the
    /// reader kills its process when that passes). The reader travels with the poll and comes
    /// back when it ends.
    pub(super) fn poll_vfs(&mut self, source: VfsSource) -> ResponseActFuture<Self, Observed> {
        let mut reader = self.vfs.take().unwrap_or_else(|| VfsReader::new(source));
        let timeout = self.cfg.timeout;
        self.stats.backup_reads_total += 1;
        let read = async move {
            let res = reader.read(timeout).await;
            (reader, res)
        };
        Box::pin(read.into_actor(self).map(|(reader, res), act, _| {
            act.vfs = Some(reader);
            act.vfs_observed(res)
        }))
    }

    /// Turns what the VFS reader read into one sample of replica [`VFS_REPLICA`], dated by the
    /// first poll that read that watermark.
    fn vfs_observed(&mut self, res: Result<BackupReading, VfsError>) -> Observed {
        let (text, replica_size) = match res {
            Ok(r) => (r.watermark, r.bytes),
            Err(e) => return self.failed(e.to_string()),
        };
        self.stats.last_poll_ok = Some(true);
        let watermark = match Watermark::parse(&text) {
            Ok(w) => w,
            Err(e) => {
                warn!("ignoring the backup's watermark: {e} (replica {VFS_REPLICA:?})");
                self.stats.invalid_watermarks_total += 1;
                self.stats.backup_watermark = None;
                return (
                    Vec::new(),
                    PollOutcome::Read {
                        samples: 0,
                        invalid: 1,
                    },
                );
            }
        };
        let first_read_ms = match &self.vfs_first_read {
            Some((w, at)) if *w == watermark => *at,
            _ => {
                let now = self.cfg.clock.now_ms();
                debug!(watermark:% = watermark; "the backup holds watermark={watermark}");
                self.vfs_first_read = Some((watermark.clone(), now));
                now
            }
        };
        self.stats.backup_watermark = Some(watermark.clone());
        self.report_read(BackupRead {
            watermark: watermark.clone(),
            replica_size,
        });
        let sample = BackupSample {
            watermark,
            replica: VFS_REPLICA.to_string(),
            backed_up_at_ms: first_read_ms,
        };
        (
            vec![sample],
            PollOutcome::Read {
                samples: 1,
                invalid: 0,
            },
        )
    }
}
