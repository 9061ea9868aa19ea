//! `/status` (PROTOCOL.md §11) as one typed client view, for the demo and the tests that read it:
//! a key renamed or dropped by the service fails to deserialize here, naming it, instead of
//! reading as a silent `null` (issue 45: the demo read `backup.monitor.backupWatermark`, which
//! the metrics source never fills, and showed `-` for its whole run). Both roles: a key the
//! standby lacks is an `Option` skipped when absent; a key shown as `null` is an `Option` kept.
//! `tests/operator_doc.rs` reads §11's owner example into it and back, key for key.

use serde::{Deserialize, Serialize};

/// The whole document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// `owner` or `standby`.
    pub role: String,
    pub instance: String,
    pub replica_version: Option<String>,
    pub change_log: Option<ChangeLog>,
    pub upstream: Option<Upstream>,
    pub backup: Option<Backup>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backups: Option<Vec<BackupEntry>>,
    pub reservations: Vec<Reservation>,
    pub subscribers: Vec<Subscriber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_control: Option<FlowControl>,
    pub purge: Option<Purge>,
    /// On a shared change DB only; `null` there while the records cannot be read.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub instances: Option<Option<Vec<Instance>>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeLog {
    pub min_watermark: Option<String>,
    pub max_watermark: Option<String>,
    pub rows: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Upstream {
    pub url: Option<String>,
    pub connected: bool,
    /// While not connected, why (PROTOCOL.md §4); `null` while connected.
    pub disconnect_reason: Option<String>,
    pub reset_required: bool,
    pub reset_message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    #[serde(rename = "backupURL")]
    pub backup_url: Option<String>,
    #[serde(rename = "metricsURL")]
    pub metrics_url: String,
    pub cleanup_delay_ms: u64,
    pub paused: bool,
    pub last_scheduled_watermark: Option<String>,
    pub pending_watermarks: Vec<PendingWatermark>,
    /// The owner's only, as the four below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanups_scheduled: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor: Option<Monitor>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub restart_catch_up: Option<Option<RestartCatchUp>>,
    /// `metrics`, `vfs` or `control`.
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge_quorum: Option<u64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub quorum_watermark: Option<Option<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingWatermark {
    pub watermark: String,
    pub replica: String,
    pub backed_up_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Monitor {
    pub polls_total: u64,
    pub poll_errors_total: u64,
    pub invalid_watermarks_total: u64,
    /// `null` before the first poll.
    pub last_poll_ok: Option<bool>,
    pub last_error: Option<String>,
    /// `vfs` and `control` only; `null` with `metrics`.
    pub backup_watermark: Option<String>,
    pub backup_reads_total: u64,
    pub audit: Option<Audit>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Audit {
    pub backup: String,
    pub interval_ms: u64,
    pub audits_total: u64,
    pub failures_total: u64,
    pub last_read: Option<String>,
    pub last_error: Option<String>,
    pub blocked_below: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartCatchUp {
    pub recorded: String,
    pub backup: Option<String>,
}

/// One backup of `backups` (PROTOCOL.md §8.4): what it holds, whatever its source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupEntry {
    pub name: String,
    pub source: String,
    /// Its highest held watermark: the confirmed one, with every source.
    pub watermark: Option<String>,
    pub age_ms: Option<i64>,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    #[serde(rename = "taskID")]
    pub task_id: String,
    pub held_ms: i64,
    pub orphaned: bool,
    pub verified: bool,
    /// The three below once the replica reported progress (PROTOCOL.md §6.8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_bytes: Option<u64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub replica_size: Option<Option<u64>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub restore_bytes_per_second: Option<Option<u64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscriber {
    pub id: String,
    /// `serving` or `backup`.
    pub mode: String,
    pub protocol: u32,
    pub phase: String,
    pub watermark: String,
    pub acked: String,
    pub pending: u64,
    pub queued_bytes: u64,
    pub lag_seconds: f64,
    pub lagging: Option<Lagging>,
    pub process_rate: f64,
    pub required: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lagging {
    pub watermark: String,
    pub ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlowControl {
    pub tracked_sends: u64,
    pub releases_all: u64,
    pub releases_consensus: u64,
    pub padding_seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Purge {
    pub scheduled: Vec<String>,
    pub last_purged_before: Option<String>,
    pub rows_purged: u64,
    pub purges: u64,
    pub waiting: Option<String>,
    /// `subscriber`, `no-subscriber`, `retention` or `audit` (PROTOCOL.md §9).
    pub blocked_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    pub id: String,
    pub role: String,
    pub subscribers: u64,
    pub reservations: u64,
    pub last_seen_ms: u64,
}

impl Status {
    /// `/status`'s body read into the type; the error names the key that does not fit.
    pub fn parse(body: &str) -> Result<Status, String> {
        serde_json::from_str(body)
            .map_err(|e| format!("/status does not read as PROTOCOL.md §11 says: {e}: {body}"))
    }

    /// The same from an already parsed document.
    pub fn from_value(v: serde_json::Value) -> Result<Status, String> {
        let shown = v.to_string();
        serde_json::from_value(v)
            .map_err(|e| format!("/status does not read as PROTOCOL.md §11 says: {e}: {shown}"))
    }
}

/// A key that may be absent (outer `None`), `null` (`Some(None)`) or a value.
mod double_option {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(
        v: &Option<Option<T>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(inner) => inner.serialize(s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }
}
