//! The audit (PROTOCOL.md §8.1d): now and then, the monitor reads its backup itself through the
//! VFS and compares what it reads with what it has confirmed (the highest watermark it sent to
//! the cleanup actor). A backup that reads back below that is lying (a replica directory rolled
//! back, a bucket restored from an old copy): every purge stops ([`AuditBlock`] to the purger)
//! until a later read reaches the watermark it was compared with.
//!
//! One audit per monitor, so per backup, named by [`AuditConfig::backup`]; the service has one
//! backup, named [`SINGLE_BACKUP`]. Each read uses a new VFS reader process (started and killed
//! by the read): the VFS of a reader kept loaded may still show what it listed earlier, and an
//! audit is rare. Reads never overlap, and a read that fails proves nothing either way.

use std::time::Duration;

use actix::prelude::*;
use log::{error, info, warn};
use serde::Serialize;

use super::MonitorActor;
use crate::litestream::BackupSample;
use crate::purger::AuditBlock;
use crate::vfs::{BackupReading, VfsError, VfsReader, VfsSource};
use crate::watermark::Watermark;

/// The name of the service's one backup, in the audit's metric label and log lines.
pub const SINGLE_BACKUP: &str = "backup";

/// How long one audit read may take, loading the extension included.
const READ_LIMIT: Duration = Duration::from_secs(10);

/// `--backup-audit-interval-ms` with `--litestream-vfs`, for one backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// The backup's name ([`SINGLE_BACKUP`] for the service's one backup).
    pub backup: String,
    /// How to read it.
    pub vfs: VfsSource,
    /// Between audits; the first comes one interval after start.
    pub interval: Duration,
}

/// `/status` `backup.monitor.audit` (PROTOCOL.md §8.1d).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditStats {
    pub backup: String,
    pub interval_ms: u64,
    /// Audits that read a watermark.
    pub audits_total: u64,
    /// Reads below what was confirmed (`change_streamer_backup_audit_failures_total`).
    pub failures_total: u64,
    pub last_read: Option<Watermark>,
    /// Why the latest audit could not read; `None` once one reads.
    pub last_error: Option<String>,
    /// What a read must reach to lift the block; `None`: not blocked.
    pub blocked_below: Option<Watermark>,
}

/// The audit's state inside the monitor.
#[derive(Default)]
pub(super) struct AuditState {
    /// The highest watermark this monitor confirmed (sent to the cleanup actor).
    confirmed: Option<Watermark>,
    /// Told each time the block starts or ends.
    purger: Option<Recipient<AuditBlock>>,
    reading: bool,
    pub(super) stats: Option<AuditStats>,
}

impl AuditState {
    pub(super) fn new(cfg: Option<&AuditConfig>) -> AuditState {
        AuditState {
            stats: cfg.map(|c| AuditStats {
                backup: c.backup.clone(),
                interval_ms: u64::try_from(c.interval.as_millis()).unwrap_or(u64::MAX),
                ..AuditStats::default()
            }),
            ..AuditState::default()
        }
    }

    /// What a poll sent to the cleanup actor is confirmed.
    pub(super) fn note_confirmed(&mut self, samples: &[BackupSample]) {
        if let Some(top) = samples.iter().map(|s| &s.watermark).max() {
            if self.confirmed.as_ref() < Some(top) {
                self.confirmed = Some(top.clone());
            }
        }
    }
}

impl MonitorActor {
    /// Tells `purger` when this monitor's audit blocks every purge, and when it lifts the block.
    pub fn auditing_to(mut self, purger: Recipient<AuditBlock>) -> Self {
        self.audit.purger = Some(purger);
        self
    }

    /// Audits every interval, with an [`AuditConfig`].
    pub(super) fn schedule_audits(&mut self, ctx: &mut Context<Self>) {
        let Some(cfg) = self.cfg.audit.clone() else {
            return;
        };
        info!(
            backup:% = cfg.backup; "auditing backup {} at {} through the VFS every {} ms",
            cfg.backup,
            cfg.vfs.backup_url,
            cfg.interval.as_millis()
        );
        ctx.run_interval(cfg.interval, move |act, ctx| act.audit(&cfg, ctx));
    }

    /// One audit read, unless one is in flight.
    fn audit(&mut self, cfg: &AuditConfig, ctx: &mut Context<Self>) {
        if self.audit.reading || self.stopping {
            return;
        }
        self.audit.reading = true;
        self.stats.backup_reads_total += 1;
        let confirmed = self.audit.confirmed.clone();
        let mut reader = VfsReader::new(cfg.vfs.clone());
        let read = async move { reader.read(READ_LIMIT).await };
        let cfg = cfg.clone();
        ctx.spawn(read.into_actor(self).map(move |res, act, _| {
            act.audit.reading = false;
            act.audited(&cfg, confirmed, res);
        }));
    }

    /// PROTOCOL.md §8.1d: judges one read against what was confirmed when it started.
    fn audited(
        &mut self,
        cfg: &AuditConfig,
        confirmed: Option<Watermark>,
        res: Result<BackupReading, VfsError>,
    ) {
        let backup = &cfg.backup;
        let Some(stats) = self.audit.stats.as_mut() else {
            return;
        };
        let read = match res.map(|r| Watermark::parse(&r.watermark)) {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => return audit_unread(stats, backup, e.to_string()),
            Err(e) => return audit_unread(stats, backup, e.to_string()),
        };
        stats.audits_total += 1;
        stats.last_error = None;
        stats.last_read = Some(read.clone());
        match confirmed.filter(|c| read < *c) {
            Some(c) => {
                let below = match stats.blocked_below.clone() {
                    Some(b) if b > c => b,
                    _ => c,
                };
                stats.failures_total += 1;
                error!(backup:% = backup; "backup {backup} read back watermark {read} below the confirmed watermark {below}: purging stops until it reads {below} again");
                // The purger is told when the block starts or its watermark rises.
                let changed = stats.blocked_below.as_ref() != Some(&below);
                stats.blocked_below = Some(below.clone());
                if let (true, Some(p)) = (changed, &self.audit.purger) {
                    p.do_send(AuditBlock {
                        backup: backup.clone(),
                        below: Some(below),
                    });
                }
            }
            None => {
                if let Some(below) = stats.blocked_below.take() {
                    info!(backup:% = backup; "backup {backup} reads back watermark {read}, at or above the confirmed {below}: the audit no longer blocks purging");
                    if let Some(p) = &self.audit.purger {
                        p.do_send(AuditBlock {
                            backup: backup.clone(),
                            below: None,
                        });
                    }
                }
            }
        }
    }
}

/// An audit that read nothing: a warning; a block stays, none starts.
fn audit_unread(stats: &mut AuditStats, backup: &str, reason: String) {
    warn!(backup:% = backup; "the audit of backup {backup} could not read it: {reason}");
    stats.last_error = Some(reason);
}
