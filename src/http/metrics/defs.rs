//! The service's own metrics, one definition each (name, type, help, labels): the one table the
//! `/metrics` page renders from ([`super::Scrape`] takes a [`Metric`]) and that
//! `tests/operator_doc.rs` checks against PROTOCOL.md §11's list. Adding a metric is a row here,
//! a line in §11, and one call where the page is built.

/// Prometheus's type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    /// A total kept by an actor; set once per scrape.
    Counter,
}

impl Kind {
    /// As Prometheus's text format and PROTOCOL.md write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        }
    }
}

/// One metric of `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub labels: &'static [&'static str],
}

const fn gauge(name: &'static str, help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Gauge,
        help,
        labels: &[],
    }
}

const fn counter(name: &'static str, help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Counter,
        help,
        labels: &[],
    }
}

impl Metric {
    /// The same metric, with these labels.
    const fn by(self, labels: &'static [&'static str]) -> Metric {
        Metric { labels, ..self }
    }
}

pub const OWNER: Metric = gauge(
    "change_streamer_owner",
    "1 if this instance owns the change DB, 0 on a standby.",
);
pub const AUTH_FAILURES: Metric = counter(
    "change_streamer_auth_failures_total",
    "Requests refused by the access rule (PROTOCOL.md §15), by reason.",
)
.by(&["reason"]);
pub const AUTH_SUCCESSES: Metric = counter(
    "change_streamer_auth_success_total",
    "Requests admitted with a secret (PROTOCOL.md §15.1), by which one: 1 or 2.",
)
.by(&["secret"]);
pub const RESERVATIONS: Metric = gauge(
    "change_streamer_reservations",
    "Open snapshot reservations.",
);
pub const RESERVATION_OLDEST: Metric = gauge(
    "change_streamer_reservation_oldest_seconds",
    "How long the oldest open snapshot reservation has been held (0 when none).",
);
pub const RESERVATIONS_EXPIRED: Metric = counter(
    "change_streamer_reservations_expired_total",
    "Snapshot reservations ended by --max-reservation-ms.",
);
pub const RESTORE_RATIO: Metric = gauge(
    "change_streamer_reservation_restore_ratio",
    "Bytes a reserving replica reported restored over its status's replicaSize (PROTOCOL.md §6.8).",
)
.by(&["task"]);
pub const CLEANUP_DELAY: Metric = gauge(
    "change_streamer_cleanup_delay_seconds",
    "Current cleanup delay.",
);
pub const WATERMARKS_PENDING: Metric = gauge(
    "change_streamer_backup_watermarks_pending",
    "Backed-up watermarks recorded and not yet scheduled for cleanup.",
);
pub const CLEANUPS_SCHEDULED: Metric = counter(
    "change_streamer_cleanups_scheduled_total",
    "Cleanups scheduled by the backup monitor.",
);
pub const POLLS: Metric = counter(
    "change_streamer_litestream_polls_total",
    "Polls of litestream's metrics.",
);
pub const POLL_ERRORS: Metric = counter(
    "change_streamer_litestream_poll_errors_total",
    "Failed polls of litestream's metrics.",
);
pub const AUDIT_FAILURES: Metric = counter(
    "change_streamer_backup_audit_failures_total",
    "Audit reads of a backup that found less than was confirmed (PROTOCOL.md §8.1d).",
)
.by(&["backup"]);
pub const INVALID_WATERMARKS: Metric = counter(
    "change_streamer_invalid_watermarks_total",
    "litestream progress samples ignored for an invalid watermark or time.",
);
pub const BACKUP_WATERMARK: Metric = gauge(
    "change_streamer_backup_watermark",
    "A backup's highest held watermark, the LexiVersion read as a number (PROTOCOL.md §8.4).",
)
.by(&["backup"]);
pub const BACKUP_AGE: Metric = gauge(
    "change_streamer_backup_age_seconds",
    "Seconds since a backup first held its highest held watermark (PROTOCOL.md §8.4).",
)
.by(&["backup"]);
pub const CHANGES_STORED: Metric = counter(
    "change_streamer_changes_stored_total",
    "Changes stored in the change log since start.",
);
pub const CHANGES_PURGED: Metric = counter(
    "change_streamer_changes_purged_total",
    "Changes purged from the change log since start.",
);
pub const CHANGE_LOG_ROWS: Metric =
    gauge("change_streamer_change_log_rows", "Rows in the change log.");
pub const CHANGE_LOG_BYTES: Metric = gauge(
    "change_streamer_change_log_bytes",
    "Bytes of the change log's database and WAL files.",
);
pub const PURGES: Metric = counter("change_streamer_purges_total", "Purges carried out.");
pub const PURGE_BLOCKED: Metric = gauge(
    "change_streamer_purge_blocked",
    "1 for what holds the oldest scheduled purge back (PROTOCOL.md §9), 0 for the other reasons.",
)
.by(&["reason"]);
pub const UPSTREAM_CONNECTED: Metric = gauge(
    "change_streamer_upstream_connected",
    "1 while connected to the change source.",
);
pub const SUBSCRIBERS: Metric = gauge("change_streamer_subscribers", "Connected subscribers.");
pub const RELEASES: Metric = counter(
    "change_streamer_flow_control_releases_total",
    "Tracked sends released, by all acks or by consensus.",
)
.by(&["mode"]);
pub const EVICTED: Metric = counter(
    "change_streamer_subscribers_evicted_total",
    "Subscribers closed for lagging on a tracked send past --slow-subscriber-grace-ms.",
);
pub const PENDING_CHANGES: Metric = gauge(
    "change_streamer_subscriber_pending_changes",
    "Changes sent or queued for a subscriber and not yet acked.",
)
.by(&["id"]);
pub const PENDING_MESSAGES: Metric = gauge(
    "change_streamer_subscriber_pending_messages",
    "Messages sent to a subscriber and not yet acked, plus its catch-up backlog.",
)
.by(&["id", "mode"]);
pub const SUBSCRIBER_QUEUED_BYTES: Metric = gauge(
    "change_streamer_subscriber_queued_bytes",
    "Bytes of change payload held for a subscriber: sent and not acked, or queued (PROTOCOL.md §10.2).",
)
.by(&["id"]);
pub const QUEUED_BYTES: Metric = gauge(
    "change_streamer_queued_bytes",
    "Bytes of change payload held for all subscribers together (PROTOCOL.md §10.2).",
);
pub const LAG: Metric = gauge(
    "change_streamer_subscriber_lag_seconds",
    "Age of a subscriber's oldest unacked change; 0 when none.",
)
.by(&["id"]);
pub const PROCESS_RATE: Metric = gauge(
    "change_streamer_subscriber_process_rate",
    "Messages a subscriber acked per second, over the last ten seconds.",
)
.by(&["id", "mode"]);

pub const STAGE_STALLED: Metric = gauge(
    "change_streamer_stage_stalled",
    "1 while the stage has had work pending and no progress for --stall-alarm-ms (PROTOCOL.md §11.1), else 0.",
)
.by(&["stage"]);

/// Every metric of the owner's page, in PROTOCOL.md §11's order.
pub const OWNER_PAGE: &[Metric] = &[
    OWNER,
    AUTH_FAILURES,
    AUTH_SUCCESSES,
    RESERVATIONS,
    RESERVATION_OLDEST,
    RESERVATIONS_EXPIRED,
    RESTORE_RATIO,
    CLEANUP_DELAY,
    WATERMARKS_PENDING,
    CLEANUPS_SCHEDULED,
    POLLS,
    POLL_ERRORS,
    AUDIT_FAILURES,
    INVALID_WATERMARKS,
    BACKUP_WATERMARK,
    BACKUP_AGE,
    CHANGES_STORED,
    CHANGES_PURGED,
    CHANGE_LOG_ROWS,
    CHANGE_LOG_BYTES,
    PURGES,
    PURGE_BLOCKED,
    STAGE_STALLED,
    UPSTREAM_CONNECTED,
    SUBSCRIBERS,
    RELEASES,
    EVICTED,
    PENDING_CHANGES,
    PENDING_MESSAGES,
    SUBSCRIBER_QUEUED_BYTES,
    QUEUED_BYTES,
    LAG,
    PROCESS_RATE,
];

/// Every metric of a standby's page (PROTOCOL.md §11).
pub const STANDBY_PAGE: &[Metric] = &[OWNER, AUTH_FAILURES, AUTH_SUCCESSES, STAGE_STALLED];
