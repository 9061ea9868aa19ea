//! `GET /metrics` (PROTOCOL.md §11): the Prometheus text of the service's own metrics, defined
//! once in [`defs`] and set on a registry per scrape ([`scrape`]), which adds the standard
//! `process_*` metrics.
//!
//! Why a registry per scrape: the values live in the actors and are asked for on each request
//! ([`observe`](super::status::observe)), as `/status` does, so both views agree; nothing is
//! kept between scrapes. The owner's page is built in four phases (who answers, the backup,
//! the change log, the subscribers); a standby's is the first and its stages.

pub mod defs;
mod scrape;

use std::time::Duration;

use actix_web::HttpResponse;
use change_streamer_actors::purger::BlockedBy;
use change_streamer_actors::stall::StageState;
use change_streamer_actors::streamer::{Mode, StreamerState, SubscriberInfo};
use prometheus::{Encoder, TextEncoder};

use self::defs::*;
use self::scrape::Scrape;
use super::access::{AuthFailures, Refusal};
use super::status::{cleanup_delay, learned_delay, observe, unavailable, Observation};
use super::AppState;

pub async fn metrics(state: &AppState) -> HttpResponse {
    match observe(state).await {
        Ok(o) => page(owner_page(&Facts::of(state, &o), &o)),
        Err(e) => unavailable(e),
    }
}

/// The answer for a rendered page (the owner's or a standby's).
pub fn page(text: prometheus::Result<String>) -> HttpResponse {
    match text {
        Ok(text) => HttpResponse::Ok()
            .content_type(TextEncoder::new().format_type())
            .body(text),
        Err(e) => HttpResponse::InternalServerError()
            .content_type("text/plain")
            .body(format!("rendering the metrics failed: {e}\n")),
    }
}

/// What the owner's page shows beside its actors' [`Observation`].
#[derive(Debug, Clone)]
pub struct Facts {
    /// Whether this instance still owns the change log.
    pub owner: bool,
    pub failures: AuthFailures,
    /// As `/status` shows it ([`cleanup_delay`]).
    pub cleanup_delay: Duration,
}

impl Facts {
    fn of(state: &AppState, o: &Observation) -> Facts {
        Facts {
            owner: state.log.is_owner(),
            failures: state.access.failures(),
            cleanup_delay: cleanup_delay(&state.config, o.cleanup.as_ref().map(learned_delay)),
        }
    }
}

/// Every metric of the owner's page ([`OWNER_PAGE`]).
pub fn owner_page(f: &Facts, o: &Observation) -> prometheus::Result<String> {
    let m = Scrape::default();
    who_answers(&m, f.owner, &f.failures)?;
    backup(&m, o, f.cleanup_delay)?;
    change_log(&m, o)?;
    subscribers(&m, &o.streamer)?;
    m.render()
}

/// A standby's page ([`STANDBY_PAGE`]): `change_streamer_owner 0`, the access rule's refusals
/// and, at a serving standby, its `stages` (PROTOCOL.md §11.1).
pub fn standby_page(failures: &AuthFailures, stages: &[StageState]) -> prometheus::Result<String> {
    let m = Scrape::default();
    who_answers(&m, false, failures)?;
    stalled(&m, stages)?;
    m.render()
}

/// Whether this instance owns the change DB, and the requests its access rule refused.
fn who_answers(m: &Scrape, owner: bool, failures: &AuthFailures) -> prometheus::Result<()> {
    m.set(&OWNER, f64::from(u8::from(owner)))?;
    m.set_each(
        &AUTH_FAILURES,
        Refusal::ALL.map(|r| ([r.reason()], failures.get(r) as f64)),
    )?;
    m.set_each(
        &AUTH_SUCCESSES,
        [["1"], ["2"]]
            .into_iter()
            .zip(failures.successes.map(|n| n as f64)),
    )
}

/// The snapshot reservations, the cleanup they pause and the backup monitor's polls.
fn backup(m: &Scrape, o: &Observation, delay: Duration) -> prometheus::Result<()> {
    let c = o.cleanup.as_ref();
    let oldest_ms = o.reservations.iter().map(|r| r.held_ms).max().unwrap_or(0);
    m.set(&RESERVATIONS, o.reservations.len() as f64)?;
    m.set(&RESERVATION_OLDEST, oldest_ms.max(0) as f64 / 1000.0)?;
    m.set(
        &RESERVATIONS_EXPIRED,
        o.reservation_stats.expired_total as f64,
    )?;
    m.set_each(
        &RESTORE_RATIO,
        o.reservations.iter().filter_map(|r| {
            let ratio = r.progress.as_ref()?.ratio()?;
            Some(([r.task_id.as_str()], ratio))
        }),
    )?;
    m.set(&CLEANUP_DELAY, delay.as_secs_f64())?;
    let pending = c.map(|c| c.pending_watermarks.len()).unwrap_or(0);
    m.set(&WATERMARKS_PENDING, pending as f64)?;
    let scheduled = c.map(|c| c.cleanups_scheduled_total).unwrap_or(0);
    m.set(&CLEANUPS_SCHEDULED, scheduled as f64)?;
    m.set(&POLLS, o.monitor.polls_total as f64)?;
    m.set(&POLL_ERRORS, o.monitor.poll_errors_total as f64)?;
    m.set_each(
        &AUDIT_FAILURES,
        o.audits
            .iter()
            .map(|a| ([a.backup.as_str()], a.failures_total as f64)),
    )?;
    m.set(
        &INVALID_WATERMARKS,
        o.monitor.invalid_watermarks_total as f64,
    )?;
    let backups = o
        .quorum
        .as_ref()
        .map(|q| q.backups.as_slice())
        .unwrap_or(&[]);
    m.set_each(
        &BACKUP_WATERMARK,
        backups.iter().filter_map(|b| {
            let value = b.watermark.as_ref()?.to_u64()?;
            Some(([b.name.as_str()], value as f64))
        }),
    )?;
    m.set_each(
        &BACKUP_AGE,
        backups
            .iter()
            .filter_map(|b| Some(([b.name.as_str()], b.age_ms? as f64 / 1000.0))),
    )
}

/// What the change log holds, and its purges (PROTOCOL.md §9).
fn change_log(m: &Scrape, o: &Observation) -> prometheus::Result<()> {
    m.set(&CHANGES_STORED, o.log.changes_stored_total as f64)?;
    m.set(&CHANGES_PURGED, o.log.changes_purged_total as f64)?;
    m.set(&CHANGE_LOG_ROWS, o.log.rows as f64)?;
    m.set(&CHANGE_LOG_BYTES, o.change_log_bytes as f64)?;
    m.set(&PURGES, o.purge.purges as f64)?;
    stalled(m, &o.stages)?;
    m.set_each(
        &PURGE_BLOCKED,
        BlockedBy::ALL.map(|b| {
            (
                [b.as_str()],
                f64::from(u8::from(o.purge.blocked_by == Some(b))),
            )
        }),
    )
}

/// `change_streamer_stage_stalled`: each stage that reported, 1 while stalled (PROTOCOL.md §11.1).
fn stalled(m: &Scrape, stages: &[StageState]) -> prometheus::Result<()> {
    m.set_each(
        &STAGE_STALLED,
        stages.iter().map(|s| {
            let stalled = f64::from(u8::from(s.stalled_ms.is_some()));
            ([s.stage.as_str()], stalled)
        }),
    )
}

/// The upstream, the subscribers and their flow control (PROTOCOL.md §10), each subscriber's
/// series by id.
fn subscribers(m: &Scrape, s: &StreamerState) -> prometheus::Result<()> {
    let subs = &s.subscribers;
    m.set(
        &UPSTREAM_CONNECTED,
        f64::from(u8::from(s.upstream_connected)),
    )?;
    m.set(&SUBSCRIBERS, subs.len() as f64)?;
    m.set_each(
        &RELEASES,
        [
            (["all"], s.releases_all as f64),
            (["consensus"], s.releases_consensus as f64),
        ],
    )?;
    m.set(&EVICTED, s.subscribers_evicted as f64)?;
    m.set(&QUEUED_BYTES, s.queued_bytes as f64)?;
    m.set_each(
        &PENDING_CHANGES,
        per_id(subs, |s| s.pending as f64, |a, b| a + b),
    )?;
    m.set_each(
        &PENDING_MESSAGES,
        subs.iter().map(|s| (labels(s), s.pending as f64)),
    )?;
    let bytes = per_id(subs, |s| s.queued_bytes as f64, |a, b| a + b);
    m.set_each(&SUBSCRIBER_QUEUED_BYTES, bytes)?;
    m.set_each(&LAG, per_id(subs, |s| s.lag_seconds, f64::max))?;
    m.set_each(
        &PROCESS_RATE,
        subs.iter().map(|s| (labels(s), s.process_rate)),
    )
}

/// One sample per subscriber id, `value` of each subscriber, `merge`d when two connections
/// share an id (a replica reconnecting while its old socket lingers).
fn per_id(
    subs: &[SubscriberInfo],
    value: impl Fn(&SubscriberInfo) -> f64,
    merge: impl Fn(f64, f64) -> f64,
) -> Vec<([&str; 1], f64)> {
    let mut by_id: std::collections::BTreeMap<&str, f64> = std::collections::BTreeMap::new();
    for s in subs {
        let v = value(s);
        by_id
            .entry(s.id.as_str())
            .and_modify(|m| *m = merge(*m, v))
            .or_insert(v);
    }
    by_id.into_iter().map(|(id, v)| ([id], v)).collect()
}

/// The labels of a per-subscriber metric: its id and mode.
fn labels(s: &SubscriberInfo) -> [&str; 2] {
    let mode = if s.mode == Mode::Backup {
        "backup"
    } else {
        "serving"
    };
    [s.id.as_str(), mode]
}
