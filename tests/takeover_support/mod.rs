//! What the end-to-end tests on a shared PostgreSQL change DB (`tests/takeover.rs`) share: a
//! service process and what its log says, requests to its operator endpoints, the change
//! source's acks, ending the owner's PostgreSQL session, and polling an instance's `/status`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::wait_until;

use change_streamer_test_support::pg::TestDb;

pub const INTERVAL_MS: u64 = 200;

/// A service process; `standby` says where it answers as a standby, `listening` where it
/// listens as the owner, once it does.
pub struct Instance {
    pub child: Child,
    pub standby: mpsc::Receiver<String>,
    pub listening: mpsc::Receiver<(String, Instant)>,
    /// Said once the deposed owner's change log writer ended: no handle on it was left.
    pub writer_gone: mpsc::Receiver<()>,
    /// Every line it logs, as it logs it.
    pub log: mpsc::Receiver<String>,
    _dir: tempfile::TempDir,
}

impl Instance {
    pub fn start(db: &TestDb, upstream: &str) -> Instance {
        Self::start_with(db, upstream, INTERVAL_MS, &[])
    }

    /// With its own takeover interval and more flags.
    pub fn start_with(db: &TestDb, upstream: &str, interval_ms: u64, args: &[&str]) -> Instance {
        Self::start_on(&db.url, upstream, interval_ms, args)
    }

    /// [`Instance::start_with`] on the change DB at `url` (the test database reached through a
    /// proxy, say).
    pub fn start_on(url: &str, upstream: &str, interval_ms: u64, args: &[&str]) -> Instance {
        let dir = tempfile::tempdir().unwrap();
        let interval = interval_ms.to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_change-streamer"))
            .args(["--host", "127.0.0.1", "--port", "0", "--upstream", upstream])
            .args(["--change-db", url, "--takeover-interval-ms", &interval])
            .args(args)
            .arg("--data-dir")
            .arg(dir.path())
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the binary");
        let stderr = child.stderr.take().unwrap();
        let (tx, listening) = mpsc::channel();
        let (standby_tx, standby) = mpsc::channel();
        let (gone_tx, writer_gone) = mpsc::channel();
        let (log_tx, log) = mpsc::channel();
        let pid = child.id();
        std::thread::spawn(move || {
            let addr = |rest: &str| rest.split_whitespace().next().unwrap_or("").to_string();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Shown with a failing test's output.
                eprintln!("[pid {pid}] {line}");
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let _ = tx.send((addr(rest), Instant::now()));
                } else if let Some(rest) = line.split("standby on ").nth(1) {
                    let _ = standby_tx.send(addr(rest));
                } else if line.contains("deposed change log writer stopped") {
                    let _ = gone_tx.send(());
                }
                let _ = log_tx.send(line);
            }
        });
        Instance {
            child,
            standby,
            listening,
            writer_gone,
            log,
            _dir: dir,
        }
    }

    pub fn listening_within(&self, limit: Duration) -> Option<(String, Instant)> {
        self.listening.recv_timeout(limit).ok()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET http://{addr}{path}`: the status code and the body.
pub async fn get(addr: &str, path: &str) -> (u16, String) {
    let mut resp = change_streamer_test_support::client::http_client()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .expect("http get");
    let body = resp.body().await.expect("body");
    (
        resp.status().as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// The `change_streamer_owner` gauge's value on `/metrics`.
pub async fn owner_gauge(addr: &str) -> String {
    metric(addr, "change_streamer_owner").await
}

/// The value of the metric `name` on `/metrics`, as written.
pub async fn metric(addr: &str, name: &str) -> String {
    let (code, text) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .to_string()
}

pub async fn role(addr: &str) -> serde_json::Value {
    let (code, body) = get(addr, "/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["role"].clone()
}

pub fn wm(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The commit watermarks the change source was acked.
pub fn acked(up: &FakeUpstream) -> Vec<u64> {
    up.acks()
        .iter()
        .filter_map(|a| serde_json::from_str::<serde_json::Value>(a).ok())
        .filter(|a| a[1]["tag"] == "commit")
        .filter_map(|a| Watermark::parse(a[2]["watermark"].as_str()?).ok()?.to_u64())
        .collect()
}

/// Sends the initial sync (watermark 100, `rows` rows) and waits for its ack; then
/// subscribes at `addr` from it as `id`.
pub async fn initial_sync_then_subscribe(
    up: &FakeUpstream,
    rows: u64,
    addr: &str,
    id: &str,
) -> WsClient {
    up.send(txn(100, rows));
    wait_until("the initial sync acked", Duration::from_secs(20), || {
        !acked(up).is_empty()
    })
    .await;
    WsClient::connect(&format!(
        "ws://{addr}/replication/v6/changes?id={id}&replicaVersion={}&watermark={}",
        wm(100),
        wm(100)
    ))
    .await
}

/// Reads (and acks) a subscription until the commit of `last`: the commit watermarks in order.
pub async fn commits_until(c: &mut WsClient, last: u64) -> Vec<u64> {
    let mut commits = Vec::new();
    loop {
        let (id, msg) = c.msg().await;
        assert_ne!(
            msg[0], "error",
            "the subscription got an error frame: {msg:?}"
        );
        c.ack(id).await;
        if msg[0] == "commit" {
            let w = Watermark::parse(msg[2]["watermark"].as_str().unwrap()).unwrap();
            let n = w.to_u64().unwrap();
            commits.push(n);
            if n >= last {
                return commits;
            }
        }
    }
}

/// Ends the owner's PostgreSQL session, as PostgreSQL does when it notices its connection died.
pub async fn terminate_owner_session(db: &TestDb) {
    let c = db.connect().await;
    let ended = c
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks
             WHERE locktype = 'advisory' AND granted AND objid::int8 = $1
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&change_streamer_actors::ownership::OWNER_LOCK_KEY],
        )
        .await
        .unwrap();
    assert_eq!(ended, 1, "one owner session to end");
}

/// The close of `c`, skipping whatever messages come before it, within `limit`.
pub async fn close_within(c: &mut WsClient, limit: Duration) -> (u16, String) {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.next(left).await {
            Some(Seen::Closed { code, reason }) => return (code, reason),
            Some(Seen::Msg { id, .. }) => c.ack(id).await,
            None => panic!("no close within {limit:?}"),
        }
    }
}

pub fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Polls `GET {addr}/status` until `cond` holds of it; panics, naming `what`, after `limit`.
pub async fn status_until(
    addr: &str,
    what: &str,
    limit: Duration,
    mut cond: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let (code, body) = get(addr, "/status").await;
        let status: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if code == 200 && cond(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not reached within {limit:?}; last /status: {body}"
        );
        actix_rt::time::sleep(change_streamer_test_support::wait::POLL).await;
    }
}

/// The id of the instance answering at `addr` (its `/status` `instance`).
pub async fn instance_id(addr: &str) -> String {
    let status = status_until(addr, "an instance id", Duration::from_secs(20), |s| {
        s["instance"].is_string()
    })
    .await;
    status["instance"].as_str().unwrap().to_string()
}
