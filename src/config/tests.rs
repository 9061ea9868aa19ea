//! Unit tests of the flags: defaults, the environment, each value's checks, and the messages
//! that name a bad flag and where its value came from.

use super::*;

fn parse(args: &[&str]) -> Result<Config, clap::Error> {
    Config::try_parse_from(std::iter::once("change-streamer").chain(args.iter().copied()))
}

#[test]
fn defaults_follow_the_spec() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.port, 4849);
    assert_eq!(c.host, "0.0.0.0");
    assert_eq!(c.litestream_metrics_url, "http://localhost:4850/metrics");
    assert_eq!(c.backup_check_interval_ms, 60_000);
    assert_eq!(c.starting_cleanup_delay(), Duration::from_secs(30));
    assert_eq!(c.purge_delay_ms, 30_000);
    assert_eq!(c.change_log_retention_ms, 60_000);
    assert_eq!(c.max_reservation_ms, 0);
    assert_eq!(c.flow_control_consensus_padding_seconds, 1.0);
    assert_eq!(c.padding(), Some(Duration::from_secs(1)));
    assert_eq!(c.ping_interval_ms, 30_000);
    assert_eq!(c.slow_subscriber_grace_ms, 30_000);
    assert_eq!(c.max_subscriber_queue_changes, 20_000);
    assert_eq!(c.max_subscriber_queue_bytes, 16 << 20);
    assert_eq!(c.max_queued_bytes, 256 << 20);
    assert!(c.upstream.is_none() && c.litestream_backup_url.is_none());
    assert_eq!((c.change_db, c.takeover_interval_ms), (None, 1_000));
    let c = parse(&["--change-db", "postgres://u@db:5432/zero"]).unwrap();
    assert_eq!(c.change_db.as_deref(), Some("postgres://u@db:5432/zero"));
}

#[test]
fn bad_values_name_their_flag() {
    for (args, flag) in [
        (&["--port", "x"][..], "--port"),
        (&["--upstream", "http://x"][..], "--upstream"),
        (
            &["--litestream-metrics-url", "ws://x/metrics"][..],
            "--litestream-metrics-url",
        ),
        (
            &["--backup-check-interval-ms", "0"][..],
            "--backup-check-interval-ms",
        ),
        (
            &["--min-cleanup-delay-ms", "-5"][..],
            "--min-cleanup-delay-ms",
        ),
        (
            &["--flow-control-consensus-padding-seconds", "NaN"][..],
            "--flow-control-consensus-padding-seconds",
        ),
        (&["--ping-interval-ms", "soon"][..], "--ping-interval-ms"),
        (
            &["--change-log-retention-ms", "-1"][..],
            "--change-log-retention-ms",
        ),
        (&["--max-reservation-ms", "1.5"][..], "--max-reservation-ms"),
        (
            &["--slow-subscriber-grace-ms", "-1"][..],
            "--slow-subscriber-grace-ms",
        ),
        (
            &["--max-subscriber-queue-changes", "0"][..],
            "--max-subscriber-queue-changes",
        ),
    ] {
        let e = parse(args).unwrap_err().to_string();
        assert!(e.contains(flag), "{args:?}: {e}");
    }
}

#[test]
fn the_debug_of_the_configuration_redacts_the_secret() {
    let secret = "debug-secret-0123456789";
    let c = parse(&["--secret", secret]).unwrap();
    let shown = format!("{c:?}");
    assert!(
        !shown.contains(secret) && shown.contains("redacted"),
        "{shown}"
    );
    assert!(c.secret().unwrap().is_some());
}

#[test]
fn accepts_short_floors_and_negative_padding() {
    let c = parse(&[
        "--min-cleanup-delay-ms",
        "10",
        "--initial-cleanup-delay-ms",
        "5",
        "--flow-control-consensus-padding-seconds",
        "-1",
        "--upstream",
        "ws://127.0.0.1:1/changes",
    ])
    .unwrap();
    assert_eq!(c.starting_cleanup_delay(), Duration::from_millis(10));
    assert_eq!(c.padding(), None);
}

#[test]
fn standby_serves_defaults_to_true_and_takes_an_explicit_false() {
    assert!(parse(&[]).unwrap().standby_serves);
    assert!(parse(&["--standby-serves"]).unwrap().standby_serves);
    assert!(parse(&["--standby-serves=true"]).unwrap().standby_serves);
    assert!(!parse(&["--standby-serves=false"]).unwrap().standby_serves);
    let e = parse(&["--standby-serves=yes"]).unwrap_err().to_string();
    assert!(e.contains("--standby-serves"), "{e}");
}

/// `--help` is grouped (issue 27): every flag sits under one of the eight headings, in that order,
/// so that an operator finds a flag by what it is about.
#[test]
fn every_flag_has_a_help_heading() {
    const HEADINGS: [&str; 8] = [
        "Upstream",
        "Backup",
        "Change log",
        "Subscribers",
        "Access",
        "Operations",
        "Instances",
        "Logging",
    ];
    let command = Config::command();
    let mut seen: Vec<&str> = Vec::new();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let heading = arg
            .get_help_heading()
            .unwrap_or_else(|| panic!("--{id} has no help heading"));
        assert!(
            HEADINGS.contains(&heading),
            "--{id}: unknown heading {heading}"
        );
        if seen.last() != Some(&heading) {
            assert!(
                !seen.contains(&heading),
                "--{id}: {heading} is split in --help"
            );
            seen.push(heading);
        }
    }
    assert_eq!(seen, HEADINGS, "headings in --help, in order");
}

/// PROTOCOL.md §8.1d: the audit runs every 60 s with the control API and the VFS unless the
/// flag says otherwise; 0 turns it off; without both flags there is none.
#[test]
fn backup_audit_interval_defaults_to_60_s_with_control_and_vfs_and_0_is_off() {
    let both = [
        "--litestream-backup-url",
        "s3://b/r",
        "--litestream-control-url",
        "unix:/run/litestream.sock",
        "--litestream-db-path",
        "/var/lib/zero/replica.db",
        "--litestream-vfs",
        "/opt/litestream-vfs.so",
    ];
    let audit = |extra: &[&str]| {
        let args: Vec<&str> = both.iter().chain(extra).copied().collect();
        parse(&args).unwrap().backup_audit_interval()
    };
    assert_eq!(audit(&[]), Some(Duration::from_secs(60)));
    assert_eq!(
        audit(&["--backup-audit-interval-ms", "250"]),
        Some(Duration::from_millis(250))
    );
    assert_eq!(audit(&["--backup-audit-interval-ms", "0"]), None);
    let control_only = parse(&both[..6]).unwrap();
    assert_eq!(control_only.backup_audit_interval(), None);
}

/// PROTOCOL.md §2: unset, the catch-up window is 4 MiB or `--max-subscriber-queue-bytes` where
/// that is smaller, so a bound valid before the window existed still starts; only a window
/// given above the bound is refused.
#[test]
fn catchup_window_defaults_to_the_subscriber_bound_where_that_is_smaller() {
    for (args, window) in [
        (&[][..], 4 << 20),
        (&["--max-subscriber-queue-bytes", "1048576"][..], 1 << 20),
        (&["--max-subscriber-queue-bytes", "65536"][..], 65536),
        (&["--max-subscriber-queue-bytes", "4194304"][..], 4 << 20),
        (&["--max-subscriber-queue-bytes", "4194305"][..], 4 << 20),
    ] {
        let c = parse(args).unwrap();
        assert_eq!(c.catchup_window(), window, "{args:?}");
        assert_eq!(
            c.streamer().catchup_window_bytes,
            window as usize,
            "{args:?}"
        );
        assert!(c.check_catchup_window().is_ok(), "{args:?}");
    }
    let c = parse(&[
        "--max-subscriber-queue-bytes",
        "1048576",
        "--catchup-window-bytes",
        "4194304",
    ])
    .unwrap();
    assert_eq!(
        c.check_catchup_window(),
        Err(CatchupWindowError {
            window: 4 << 20,
            bound: 1 << 20
        })
    );
}
