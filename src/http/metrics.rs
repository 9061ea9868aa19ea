//! `GET /metrics` (PROTOCOL.md §11): the Prometheus text of the service's own metrics, rendered by the
//! `prometheus` crate (its text encoder does the format and the label escaping; its process
//! collector adds the standard `process_*` metrics).
//!
//! Why a registry per scrape: the values live in the actors and are asked for on each request
//! ([`observe`](super::status::observe)), as `/status` does, so both views agree; nothing is
//! kept between scrapes. Adding a metric is one call on [`Scrape`].

use actix_web::HttpResponse;
use change_streamer_actors::purger::BlockedBy;
use change_streamer_actors::streamer::{Mode, SubscriberInfo};
use prometheus::core::Collector;
use prometheus::{Counter, CounterVec, Encoder, Gauge, GaugeVec, Opts, Registry, TextEncoder};

use super::access::{AuthFailures, Refusal};
use super::status::{observe, unavailable, Observation};
use super::AppState;

/// The help of the `change_streamer_owner` gauge.
pub const OWNER_GAUGE_HELP: &str = "1 if this instance owns the change DB, 0 on a standby.";

pub async fn metrics(state: &AppState) -> HttpResponse {
    let o = match observe(state).await {
        Ok(o) => o,
        Err(e) => return unavailable(e),
    };
    match metrics_text(state, &o) {
        Ok(text) => HttpResponse::Ok()
            .content_type(TextEncoder::new().format_type())
            .body(text),
        Err(e) => HttpResponse::InternalServerError()
            .content_type("text/plain")
            .body(format!("rendering the metrics failed: {e}\n")),
    }
}

const AUTH_FAILURES_HELP: &str =
    "Requests refused by the access rule (PROTOCOL.md §15), by reason.";

/// `change_streamer_auth_failures_total` alone (a standby's `/metrics`).
pub fn auth_failures_text(failures: &AuthFailures) -> String {
    let m = Scrape::default();
    let rendered = m
        .counters(
            "change_streamer_auth_failures_total",
            AUTH_FAILURES_HELP,
            &["reason"],
            Refusal::ALL.map(|r| ([r.reason()], failures.get(r) as f64)),
        )
        .and_then(|()| m.render());
    rendered.unwrap_or_default()
}

/// Every metric of one scrape, built from `o`.
pub fn metrics_text(state: &AppState, o: &Observation) -> prometheus::Result<String> {
    let m = Scrape::default();
    let c = o.cleanup.as_ref();
    let delay_ms = c
        .map(|c| c.cleanup_delay_ms)
        .unwrap_or(state.config.starting_cleanup_delay().as_millis() as i64);
    m.gauge(
        "change_streamer_owner",
        OWNER_GAUGE_HELP,
        f64::from(u8::from(state.log.is_owner())),
    )?;
    let failures = state.access.failures();
    m.counters(
        "change_streamer_auth_failures_total",
        AUTH_FAILURES_HELP,
        &["reason"],
        Refusal::ALL.map(|r| ([r.reason()], failures.get(r) as f64)),
    )?;
    m.gauge(
        "change_streamer_reservations",
        "Open snapshot reservations.",
        o.reservations.len() as f64,
    )?;
    m.gauge(
        "change_streamer_cleanup_delay_seconds",
        "Current cleanup delay.",
        delay_ms as f64 / 1000.0,
    )?;
    m.gauge(
        "change_streamer_backup_watermarks_pending",
        "Backed-up watermarks recorded and not yet scheduled for cleanup.",
        c.map(|c| c.pending_watermarks.len()).unwrap_or(0) as f64,
    )?;
    m.counter(
        "change_streamer_cleanups_scheduled_total",
        "Cleanups scheduled by the backup monitor.",
        c.map(|c| c.cleanups_scheduled_total).unwrap_or(0) as f64,
    )?;
    m.counter(
        "change_streamer_litestream_poll_errors_total",
        "Failed polls of litestream's metrics.",
        o.monitor.poll_errors_total as f64,
    )?;
    m.counter(
        "change_streamer_litestream_polls_total",
        "Polls of litestream's metrics.",
        o.monitor.polls_total as f64,
    )?;
    m.counter(
        "change_streamer_invalid_watermarks_total",
        "litestream progress samples ignored for an invalid watermark or time.",
        o.monitor.invalid_watermarks_total as f64,
    )?;
    m.counter(
        "change_streamer_changes_stored_total",
        "Changes stored in the change log since start.",
        o.log.changes_stored_total as f64,
    )?;
    m.counter(
        "change_streamer_changes_purged_total",
        "Changes purged from the change log since start.",
        o.log.changes_purged_total as f64,
    )?;
    m.gauge(
        "change_streamer_change_log_rows",
        "Rows in the change log.",
        o.log.rows as f64,
    )?;
    m.gauge(
        "change_streamer_subscribers",
        "Connected subscribers.",
        o.streamer.subscribers.len() as f64,
    )?;
    m.counters(
        "change_streamer_flow_control_releases_total",
        "Tracked sends released, by all acks or by consensus.",
        &["mode"],
        [
            (["all"], o.streamer.releases_all as f64),
            (["consensus"], o.streamer.releases_consensus as f64),
        ],
    )?;
    m.gauge(
        "change_streamer_upstream_connected",
        "1 while connected to the change source.",
        if o.streamer.upstream_connected {
            1.0
        } else {
            0.0
        },
    )?;
    m.counter(
        "change_streamer_purges_total",
        "Purges carried out.",
        o.purge.purges as f64,
    )?;
    m.counter(
        "change_streamer_reservations_expired_total",
        "Snapshot reservations ended by --max-reservation-ms.",
        o.reservation_stats.expired_total as f64,
    )?;
    m.gauge(
        "change_streamer_reservation_oldest_seconds",
        "How long the oldest open snapshot reservation has been held (0 when none).",
        o.reservations
            .iter()
            .map(|r| r.held_ms)
            .max()
            .unwrap_or(0)
            .max(0) as f64
            / 1000.0,
    )?;
    m.gauge(
        "change_streamer_change_log_bytes",
        "Bytes of the change log's database and WAL files.",
        o.change_log_bytes as f64,
    )?;
    m.gauges(
        "change_streamer_purge_blocked",
        "1 for what holds the oldest scheduled purge back (PROTOCOL.md §9), 0 for the other reasons.",
        &["reason"],
        BlockedBy::ALL.map(|b| {
            let now = if o.purge.blocked_by == Some(b) {
                1.0
            } else {
                0.0
            };
            ([b.as_str()], now)
        }),
    )?;
    m.counter(
        "change_streamer_subscribers_evicted_total",
        "Subscribers closed for lagging on a tracked send past --slow-subscriber-grace-ms.",
        o.streamer.subscribers_evicted as f64,
    )?;
    m.gauges(
        "change_streamer_subscriber_pending_messages",
        "Messages sent to a subscriber and not yet acked, plus its catch-up backlog.",
        &["id", "mode"],
        o.streamer
            .subscribers
            .iter()
            .map(|s| (subscriber(s), s.pending as f64)),
    )?;
    m.gauges(
        "change_streamer_subscriber_pending_changes",
        "Changes sent or queued for a subscriber and not yet acked.",
        &["id"],
        per_id(&o.streamer.subscribers, |s| s.pending as f64, |a, b| a + b),
    )?;
    m.gauges(
        "change_streamer_subscriber_queued_bytes",
        "Bytes of change payload held for a subscriber: sent and not acked, or queued (PROTOCOL.md §10.2).",
        &["id"],
        per_id(
            &o.streamer.subscribers,
            |s| s.queued_bytes as f64,
            |a, b| a + b,
        ),
    )?;
    m.gauge(
        "change_streamer_queued_bytes",
        "Bytes of change payload held for all subscribers together (PROTOCOL.md §10.2).",
        o.streamer.queued_bytes as f64,
    )?;
    m.gauges(
        "change_streamer_subscriber_lag_seconds",
        "Age of a subscriber's oldest unacked change; 0 when none.",
        &["id"],
        per_id(&o.streamer.subscribers, |s| s.lag_seconds, f64::max),
    )?;
    m.gauges(
        "change_streamer_subscriber_process_rate",
        "Messages a subscriber acked per second, over the last ten seconds.",
        &["id", "mode"],
        o.streamer
            .subscribers
            .iter()
            .map(|s| (subscriber(s), s.process_rate)),
    )?;
    m.render()
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
fn subscriber(s: &SubscriberInfo) -> [&str; 2] {
    let mode = if s.mode == Mode::Backup {
        "backup"
    } else {
        "serving"
    };
    [s.id.as_str(), mode]
}

/// The registry of one scrape, with one call per kind of metric.
struct Scrape {
    registry: Registry,
}

impl Default for Scrape {
    /// Starts with the process collector (`process_cpu_seconds_total`,
    /// `process_resident_memory_bytes`, `process_open_fds`, `process_start_time_seconds`…).
    fn default() -> Self {
        let registry = Registry::new();
        // Only fails on a name registered twice, which an empty registry cannot have.
        let _ = registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        Scrape { registry }
    }
}

impl Scrape {
    fn add(&self, metric: impl Collector + 'static) -> prometheus::Result<()> {
        self.registry.register(Box::new(metric))
    }

    fn gauge(&self, name: &str, help: &str, value: f64) -> prometheus::Result<()> {
        let g = Gauge::with_opts(Opts::new(name, help))?;
        g.set(value);
        self.add(g)
    }

    /// A counter whose total is kept elsewhere (by an actor): set once to `total`.
    fn counter(&self, name: &str, help: &str, total: f64) -> prometheus::Result<()> {
        let c = Counter::with_opts(Opts::new(name, help))?;
        c.inc_by(total);
        self.add(c)
    }

    fn gauges<'a, const N: usize>(
        &self,
        name: &str,
        help: &str,
        labels: &[&str; N],
        samples: impl IntoIterator<Item = ([&'a str; N], f64)>,
    ) -> prometheus::Result<()> {
        let g = GaugeVec::new(Opts::new(name, help), labels)?;
        for (values, v) in samples {
            g.get_metric_with_label_values(&values)?.set(v);
        }
        self.add(g)
    }

    fn counters<'a, const N: usize>(
        &self,
        name: &str,
        help: &str,
        labels: &[&str; N],
        samples: impl IntoIterator<Item = ([&'a str; N], f64)>,
    ) -> prometheus::Result<()> {
        let c = CounterVec::new(Opts::new(name, help), labels)?;
        for (values, total) in samples {
            c.get_metric_with_label_values(&values)?.inc_by(total);
        }
        self.add(c)
    }

    fn render(&self) -> prometheus::Result<String> {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}
