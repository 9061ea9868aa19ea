//! The binary's edge (SPEC §2, §12): `--help`, and bad flag or environment values rejected at
//! start, exiting non-zero with a message naming the flag.

use std::process::Command;

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
            &["--data-dir", "/proc/version/cannot-be-a-dir"][..],
            &[][..],
            "--data-dir",
        ),
        (
            &["--host", "256.0.0.1", "--data-dir", "/tmp"][..],
            &[][..],
            "--host",
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
