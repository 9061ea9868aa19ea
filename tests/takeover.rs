//! End to end on a shared PostgreSQL change DB (SPEC §14): two real service processes on one
//! database, exactly one of them the owner (the standby answers `/healthz`, `/status` and
//! `/metrics` with its role, and closes sessions with 1011); kill -9 of the owner mid-ingest, the standby owns
//! within --takeover-interval-ms + 1 s, asks the change source for the last durable
//! watermark, and no commit acked upstream is lost or stored twice.

#[path = "../actors/tests/pg_support/mod.rs"]
mod pg_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::wait_until;
use pg_support::TestDb;

const INTERVAL_MS: u64 = 200;

/// A service process; `standby` says where it answers as a standby, `listening` where it
/// listens as the owner, once it does.
struct Instance {
    child: Child,
    standby: mpsc::Receiver<String>,
    listening: mpsc::Receiver<(String, Instant)>,
    _dir: tempfile::TempDir,
}

impl Instance {
    fn start(db: &TestDb, upstream: &str) -> Instance {
        let dir = tempfile::tempdir().unwrap();
        let interval = INTERVAL_MS.to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_change-streamer"))
            .args(["--host", "127.0.0.1", "--port", "0", "--upstream", upstream])
            .args(["--change-db", &db.url, "--takeover-interval-ms", &interval])
            .arg("--data-dir")
            .arg(dir.path())
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the binary");
        let stderr = child.stderr.take().unwrap();
        let (tx, listening) = mpsc::channel();
        let (standby_tx, standby) = mpsc::channel();
        std::thread::spawn(move || {
            let addr = |rest: &str| rest.split_whitespace().next().unwrap_or("").to_string();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let _ = tx.send((addr(rest), Instant::now()));
                } else if let Some(rest) = line.split("standby on ").nth(1) {
                    let _ = standby_tx.send(addr(rest));
                }
            }
        });
        Instance {
            child,
            standby,
            listening,
            _dir: dir,
        }
    }

    fn listening_within(&self, limit: Duration) -> Option<(String, Instant)> {
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
async fn get(addr: &str, path: &str) -> (u16, String) {
    let mut resp = awc::Client::new()
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
async fn owner_gauge(addr: &str) -> String {
    let (code, text) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    text.lines()
        .find_map(|l| l.strip_prefix("change_streamer_owner "))
        .unwrap_or_else(|| panic!("no change_streamer_owner in {text}"))
        .to_string()
}

async fn role(addr: &str) -> serde_json::Value {
    let (code, body) = get(addr, "/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["role"].clone()
}

fn wm(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The commit watermarks the change source was acked.
fn acked(up: &FakeUpstream) -> Vec<u64> {
    up.acks()
        .iter()
        .filter_map(|a| serde_json::from_str::<serde_json::Value>(a).ok())
        .filter(|a| a[1]["tag"] == "commit")
        .filter_map(|a| Watermark::parse(a[2]["watermark"].as_str()?).ok()?.to_u64())
        .collect()
}

/// Reads (and acks) a subscription until the commit of `last`: the commit watermarks in order.
async fn commits_until(c: &mut WsClient, last: u64) -> Vec<u64> {
    let mut commits = Vec::new();
    loop {
        let (id, msg) = c.msg().await;
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

#[actix_rt::test]
async fn kill_9_of_the_owner_mid_ingest_the_standby_owns_and_no_acked_commit_is_lost() {
    let db = TestDb::create("takeover_e2e").await;
    let up = FakeUpstream::start().await;
    let mut a = Instance::start(&db, &up.url());
    let (a_addr, _) = a
        .listening_within(Duration::from_secs(20))
        .expect("the first instance owns the change DB and listens");
    up.wait_connections(1).await;
    let b = Instance::start(&db, &up.url());
    let b_addr = b
        .standby
        .recv_timeout(Duration::from_secs(20))
        .expect("the second instance answers as a standby");
    // Exactly one owner: the second instance stands by while the first lives.
    assert!(
        b.listening_within(Duration::from_millis(5 * INTERVAL_MS))
            .is_none(),
        "two owners of one change DB"
    );
    assert_eq!(up.queries().len(), 1, "a standby connected upstream");
    assert_eq!(role(&a_addr).await, "owner");
    assert_eq!(owner_gauge(&a_addr).await, "1");
    assert_eq!(role(&b_addr).await, "standby");
    assert_eq!(owner_gauge(&b_addr).await, "0");
    assert_eq!(get(&b_addr, "/healthz").await.0, 200);
    for path in [
        "snapshot?taskID=t1",
        "changes?id=r0&replicaVersion=00&watermark=00",
    ] {
        let mut c = WsClient::connect(&format!("ws://{b_addr}/replication/v6/{path}")).await;
        assert_eq!(
            c.closed().await,
            (1011, "standby: not the owner".to_string())
        );
    }

    for n in 100..140 {
        up.send(txn(n, 3));
    }
    wait_until("acks from the owner", Duration::from_secs(20), || {
        acked(&up).len() >= 10
    })
    .await;
    a.child.kill().unwrap(); // SIGKILL, mid-ingest
    let killed = Instant::now();
    a.child.wait().unwrap();
    let acked_by_a = acked(&up);

    let (addr, owned_at) = b
        .listening_within(Duration::from_millis(INTERVAL_MS) + Duration::from_secs(1))
        .expect("the standby owns within --takeover-interval-ms + 1 s");
    eprintln!("takeover in {:?}", owned_at - killed);
    assert_eq!(addr, b_addr, "the owner serves where the standby answered");
    assert_eq!(role(&addr).await, "owner");
    assert_eq!(owner_gauge(&addr).await, "1");
    // The new owner resumes from the last durable watermark.
    up.wait_connections(2).await;
    let query = up.queries()[1].clone();
    let resumed_at = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("lastWatermark="))
        .and_then(|w| Watermark::parse(w).ok()?.to_u64())
        .unwrap_or_else(|| panic!("no lastWatermark in {query}"));
    let last_acked = *acked_by_a.last().unwrap();
    assert!(
        resumed_at >= last_acked,
        "resumed at {resumed_at}, but {last_acked} was acked"
    );
    for n in 200..210 {
        up.send(txn(n, 3));
    }

    // Everything from the replicaVersion on: each acked commit once, in order.
    let mut sub = WsClient::connect(&format!(
        "ws://{addr}/replication/v6/changes?id=r1&replicaVersion={}&watermark={}",
        wm(100),
        wm(100)
    ))
    .await;
    let commits = commits_until(&mut sub, 209).await;
    assert!(
        commits.windows(2).all(|p| p[0] < p[1]),
        "a commit twice or out of order: {commits:?}"
    );
    for n in acked_by_a.iter().filter(|n| **n > 100) {
        assert!(commits.contains(n), "acked commit {n} lost: {commits:?}");
    }
    assert_eq!(
        commits.iter().filter(|n| **n >= 200).count(),
        10,
        "{commits:?}"
    );
    assert_eq!(
        *commits.iter().filter(|n| **n < 200).max().unwrap(),
        resumed_at
    );
}

#[actix_rt::test]
async fn an_owner_that_loses_its_session_stops_and_exits_for_a_standby() {
    let db = TestDb::create("deposed_e2e").await;
    let up = FakeUpstream::start().await;
    let mut a = Instance::start(&db, &up.url());
    a.listening_within(Duration::from_secs(20))
        .expect("the first instance owns the change DB and listens");
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    wait_until("the initial sync acked", Duration::from_secs(20), || {
        !acked(&up).is_empty()
    })
    .await;
    let b = Instance::start(&db, &up.url());
    b.standby
        .recv_timeout(Duration::from_secs(20))
        .expect("the second instance answers as a standby");

    // PostgreSQL ends the owner's session (as when it notices its connection died).
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
    assert_eq!(ended, 1);
    let deadline = Instant::now() + Duration::from_millis(3 * INTERVAL_MS) + Duration::from_secs(1);
    let status = loop {
        if let Some(status) = a.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the deposed owner still runs");
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        status.code(),
        Some(change_streamer::ownership::EXIT_DEPOSED)
    );
    b.listening_within(Duration::from_millis(INTERVAL_MS) + Duration::from_secs(1))
        .expect("the standby owns within --takeover-interval-ms + 1 s");
    up.wait_connections(2).await;
    assert!(
        up.queries()[1].contains(&format!("lastWatermark={}", wm(100))),
        "{:?}",
        up.queries()
    );
}
