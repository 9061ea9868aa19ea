//! End to end on the real binary as a process: rotation without a restart (PROTOCOL.md §15.1).
//! Two secrets accepted while both are configured and counted by which, the old one refused once
//! removed; the files re-read when they change and on `SIGHUP`, which never stops the service;
//! an invalid file keeping the old secrets with an ERROR naming the flag, never the secret; a
//! rotated TLS pair serving new handshakes while an open connection stays; a rotated upstream
//! secret used at the next connect.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::access::{Credentials, TestCert};
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::load::read_through;
use change_streamer_test_support::upstream::{txn, FakeUpstream, UpstreamOptions};
use change_streamer_test_support::wait::wait_until;

const OLD: &str = "old-secret-0123456789abcdef";
const NEW: &str = "new-secret-fedcba9876543210";
/// How long a test waits for a reload it caused (the files are looked at every 2 s).
const RELOAD: Duration = Duration::from_secs(30);

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The binary as a child, its stderr in a file of its data directory.
struct Service {
    child: Child,
    addr: String,
    log_path: PathBuf,
    tls: Option<Credentials>,
}

impl Service {
    async fn spawn(dir: &Path, args: &[&str]) -> Service {
        let log_path = dir.join("stderr.log");
        let child = Command::new(env!("CARGO_BIN_EXE_change-streamer"))
            .args(["--host", "127.0.0.1", "--port", "0", "--data-dir"])
            .arg(dir.join("data"))
            .args(args)
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log_path).expect("log file"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start the binary");
        let mut svc = Service {
            child,
            addr: String::new(),
            log_path,
            tls: None,
        };
        wait_until("it says where it listens", Duration::from_secs(20), || {
            svc.log().contains("listening on ")
        })
        .await;
        svc.addr = svc
            .log()
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .expect("address")
            .to_string();
        svc
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn creds(&self, secret: Option<&str>) -> Credentials {
        Credentials {
            secret: secret.map(str::to_string),
            tls: self.tls.as_ref().and_then(|c| c.tls.clone()),
        }
    }

    /// The status code of GET `path` presenting `creds`.
    async fn get(&self, creds: &Credentials, path: &str) -> (u16, String) {
        let url = format!("{}://{}{path}", creds.http(), self.addr);
        match creds.client().get(url).send().await {
            Ok(mut resp) => {
                let body = resp.body().limit(1 << 22).await.unwrap_or_default();
                (
                    resp.status().as_u16(),
                    String::from_utf8_lossy(&body).into_owned(),
                )
            }
            Err(e) => (0, e.to_string()),
        }
    }

    async fn status_with(&self, secret: &str) -> u16 {
        self.get(&self.creds(Some(secret)), "/status").await.0
    }

    /// Waits until `/status` answers `code` to `secret`.
    async fn wait_answer(&self, secret: &str, code: u16, what: &str) {
        let start = std::time::Instant::now();
        while self.status_with(secret).await != code {
            assert!(start.elapsed() < RELOAD, "{what}: not within {RELOAD:?}");
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn metrics(&self) -> String {
        self.get(&self.creds(None), "/metrics").await.1
    }

    fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success());
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    /// SIGTERM and the graceful stop's exit status 0; answers the log.
    async fn terminate(mut self) -> String {
        self.signal("TERM");
        let start = std::time::Instant::now();
        let exit = loop {
            if let Some(exit) = self.child.try_wait().expect("wait") {
                break exit;
            }
            assert!(start.elapsed() < RELOAD, "still running after SIGTERM");
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(exit.success(), "{exit:?}");
        self.log()
    }
}

/// A file `name` in `dir` holding the old secret, and its path as a flag's value.
fn holding_old(dir: &Path, name: &str) -> (PathBuf, String) {
    let file = dir.join(name);
    std::fs::write(&file, OLD).expect("write");
    let shown = file.display().to_string();
    (file, shown)
}

impl Drop for Service {
    /// A test that fails half-way leaves no service running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `content` to `path` whole (a new file renamed over it, as deployment tools do).
fn replace(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// A change source with one stored transaction, the service started on it with `args`.
async fn with_upstream(dir: &Path, args: &[&str]) -> (Service, FakeUpstream) {
    let up = FakeUpstream::start().await;
    let url = up.url();
    let mut all = vec!["--upstream", &url, "--ping-interval-ms", "600000"];
    all.extend_from_slice(args);
    let svc = Service::spawn(dir, &all).await;
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    (svc, up)
}

/// A subscriber presenting `creds`, live at 100, acking what it reads.
async fn subscribe(svc: &Service, creds: &Credentials, id: &str) -> WsClient {
    let url = format!(
        "{}://{}/replication/v6/changes?id={id}&replicaVersion={}&watermark={}",
        creds.ws(),
        svc.addr,
        w(100),
        w(100)
    );
    let start = std::time::Instant::now();
    loop {
        // The first transaction must be stored first.
        let (code, body) = svc.get(creds, "/status").await;
        let status: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if code == 200 && status["replicaVersion"] == w(100) {
            break;
        }
        assert!(start.elapsed() < RELOAD, "status {code}: {body}");
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    WsClient::connect_with(&url, creds).await
}

/// `c` reads on until the commit of transaction `n`, acking; panics on a close.
async fn reads_commit(c: &mut WsClient, n: u64) {
    read_through(c, n, || ()).await
}

fn count(metrics: &str, secret: &str) -> u64 {
    let prefix = format!("change_streamer_auth_success_total{{secret=\"{secret}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix}in {metrics}"))
}

#[actix_rt::test]
async fn two_secret_files_are_both_accepted_and_counted_by_which() {
    let dir = tempfile::tempdir().unwrap();
    let (cur, next) = (dir.path().join("current"), dir.path().join("next"));
    std::fs::write(&cur, format!("{OLD}\n")).unwrap();
    std::fs::write(&next, NEW).unwrap();
    let (cur_s, next_s) = (cur.display().to_string(), next.display().to_string());
    let svc = Service::spawn(
        dir.path(),
        &["--secret-file", &cur_s, "--secret-file", &next_s],
    )
    .await;
    for _ in 0..3 {
        assert_eq!(svc.status_with(OLD).await, 200);
    }
    assert_eq!(svc.status_with(NEW).await, 200);
    assert_eq!(svc.status_with("neither-secret-0123456789").await, 401);
    let metrics = svc.metrics().await;
    assert_eq!((count(&metrics, "1"), count(&metrics, "2")), (3, 1));
    svc.terminate().await;
}

#[actix_rt::test]
async fn a_rotated_secret_file_is_reread_when_it_changes_and_the_removed_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (file, file_s) = holding_old(dir.path(), "secret");
    let (svc, up) = with_upstream(dir.path(), &["--secret-file", &file_s]).await;
    let mut kept = subscribe(&svc, &svc.creds(Some(OLD)), "kept").await;
    assert_eq!(svc.status_with(NEW).await, 401);
    // The next secret is added: both are accepted.
    replace(&file, &format!("{OLD}\n{NEW}\n"));
    svc.wait_answer(NEW, 200, "the added secret accepted").await;
    assert_eq!(svc.status_with(OLD).await, 200);
    let mut joined = subscribe(&svc, &svc.creds(Some(NEW)), "joined").await;
    // The old one is removed: refused from then on; the subscriber that connected with it stays.
    replace(&file, &format!("{NEW}\n"));
    svc.wait_answer(OLD, 401, "the removed secret refused")
        .await;
    up.send(txn(101, 1));
    reads_commit(&mut kept, 101).await;
    reads_commit(&mut joined, 101).await;
    let metrics = svc.metrics().await;
    assert!(count(&metrics, "2") >= 2, "{metrics}");
    let log = svc.terminate().await;
    assert!(
        log.contains("reload: --secret-file (2 secret(s)): the file changed"),
        "{log}"
    );
    assert!(
        !log.contains(OLD) && !log.contains(NEW),
        "a secret in the log"
    );
}

#[actix_rt::test]
async fn sighup_reloads_logs_one_line_and_never_stops_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let (file, file_s) = holding_old(dir.path(), "secret");
    let (mut svc, up) = with_upstream(dir.path(), &["--secret-file", &file_s]).await;
    let mut kept = subscribe(&svc, &svc.creds(Some(OLD)), "kept").await;
    // Written in place, size and time as they were: only SIGHUP tells.
    let before = std::fs::metadata(&file).unwrap().modified().unwrap();
    std::fs::write(&file, NEW).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(before)
        .unwrap();
    svc.signal("HUP");
    svc.wait_answer(NEW, 200, "SIGHUP reloaded").await;
    assert_eq!(svc.status_with(OLD).await, 401);
    assert!(svc.running(), "SIGHUP stopped the service");
    svc.signal("HUP");
    wait_until("the second SIGHUP's line", RELOAD, || {
        svc.log()
            .matches("SIGHUP: reloaded --secret-file (1 secret(s))")
            .count()
            == 2
    })
    .await;
    assert!(svc.running(), "SIGHUP stopped the service");
    up.send(txn(101, 1));
    reads_commit(&mut kept, 101).await;
    svc.terminate().await;
}

#[actix_rt::test]
async fn an_invalid_secret_file_keeps_the_old_secrets_and_logs_naming_the_flag_never_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let (file, file_s) = holding_old(dir.path(), "secret");
    let svc = Service::spawn(dir.path(), &["--secret-file", &file_s]).await;
    // Too short, then three secrets, then gone: each keeps the old one.
    for (bad, why) in [
        ("short".to_string(), "is 5 bytes"),
        (format!("{OLD}\n{NEW}\n{NEW}"), "3 secrets given"),
    ] {
        replace(&file, &bad);
        wait_until("the ERROR", RELOAD, || svc.log().contains(why)).await;
        assert_eq!(svc.status_with(OLD).await, 200);
    }
    std::fs::remove_file(&file).unwrap();
    wait_until("the ERROR", RELOAD, || svc.log().contains("cannot read")).await;
    assert_eq!(svc.status_with(OLD).await, 200);
    assert_eq!(svc.status_with(NEW).await, 401);
    let log = svc.terminate().await;
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 3, "{log}");
    for e in errors {
        assert!(
            e.contains(&format!("reload: --secret-file ({file_s}): ")),
            "{e}"
        );
        assert!(e.contains("keeping what was loaded before"), "{e}");
    }
    assert!(
        !log.contains(OLD) && !log.contains(NEW),
        "a secret in the log: {log}"
    );
}

#[actix_rt::test]
async fn a_rotated_certificate_serves_new_handshakes_and_keeps_open_connections() {
    let (a, b) = (TestCert::localhost(), TestCert::localhost());
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::copy(&a.cert, &cert).unwrap();
    std::fs::copy(&a.key, &key).unwrap();
    let (cert_s, key_s) = (cert.display().to_string(), key.display().to_string());
    let (mut svc, up) =
        with_upstream(dir.path(), &["--tls-cert", &cert_s, "--tls-key", &key_s]).await;
    let trust = |c: &TestCert| Credentials {
        secret: None,
        tls: Some(c.client_config()),
    };
    svc.tls = Some(trust(&a));
    let mut kept = subscribe(&svc, &trust(&a), "kept").await;
    assert_eq!(
        svc.get(&trust(&b), "/healthz").await.0,
        0,
        "b is not served yet"
    );
    std::fs::copy(&b.key, &key).unwrap();
    std::fs::copy(&b.cert, &cert).unwrap();
    svc.signal("HUP");
    wait_until("new handshakes use the new pair", RELOAD, || {
        svc.log().contains("SIGHUP: reloaded --tls-cert/--tls-key")
    })
    .await;
    assert_eq!(svc.get(&trust(&b), "/healthz").await.0, 200);
    assert_eq!(
        svc.get(&trust(&a), "/healthz").await.0,
        0,
        "a is no longer served"
    );
    up.send(txn(101, 1));
    reads_commit(&mut kept, 101).await;
    assert!(svc.running());
    svc.terminate().await;
}

#[actix_rt::test]
async fn a_rotated_upstream_secret_is_used_at_the_next_connect() {
    let up = FakeUpstream::start_with(UpstreamOptions {
        secret: Some(NEW.to_string()),
        ..UpstreamOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (file, file_s) = holding_old(dir.path(), "upstream-secret");
    let url = up.url();
    let svc = Service::spawn(
        dir.path(),
        &["--upstream", &url, "--upstream-secret-file", &file_s],
    )
    .await;
    wait_until("a refusal", RELOAD, || up.refused() >= 1).await;
    assert!(up.queries().is_empty(), "connected with the old secret");
    replace(&file, NEW);
    up.wait_connections(1).await;
    let log = svc.terminate().await;
    assert!(
        log.contains("reload: --upstream-secret-file (used from the next connect)"),
        "{log}"
    );
    assert!(
        !log.contains(OLD) && !log.contains(NEW),
        "a secret in the log"
    );
}
