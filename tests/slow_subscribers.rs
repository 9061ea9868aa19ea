//! End to end: slow subscribers (PROTOCOL.md §10.1), bounded memory per subscriber (PROTOCOL.md §10.2),
//! liveness under load (PROTOCOL.md §5) and the per-subscriber metrics (PROTOCOL.md §11), against the real
//! server with a fake change source and real websocket clients.

use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::own_thread::on_own_thread;
use change_streamer_test_support::service::{service_with_upstream, TestService};
use change_streamer_test_support::upstream::txn;
use serde_json::{json, Value};

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

fn changes_url(svc: &TestService, id: &str, watermark: u64) -> String {
    svc.ws(&format!(
        "/replication/v6/changes?id={id}&replicaVersion={}&watermark={}",
        w(100),
        w(watermark)
    ))
}

/// Reads and acks until the commit of `last`; returns the commit watermarks in order, checking
/// that each transaction arrived whole and nothing came twice.
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
                let wm = msg[2]["watermark"].as_str().unwrap_or_default();
                let n = Watermark::parse(wm).unwrap().to_u64().unwrap();
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

/// Answering pings is not acking (PROTOCOL.md §5, §10.1): a subscriber that goes on answering the
/// server's pings for several ping intervals while it lags is still evicted, with 1013, once the
/// grace is over. The interval (1 s) is one a busy machine's round trips fit in, so liveness
/// keeps every client here connected; the grace spans five of them, and the silent client counts
/// the pings it answered while it lagged, so the test sees that liveness was judging it all along.
#[actix_rt::test]
async fn a_subscriber_that_answers_pings_but_never_acks_is_evicted_with_1013() {
    let (svc, up) = service_with_upstream(&[
        "--slow-subscriber-grace-ms",
        "5000",
        "--flow-control-consensus-padding-seconds",
        "0.05",
        "--ping-interval-ms",
        "1000",
    ])
    .await;
    // Each client reads from the moment it connects, on a thread of its own, as another
    // process would: on the test's thread it would answer only when the in-process streamer
    // and the test let it.
    let mut healthy = Vec::new();
    for id in ["a", "b"] {
        let url = changes_url(&svc, id, 100);
        healthy.push(on_own_thread(move || async move {
            let mut c = WsClient::connect(&url).await;
            read_txns(&mut c, 110).await
        }));
    }
    // The silent one reads (and so answers pings) but never acks. It returns its close and the
    // pings it answered from its first transaction on (while it lagged).
    let url = changes_url(&svc, "silent", 100);
    let silent = on_own_thread(move || async move {
        let mut c = WsClient::connect(&url).await;
        let mut lagging_since = None;
        loop {
            match c.next(Duration::from_secs(60)).await {
                Some(Seen::Msg { msg, .. }) => {
                    if msg[0] == "begin" && lagging_since.is_none() {
                        lagging_since = Some(c.pings_answered);
                    }
                }
                Some(Seen::Closed { code, reason }) => {
                    let pings = c.pings_answered - lagging_since.unwrap_or(c.pings_answered);
                    return (code, reason, pings);
                }
                None => panic!("not evicted within a minute"),
            }
        }
    });
    svc.wait_status("three live subscribers", |s| {
        s["subscribers"].as_array().map(Vec::len) == Some(3)
            && s["subscribers"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["phase"] == "live")
    })
    .await;
    // Well over 64 KiB: several tracked sends.
    for n in 101..=110 {
        up.send(txn(n, 200));
    }
    let closed = silent.await.expect("the silent client's thread");
    assert_eq!(closed.0, 1013, "{closed:?}");
    assert!(
        closed.2 >= 2,
        "answered {} pings while lagging; the grace spans five intervals",
        closed.2
    );
    assert!(
        closed.1.starts_with("too slow: lagging ") && closed.1.contains(" ms on watermark "),
        "{closed:?}"
    );
    for r in healthy {
        assert_eq!(
            r.await.expect("a healthy client's thread"),
            (101..=110).collect::<Vec<_>>()
        );
    }
    let (_, metrics) = svc.get("/metrics").await;
    assert!(
        metrics.contains("change_streamer_subscribers_evicted_total 1"),
        "{metrics}"
    );
    svc.stop().await;
}

#[actix_rt::test]
async fn a_subscriber_that_stops_reading_holds_at_most_the_limit_and_later_gets_everything() {
    let limit = 2000u64;
    let (svc, up) = service_with_upstream(&[
        "--max-subscriber-queue-changes",
        "2000",
        "--slow-subscriber-grace-ms",
        "0",
        "--flow-control-consensus-padding-seconds",
        "0",
        "--ping-interval-ms",
        "600000",
    ])
    .await;
    let mut healthy = Vec::new();
    for id in ["a", "b"] {
        healthy.push(WsClient::connect(&changes_url(&svc, id, 100)).await);
    }
    let mut stopped = WsClient::connect(&changes_url(&svc, "stopped", 100)).await;
    svc.wait_status("three subscribers", |s| {
        s["subscribers"].as_array().map(Vec::len) == Some(3)
    })
    .await;
    // 1,000 transactions of 100 rows: 102,000 changes. `stopped` reads nothing meanwhile.
    let last = 1100;
    for chunk in (101..=last).collect::<Vec<u64>>().chunks(50) {
        up.send(chunk.iter().flat_map(|&n| txn(n, 100)).collect());
    }
    let readers: Vec<_> = healthy
        .into_iter()
        .map(|mut c| actix_rt::spawn(async move { read_txns(&mut c, last).await }))
        .collect();
    let mut most = 0;
    let mut done = Vec::new();
    for r in readers {
        while !r.is_finished() {
            let st = svc.status().await;
            let pending = subscriber(&st, "stopped")["pending"].as_u64().unwrap_or(0);
            assert!(pending <= limit, "holds {pending} > {limit}: {st}");
            most = most.max(pending);
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        done.push(r.await.unwrap());
    }
    for got in done {
        assert_eq!(
            got,
            (101..=last).collect::<Vec<_>>(),
            "a healthy one missed some"
        );
    }
    assert!(most > 0, "the stopped subscriber never held anything");
    let (_, metrics) = svc.get("/metrics").await;
    assert!(
        metrics.contains("change_streamer_subscriber_pending_changes{id=\"stopped\"}")
            && metrics.contains("change_streamer_subscriber_lag_seconds{id=\"stopped\"}"),
        "{metrics}"
    );
    // It reads again: everything, from the change log, once each, in order.
    let (id, status) = stopped.msg().await;
    assert_eq!(status[0], "status");
    stopped.ack(id).await;
    assert_eq!(
        read_txns(&mut stopped, last).await,
        (101..=last).collect::<Vec<_>>()
    );
    up.send(txn(last + 1, 3));
    assert_eq!(read_txns(&mut stopped, last + 1).await, vec![last + 1]);
    svc.stop().await;
}

/// Regression (see BENCHMARKS.md, "Liveness under load"): an acking subscriber stays connected
/// through a catch-up that spans many ping intervals. The session's socket is full for most of
/// it; a periodic timer would then fire its missed ticks back to back, and the second would find
/// nothing heard since the first and drop a client that was acking all along. The interval
/// (500 ms) is one a busy machine's round trips fit in; the catch-up (200,000 changes) is large
/// enough to span several of them, which the client checks by the pings it answered.
#[actix_rt::test]
async fn an_acking_subscriber_survives_a_large_catch_up_spanning_many_ping_intervals() {
    let (svc, up) = service_with_upstream(&["--ping-interval-ms", "500"]).await;
    // 200,000 changes stored before it subscribes.
    let last = 2100;
    for chunk in (101..=last).collect::<Vec<u64>>().chunks(50) {
        up.send(chunk.iter().flat_map(|&n| txn(n, 98)).collect());
    }
    svc.wait_status("stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(last))
    })
    .await;
    // On a thread of its own, as another process would: on the test's thread the client would
    // wait for the streamer's turns (it runs there).
    let url = changes_url(&svc, "r", 100);
    let (got, pings) = on_own_thread(move || async move {
        let mut c = WsClient::connect(&url).await;
        let got = read_txns(&mut c, last).await;
        (got, c.pings_answered)
    })
    .await
    .expect("the client's thread");
    assert_eq!(got, (101..=last).collect::<Vec<_>>());
    assert!(
        pings >= 2,
        "the catch-up spanned {pings} pings, too few to prove anything"
    );
    svc.stop().await;
}
