//! PROTOCOL.md §11 against the code: the keys of `/status` (the owner's and a standby's
//! examples) against what [`Status`] serializes, and the `/metrics` list against the one table of
//! metric definitions the page renders from, both ways: a key or metric documented but not
//! produced fails, and so does one produced but not documented.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use change_streamer::http::access::AuthFailures;
use change_streamer::http::metrics::defs::{Metric, OWNER_PAGE, STANDBY_PAGE};
use change_streamer::http::metrics::{owner_page, standby_page, Facts};
use change_streamer::http::status::{Observation, Status};
use change_streamer::Config;
use change_streamer_actors::changelog::{
    ChangeDbView, LogStats, RecordedWatermark, SafetyState, StoredReservation,
};
use change_streamer_actors::cleanup::{CleanupState, PendingWatermark};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::instance::{InstanceId, InstanceSeen};
use change_streamer_actors::monitor::{
    AuditStats, BackupState, MonitorStats, QuorumState, SINGLE_BACKUP,
};
use change_streamer_actors::ownership::Role;
use change_streamer_actors::purger::PurgeState;
use change_streamer_actors::reservation::{ProgressInfo, ReservationInfo, ReservationStats};
use change_streamer_actors::stall::StageState;
use change_streamer_actors::streamer::{Mode, Phase, StreamerState, SubscriberInfo};
use change_streamer_actors::watermark::Watermark;
use clap::Parser;
use serde_json::Value;

/// PROTOCOL.md §11, from its heading to the next section's.
fn section_11() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PROTOCOL.md");
    let doc = std::fs::read_to_string(path).expect("docs/PROTOCOL.md is readable");
    let start = doc.find("\n## 11. ").expect("PROTOCOL.md has a §11");
    let end = doc[start + 1..]
        .find("\n## ")
        .map_or(doc.len(), |e| start + 1 + e);
    doc[start..end].to_string()
}

/// §11's `/status` examples, by their `role`.
fn documented_status(role: &str) -> Value {
    let section = section_11();
    section
        .split("```json\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .map(|block| serde_json::from_str::<Value>(block).expect("a §11 example is JSON"))
        .find(|v| v["role"] == role)
        .unwrap_or_else(|| panic!("§11 has no /status example with \"role\": \"{role}\""))
}

/// The keys where `documented` and `produced` differ, each with its path. An object of the doc
/// with a `"..."` key has the rest of its keys as `owner` (the owner's example) at the same place;
/// a documented `null` or value is not looked into; an array is compared by its first element.
fn key_differences(documented: &Value, produced: &Value, owner: &Value, path: &str) -> Vec<String> {
    match (documented, produced) {
        (Value::Object(doc), Value::Object(out)) => {
            let mut keys: BTreeSet<&String> = doc.keys().filter(|k| *k != "...").collect();
            if doc.contains_key("...") {
                if let Value::Object(o) = owner {
                    keys.extend(o.keys());
                }
            }
            let made: BTreeSet<&String> = out.keys().collect();
            let mut diffs: Vec<String> = keys
                .difference(&made)
                .map(|k| format!("{path}.{k}: documented, not produced"))
                .chain(
                    made.difference(&keys)
                        .map(|k| format!("{path}.{k}: produced, not documented")),
                )
                .collect();
            for k in keys.intersection(&made) {
                let doc_value = doc
                    .get(*k)
                    .or_else(|| owner.get(*k))
                    .unwrap_or(&Value::Null);
                let owner_value = owner.get(*k).unwrap_or(&Value::Null);
                diffs.extend(key_differences(
                    doc_value,
                    &out[*k],
                    owner_value,
                    &format!("{path}.{k}"),
                ));
            }
            diffs
        }
        (Value::Array(doc), Value::Array(out)) => match (doc.first(), out.first()) {
            (Some(d), Some(o)) => {
                let owner_first = owner.get(0).unwrap_or(&Value::Null);
                key_differences(d, o, owner_first, &format!("{path}[]"))
            }
            (Some(_), None) => vec![format!("{path}[]: the fixture produced no element")],
            (None, _) => Vec::new(),
        },
        (Value::Object(_), other) => {
            vec![format!("{path}: documented as an object, produced {other}")]
        }
        _ => Vec::new(),
    }
}

/// Where the `role`'s example in §11 and `produced` differ, each line naming the role.
fn role_differences(role: &str, produced: &Status) -> Vec<String> {
    let documented = documented_status(role);
    let owner = documented_status("owner");
    let produced = produced.to_json().expect("a Status serializes");
    let diffs = key_differences(&documented, &produced, &owner, "");
    diffs.into_iter().map(|d| format!("{role}: {d}")).collect()
}

fn config() -> Config {
    Config::try_parse_from([
        "change-streamer",
        "--upstream",
        "ws://source.example:9000/changes",
        "--litestream-backup-url",
        "s3://bucket/replica",
    ])
    .expect("the flags parse")
}

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

fn instance() -> InstanceId {
    InstanceId::new(SocketAddr::from(([127, 0, 0, 1], 4849)), &Clock::manual(0))
}

fn subscriber() -> SubscriberInfo {
    SubscriberInfo {
        id: "view-syncer-1".into(),
        mode: Mode::Serving,
        protocol: 6,
        phase: Phase::Live,
        watermark: w(14),
        acked: w(11),
        pending: 4,
        queued_bytes: 512,
        lag_seconds: 0.3,
        lagging: None,
        process_rate: 12.5,
        required: false,
    }
}

fn reservation() -> ReservationInfo {
    ReservationInfo {
        task_id: "restore-7".into(),
        held_ms: 5400,
        orphaned: false,
        verified: true,
        progress: Some(ProgressInfo {
            restored_bytes: 229_376,
            replica_size: Some(450_560),
            restore_bytes_per_second: Some(40_960),
        }),
    }
}

/// What the owner's actors answer with one subscriber and one reservation, as §11's example.
fn observation() -> Observation {
    Observation {
        log: LogStats {
            replica_version: Some(w(10)),
            min_watermark: Some(w(10)),
            max_watermark: Some(w(14)),
            rows: 12,
            ..LogStats::default()
        },
        streamer: StreamerState {
            upstream_connected: true,
            upstream_down: None,
            reset_required: None,
            subscribers: vec![subscriber()],
            releases_all: 3,
            releases_consensus: 0,
            tracked_sends: 3,
            last_commit: Some(w(14)),
            subscribers_evicted: 0,
            queued_bytes: 512,
        },
        purge: PurgeState {
            scheduled: vec![w(12)],
            ..PurgeState::default()
        },
        cleanup: Some(CleanupState {
            cleanup_delay_ms: 30_000,
            paused: true,
            last_scheduled_watermark: Some(w(12)),
            pending_watermarks: vec![PendingWatermark::new(w(14), "s3".into(), 0)],
            cleanups_scheduled_total: 1,
            restart_catch_up: None,
        }),
        reservations: vec![reservation()],
        reservation_stats: ReservationStats::default(),
        monitor: MonitorStats {
            polls_total: 40,
            last_poll_ok: Some(true),
            // An audit runs (PROTOCOL.md §8.1d): its failures are a series of the page.
            audit: Some(AuditStats {
                backup: SINGLE_BACKUP.into(),
                ..AuditStats::default()
            }),
            ..MonitorStats::default()
        },
        audits: vec![AuditStats {
            backup: SINGLE_BACKUP.into(),
            ..AuditStats::default()
        }],
        quorum: Some(QuorumState {
            purge_quorum: 1,
            quorum_watermark: Some(w(14)),
            backups: vec![BackupState {
                name: "backup".into(),
                source: "metrics".into(),
                watermark: Some(w(14)),
                age_ms: Some(1200),
                last_error: None,
            }],
        }),
        stages: vec![StageState {
            stage: "purger".into(),
            stalled_ms: None,
        }],
        change_log_bytes: 4096,
    }
}

/// The change DB as an owner stored it, as a standby reads it.
fn stored_view() -> ChangeDbView {
    let o = observation();
    ChangeDbView {
        log: o.log,
        safety: SafetyState {
            cleanup_delay: Some(Duration::from_secs(30)),
            last_scheduled: Some(w(12)),
            recorded: vec![RecordedWatermark {
                watermark: w(14),
                replica: "s3".into(),
                backed_up_ms: 0,
            }],
            scheduled: vec![w(12)],
            reservations: vec![StoredReservation {
                task_id: "restore-7".into(),
                started_ms: 0,
            }],
        },
    }
}

fn instance_seen() -> InstanceSeen {
    InstanceSeen {
        id: "streamer-1".into(),
        role: "owner".into(),
        subscribers: 1,
        reservations: 1,
        last_seen_ms: 420,
    }
}

#[test]
fn status_keys_match_protocol_table() {
    let cfg = config();
    let owner = Status::owner(
        &cfg,
        Role::Owner,
        &instance(),
        &observation(),
        Some(Some(vec![instance_seen()])),
    );
    let view = stored_view();
    let standby = Status::standby(
        &cfg,
        &instance(),
        Some(&view),
        vec![subscriber()],
        vec![reservation()],
    );
    let mut diffs = role_differences("owner", &owner);
    diffs.extend(role_differences("standby", &standby));
    assert!(
        diffs.is_empty(),
        "/status and PROTOCOL.md §11 differ:\n{}",
        diffs.join("\n")
    );
}

/// The one client type of `/status` (test-support's `status::Status`, which the demo reads)
/// against what the service serializes, both roles: each document reads into it (a key renamed
/// or dropped fails, naming it) and comes back out with the same keys (a key the type lacks
/// fails too), issue 45.
#[test]
fn the_client_status_type_reads_both_roles_key_for_key() {
    use change_streamer_test_support::status::Status as ClientStatus;
    let cfg = config();
    let owner = Status::owner(
        &cfg,
        Role::Owner,
        &instance(),
        &observation(),
        Some(Some(vec![instance_seen()])),
    );
    let view = stored_view();
    let standby = Status::standby(
        &cfg,
        &instance(),
        Some(&view),
        vec![subscriber()],
        vec![reservation()],
    );
    let mut diffs = Vec::new();
    for (role, produced) in [
        ("owner", owner.to_json().expect("a Status serializes")),
        ("standby", standby.to_json().expect("a Status serializes")),
        ("the documented owner", documented_status("owner")),
    ] {
        let typed =
            ClientStatus::from_value(produced.clone()).unwrap_or_else(|e| panic!("{role}: {e}"));
        let back = serde_json::to_value(&typed).expect("the client type serializes");
        diffs.extend(
            key_differences(&produced, &back, &produced, "")
                .into_iter()
                .map(|d| format!("{role}: {d}")),
        );
    }
    assert!(
        diffs.is_empty(),
        "test-support's status::Status and /status differ:\n{}",
        diffs.join("\n")
    );
}

#[test]
fn status_keys_a_role_lacks_are_absent_or_null_as_documented() {
    let cfg = config();
    // On SQLite the owner has no `instances`; with the records unreadable it is `null`.
    let sqlite = Status::owner(&cfg, Role::Owner, &instance(), &observation(), None);
    let json = sqlite.to_json().expect("a Status serializes");
    assert!(json.get("instances").is_none(), "{json}");
    let unread = Status::owner(&cfg, Role::Owner, &instance(), &observation(), Some(None));
    assert_eq!(
        unread.to_json().expect("serializes")["instances"],
        Value::Null
    );
    // A standby that cannot read the change DB: `replicaVersion`, `changeLog` and `backup` null.
    let blind = Status::standby(&cfg, &instance(), None, Vec::new(), Vec::new());
    let json = blind.to_json().expect("a Status serializes");
    for key in ["replicaVersion", "changeLog", "backup", "upstream", "purge"] {
        assert_eq!(json[key], Value::Null, "{key} in {json}");
    }
    assert!(
        json.get("flowControl").is_none() && json.get("instances").is_none(),
        "{json}"
    );
}

#[test]
fn both_roles_show_one_cleanup_delay() {
    let cfg = config();
    let owner = Status::owner(&cfg, Role::Owner, &instance(), &observation(), None);
    let view = stored_view();
    let standby = Status::standby(&cfg, &instance(), Some(&view), Vec::new(), Vec::new());
    let delay = |s: &Status| s.to_json().expect("serializes")["backup"]["cleanupDelayMs"].clone();
    assert_eq!(delay(&owner), delay(&standby));
    // Nothing learned yet: the starting delay, at either role.
    let mut fresh = stored_view();
    fresh.safety.cleanup_delay = None;
    let fresh = Status::standby(&cfg, &instance(), Some(&fresh), Vec::new(), Vec::new());
    assert_eq!(
        delay(&fresh),
        cfg.starting_cleanup_delay().as_millis() as u64
    );
}

/// A metric as §11's table or the page shows it: name, type and label names.
type Shown = (String, String, Vec<String>);

fn defined(defs: &[Metric]) -> BTreeSet<Shown> {
    defs.iter()
        .map(|m| {
            let labels = m.labels.iter().map(|l| l.to_string()).collect();
            (m.name.to_string(), m.kind.as_str().to_string(), labels)
        })
        .collect()
}

/// §11's `/metrics` table: `| `name{labels}` | type | what |` rows.
fn documented_metrics() -> BTreeSet<Shown> {
    section_11()
        .lines()
        .filter(|l| l.starts_with("| `change_streamer_"))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let series = cells[1].trim_matches('`');
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let labels = rest.trim_end_matches('}').split(',');
                    (name, labels.map(|l| l.trim().to_string()).collect())
                }
                None => (series, Vec::new()),
            };
            (name.to_string(), cells[2].to_string(), labels)
        })
        .collect()
}

fn assert_same(what: &str, documented: &BTreeSet<Shown>, produced: &BTreeSet<Shown>) {
    let missing: Vec<_> = documented.difference(produced).collect();
    let extra: Vec<_> = produced.difference(documented).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}:\ndocumented, not produced: {missing:?}\nproduced, not documented: {extra:?}"
    );
}

#[test]
fn metrics_match_protocol_table() {
    assert_same(
        "PROTOCOL.md §11 and the metric table",
        &documented_metrics(),
        &defined(OWNER_PAGE),
    );
    // "A standby's `/metrics` holds …": the names that paragraph gives, and no other.
    let section = section_11();
    let paragraph = section
        .split("\n\n")
        .find(|p| p.starts_with("A standby's `/metrics`"))
        .expect("§11 says what a standby's /metrics holds");
    let named: BTreeSet<&str> = paragraph
        .split('`')
        .filter_map(|s| s.split([' ', '{']).next())
        .filter(|s| s.starts_with("change_streamer_"))
        .collect();
    let standby: BTreeSet<&str> = STANDBY_PAGE.iter().map(|m| m.name).collect();
    assert_eq!(named, standby);
}

/// The page's own metrics (not `process_*`), as Prometheus's text format shows them.
fn rendered(text: &str) -> BTreeSet<Shown> {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the page is Prometheus text");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric.starts_with("change_streamer_"))
        .map(|s| {
            let kind = match s.value {
                prometheus_parse::Value::Counter(_) => "counter",
                prometheus_parse::Value::Gauge(_) => "gauge",
                _ => "other",
            };
            let mut labels: Vec<String> = s.labels.keys().cloned().collect();
            labels.sort_by_key(|l| {
                OWNER_PAGE
                    .iter()
                    .find(|m| m.name == s.metric)
                    .and_then(|m| m.labels.iter().position(|d| d == l))
            });
            (s.metric.clone(), kind.to_string(), labels)
        })
        .collect()
}

#[test]
fn metrics_pages_render_every_defined_metric() {
    let facts = Facts {
        owner: true,
        failures: AuthFailures::default(),
        cleanup_delay: Duration::from_secs(30),
    };
    let owner = owner_page(&facts, &observation()).expect("the owner's page renders");
    assert_same(
        "the owner's page and the metric table",
        &defined(OWNER_PAGE),
        &rendered(&owner),
    );
    let stages = [StageState {
        stage: "follower".into(),
        stalled_ms: None,
    }];
    let standby =
        standby_page(&AuthFailures::default(), &stages).expect("a standby's page renders");
    assert_same(
        "a standby's page and the metric table",
        &defined(STANDBY_PAGE),
        &rendered(&standby),
    );
    assert!(standby.contains("\nchange_streamer_owner 0\n"), "{standby}");
}
