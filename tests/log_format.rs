//! `--log-format json` (PROTOCOL.md §2, Logs), end to end: the real binary with a change source,
//! a subscriber and a snapshot reservation writes every stderr line as one JSON object with
//! `time`, `level`, `target` and `message`, the lines that name a subscriber, a task or a
//! watermark carry them as fields, and a start error is an object too. `text` stays the default.

use std::process::{Command, Stdio};
use std::time::Duration;

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::wait_until;
use serde_json::Value;

fn binary() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_change-streamer"));
    cmd.env_remove("RUST_LOG").env_remove("ZERO_LOG_FORMAT");
    cmd
}

/// Every line of `log` parsed, panicking on the first that is not one JSON object with the four
/// fields every line has.
fn objects(log: &str) -> Vec<Value> {
    log.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a stderr line is not JSON ({e}): {line}"));
            for key in ["time", "level", "target", "message"] {
                assert!(v[key].is_string(), "no string {key}: {line}");
            }
            v
        })
        .collect()
}

#[actix_rt::test]
async fn json_log_format_writes_one_object_a_line_with_the_fields_a_line_names() {
    let up = FakeUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("stderr.log");
    let mut child = binary()
        .args(["--host", "127.0.0.1", "--port", "0", "--log-format", "json"])
        .args([
            "--upstream",
            &up.url(),
            "--litestream-backup-url",
            "s3://b/r",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "debug")
        .stderr(std::fs::File::create(&log_path).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let complete = || {
        let text = log();
        // A line still being written has no newline yet.
        text[..text.rfind('\n').map_or(0, |i| i + 1)].to_string()
    };
    wait_until(
        "the service says where it listens",
        Duration::from_secs(20),
        || complete().contains("listening on "),
    )
    .await;
    let addr = objects(&complete())
        .iter()
        .filter_map(|v| v["message"].as_str()?.split("listening on ").nth(1))
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_string();
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    let rv = change_streamer_actors::watermark::Watermark::from_u64(100).to_string();
    wait_until(
        "the initial sync is stored",
        Duration::from_secs(20),
        || complete().contains(&format!("replicaVersion={rv}")),
    )
    .await;
    let mut sub = WsClient::connect(&format!(
        "ws://{addr}/replication/v6/changes?id=r1&replicaVersion={rv}&watermark={rv}"
    ))
    .await;
    let (id, _) = sub.msg().await;
    sub.ack(id).await;
    let mut res =
        WsClient::connect(&format!("ws://{addr}/replication/v6/snapshot?taskID=t-42")).await;
    let (id, _) = res.msg().await;
    res.ack(id).await;
    wait_until(
        "the subscriber and the reservation are logged",
        Duration::from_secs(20),
        || {
            let text = complete();
            text.contains("subscriber r1 ") && text.contains("task t-42")
        },
    )
    .await;
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    up.stop().await;

    let text = log();
    assert!(text.ends_with('\n'), "the last line is cut: {text}");
    let lines = objects(&text);
    assert!(
        lines.iter().any(|v| v["level"] == "DEBUG"),
        "RUST_LOG still chooses the level"
    );
    let accepted = lines
        .iter()
        .find(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("subscriber r1 "))
        })
        .expect("the subscriber's acceptance is logged");
    assert_eq!(accepted["subscriber"], "r1", "{accepted}");
    assert_eq!(
        accepted["watermark"],
        Value::String(rv.clone()),
        "{accepted}"
    );
    assert_eq!(accepted["level"], "INFO");
    assert!(
        accepted["target"]
            .as_str()
            .unwrap()
            .starts_with("change_streamer_actors::streamer"),
        "{accepted}"
    );
    // Every line that names the subscriber carries it as a field (PROTOCOL.md §2): its
    // acceptance, its catch-up and going live, its leaving.
    let naming: Vec<&Value> = lines
        .iter()
        .filter(|v| {
            v["level"] != "DEBUG"
                && v["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("subscriber r1 "))
        })
        .collect();
    assert!(naming.len() >= 2, "{naming:?}");
    for line in &naming {
        assert_eq!(
            line["subscriber"], "r1",
            "a line names r1 without the field: {line}"
        );
    }
    let opened = lines
        .iter()
        .find(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.contains("opened by task t-42"))
        })
        .expect("the reservation is logged");
    assert_eq!(opened["task"], "t-42", "{opened}");
    // RFC 3339 in UTC.
    let time = accepted["time"].as_str().unwrap();
    assert!(time.ends_with('Z') && time.contains('T'), "{time}");
    humantime::parse_rfc3339(time).unwrap_or_else(|e| panic!("{time}: {e}"));
}

#[test]
fn a_start_error_is_one_json_object_in_json_format() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let out = binary()
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-format",
            "json",
            "--data-dir",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    let lines = objects(&text);
    let last = lines.last().expect("an error line");
    assert_eq!(last["level"], "ERROR", "{text}");
    assert_eq!(last["target"], "change_streamer", "{text}");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .starts_with("change-streamer: "),
        "{text}"
    );
}

#[test]
fn text_is_the_default_and_json_is_read_from_zero_log_format() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let run = |env: Option<&str>| {
        let mut cmd = binary();
        cmd.args(["--host", "127.0.0.1", "--port", "0", "--data-dir"])
            .arg(&file);
        if let Some(v) = env {
            cmd.env("ZERO_LOG_FORMAT", v);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let text = run(None);
    assert!(text.starts_with("change-streamer: "), "{text}");
    objects(&run(Some("json")));
    let bad = binary().args(["--log-format", "yaml"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--log-format"));
}
