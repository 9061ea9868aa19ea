//! The streamer's word to the backup monitors: each commit a `mode=backup` subscriber (a backup
//! replicator) acks, so that the control source asks litestream whether it is backed up
//! (PROTOCOL.md §8.1c). With one backup, whoever asks first with [`ReportBackupAcks`] is told,
//! from then on, with one [`BackupAcked`] per ack that moved such a subscriber's acked
//! watermark, and one for the watermark it subscribed with once it is accepted (what its file
//! holds: after a restart the backup is confirmed without waiting for a new commit, PROTOCOL.md
//! §8.1c, §13.1). With several (PROTOCOL.md §7.1, §8.4), each backup's monitor asks with
//! [`RouteBackupAcks`] and is told only of the acks of the replicator that names it
//! (`backup=NAME`).

use std::collections::BTreeMap;

use actix::prelude::*;
use log::warn;

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

/// From now on, tell `to` each [`BackupAcked`] of the backup replicator of backup `backup`
/// only; once one backup is routed so, the acks of the others go nowhere else.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RouteBackupAcks {
    pub backup: String,
    pub to: Recipient<BackupAcked>,
}

/// Who is told of the backup replicators' acks.
#[derive(Default)]
pub(super) struct AckRoutes {
    /// With one backup: every backup replicator's acks.
    all: Option<Recipient<BackupAcked>>,
    /// With several: each backup's replicator's, by the backup's name.
    by_backup: BTreeMap<String, Recipient<BackupAcked>>,
}

impl AckRoutes {
    /// Whether the service has several backups, each with its own replicator.
    pub(super) fn several(&self) -> bool {
        !self.by_backup.is_empty()
    }

    /// Whether `backup` (a subscriber's `backup` parameter) names a routed backup.
    pub(super) fn knows(&self, backup: Option<&str>) -> bool {
        backup.is_some_and(|b| self.by_backup.contains_key(b))
    }

    /// Tells who follows `sub`'s backup of its ack, when it is a backup replicator's and moved
    /// its acked watermark past `before`.
    pub(super) fn tell(&self, sub: &Subscriber, before: &Watermark) {
        if sub.acked > *before {
            self.joined(sub);
        }
    }

    /// Tells who follows `sub`'s backup of the watermark it holds, when it is a backup
    /// replicator's: at its acceptance, the watermark it subscribed with.
    pub(super) fn joined(&self, sub: &Subscriber) {
        if sub.mode != Mode::Backup {
            return;
        }
        let to = if self.several() {
            sub.backup.as_deref().and_then(|b| self.by_backup.get(b))
        } else {
            self.all.as_ref()
        };
        if let Some(to) = to {
            to.do_send(BackupAcked {
                watermark: sub.acked.clone(),
            });
        }
    }
}

impl Handler<ReportBackupAcks> for Streamer {
    type Result = ();
    fn handle(&mut self, msg: ReportBackupAcks, _: &mut Context<Self>) {
        self.backup_acks.all = Some(msg.to);
    }
}

impl Handler<RouteBackupAcks> for Streamer {
    type Result = ();
    fn handle(&mut self, msg: RouteBackupAcks, _: &mut Context<Self>) {
        self.backup_acks.by_backup.insert(msg.backup, msg.to);
    }
}

impl Streamer {
    /// PROTOCOL.md §7.1: with several backups, a backup replicator that names none of them is
    /// served (and required) but confirms nothing; say so when it joins.
    pub(super) fn warn_if_unrouted(&self, sub: &Subscriber) {
        if sub.mode == Mode::Backup
            && self.backup_acks.several()
            && !self.backup_acks.knows(sub.backup.as_deref())
        {
            let names: Vec<&str> = self
                .backup_acks
                .by_backup
                .keys()
                .map(String::as_str)
                .collect();
            warn!(subscriber:% = sub.id;
                "backup replicator {} names backup {:?}, which is none of the backups ({}): its acks confirm nothing",
                sub.id,
                sub.backup.as_deref().unwrap_or(""),
                names.join(", ")
            );
        }
    }
}
