//! End to end: the backup replicator required (PROTOCOL.md §10.3) and one backup replicator per
//! backup (PROTOCOL.md §7.1), against the real server with a fake change source and real
//! websocket clients, each reading on a thread of its own as another process would (see
//! `own_thread`), except the ghost, which reads nothing.

use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::own_thread::on_own_thread;
use change_streamer_test_support::service::{service_with_upstream, TestService};
use change_streamer_test_support::upstream::txn;
use serde_json::Value;
use tokio::sync::oneshot;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

fn n_of(watermark: &Value) -> u64 {
    watermark
        .as_str()
        .and_then(|w| Watermark::parse(w).ok())
        .and_then(|w| w.to_u64())
        .unwrap_or(0)
}

/// A `/changes` URL for `id` at watermark 100, with `extra` query parameters.
fn changes_url(svc: &TestService, id: &str, extra: &str) -> String {
    svc.ws(&format!(
        "/replication/v6/changes?id={id}&replicaVersion={}&watermark={}{extra}",
        w(100),
        w(100)
    ))
}

/// Reads and acks until the commit of `last`; returns the commit watermarks in order, checking
/// that each transaction arrived whole.
async fn read_txns(c: &mut WsClient, last: u64) -> Vec<u64> {
    let mut txns = Vec::new();
    let mut open = false;
    loop {
        let (id, msg) = c.msg().await;
        c.ack(id).await;
        match msg[0].as_str() {
            Some("begin") => {
                assert!(!open, "begin inside a transaction: {msg}");
                open = true;
            }
            Some("data") => assert!(open, "data outside a transaction"),
            Some("commit") => {
                assert!(open, "commit without its begin: {msg}");
                open = false;
                let n = n_of(&msg[2]["watermark"]);
                txns.push(n);
                if n >= last {
                    return txns;
                }
            }
            _ => {}
        }
    }
}

/// The subscriber `id` in `/status`.
fn subscriber<'a>(st: &'a Value, id: &str) -> &'a Value {
    st["subscribers"]
        .as_array()
        .and_then(|subs| subs.iter().find(|s| s["id"] == id))
        .unwrap_or(&Value::Null)
}

fn subscribers(st: &Value) -> usize {
    st["subscribers"].as_array().map_or(0, Vec::len)
}

/// A client on a thread of its own that acks its `status` frame, then reads without acking
/// until `resume` fires, then acks all it read and reads and acks on up to the commit of
/// `last`; returns the commits it got.
fn stalled_until(
    url: String,
    mut resume: oneshot::Receiver<()>,
    last: u64,
) -> oneshot::Receiver<Vec<u64>> {
    on_own_thread(move || async move {
        let mut c = WsClient::connect(&url).await;
        let (id, status) = c.msg().await;
        assert_eq!(status[0], "status");
        c.ack(id).await;
        let (mut read, mut acked, mut acking) = (id, id, false);
        let mut commits = Vec::new();
        loop {
            if !acking && resume.try_recv().is_ok() {
                acking = true;
            }
            if acking {
                // One by one, in order (PROTOCOL.md §5).
                for n in acked + 1..=read {
                    c.ack(n).await;
                }
                acked = read;
            }
            if commits.last() == Some(&last) {
                return commits;
            }
            match c.next(Duration::from_millis(50)).await {
                Some(Seen::Msg { id, msg }) => {
                    read = id;
                    if msg[0] == "commit" {
                        commits.push(n_of(&msg[2]["watermark"]));
                    }
                }
                Some(Seen::Closed { code, reason }) => panic!("closed {code} {reason}"),
                None => {}
            }
        }
    })
}

/// Reads, without acking, what `c` was sent before its close; returns the close.
async fn close_after_what_it_was_sent(c: &mut WsClient) -> (u16, String) {
    loop {
        match c.next(Duration::from_secs(60)).await {
            Some(Seen::Msg { .. }) => {}
            Some(Seen::Closed { code, reason }) => return (code, reason),
            None => panic!("not closed within a minute"),
        }
    }
}

/// PROTOCOL.md §10.3 with §10.1: a stalled serving subscriber is evicted with 1013 after the
/// grace; a stalled backup replicator is never evicted, never lagging, and ingest waits for it,
/// then goes on at its ack. `/status` shows it `required`.
#[actix_rt::test]
async fn a_stalled_backup_replicator_is_not_evicted_while_a_stalled_serving_one_is_and_ingest_waits_for_it(
) {
    let (svc, up) = service_with_upstream(&[
        "--slow-subscriber-grace-ms",
        "2000",
        "--flow-control-consensus-padding-seconds",
        "0.05",
        "--ping-interval-ms",
        "1000",
    ])
    .await;
    let url = changes_url(&svc, "healthy", "");
    let healthy = on_own_thread(move || async move {
        let mut c = WsClient::connect(&url).await;
        read_txns(&mut c, 110).await
    });
    // The silent one reads (answering pings) and never acks.
    let url = changes_url(&svc, "silent", "");
    let silent = on_own_thread(move || async move {
        let mut c = WsClient::connect(&url).await;
        loop {
            match c.next(Duration::from_secs(60)).await {
                Some(Seen::Msg { .. }) => {}
                Some(Seen::Closed { code, reason }) => return (code, reason),
                None => panic!("not evicted within a minute"),
            }
        }
    });
    let (resume, resumed) = oneshot::channel();
    let backup = stalled_until(changes_url(&svc, "backup", "&mode=backup"), resumed, 110);
    svc.wait_status("three live subscribers", |s| {
        subscribers(s) == 3
            && s["subscribers"]
                .as_array()
                .is_some_and(|subs| subs.iter().all(|s| s["phase"] == "live"))
    })
    .await;
    // Well over 64 KiB: several tracked sends.
    for n in 101..=110 {
        up.send(txn(n, 200));
    }
    let (code, reason) = silent.await.expect("the silent client's thread");
    assert_eq!(code, 1013, "{reason}");
    assert!(reason.starts_with("too slow: lagging "), "{reason}");
    // The backup replicator has held a tracked send for well over the grace: still there.
    let st = svc
        .wait_status("the backup replicator waited 3 s", |s| {
            subscriber(s, "backup")["lagSeconds"].as_f64() >= Some(3.0)
        })
        .await;
    let b = subscriber(&st, "backup");
    assert_eq!(
        (b["required"].clone(), b["lagging"].clone()),
        (true.into(), Value::Null),
        "{st}"
    );
    assert_eq!(subscriber(&st, "healthy")["required"], false, "{st}");
    assert_eq!(subscribers(&st), 2, "{st}");
    let stored = n_of(&st["changeLog"]["maxWatermark"]);
    assert!(
        stored < 110,
        "ingest went on without the backup replicator: {st}"
    );
    // It acks: ingest goes on, and everyone gets everything.
    resume.send(()).expect("the backup client waits");
    assert_eq!(
        backup.await.expect("the backup client's thread"),
        (101..=110).collect::<Vec<_>>()
    );
    assert_eq!(
        healthy.await.expect("the healthy client's thread"),
        (101..=110).collect::<Vec<_>>()
    );
    let (_, metrics) = svc.get("/metrics").await;
    assert!(
        metrics.contains("change_streamer_subscribers_evicted_total 1"),
        "{metrics}"
    );
    svc.stop().await;
}

/// PROTOCOL.md §7.1: a restarted backup replicator replaces its ghost, which holds a tracked
/// send (ingest waits for it, §10.3, and nothing evicts it): the ghost is closed with 1000
/// `replaced …`, ingest goes on, and the new one gets everything.
#[actix_rt::test]
async fn a_second_backup_replicator_replaces_the_first_with_1000_replaced() {
    let (svc, up) = service_with_upstream(&[
        "--slow-subscriber-grace-ms",
        "0",
        "--flow-control-consensus-padding-seconds",
        "0.05",
        "--ping-interval-ms",
        "600000",
    ])
    .await;
    let url = changes_url(&svc, "healthy", "");
    let healthy = on_own_thread(move || async move {
        let mut c = WsClient::connect(&url).await;
        read_txns(&mut c, 110).await
    });
    let mut ghost = WsClient::connect(&changes_url(&svc, "backup", "&mode=backup")).await;
    let (id, status) = ghost.msg().await;
    assert_eq!(status[0], "status");
    ghost.ack(id).await;
    svc.wait_status("two subscribers", |s| subscribers(s) == 2)
        .await;
    for n in 101..=110 {
        up.send(txn(n, 200));
    }
    let st = svc
        .wait_status("the ghost holding a tracked send for a second", |s| {
            subscriber(s, "backup")["lagSeconds"].as_f64() >= Some(1.0)
        })
        .await;
    assert!(n_of(&st["changeLog"]["maxWatermark"]) < 110, "{st}");
    // The restarted replicator, naming the backup with an empty `backup`: the only one.
    let url = changes_url(&svc, "backup", "&mode=backup&backup=");
    let (got, got_rx) = oneshot::channel();
    let (hang_up, hung_up) = oneshot::channel::<()>();
    let restarted = on_own_thread(move || async move {
        let mut c = WsClient::connect(&url).await;
        let _ = got.send(read_txns(&mut c, 110).await);
        // Stays connected (answering nothing) until the test has seen it in /status.
        let _ = hung_up.await;
    });
    assert_eq!(
        close_after_what_it_was_sent(&mut ghost).await,
        (
            1000,
            "replaced by a newer backup replicator of the same backup".to_string()
        )
    );
    assert_eq!(
        got_rx.await.expect("the restarted client's thread"),
        (101..=110).collect::<Vec<_>>()
    );
    let st = svc.status().await;
    let required: Vec<&Value> = st["subscribers"]
        .as_array()
        .map(|subs| subs.iter().filter(|s| s["required"] == true).collect())
        .unwrap_or_default();
    assert_eq!(required.len(), 1, "one backup replicator: {st}");
    assert_eq!(required[0]["id"], "backup", "{st}");
    let _ = hang_up.send(());
    restarted.await.expect("the restarted client's thread");
    assert_eq!(
        healthy.await.expect("the healthy client's thread"),
        (101..=110).collect::<Vec<_>>()
    );
    svc.stop().await;
}

/// PROTOCOL.md §7: `backup` names the backup of a backup replicator, and only of one.
#[actix_rt::test]
async fn the_backup_parameter_is_refused_without_mode_backup() {
    let (svc, _up) = service_with_upstream(&[]).await;
    let mut c = WsClient::connect(&changes_url(&svc, "r", "&backup=primary")).await;
    assert_eq!(
        c.closed().await,
        (
            1002,
            "Invalid backup in subscription request: only with mode=backup".to_string()
        )
    );
    let mut c = WsClient::connect(&changes_url(&svc, "r", "&mode=backup&backup=primary")).await;
    let (_, status) = c.msg().await;
    assert_eq!(status[0], "status");
    svc.stop().await;
}
