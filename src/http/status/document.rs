//! The `/status` document (PROTOCOL.md §11) as a type: [`Status`], one field per documented key,
//! and the one way each role builds it. The owner builds it from its actors' [`Observation`],
//! a standby from the change DB as the owner last stored it; both make `changeLog` and
//! `backup` through the same functions, so the cleanup delay is computed once
//! ([`cleanup_delay`]).
//!
//! A key a role lacks is an `Option` skipped when `None`; a key a role shows as `null` is an
//! `Option` that is not skipped. `tests/operator_doc.rs` checks the keys against §11.

use std::time::Duration;

use change_streamer_actors::changelog::{ChangeDbView, LogStats};
use change_streamer_actors::cleanup::{CleanupState, PendingWatermark};
use change_streamer_actors::instance::{InstanceId, InstanceSeen};
use change_streamer_actors::monitor::{BackupState, MonitorStats};
use change_streamer_actors::ownership::Role;
use change_streamer_actors::purger::{BlockedBy, PurgeState};
use change_streamer_actors::reservation::ReservationInfo;
use change_streamer_actors::restart_catch_up::CatchUpView;
use change_streamer_actors::streamer::{StreamerState, SubscriberInfo};
use change_streamer_actors::watermark::Watermark;
use serde::Serialize;

use super::Observation;
use crate::config::{Config, SourceSpec};

/// `GET /status`. Written with each object's keys in alphabetical order (PROTOCOL.md §11), which
/// [`to_json`](Status::to_json) does.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub role: Role,
    pub instance: InstanceId,
    /// `null` before anything was stored, and at a standby while the change DB cannot be read.
    pub replica_version: Option<Watermark>,
    /// `null` at a standby while the change DB cannot be read.
    pub change_log: Option<ChangeLogStatus>,
    /// `null` at a standby: the owner's business.
    pub upstream: Option<Upstream>,
    /// `null` at a standby while the change DB cannot be read.
    pub backup: Option<Backup>,
    /// The owner's: one entry per backup (PROTOCOL.md §8.4), empty without a backup monitor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backups: Option<Vec<BackupState>>,
    pub reservations: Vec<ReservationInfo>,
    pub subscribers: Vec<SubscriberInfo>,
    /// The owner's only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow_control: Option<FlowControl>,
    /// `null` at a standby: the owner's business.
    pub purge: Option<Purge>,
    /// The owner's, on a shared change DB only (PROTOCOL.md §14.1); `Some(None)` is `null`,
    /// while the instance records cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<Option<Vec<InstanceSeen>>>,
}

/// `changeLog`: the range the change log holds.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeLogStatus {
    pub min_watermark: Option<Watermark>,
    pub max_watermark: Option<Watermark>,
    pub rows: u64,
}

/// `upstream`: the change source (PROTOCOL.md §4).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Upstream {
    pub url: Option<String>,
    pub connected: bool,
    /// While not connected, why (PROTOCOL.md §4, §11); `null` while connected.
    pub disconnect_reason: Option<String>,
    pub reset_required: bool,
    pub reset_message: Option<String>,
}

/// `backup`: the backup monitor and the cleanup it schedules (PROTOCOL.md §8).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    #[serde(rename = "backupURL")]
    pub backup_url: Option<String>,
    #[serde(rename = "metricsURL")]
    pub metrics_url: String,
    pub cleanup_delay_ms: u64,
    pub paused: bool,
    pub last_scheduled_watermark: Option<Watermark>,
    pub pending_watermarks: Vec<PendingWatermark>,
    /// The owner's counter; not stored, so absent at a standby.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cleanups_scheduled: Option<u64>,
    /// The owner's counters; not stored, so absent at a standby.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor: Option<MonitorStats>,
    /// The owner's wait after a restart (PROTOCOL.md §13.1): `null` once the backup covers what
    /// was recorded; absent at a standby.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_catch_up: Option<Option<CatchUpView>>,
    pub source: BackupSource,
    /// K (PROTOCOL.md §8.4); the owner's, with a backup monitor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purge_quorum: Option<usize>,
    /// The purge floor, `null` while fewer than K backups hold anything; as `purgeQuorum`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quorum_watermark: Option<Option<Watermark>>,
}

/// `backup.source`: what the backup's progress is read from (PROTOCOL.md §8.1, §8.1b, §8.1c).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackupSource {
    Metrics,
    Vfs,
    Control,
}

/// `flowControl` (PROTOCOL.md §10).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlowControl {
    pub tracked_sends: u64,
    pub releases_all: u64,
    pub releases_consensus: u64,
    pub padding_seconds: f64,
}

/// `purge` (PROTOCOL.md §9).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Purge {
    pub scheduled: Vec<Watermark>,
    pub last_purged_before: Option<Watermark>,
    pub rows_purged: u64,
    pub purges: u64,
    pub waiting: Option<String>,
    pub blocked_by: Option<BlockedBy>,
}

/// What `backup` is made of: the cleanup actor's state at the owner, the stored safety state
/// at a standby.
struct Cleanup {
    /// The delay learned so far, if any (never below the starting delay once applied).
    learned_delay: Option<Duration>,
    paused: bool,
    last_scheduled: Option<Watermark>,
    pending: Vec<PendingWatermark>,
    /// The owner's counters: cleanups scheduled and the monitor's.
    counters: Option<(u64, MonitorStats)>,
    /// The owner's wait after a restart (PROTOCOL.md §13.1).
    catch_up: Option<Option<CatchUpView>>,
    /// The owner's quorum: K and the purge floor.
    quorum: Option<(usize, Option<Watermark>)>,
}

/// The cleanup delay shown by `/status` and `/metrics`: the one learned (PROTOCOL.md §8.3), never
/// below the one the service starts with.
pub fn cleanup_delay(cfg: &Config, learned: Option<Duration>) -> Duration {
    learned
        .unwrap_or_default()
        .max(cfg.starting_cleanup_delay())
}

/// The delay the cleanup actor holds, as a [`Duration`].
pub fn learned_delay(c: &CleanupState) -> Duration {
    Duration::from_millis(u64::try_from(c.cleanup_delay_ms).unwrap_or(0))
}

impl Status {
    /// The owner's, from what its actors answered; `instances` as [`Status::instances`]. `role`
    /// is the owner's until its change log finds it was deposed.
    pub fn owner(
        cfg: &Config,
        role: Role,
        instance: &InstanceId,
        o: &Observation,
        instances: Option<Option<Vec<InstanceSeen>>>,
    ) -> Status {
        Status {
            role,
            instance: instance.clone(),
            replica_version: o.log.replica_version.clone(),
            change_log: Some(ChangeLogStatus::of(&o.log)),
            upstream: Some(Upstream::of(cfg, &o.streamer)),
            backup: Some(Backup::of(cfg, Cleanup::owner(o))),
            backups: Some(
                o.quorum
                    .as_ref()
                    .map(|q| q.backups.clone())
                    .unwrap_or_default(),
            ),
            reservations: o.reservations.clone(),
            subscribers: o.streamer.subscribers.clone(),
            flow_control: Some(FlowControl::of(cfg, &o.streamer)),
            purge: Some(Purge::of(&o.purge)),
            instances,
        }
    }

    /// A standby's: the change DB's state as the owner last stored it (`view`, `None` while it
    /// cannot be read), and the subscribers and reservations this standby's sockets hold.
    pub fn standby(
        cfg: &Config,
        instance: &InstanceId,
        view: Option<&ChangeDbView>,
        subscribers: Vec<SubscriberInfo>,
        reservations: Vec<ReservationInfo>,
    ) -> Status {
        Status {
            role: Role::Standby,
            instance: instance.clone(),
            replica_version: view.and_then(|v| v.log.replica_version.clone()),
            change_log: view.map(|v| ChangeLogStatus::of(&v.log)),
            upstream: None,
            backup: view.map(|v| Backup::of(cfg, Cleanup::stored(v))),
            backups: None,
            reservations,
            subscribers,
            flow_control: None,
            purge: None,
            instances: None,
        }
    }

    /// The document as JSON, each object's keys in alphabetical order (serde_json's map).
    pub fn to_json(&self) -> serde_json::Result<serde_json::Value> {
        serde_json::to_value(self)
    }
}

impl ChangeLogStatus {
    fn of(log: &LogStats) -> ChangeLogStatus {
        ChangeLogStatus {
            min_watermark: log.min_watermark.clone(),
            max_watermark: log.max_watermark.clone(),
            rows: log.rows,
        }
    }
}

impl Upstream {
    fn of(cfg: &Config, s: &StreamerState) -> Upstream {
        Upstream {
            url: cfg.upstream.clone(),
            connected: s.upstream_connected,
            disconnect_reason: s
                .upstream_down
                .as_ref()
                .filter(|_| !s.upstream_connected)
                .map(|d| d.reason.clone()),
            reset_required: s.reset_required.is_some(),
            reset_message: s.reset_required.clone(),
        }
    }
}

impl Cleanup {
    /// The cleanup actor's state (none without `--litestream-backup-url`).
    fn owner(o: &Observation) -> Cleanup {
        let c = o.cleanup.as_ref();
        Cleanup {
            learned_delay: c.map(learned_delay),
            paused: c.is_some_and(|c| c.paused),
            last_scheduled: c.and_then(|c| c.last_scheduled_watermark.clone()),
            pending: c.map(|c| c.pending_watermarks.clone()).unwrap_or_default(),
            counters: Some((
                c.map(|c| c.cleanups_scheduled_total).unwrap_or(0),
                o.monitor.clone(),
            )),
            catch_up: Some(c.and_then(|c| c.restart_catch_up.clone())),
            quorum: o
                .quorum
                .as_ref()
                .map(|q| (q.purge_quorum, q.quorum_watermark.clone())),
        }
    }

    /// The safety state the owner stored: paused while it holds an open reservation.
    fn stored(view: &ChangeDbView) -> Cleanup {
        let safety = &view.safety;
        Cleanup {
            learned_delay: safety.cleanup_delay,
            paused: !safety.reservations.is_empty(),
            last_scheduled: safety.last_scheduled.clone(),
            pending: safety
                .recorded
                .iter()
                .map(|r| {
                    PendingWatermark::new(r.watermark.clone(), r.replica.clone(), r.backed_up_ms)
                })
                .collect(),
            counters: None,
            catch_up: None,
            quorum: None,
        }
    }
}

impl Backup {
    fn of(cfg: &Config, c: Cleanup) -> Backup {
        let (cleanups_scheduled, monitor) = c.counters.unzip();
        let (purge_quorum, quorum_watermark) = c.quorum.unzip();
        Backup {
            backup_url: cfg.backup_url(),
            metrics_url: cfg.litestream_metrics_url.clone(),
            cleanup_delay_ms: cleanup_delay(cfg, c.learned_delay).as_millis() as u64,
            paused: c.paused,
            last_scheduled_watermark: c.last_scheduled,
            pending_watermarks: c.pending,
            cleanups_scheduled,
            monitor,
            restart_catch_up: c.catch_up,
            source: BackupSource::of(cfg),
            purge_quorum,
            quorum_watermark,
        }
    }
}

impl BackupSource {
    /// The first backup's (PROTOCOL.md §8.4: each backup's is in `backups`).
    fn of(cfg: &Config) -> BackupSource {
        match cfg.backups().first().map(|b| &b.source) {
            Some(SourceSpec::Vfs { .. }) => BackupSource::Vfs,
            Some(SourceSpec::Control { .. }) => BackupSource::Control,
            Some(SourceSpec::Metrics { .. }) => BackupSource::Metrics,
            None if cfg.litestream_control_url.is_some() => BackupSource::Control,
            None if cfg.litestream_vfs.is_some() => BackupSource::Vfs,
            None => BackupSource::Metrics,
        }
    }
}

impl FlowControl {
    fn of(cfg: &Config, s: &StreamerState) -> FlowControl {
        FlowControl {
            tracked_sends: s.tracked_sends,
            releases_all: s.releases_all,
            releases_consensus: s.releases_consensus,
            padding_seconds: cfg.flow_control_consensus_padding_seconds,
        }
    }
}

impl Purge {
    fn of(p: &PurgeState) -> Purge {
        Purge {
            scheduled: p.scheduled.clone(),
            last_purged_before: p.last_purged_before.clone(),
            rows_purged: p.rows_purged,
            purges: p.purges,
            waiting: p.waiting.clone(),
            blocked_by: p.blocked_by,
        }
    }
}
