//! End to end: the secrets are never printed (PROTOCOL.md §15). The real binary runs at the most
//! verbose log level with a client secret, TLS, and a `wss://` change source that wants its own
//! secret and refuses the first handshake; clients present it wrong, cut short and right. Then
//! every log line, `/status`, `/metrics`, `--help` (with the secret in its variable) and the
//! start errors are searched for either secret, with the logs in both `--log-format`s.

use std::process::{Command, Stdio};
use std::time::Duration;

use change_streamer_test_support::access::{Credentials, TestCert};
use change_streamer_test_support::upstream::{txn, FakeUpstream, UpstreamOptions};
use change_streamer_test_support::wait::wait_until;

const SECRET: &str = "Clnt5ecr3t-7f3a9c1e2b4d6f80a1c3e5";
const UPSTREAM_SECRET: &str = "Upstr3am5ecr3t-0b1d2f3a4c5e6a7b";

/// Whether `text` shows any part of either secret long enough to mean it (16 bytes, which a
/// prefix presented by a client also holds).
fn shows_a_secret(text: &str) -> bool {
    text.contains(&SECRET[..16]) || text.contains(&UPSTREAM_SECRET[..16])
}

fn binary() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_change-streamer"));
    cmd.env_remove("RUST_LOG");
    cmd
}

#[test]
fn help_does_not_show_the_secret_from_its_variable() {
    let out = binary()
        .arg("--help")
        .env("ZERO_CHANGE_STREAMER_SECRET", SECRET)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ZERO_CHANGE_STREAMER_SECRET"), "{text}");
    assert!(!shows_a_secret(&text), "{text}");
}

/// Runs `cmd`, which must stop by itself: one that is still running after 20 s (it started
/// when it should have refused) is killed and the test fails.
fn refused_start(mut cmd: Command) -> std::process::Output {
    let child = cmd
        .args(["--host", "127.0.0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{cmd:?} started instead of refusing");
        }
    }
}

#[test]
fn start_errors_do_not_show_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let short = &SECRET[..15];
    for (args, env) in [
        (vec!["--secret", short], None),
        (vec![], Some(short)),
        (vec!["--secret", &format!("{SECRET} {SECRET}")], None),
        (vec!["--secret-file", "/nonexistent"], Some(SECRET)),
        // A value starting with `-` is still the secret's, not a flag.
        (vec!["--secret", &format!("-{}", &SECRET[..10])], Some("x")),
    ] {
        let mut cmd = binary();
        cmd.args(["--port", "0", "--data-dir"])
            .arg(dir.path())
            .args(&args);
        if let Some(v) = env {
            cmd.env("ZERO_CHANGE_STREAMER_SECRET", v);
        }
        let out = refused_start(cmd);
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{args:?}: {text}");
        assert!(text.contains("--secret"), "{args:?}: {text}");
        assert!(!text.contains(&SECRET[..10]), "{args:?}: {text}");
    }
}

#[actix_rt::test]
async fn logs_status_and_metrics_never_show_a_secret() {
    logs_status_and_metrics_in("text").await;
}

/// The same in `--log-format json` (PROTOCOL.md §2): every line is one JSON object, and none
/// shows a secret either.
#[actix_rt::test]
async fn json_logs_never_show_a_secret() {
    logs_status_and_metrics_in("json").await;
}

async fn logs_status_and_metrics_in(log_format: &str) {
    let cert = TestCert::localhost();
    let up = FakeUpstream::start_with(UpstreamOptions::guarded(
        UPSTREAM_SECRET,
        cert.server_config(),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let upstream_secret = dir.path().join("upstream-secret");
    std::fs::write(&upstream_secret, UPSTREAM_SECRET).unwrap();
    let log_path = dir.path().join("stderr.log");
    let data = dir.path().join("data");
    // Port 0 is not known in advance: the service logs it.
    let mut child = binary()
        .args(["--host", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(&data)
        .arg("--secret-file")
        .arg(&secret_file)
        .args(cert.flags())
        .args(["--upstream", &up.url(), "--upstream-ca-file"])
        .arg(&cert.cert)
        .arg("--upstream-secret-file")
        .arg(&upstream_secret)
        .args(["--log-format", log_format])
        .env("RUST_LOG", "trace")
        .stderr(std::fs::File::create(&log_path).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_until(
        "the service says where it listens",
        Duration::from_secs(20),
        || log().contains("listening on "),
    )
    .await;
    let addr = log()
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_string();
    up.wait_connections(1).await;
    up.send(txn(1, 1));

    let trusted = Some(cert.client_config());
    let present = |secret: &str| Credentials {
        secret: Some(secret.to_string()),
        tls: trusted.clone(),
    };
    let get = |creds: Credentials, path: &'static str| {
        let url = format!("https://{addr}{path}");
        async move {
            let mut resp = creds.client().get(url).send().await.expect("request");
            let body = resp.body().limit(16 << 20).await.expect("body");
            (
                resp.status().as_u16(),
                String::from_utf8_lossy(&body).into_owned(),
            )
        }
    };
    assert_eq!(
        get(present("wrong-secret-wrong-secret"), "/status").await.0,
        401
    );
    assert_eq!(
        get(present(&SECRET[..SECRET.len() - 1]), "/status").await.0,
        401
    );
    assert_eq!(get(present(&format!("{SECRET}0")), "/status").await.0, 401);
    let (code, status) = get(present(SECRET), "/status").await;
    assert_eq!(code, 200, "{status}");
    let (code, metrics) = get(
        Credentials {
            secret: None,
            tls: trusted.clone(),
        },
        "/metrics",
    )
    .await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("change_streamer_auth_failures_total{reason=\"wrong\"} 3"),
        "{metrics}"
    );

    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    let log = log();
    assert!(
        log.contains("refused the handshake with 401"),
        "the upstream refusal is logged"
    );
    assert!(
        log.contains("access: refused /status from 127.0.0.1:"),
        "refusals are logged"
    );
    for (what, text) in [("/status", &status), ("/metrics", &metrics)] {
        assert!(!shows_a_secret(text), "{what} shows a secret: {text}");
    }
    for line in log.lines() {
        assert!(!shows_a_secret(line), "a log line shows a secret: {line}");
        if log_format == "json" {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            assert!(v["message"].is_string(), "{line}");
        }
    }
}
