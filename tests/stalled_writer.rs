//! PROTOCOL.md §11.1 (issue 41, item 5), end to end against the binary: the owner's change-log
//! writer behind a frozen TCP proxy in front of a real PostgreSQL change DB ([`FreezeProxy`]: the
//! connection stays open, no byte crosses) is a stalled stage once a commit waits on it: past
//! `--stall-alarm-ms`, `/readyz` answers 503 `stalled: writer for N ms` (it asks the stall watch
//! before the change log, which the hung writer holds) and one ERROR line says so; thawed, the
//! commit is stored and the owner is ready again.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use change_streamer_test_support::client::http_client;
use change_streamer_test_support::freeze::FreezeProxy;
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::upstream::{txn, FakeUpstream};

/// A safety net against a test that would hang, not what the test waits for.
const LIMIT: Duration = Duration::from_secs(60);

/// `/readyz` polled until `cond` holds on its (status, line). Each request may wait a second: a
/// `/readyz` asked just before the stall is seen waits on the change log, which the hung writer
/// holds; the next one is answered by the stall watch.
async fn wait_readyz(svc: &ServiceProcess, what: &str, cond: impl Fn(u16, &str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let resp = http_client()
            .get(format!("http://{}/readyz", svc.addr))
            .timeout(Duration::from_secs(1))
            .send()
            .await;
        let (code, line) = match resp {
            Ok(mut r) => {
                let body = r.body().await.unwrap_or_default();
                let line = String::from_utf8_lossy(&body).trim().to_string();
                (r.status().as_u16(), line)
            }
            Err(e) => (0, format!("no answer: {e}")),
        };
        if cond(code, &line) {
            return line;
        }
        assert!(
            start.elapsed() < LIMIT,
            "{what} within {LIMIT:?}: {code} {line}"
        );
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `db`'s URL with its server's address replaced by `via`.
fn through(db: &TestDb, via: SocketAddr) -> (SocketAddr, String) {
    let (head, rest) = db.url.split_once('@').expect("a URL with a user");
    let (server, name) = rest.split_once('/').expect("a URL with a database");
    let addr: SocketAddr = server.parse().expect("the server at an IP:port");
    (addr, format!("{head}@{via}/{name}"))
}

#[actix_rt::test]
async fn a_writer_behind_a_frozen_change_db_is_a_stalled_stage() {
    let db = TestDb::create("stalled_writer").await;
    let (server, _) = through(&db, "127.0.0.1:1".parse().unwrap());
    let proxy = FreezeProxy::start(server).await;
    let (_, url) = through(&db, proxy.addr);
    let up = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = up.url();
    let data = dir.path().to_path_buf();
    // Off the test's thread: the proxy runs on it and must forward while the start is awaited.
    let svc = tokio::task::spawn_blocking(move || {
        ServiceProcess::spawn(
            Path::new(env!("CARGO_BIN_EXE_change-streamer")),
            0,
            &data,
            &[
                "--upstream",
                &upstream,
                "--change-db",
                &url,
                "--stall-alarm-ms",
                "1000",
            ],
        )
    })
    .await
    .expect("the service starts");
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    svc.wait_status("the initial sync", |s| s["replicaVersion"].is_string())
        .await;
    wait_readyz(&svc, "ready", |code, _| code == 200).await;

    proxy.freeze();
    up.send(txn(101, 1));
    let line = wait_readyz(&svc, "stalled in /readyz", |code, line| {
        code == 503 && line.starts_with("stalled: ")
    })
    .await;
    let ms: u64 = line
        .strip_prefix("stalled: writer for ")
        .and_then(|rest| rest.strip_suffix(" ms"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not `stalled: writer for N ms`: {line}"));
    assert!(ms >= 1000, "{line}");
    let errors = svc
        .wait_logged("stage writer stalled: work pending and no progress for")
        .await;
    assert!(
        errors.len() == 1 && errors[0].contains("ERROR"),
        "{errors:?}"
    );

    proxy.thaw();
    wait_readyz(&svc, "ready again once thawed", |code, _| code == 200).await;
    svc.wait_logged("stage writer is no longer stalled").await;
    svc.wait_status("101 stored", |s| {
        s["changeLog"]["maxWatermark"]
            == change_streamer_actors::watermark::Watermark::from_u64(101).to_string()
    })
    .await;
    svc.terminate().await;
}
