//! Operator endpoints (PROTOCOL.md §11): `/healthz` and `/status` (JSON), and the [`Observation`] that
//! `/status` and `/metrics` ([`super::metrics`]) are both rendered from, gathered by asking each
//! actor for its state, so they always agree.

use actix_web::HttpResponse;
use change_streamer_actors::changelog::LogStats;
use change_streamer_actors::cleanup::{CleanupState, GetCleanupState};
use change_streamer_actors::instance::recorder::ListInstances;
use change_streamer_actors::monitor::{GetMonitorStats, MonitorStats};
use change_streamer_actors::ownership::Role;
use change_streamer_actors::purger::{GetPurgeState, PurgeState};
use change_streamer_actors::reservation::{
    GetReservationStats, ListReservations, ReservationInfo, ReservationStats,
};
use change_streamer_actors::streamer::{GetStreamerState, StreamerState};
use serde_json::json;

use super::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok")
}

/// Everything `/status` and `/metrics` show, asked from the actors.
pub struct Observation {
    pub log: LogStats,
    pub streamer: StreamerState,
    pub purge: PurgeState,
    pub cleanup: Option<CleanupState>,
    pub reservations: Vec<ReservationInfo>,
    pub reservation_stats: ReservationStats,
    pub monitor: MonitorStats,
    /// Bytes the change log takes on disk, as its engine counts them
    /// ([`ChangeLog::disk_bytes`](change_streamer_actors::changelog::ChangeLog::disk_bytes)).
    pub change_log_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("{0} did not answer: {1}")]
pub struct Unavailable(&'static str, String);

pub async fn observe(state: &AppState) -> Result<Observation, Unavailable> {
    let log = state.log.stats();
    let bytes = state.log.disk_bytes();
    let streamer = state.streamer.send(GetStreamerState);
    let purge = state.purger.send(GetPurgeState);
    let (log, bytes, streamer, purge) =
        futures_util::future::join4(log, bytes, streamer, purge).await;
    let mut obs = Observation {
        log: log.map_err(|e| Unavailable("change log", e.to_string()))?,
        streamer: streamer.map_err(|e| Unavailable("streamer", e.to_string()))?,
        purge: purge.map_err(|e| Unavailable("purger", e.to_string()))?,
        cleanup: None,
        reservations: Vec::new(),
        reservation_stats: ReservationStats::default(),
        monitor: MonitorStats::default(),
        change_log_bytes: bytes.map_err(|e| Unavailable("change log", e.to_string()))?,
    };
    if let Some(b) = &state.backup {
        let (c, r, m, rs) = futures_util::future::join4(
            b.cleanup.send(GetCleanupState),
            b.reservations.send(ListReservations),
            b.monitor.send(GetMonitorStats),
            b.reservations.send(GetReservationStats),
        )
        .await;
        obs.cleanup = Some(c.map_err(|e| Unavailable("cleanup", e.to_string()))?);
        obs.reservations = r.map_err(|e| Unavailable("reservations", e.to_string()))?;
        obs.reservation_stats = rs.map_err(|e| Unavailable("reservations", e.to_string()))?;
        // The monitor stops before the others at shutdown; its counters are then unknown.
        obs.monitor = m.unwrap_or_default();
    }
    Ok(obs)
}

pub(super) fn unavailable(e: Unavailable) -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .content_type("text/plain")
        .body(format!("{e}\n"))
}

pub async fn status(state: &AppState) -> HttpResponse {
    let (observed, instances) = futures_util::future::join(observe(state), instances(state)).await;
    match observed {
        Ok(o) => {
            let mut json = status_json(state, &o);
            if let Some(list) = instances {
                json["instances"] = list;
            }
            HttpResponse::Ok().json(json)
        }
        Err(e) => unavailable(e),
    }
}

/// The instances not gone (PROTOCOL.md §14.1), on a shared change DB only; `null` while the
/// change DB cannot be read.
async fn instances(state: &AppState) -> Option<serde_json::Value> {
    let recorder = state.recorder.as_ref()?;
    Some(match recorder.send(ListInstances).await {
        Ok(Ok(list)) => json!(list),
        Ok(Err(e)) => {
            log::warn!("/status: reading the instance records failed: {e}");
            serde_json::Value::Null
        }
        Err(_) => serde_json::Value::Null,
    })
}

pub fn status_json(state: &AppState, o: &Observation) -> serde_json::Value {
    let cfg = &state.config;
    let c = o.cleanup.as_ref();
    json!({
        "role": if state.log.is_owner() { Role::Owner } else { Role::Standby },
        "instance": state.instance,
        "replicaVersion": o.log.replica_version,
        "changeLog": {
            "minWatermark": o.log.min_watermark,
            "maxWatermark": o.log.max_watermark,
            "rows": o.log.rows,
        },
        "upstream": {
            "url": cfg.upstream,
            "connected": o.streamer.upstream_connected,
            "resetRequired": o.streamer.reset_required.is_some(),
            "resetMessage": o.streamer.reset_required,
        },
        "backup": {
            "backupURL": cfg.litestream_backup_url,
            "metricsURL": cfg.litestream_metrics_url,
            "cleanupDelayMs": c.map(|c| c.cleanup_delay_ms).unwrap_or(cfg.starting_cleanup_delay().as_millis() as i64),
            "paused": c.is_some_and(|c| c.paused),
            "lastScheduledWatermark": c.and_then(|c| c.last_scheduled_watermark.clone()),
            "pendingWatermarks": c.map(|c| c.pending_watermarks.clone()).unwrap_or_default(),
            "cleanupsScheduled": c.map(|c| c.cleanups_scheduled_total).unwrap_or(0),
            "monitor": o.monitor,
            "source": if cfg.litestream_vfs.is_some() { "vfs" } else { "metrics" },
        },
        "reservations": o.reservations,
        "subscribers": o.streamer.subscribers,
        "flowControl": {
            "trackedSends": o.streamer.tracked_sends,
            "releasesAll": o.streamer.releases_all,
            "releasesConsensus": o.streamer.releases_consensus,
            "paddingSeconds": cfg.flow_control_consensus_padding_seconds,
        },
        "purge": {
            "scheduled": o.purge.scheduled,
            "lastPurgedBefore": o.purge.last_purged_before,
            "rowsPurged": o.purge.rows_purged,
            "purges": o.purge.purges,
            "waiting": o.purge.waiting,
            "blockedBy": o.purge.blocked_by,
        },
    })
}
