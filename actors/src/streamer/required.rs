//! The backup replicator required (PROTOCOL.md §10.3), and one per backup (PROTOCOL.md §7.1).
//!
//! The subscriber with `mode=backup` feeds the replica that litestream backs up, and the purge
//! can never pass what it has applied. So it is *required*: flow control waits for it
//! ([`flow`](super::flow)) and it is never lagging, hence never evicted. Being waited for, a
//! ghost of it (the old socket of a backup replicator that restarted, not yet dropped by
//! liveness) would hold ingest, and with it the restarted replicator, which joins only at a
//! transaction boundary ([`join`](super::join)). So each accepted `mode=backup` subscription
//! replaces every older one for the same backup: closed with 1000 and forgotten at once.
//!
//! "Older" is the order of the [`Subscribe`](super::Subscribe) messages, not of their checks:
//! a newer subscription whose checks end first still replaces the older, which is then gone
//! when its own checks end.

use actix::prelude::*;
use log::info;

use super::subscriber::{Mode, Subscriber};
use super::Streamer;
use crate::session_end::{SessionEnd, SessionId};

impl Subscriber {
    /// Whether flow control waits for it and never evicts it: the backup replicator
    /// (PROTOCOL.md §10.3).
    pub fn is_required(&self) -> bool {
        self.mode == Mode::Backup
    }

    /// Whether `self` and `other` are backup replicators of the same backup (PROTOCOL.md §7.1).
    /// With one backup every `mode=backup` subscriber is for it, whatever its `backup`
    /// parameter names; with `several`, the one it names.
    fn same_backup(&self, other: &Subscriber, several: bool) -> bool {
        self.mode == Mode::Backup
            && other.mode == Mode::Backup
            && (!several || self.backup == other.backup)
    }

    /// The backup it names, for log lines.
    fn backup_name(&self) -> &str {
        self.backup.as_deref().unwrap_or("(the only one)")
    }
}

impl Streamer {
    /// `session_id`'s subscription passed its checks: if it is a backup replicator, every older
    /// one of the same backup is closed with 1000 (PROTOCOL.md §7.1), so that it no longer
    /// holds a tracked send or a purge.
    pub(super) fn replace_older_backup_replicators(
        &mut self,
        ctx: &mut Context<Self>,
        session_id: SessionId,
    ) {
        let Some(new) = self.subscribers.get(&session_id) else {
            return;
        };
        self.warn_if_unrouted(new);
        let several = self.backup_acks.several();
        let older: Vec<(SessionId, String)> = self
            .subscribers
            .values()
            .filter(|s| s.joined < new.joined && s.same_backup(new, several))
            .map(|s| (s.session_id, s.id.clone()))
            .collect();
        let (new_id, backup) = (new.id.clone(), new.backup_name().to_string());
        for (old, old_id) in older {
            info!(subscriber:% = new_id, backup:% = backup;
                "backup replicator {new_id} replaces {old_id} (session {old}) for backup {backup}"
            );
            self.close_subscriber(ctx, old, SessionEnd::BackupReplaced);
        }
    }
}
