//! What the owner's actors answer for `/status` and `/metrics`: the [`Observation`] both are
//! rendered from, gathered by asking each actor for its state at each request, so the two views
//! always agree.

use actix_web::HttpResponse;
use change_streamer_actors::changelog::LogStats;
use change_streamer_actors::cleanup::{CleanupState, GetCleanupState};
use change_streamer_actors::monitor::{
    AuditStats, GetMonitorStats, GetQuorumState, MonitorStats, QuorumState,
};
use change_streamer_actors::purger::{GetPurgeState, PurgeState};
use change_streamer_actors::reservation::{
    GetReservationStats, ListReservations, ReservationInfo, ReservationStats,
};
use change_streamer_actors::stall::{GetStages, StageState};
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
    /// The monitors' counters, summed over the backups (PROTOCOL.md §8.4).
    pub monitor: MonitorStats,
    /// Each backup's audit (PROTOCOL.md §8.1d), one `/metrics` series each.
    pub audits: Vec<AuditStats>,
    /// Each backup's state and the purge floor; `None` without a backup monitor.
    pub quorum: Option<QuorumState>,
    /// Every stage that reported to the stall watch (PROTOCOL.md §11.1).
    pub stages: Vec<StageState>,
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
    let stages = state.stall.send(GetStages);
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
        audits: Vec::new(),
        quorum: None,
        // The watch stops last at shutdown; until then it answers.
        stages: stages.await.unwrap_or_default(),
        change_log_bytes: bytes.map_err(|e| Unavailable("change log", e.to_string()))?,
    };
    if let Some(b) = &state.backup {
        let monitors =
            futures_util::future::join_all(b.monitors.iter().map(|m| m.send(GetMonitorStats)));
        let (c, r, m, rs) = futures_util::future::join4(
            b.cleanup.send(GetCleanupState),
            b.reservations.send(ListReservations),
            monitors,
            b.reservations.send(GetReservationStats),
        )
        .await;
        obs.cleanup = Some(c.map_err(|e| Unavailable("cleanup", e.to_string()))?);
        obs.reservations = r.map_err(|e| Unavailable("reservations", e.to_string()))?;
        obs.reservation_stats = rs.map_err(|e| Unavailable("reservations", e.to_string()))?;
        // The monitors stop before the others at shutdown; their counters are then unknown.
        let m: Vec<MonitorStats> = m.into_iter().map(Result::unwrap_or_default).collect();
        obs.audits = m.iter().filter_map(|s| s.audit.clone()).collect();
        obs.monitor = summed(m);
        obs.quorum = b.quorum.send(GetQuorumState).await.ok();
    }
    Ok(obs)
}

/// One backup's counters as they are; several backups' summed, the latest poll ok only if
/// every backup's was, the first error found, and the first audit that blocks the purge (else
/// the first audit) (PROTOCOL.md §11).
fn summed(mut each: Vec<MonitorStats>) -> MonitorStats {
    if each.len() == 1 {
        return each.remove(0);
    }
    let mut all = MonitorStats::default();
    for m in each {
        all.polls_total += m.polls_total;
        all.poll_errors_total += m.poll_errors_total;
        all.invalid_watermarks_total += m.invalid_watermarks_total;
        all.backup_reads_total += m.backup_reads_total;
        all.last_poll_ok = match (all.last_poll_ok, m.last_poll_ok) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (Some(true), _) | (_, Some(true)) => Some(true),
            (None, None) => None,
        };
        all.last_error = all.last_error.or(m.last_error);
        all.backup_watermark = all.backup_watermark.max(m.backup_watermark);
        let blocks = |a: &Option<AuditStats>| a.as_ref().is_some_and(|a| a.blocked_below.is_some());
        if all.audit.is_none() || (!blocks(&all.audit) && blocks(&m.audit)) {
            all.audit = m.audit.or(all.audit);
        }
    }
    all
}

/// The 503 of `/status` and `/metrics` while an actor does not answer (PROTOCOL.md §11).
pub fn unavailable(e: Unavailable) -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .content_type("text/plain")
        .body(format!("{e}\n"))
}

#[cfg(test)]
mod tests {
    use change_streamer_actors::watermark::Watermark;

    use super::*;

    fn audited(backup: &str, blocked_below: Option<u64>) -> MonitorStats {
        MonitorStats {
            audit: Some(AuditStats {
                backup: backup.into(),
                blocked_below: blocked_below.map(Watermark::from_u64),
                ..AuditStats::default()
            }),
            ..MonitorStats::default()
        }
    }

    /// PROTOCOL.md §11: with several backups `backup.monitor.audit` is the first audit that
    /// blocks the purge, else the first audit; none is lost for want of a slot.
    #[test]
    fn several_backups_show_the_audit_that_blocks() {
        let all = summed(vec![
            audited("east", None),
            audited("west", Some(105)),
            audited("north", Some(104)),
        ]);
        assert_eq!(all.audit.map(|a| a.backup), Some("west".to_string()));
        let none_blocks = summed(vec![MonitorStats::default(), audited("west", None)]);
        assert_eq!(
            none_blocks.audit.map(|a| a.backup),
            Some("west".to_string())
        );
    }
}
