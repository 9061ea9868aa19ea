//! The streamer's word to the backup monitor: each commit a `mode=backup` subscriber (the backup
//! replicator) acks, so that the control source asks litestream whether it is backed up
//! (PROTOCOL.md §8.1c). Whoever asks first with [`ReportBackupAcks`] is told, from then on, with
//! one [`BackupAcked`] per ack that moved such a subscriber's acked watermark, and one for the
//! watermark it subscribed with once it is accepted (what its file holds: after a restart the
//! backup is confirmed without waiting for a new commit, PROTOCOL.md §8.1c, §13.1).

use actix::prelude::*;

use super::subscriber::{Mode, Subscriber};
use super::Streamer;
use crate::watermark::Watermark;

/// A `mode=backup` subscriber acked commit `watermark` (above what it had acked before).
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct BackupAcked {
    pub watermark: Watermark,
}

/// From now on, tell `to` each [`BackupAcked`] (replacing whoever was told before).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReportBackupAcks {
    pub to: Recipient<BackupAcked>,
}

impl Handler<ReportBackupAcks> for Streamer {
    type Result = ();
    fn handle(&mut self, msg: ReportBackupAcks, _: &mut Context<Self>) {
        self.backup_acks = Some(msg.to);
    }
}

/// Tells `to` of `sub`'s ack when it is the backup replicator's and moved its acked watermark
/// past `before`.
pub(super) fn tell(to: &Option<Recipient<BackupAcked>>, sub: &Subscriber, before: &Watermark) {
    if let Some(to) = to {
        if sub.mode == Mode::Backup && sub.acked > *before {
            to.do_send(BackupAcked {
                watermark: sub.acked.clone(),
            });
        }
    }
}

/// Tells `to` of the watermark `sub` subscribed with, when it is the backup replicator's.
pub(super) fn joined(to: &Option<Recipient<BackupAcked>>, sub: &Subscriber) {
    if let Some(to) = to {
        if sub.mode == Mode::Backup {
            to.do_send(BackupAcked {
                watermark: sub.acked.clone(),
            });
        }
    }
}
