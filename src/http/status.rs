//! Operator endpoints (SPEC §11): `/healthz`, `/status` (JSON) and `/metrics` (Prometheus
//! text). Both views are rendered from one [`Observation`], gathered by asking each actor for
//! its state, so they always agree.

use std::fmt::Write as _;

use actix_web::{web, HttpResponse};
use change_streamer_actors::changelog::ChangeLogStats;
use change_streamer_actors::cleanup::{CleanupState, GetCleanupState};
use change_streamer_actors::monitor::{GetMonitorStats, MonitorStats};
use change_streamer_actors::reservation::{ListReservations, ReservationInfo};
use change_streamer_actors::streamer::{GetPurgeState, PurgeState};
use change_streamer_actors::streamer::{GetStreamerState, StreamerState};
use change_streamer_actors::streamer::{Mode, SubscriberInfo};
use serde_json::json;

use super::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok")
}

/// Everything `/status` and `/metrics` show, asked from the actors.
pub struct Observation {
    pub log: ChangeLogStats,
    pub streamer: StreamerState,
    pub purge: PurgeState,
    pub cleanup: Option<CleanupState>,
    pub reservations: Vec<ReservationInfo>,
    pub monitor: MonitorStats,
}

#[derive(Debug, thiserror::Error)]
#[error("{0} did not answer: {1}")]
pub struct Unavailable(&'static str, String);

pub async fn observe(state: &AppState) -> Result<Observation, Unavailable> {
    let log = state.log.stats();
    let streamer = state.streamer.send(GetStreamerState);
    let purge = state.purger.send(GetPurgeState);
    let (log, streamer, purge) = futures_util::future::join3(log, streamer, purge).await;
    let mut obs = Observation {
        log: log.map_err(|e| Unavailable("change log", e.to_string()))?,
        streamer: streamer.map_err(|e| Unavailable("streamer", e.to_string()))?,
        purge: purge.map_err(|e| Unavailable("purger", e.to_string()))?,
        cleanup: None,
        reservations: Vec::new(),
        monitor: MonitorStats::default(),
    };
    if let Some(b) = &state.backup {
        let (c, r, m) = futures_util::future::join3(
            b.cleanup.send(GetCleanupState),
            b.reservations.send(ListReservations),
            b.monitor.send(GetMonitorStats),
        )
        .await;
        obs.cleanup = Some(c.map_err(|e| Unavailable("cleanup", e.to_string()))?);
        obs.reservations = r.map_err(|e| Unavailable("reservations", e.to_string()))?;
        // The monitor stops before the others at shutdown; its counters are then unknown.
        obs.monitor = m.unwrap_or_default();
    }
    Ok(obs)
}

fn unavailable(e: Unavailable) -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .content_type("text/plain")
        .body(format!("{e}\n"))
}

pub async fn status(state: web::Data<AppState>) -> HttpResponse {
    match observe(&state).await {
        Ok(o) => HttpResponse::Ok().json(status_json(&state, &o)),
        Err(e) => unavailable(e),
    }
}

pub fn status_json(state: &AppState, o: &Observation) -> serde_json::Value {
    let cfg = &state.config;
    let c = o.cleanup.as_ref();
    json!({
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
            "cleanupDelayMs": c.map(|c| c.cleanup_delay_ms).unwrap_or(cfg.starting_cleanup_delay_ms() as i64),
            "paused": c.is_some_and(|c| c.paused),
            "lastScheduledWatermark": c.and_then(|c| c.last_scheduled_watermark.clone()),
            "pendingWatermarks": c.map(|c| c.pending_watermarks.clone()).unwrap_or_default(),
            "cleanupsScheduled": c.map(|c| c.cleanups_scheduled_total).unwrap_or(0),
            "monitor": o.monitor,
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
        },
    })
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    match observe(&state).await {
        Ok(o) => HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4; charset=utf-8")
            .body(metrics_text(&state, &o)),
        Err(e) => unavailable(e),
    }
}

pub fn metrics_text(state: &AppState, o: &Observation) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let c = o.cleanup.as_ref();
    let delay_ms = c
        .map(|c| c.cleanup_delay_ms)
        .unwrap_or(state.config.starting_cleanup_delay_ms() as i64);
    metric(
        "change_streamer_reservations",
        "gauge",
        "Open snapshot reservations.",
        &[("", o.reservations.len() as f64)],
    );
    metric(
        "change_streamer_cleanup_delay_seconds",
        "gauge",
        "Current cleanup delay.",
        &[("", delay_ms as f64 / 1000.0)],
    );
    metric(
        "change_streamer_backup_watermarks_pending",
        "gauge",
        "Backed-up watermarks recorded and not yet scheduled for cleanup.",
        &[(
            "",
            c.map(|c| c.pending_watermarks.len()).unwrap_or(0) as f64,
        )],
    );
    metric(
        "change_streamer_cleanups_scheduled_total",
        "counter",
        "Cleanups scheduled by the backup monitor.",
        &[(
            "",
            c.map(|c| c.cleanups_scheduled_total).unwrap_or(0) as f64,
        )],
    );
    metric(
        "change_streamer_litestream_poll_errors_total",
        "counter",
        "Failed polls of litestream's metrics.",
        &[("", o.monitor.poll_errors_total as f64)],
    );
    metric(
        "change_streamer_litestream_polls_total",
        "counter",
        "Polls of litestream's metrics.",
        &[("", o.monitor.polls_total as f64)],
    );
    metric(
        "change_streamer_invalid_watermarks_total",
        "counter",
        "litestream progress samples ignored for an invalid watermark or time.",
        &[("", o.monitor.invalid_watermarks_total as f64)],
    );
    metric(
        "change_streamer_changes_stored_total",
        "counter",
        "Changes stored in the change log since start.",
        &[("", o.log.changes_stored_total as f64)],
    );
    metric(
        "change_streamer_changes_purged_total",
        "counter",
        "Changes purged from the change log since start.",
        &[("", o.log.changes_purged_total as f64)],
    );
    metric(
        "change_streamer_change_log_rows",
        "gauge",
        "Rows in the change log.",
        &[("", o.log.rows as f64)],
    );
    metric(
        "change_streamer_subscribers",
        "gauge",
        "Connected subscribers.",
        &[("", o.streamer.subscribers.len() as f64)],
    );
    metric(
        "change_streamer_flow_control_releases_total",
        "counter",
        "Tracked sends released, by all acks or by consensus.",
        &[
            ("{mode=\"all\"}", o.streamer.releases_all as f64),
            ("{mode=\"consensus\"}", o.streamer.releases_consensus as f64),
        ],
    );
    metric(
        "change_streamer_upstream_connected",
        "gauge",
        "1 while connected to the change source.",
        &[(
            "",
            if o.streamer.upstream_connected {
                1.0
            } else {
                0.0
            },
        )],
    );
    metric(
        "change_streamer_purges_total",
        "counter",
        "Purges carried out.",
        &[("", o.purge.purges as f64)],
    );
    let labels: Vec<String> = o
        .streamer
        .subscribers
        .iter()
        .map(|s| {
            let mode = if s.mode == Mode::Backup {
                "backup"
            } else {
                "serving"
            };
            format!("{{id=\"{}\",mode=\"{mode}\"}}", escape_label(&s.id))
        })
        .collect();
    let per_sub = |f: &dyn Fn(&SubscriberInfo) -> f64| -> Vec<(&str, f64)> {
        labels
            .iter()
            .zip(&o.streamer.subscribers)
            .map(|(l, s)| (l.as_str(), f(s)))
            .collect()
    };
    metric(
        "change_streamer_subscriber_pending_messages",
        "gauge",
        "Messages sent to a subscriber and not yet acked, plus its catch-up backlog.",
        &per_sub(&|s| s.pending as f64),
    );
    metric(
        "change_streamer_subscriber_process_rate",
        "gauge",
        "Messages a subscriber acked per second, over the last ten seconds.",
        &per_sub(&|s| s.process_rate),
    );
    out
}

/// Escapes a Prometheus label value.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
