//! End to end: PROTOCOL.md §3.0 "an open transaction is stored as it arrives", against the real
//! binary on both engines. A large transaction (20,000 changes of ~1 KiB, several chunks) is
//! stored pending as it arrives; the service is killed with SIGKILL (`kill -9`) before its
//! commit; after the restart no row of it is visible, its pending rows are gone, the change
//! source is asked from the last durable commit, and the source's resend is stored whole, once,
//! and delivered whole to a subscriber.

use std::path::Path;
use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{frame, payloads, InOrder, Step, WsClient};
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use serde_json::json;

/// Changes of the large transaction: about five chunks of the default 4096.
const ROWS: u64 = 20_000;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The frames of transaction `n` with `ROWS` inserts of ~1 KiB, without its commit.
fn large_open(n: u64) -> Vec<String> {
    let pad = "p".repeat(900);
    let mut f = vec![format!(
        r#"["begin",{{"tag":"begin"}},{{"commitWatermark":"{}"}}]"#,
        w(n)
    )];
    f.extend((0..ROWS).map(|i| {
        format!(
            r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"items","keyColumns":["id"]}},"new":{{"id":{i},"v":"{pad}"}}}}]"#
        )
    }));
    f
}

fn commit_frame(n: u64) -> String {
    format!(
        r#"["commit",{{"tag":"commit"}},{{"watermark":"{}"}}]"#,
        w(n)
    )
}

/// Where the change log is, and how to count its pending rows from outside the service.
enum Store {
    Sqlite,
    Pg(TestDb),
}

impl Store {
    fn flags(&self) -> Vec<String> {
        match self {
            Store::Sqlite => vec![],
            Store::Pg(db) => vec!["--change-db".into(), db.url.clone()],
        }
    }

    async fn pending_rows(&self, dir: &Path) -> i64 {
        match self {
            Store::Sqlite => {
                let c = rusqlite::Connection::open(dir.join("change-log.db")).unwrap();
                c.busy_timeout(Duration::from_secs(5)).unwrap();
                c.query_row("SELECT COUNT(*) FROM pending_txn", [], |r| r.get(0))
                    .unwrap()
            }
            Store::Pg(db) => db
                .connect()
                .await
                .query_one("SELECT count(*) FROM change_streamer.pending_txn", &[])
                .await
                .unwrap()
                .get(0),
        }
    }
}

fn start(dir: &Path, up: &FakeUpstream, store: &Store) -> ServiceProcess {
    let mut flags = vec!["--upstream".to_string(), up.url()];
    flags.extend(store.flags());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    ServiceProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_change-streamer")),
        0,
        dir,
        &flags,
    )
}

/// Waits (polling, with a generous deadline) until `cond` holds of the pending rows.
async fn wait_pending(store: &Store, dir: &Path, what: &str, cond: impl Fn(i64) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let n = store.pending_rows(dir).await;
        if cond(n) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {n} pending rows"
        );
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The whole story on one engine.
async fn kill_9_inside_a_large_transaction_leaves_nothing_and_the_resend_is_stored_once(
    store: Store,
) {
    let up = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let first = start(dir.path(), &up, &store);
    up.wait_connections(1).await;
    up.send(txn(100, 2));
    first
        .wait_status("stored up to 100", |s| {
            s["changeLog"]["maxWatermark"] == json!(w(100))
        })
        .await;
    // The large transaction arrives, its commit does not: its chunks are stored as they come.
    up.send(large_open(101));
    wait_pending(&store, dir.path(), "chunks stored before the commit", |n| {
        n > 0
    })
    .await;
    let st = first.status().await;
    assert_eq!(
        st["changeLog"]["maxWatermark"],
        json!(w(100)),
        "nothing of it visible: {st}"
    );
    first.kill9();
    up.drop_connection();

    let second = start(dir.path(), &up, &store);
    up.wait_connections(2).await;
    let query = up.queries()[1].clone();
    assert!(
        query.contains(&format!("lastWatermark={}", w(100))),
        "the source is asked from the last durable commit: {query}"
    );
    let st = second.status().await;
    assert_eq!(
        st["changeLog"]["maxWatermark"],
        json!(w(100)),
        "no row of it visible: {st}"
    );
    assert_eq!(
        store.pending_rows(dir.path()).await,
        0,
        "its pending rows deleted at start"
    );
    assert_eq!(
        second
            .logged("pending row(s) of a transaction interrupted before its commit")
            .len(),
        1,
        "the start says it deleted them"
    );
    // The source resends it whole, and one more after it.
    let mut resend = large_open(101);
    resend.push(commit_frame(101));
    up.send(resend);
    up.send(txn(102, 1));
    second
        .wait_status("stored up to 102", |s| {
            s["changeLog"]["maxWatermark"] == json!(w(102))
        })
        .await;
    assert_eq!(
        store.pending_rows(dir.path()).await,
        0,
        "moved by the commit"
    );

    // A subscriber from 100 gets 101 whole, once, then 102.
    let mut sub = WsClient::connect(&second.ws(&format!(
        "/replication/v6/changes?id=r1&replicaVersion={}&watermark={}",
        w(100),
        w(100)
    )))
    .await;
    let mut order = InOrder::at(101);
    let mut ids = Vec::new();
    while order.next <= 102 {
        let (id, ps) = payloads(&frame(&mut sub).await);
        for p in &ps {
            if order.next == 101 && p[0] == "data" {
                ids.push(p[1]["new"]["id"].as_u64().expect("id"));
            }
            assert_ne!(order.payload(p), Step::Rollback, "{p}");
        }
        sub.ack(id).await;
    }
    assert_eq!(
        ids,
        (0..ROWS).collect::<Vec<_>>(),
        "101 whole, once, in order"
    );
    second.terminate().await;
    up.stop().await;
}

#[actix_rt::test]
async fn kill_9_inside_a_large_transaction_sqlite() {
    kill_9_inside_a_large_transaction_leaves_nothing_and_the_resend_is_stored_once(Store::Sqlite)
        .await;
}

#[actix_rt::test]
async fn kill_9_inside_a_large_transaction_postgres() {
    let db = TestDb::create("large_txn_kill9").await;
    kill_9_inside_a_large_transaction_leaves_nothing_and_the_resend_is_stored_once(Store::Pg(db))
        .await;
}
