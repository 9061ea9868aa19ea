//! What the owner's actors answer for `/status` and `/metrics`: the [`Observation`] both are
//! rendered from, gathered by asking each actor for its state at each request, so the two views
//! always agree.

use actix_web::HttpResponse;
use change_streamer_actors::changelog::LogStats;
use change_streamer_actors::cleanup::{CleanupState, GetCleanupState};
use change_streamer_actors::monitor::{GetMonitorStats, MonitorStats};
use change_streamer_actors::purger::{GetPurgeState, PurgeState};
use change_streamer_actors::reservation::{
    GetReservationStats, ListReservations, ReservationInfo, ReservationStats,
};
use change_streamer_actors::streamer::{GetStreamerState, StreamerState};

use crate::http::AppState;

/// Everything `/status` and `/metrics` show, asked from the actors.
#[derive(Debug, Clone)]
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

/// An actor that did not answer (it stopped: the service is stopping).
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

/// The 503 of `/status` and `/metrics` while an actor does not answer (PROTOCOL.md §11).
pub fn unavailable(e: Unavailable) -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .content_type("text/plain")
        .body(format!("{e}\n"))
}
