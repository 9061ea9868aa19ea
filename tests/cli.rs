//! The binary's edge (PROTOCOL.md §2, §12): `--help`, bad flag or environment values rejected at
//! start, exiting non-zero with a message naming the flag, and the graceful stop on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::upstream::{txn, FakeUpstream};

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_change-streamer"));
    cmd.args(args).env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the binary");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn help_lists_every_flag_with_its_environment_variable() {
    let (code, text) = run(&["--help"], &[]);
    assert_eq!(code, 0);
    for (flag, env) in [
        ("--port", "ZERO_CHANGE_STREAMER_PORT"),
        ("--host", "ZERO_CHANGE_STREAMER_HOST"),
        ("--data-dir", "ZERO_CHANGE_STREAMER_DATA_DIR"),
        ("--upstream", "ZERO_UPSTREAM_URL"),
        ("--litestream-backup-url", "ZERO_LITESTREAM_BACKUP_URL"),
        ("--litestream-metrics-url", "ZERO_LITESTREAM_METRICS_URL"),
        (
            "--backup-check-interval-ms",
            "ZERO_BACKUP_CHECK_INTERVAL_MS",
        ),
        (
            "--initial-cleanup-delay-ms",
            "ZERO_INITIAL_CLEANUP_DELAY_MS",
        ),
        ("--min-cleanup-delay-ms", "ZERO_MIN_CLEANUP_DELAY_MS"),
        ("--purge-delay-ms", "ZERO_PURGE_DELAY_MS"),
        (
            "--flow-control-consensus-padding-seconds",
            "ZERO_CHANGE_STREAMER_FLOW_CONTROL_CONSENSUS_PADDING_SECONDS",
        ),
        ("--ping-interval-ms", "ZERO_PING_INTERVAL_MS"),
        ("--standby-serves", "ZERO_STANDBY_SERVES"),
        ("--change-log-retention-ms", "ZERO_CHANGE_LOG_RETENTION_MS"),
        ("--max-reservation-ms", "ZERO_MAX_RESERVATION_MS"),
        (
            "--slow-subscriber-grace-ms",
            "ZERO_FLOW_CONTROL_SLOW_SUBSCRIBER_GRACE_MS",
        ),
        (
            "--max-subscriber-queue-changes",
            "ZERO_MAX_SUBSCRIBER_QUEUE_CHANGES",
        ),
        ("--litestream-vfs", "ZERO_LITESTREAM_VFS"),
        ("--backup-watermark-query", "ZERO_BACKUP_WATERMARK_QUERY"),
        ("--litestream-control-url", "ZERO_LITESTREAM_CONTROL_URL"),
        ("--litestream-db-path", "ZERO_LITESTREAM_DB_PATH"),
        ("--secret-file", "ZERO_CHANGE_STREAMER_SECRET_FILE"),
        ("--secret", "ZERO_CHANGE_STREAMER_SECRET"),
        (
            "--allow-unauthenticated",
            "ZERO_CHANGE_STREAMER_ALLOW_UNAUTHENTICATED",
        ),
        ("--tls-cert", "ZERO_CHANGE_STREAMER_TLS_CERT"),
        ("--tls-key", "ZERO_CHANGE_STREAMER_TLS_KEY"),
        ("--upstream-secret-file", "ZERO_UPSTREAM_SECRET_FILE"),
        ("--upstream-ca-file", "ZERO_UPSTREAM_CA_FILE"),
        (
            "--upstream-ping-interval-ms",
            "ZERO_UPSTREAM_PING_INTERVAL_MS",
        ),
        ("--change-db", "ZERO_CHANGE_DB"),
        ("--takeover-interval-ms", "ZERO_TAKEOVER_INTERVAL_MS"),
    ] {
        assert!(
            text.contains(flag) && text.contains(env),
            "{flag} / {env} missing from --help:\n{text}"
        );
    }
}

#[test]
fn bad_values_exit_non_zero_naming_the_flag() {
    for (args, env, flag) in [
        (
            &["--upstream", "http://x/changes"][..],
            &[][..],
            "--upstream",
        ),
        (&["--purge-delay-ms", "-1"][..], &[][..], "--purge-delay-ms"),
        (
            &["--change-log-retention-ms", "-1"][..],
            &[][..],
            "--change-log-retention-ms",
        ),
        (
            &[][..],
            &[("ZERO_MAX_RESERVATION_MS", "soon")][..],
            "--max-reservation-ms",
        ),
        (
            &[][..],
            &[("ZERO_BACKUP_CHECK_INTERVAL_MS", "0")][..],
            "--backup-check-interval-ms",
        ),
        (
            &[][..],
            &[("ZERO_LITESTREAM_METRICS_URL", "not a url")][..],
            "--litestream-metrics-url",
        ),
        (
            &[][..],
            &[(
                "ZERO_CHANGE_STREAMER_FLOW_CONTROL_CONSENSUS_PADDING_SECONDS",
                "soon",
            )][..],
            "--flow-control-consensus-padding-seconds",
        ),
        (
            &["--max-subscriber-queue-changes", "0"][..],
            &[][..],
            "--max-subscriber-queue-changes",
        ),
        (
            &[][..],
            &[("ZERO_MAX_SUBSCRIBER_QUEUE_CHANGES", "many")][..],
            "--max-subscriber-queue-changes",
        ),
        (
            &[][..],
            &[("ZERO_FLOW_CONTROL_SLOW_SUBSCRIBER_GRACE_MS", "-30")][..],
            "--slow-subscriber-grace-ms",
        ),
        (
            &["--data-dir", "/proc/version/cannot-be-a-dir"][..],
            &[][..],
            "--data-dir",
        ),
        (
            &["--host", "256.0.0.1", "--data-dir", "/tmp"][..],
            &[][..],
            "--host",
        ),
        (
            &["--change-db", "mysql://localhost/db"][..],
            &[][..],
            "--change-db",
        ),
        (
            &[][..],
            &[("ZERO_CHANGE_DB", "not a url")][..],
            "--change-db",
        ),
        (
            &["--upstream-ping-interval-ms", "0"][..],
            &[][..],
            "--upstream-ping-interval-ms",
        ),
        (
            &[][..],
            &[("ZERO_UPSTREAM_PING_INTERVAL_MS", "-1")][..],
            "--upstream-ping-interval-ms",
        ),
        (
            &["--takeover-interval-ms", "0"][..],
            &[][..],
            "--takeover-interval-ms",
        ),
        (
            &[][..],
            &[("ZERO_TAKEOVER_INTERVAL_MS", "-5")][..],
            "--takeover-interval-ms",
        ),
    ] {
        let (code, text) = run(args, env);
        assert_ne!(code, 0, "{args:?} {env:?} was accepted");
        assert!(
            text.contains(flag),
            "{args:?} {env:?}: the message does not name {flag}:\n{text}"
        );
    }
}

#[test]
fn a_flag_overrides_its_environment_variable() {
    // The environment's bad value is not read when the flag is given: start-up gets as far as
    // opening the (unusable) data directory, which is what fails.
    let (code, text) = run(
        &[
            "--purge-delay-ms",
            "5",
            "--data-dir",
            "/proc/version/cannot-be-a-dir",
        ],
        &[("ZERO_PURGE_DELAY_MS", "bad")],
    );
    assert_ne!(code, 0);
    assert!(
        text.contains("--data-dir") && !text.contains("--purge-delay-ms"),
        "{text}"
    );
}

/// Start-up errors that happen after parsing (binding, the data directory) must be a single
/// clear line: no second copy from the logger, no actor left to panic when the runtime goes.
fn assert_one_clean_error(text: &str, needle: &str) {
    assert!(!text.contains("panicked"), "{text}");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(needle)).collect();
    assert_eq!(lines.len(), 1, "expected one line naming {needle}:\n{text}");
}

#[test]
fn a_port_in_use_is_one_error_line_without_a_panic() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_string_lossy().into_owned();
    let (code, text) = run(
        &["--host", "127.0.0.1", "--port", &port, "--data-dir", &data],
        &[],
    );
    assert_ne!(code, 0, "{text}");
    assert_one_clean_error(&text, "--port");
}

#[test]
fn a_bad_host_is_one_error_line_without_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_string_lossy().into_owned();
    let (code, text) = run(&["--host", "256.0.0.1", "--data-dir", &data], &[]);
    assert_ne!(code, 0, "{text}");
    assert_one_clean_error(&text, "--host");
}

#[test]
fn a_litestream_vfs_that_cannot_be_loaded_is_one_error_line_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_string_lossy().into_owned();
    let missing = dir.path().join("no-such-vfs.so");
    let (code, text) = run(
        &["--port", "0", "--data-dir", &data],
        &[("ZERO_LITESTREAM_VFS", &missing.to_string_lossy())],
    );
    assert_ne!(code, 0, "{text}");
    assert_one_clean_error(&text, "--litestream-vfs");
    assert!(
        text.contains("ZERO_LITESTREAM_VFS") && text.contains("no-such-vfs.so"),
        "{text}"
    );
    let (code, text) = run(&["--backup-watermark-query", " "], &[]);
    assert_ne!(code, 0);
    assert!(text.contains("--backup-watermark-query"), "{text}");
}

#[test]
fn a_bad_environment_value_names_the_flag_and_the_variable() {
    let (code, text) = run(&[], &[("ZERO_PURGE_DELAY_MS", "-5")]);
    assert_ne!(code, 0);
    assert!(
        text.contains("--purge-delay-ms") && text.contains("ZERO_PURGE_DELAY_MS"),
        "{text}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_string_lossy().into_owned();
    let (code, text) = run(
        &["--data-dir", &data],
        &[("ZERO_CHANGE_STREAMER_HOST", "256.0.0.1")],
    );
    assert_ne!(code, 0);
    assert!(
        text.contains("--host") && text.contains("ZERO_CHANGE_STREAMER_HOST"),
        "{text}"
    );
    assert_one_clean_error(&text, "--host");
}

#[test]
fn a_flag_given_on_the_command_line_is_not_blamed_on_the_environment() {
    let (code, text) = run(&["--purge-delay-ms", "-5"], &[("ZERO_PURGE_DELAY_MS", "7")]);
    assert_ne!(code, 0);
    assert!(
        text.contains("--purge-delay-ms") && !text.contains("ZERO_PURGE_DELAY_MS"),
        "{text}"
    );
}

/// PROTOCOL.md §8.1c: the control URL needs the db path and the backup URL, the db path needs
/// the control URL, the control URL and the VFS do not go together, and the URL must be one;
/// each is a start error naming the flags at fault.
#[test]
fn control_url_flag_combinations_are_start_errors_naming_the_flags() {
    let sock = "unix:/tmp/litestream.sock";
    let backup = "file:///tmp/backup";
    for (args, env, flags) in [
        (
            &[
                "--litestream-control-url",
                sock,
                "--litestream-backup-url",
                backup,
            ][..],
            &[][..],
            &["--litestream-control-url", "--litestream-db-path"][..],
        ),
        (
            &[
                "--litestream-db-path",
                "/tmp/replica.db",
                "--litestream-backup-url",
                backup,
            ][..],
            &[][..],
            &["--litestream-db-path", "--litestream-control-url"][..],
        ),
        (
            &["--litestream-db-path", "/tmp/replica.db"][..],
            &[("ZERO_LITESTREAM_CONTROL_URL", sock)][..],
            &["--litestream-control-url", "--litestream-backup-url"][..],
        ),
        // PROTOCOL.md §8.1d: the audit needs the control API and the VFS.
        (
            &[
                "--litestream-control-url",
                sock,
                "--litestream-db-path",
                "/tmp/replica.db",
                "--litestream-backup-url",
                backup,
                "--backup-audit-interval-ms",
                "1000",
            ][..],
            &[][..],
            &["--backup-audit-interval-ms", "--litestream-vfs"][..],
        ),
        (
            &["--litestream-backup-url", backup][..],
            &[("ZERO_BACKUP_AUDIT_INTERVAL_MS", "1000")][..],
            &["--backup-audit-interval-ms", "--litestream-"][..],
        ),
        (
            &["--litestream-control-url", "ftp://x/sock"][..],
            &[][..],
            &["--litestream-control-url", "unix:/path/to/litestream.sock"][..],
        ),
        (
            &["--litestream-control-url", "unix:"][..],
            &[][..],
            &["--litestream-control-url", "socket's path"][..],
        ),
    ] {
        let (code, text) = run(args, env);
        assert_ne!(code, 0, "{args:?} started: {text}");
        assert!(!text.contains("panicked"), "{text}");
        for flag in flags {
            assert!(
                text.contains(flag),
                "{args:?} {env:?}: {flag} not named:\n{text}"
            );
        }
    }
}

/// The address the binary logs once it listens (`listening on ADDR`).
fn listening_addr(stderr: std::process::ChildStderr) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on ").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the service never said where it listens")
}

#[actix_rt::test]
async fn sigterm_closes_subscriptions_and_reservations_with_1001_and_exits_0() {
    let up = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_change-streamer"))
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--upstream",
            &up.url(),
        ])
        .args([
            "--litestream-backup-url",
            "s3://bucket/replica",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    let addr = listening_addr(child.stderr.take().expect("stderr"));
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    let rv = change_streamer_actors::watermark::Watermark::from_u64(100).to_string();
    let status = format!("http://{addr}/status");
    let started = Instant::now();
    loop {
        let mut resp = change_streamer_test_support::client::http_client()
            .get(&status)
            .send()
            .await
            .expect("status");
        let st: serde_json::Value = resp.json().await.expect("status JSON");
        if st["replicaVersion"] == serde_json::json!(rv) {
            break;
        }
        assert!(
            started.elapsed() < change_streamer_test_support::wait::STATUS_LIMIT,
            "no initial sync: {st}"
        );
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    let mut sub = WsClient::connect(&format!(
        "ws://{addr}/replication/v6/changes?id=r&replicaVersion={rv}&watermark={rv}"
    ))
    .await;
    let (id, _) = sub.msg().await;
    sub.ack(id).await;
    let mut res = WsClient::connect(&format!("ws://{addr}/replication/v6/snapshot?taskID=t")).await;
    let (id, _) = res.msg().await;
    res.ack(id).await;

    let stopping = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    assert_eq!(sub.closed().await.0, 1001);
    assert_eq!(res.closed().await.0, 1001);
    let exit = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            stopping.elapsed() < Duration::from_secs(10),
            "still running 10 s after SIGTERM"
        );
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(exit.success(), "{exit:?}");
    eprintln!("stopped in {:?}", stopping.elapsed());
    up.stop().await;
}

#[test]
fn a_change_db_url_postgresql_rejects_is_one_error_naming_change_db() {
    let (code, text) = run(
        &["--change-db", "postgres://127.0.0.1:1/db?no_such_option=1"],
        &[("ZERO_CHANGE_STREAMER_PORT", "0")],
    );
    assert_ne!(code, 0);
    assert_one_clean_error(&text, "--change-db");
}
