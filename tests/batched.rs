//! End to end: batched frames and cumulative acks (`wsBatched=true`, PROTOCOL.md §5), the old
//! framing kept strict without it, and the pending-changes gauge back to 0 once everything sent
//! is acked (PROTOCOL.md §11), against the real server with a fake change source and real
//! websocket clients.

use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{commit_of, frame, payloads, read_until, WsClient};
use change_streamer_test_support::service::{service_with_upstream, TestService};
use change_streamer_test_support::upstream::txn;
use serde_json::{json, Value};

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

fn changes_url(svc: &TestService, id: &str, extra: &str) -> String {
    svc.ws(&format!(
        "/replication/v6/changes?id={id}&replicaVersion={}&watermark={}{extra}",
        w(100),
        w(100)
    ))
}

/// `change_streamer_subscriber_pending_changes{id="<id>"}` from `/metrics`.
async fn pending(svc: &TestService, id: &str) -> Option<f64> {
    let (_, metrics) = svc.get("/metrics").await;
    let key = format!("change_streamer_subscriber_pending_changes{{id=\"{id}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

async fn wait_pending(svc: &TestService, id: &str, want: f64) {
    let start = std::time::Instant::now();
    loop {
        let got = pending(svc, id).await;
        if got == Some(want) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "pending of {id} stays {got:?}, not {want}"
        );
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
}

#[actix_rt::test]
async fn a_batched_client_gets_both_frame_shapes() {
    let (svc, up) = service_with_upstream(&[]).await;
    let mut c = WsClient::connect(&changes_url(&svc, "b", "&wsBatched=true")).await;
    // The status frame alone: a plain `msg` frame.
    let status = frame(&mut c).await;
    assert_eq!(
        status,
        json!({"msg": ["status", {"tag": "status"}], "id": 1})
    );
    c.ack(1).await;
    svc.wait_status("live", |s| s["subscribers"][0]["phase"] == "live")
        .await;
    // One transaction forwarded in one turn: one batched frame, payloads in order.
    up.send(txn(101, 3));
    let f = frame(&mut c).await;
    assert_eq!(f["id"], 2, "{f}");
    let batch = f["batch"].as_array().unwrap_or_else(|| panic!("{f}"));
    let sent = txn(101, 3);
    assert_eq!(batch.len(), sent.len(), "{f}");
    for (got, want) in batch.iter().zip(&sent) {
        assert_eq!(got, &serde_json::from_str::<Value>(want).unwrap());
    }
    c.ack(2).await;
    svc.stop().await;
}

#[actix_rt::test]
async fn cumulative_acks_release_flow_control() {
    // One subscriber: every tracked send (one per 64 KiB) waits for its ack, and the padding
    // (negative: wait for all) never releases it early.
    let (svc, up) =
        service_with_upstream(&["--flow-control-consensus-padding-seconds", "-1"]).await;
    let mut c = WsClient::connect(&changes_url(&svc, "b", "&wsBatched=true")).await;
    let (id, _) = payloads(&frame(&mut c).await);
    c.ack(id).await;
    svc.wait_status("live", |s| s["subscribers"][0]["phase"] == "live")
        .await;
    // 40 transactions of 100 rows, ~400 KiB: several tracked sends.
    let last = 140;
    for n in 101..=last {
        up.send(txn(n, 100));
    }
    // Only every third frame is acked (each ack acknowledges the two before it too), or the
    // last one read when no more come: flow control must count a tracked frame acked by any
    // later ack, or the stream stops at the first tracked send.
    let (mut next, mut open, mut skipped) = (101, false, 0);
    let mut unacked = None;
    while next <= last {
        let f = match c.next_frame(Duration::from_millis(200)).await {
            Some(Ok(f)) => f,
            Some(Err(closed)) => panic!("closed: {closed:?}"),
            None => {
                let id = unacked
                    .take()
                    .expect("nothing more sent, nothing left to ack");
                c.ack(id).await;
                continue;
            }
        };
        let (id, ps) = payloads(&f);
        for p in ps {
            match p[0].as_str() {
                Some("begin") => open = true,
                Some("commit") => {
                    assert!(open);
                    open = false;
                    assert_eq!(commit_of(&p), Some(next), "out of order");
                    next += 1;
                }
                _ => {}
            }
        }
        if id % 3 == 0 {
            c.ack(id).await;
            unacked = None;
            skipped += 2;
        } else {
            unacked = Some(id);
        }
    }
    assert!(skipped > 0);
    if let Some(id) = unacked {
        c.ack(id).await;
    }
    // The last cumulative ack acknowledged the last commit.
    svc.wait_status("last commit acked", |s| {
        s["subscribers"][0]["acked"] == json!(w(last))
    })
    .await;
    svc.stop().await;
}

#[actix_rt::test]
async fn an_ack_beyond_the_last_id_sent_closes_with_1002() {
    let (svc, _up) = service_with_upstream(&[]).await;
    let mut c = WsClient::connect(&changes_url(&svc, "b", "&wsBatched=true")).await;
    let (id, _) = payloads(&frame(&mut c).await);
    c.ack(id + 1).await;
    let (code, reason) = c.closed().await;
    assert_eq!(code, 1002, "{reason}");
    assert!(reason.contains("not sent"), "{reason}");
    svc.stop().await;
}

#[actix_rt::test]
async fn without_ws_batched_the_framing_stays_one_msg_per_frame_with_strict_acks() {
    let (svc, up) = service_with_upstream(&[]).await;
    let mut c = WsClient::connect(&changes_url(&svc, "plain", "")).await;
    let (id, msg) = c.msg().await;
    assert_eq!((id, msg[0].as_str()), (1, Some("status")));
    c.ack(1).await;
    svc.wait_status("live", |s| s["subscribers"][0]["phase"] == "live")
        .await;
    up.send(txn(101, 3));
    for want in 2..=6 {
        let f = frame(&mut c).await;
        assert!(f["batch"].is_null() && f["id"] == want, "{f}");
    }
    // A cumulative ack (skipping 2) breaks the old framing's rule.
    c.ack(4).await;
    let (code, reason) = c.closed().await;
    assert_eq!(code, 1002, "{reason}");
    assert!(reason.contains("out of order"), "{reason}");

    // `wsBatched` with another value than true or false is refused, naming it.
    for bad in ["yes", "1"] {
        let mut c = WsClient::connect(&changes_url(&svc, "x", &format!("&wsBatched={bad}"))).await;
        let (code, reason) = c.closed().await;
        assert_eq!(code, 1002, "{reason}");
        assert!(reason.contains("wsBatched"), "{reason}");
    }
    svc.stop().await;
}

#[actix_rt::test]
async fn pending_changes_fall_back_to_0_once_every_frame_sent_is_acked() {
    let (svc, up) = service_with_upstream(&[]).await;
    // The first status frame alone, then a transaction, in each framing.
    for (id, extra) in [("plain", ""), ("batched", "&wsBatched=true")] {
        let mut c = WsClient::connect(&changes_url(&svc, id, extra)).await;
        let (first, _) = payloads(&frame(&mut c).await);
        wait_pending(&svc, id, 1.0).await;
        c.ack(first).await;
        wait_pending(&svc, id, 0.0).await;
        drop(c);
    }
    let mut c = WsClient::connect(&changes_url(&svc, "b2", "&wsBatched=true")).await;
    let (first, _) = payloads(&frame(&mut c).await);
    c.ack(first).await;
    svc.wait_status("live", |s| {
        s["subscribers"]
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["id"] == "b2" && s["phase"] == "live"))
    })
    .await;
    up.send(txn(101, 2));
    let (id, _) = read_until(&mut c, 101, 101).await;
    wait_pending(&svc, "b2", 4.0).await;
    c.ack(id).await;
    wait_pending(&svc, "b2", 0.0).await;
    svc.stop().await;
}

/// PROTOCOL.md §5, frame sizes: a payload over 1 MiB travels alone in its frame, as the source
/// sent it; no compression is negotiated, whatever the client offers.
#[actix_rt::test]
async fn a_payload_over_1_mib_travels_alone_and_no_compression_is_negotiated() {
    let (svc, up) = service_with_upstream(&[]).await;
    let (answer, offer) = change_streamer_test_support::client::http_client()
        .ws(changes_url(&svc, "offer", "&wsBatched=true"))
        .header(
            "Sec-WebSocket-Extensions",
            "permessage-deflate; client_max_window_bits",
        )
        .connect()
        .await
        .expect("handshake");
    assert_eq!(answer.status().as_u16(), 101);
    assert!(
        answer.headers().get("sec-websocket-extensions").is_none(),
        "{:?}",
        answer.headers()
    );
    // Gone before the changes, so that flow control does not wait for it.
    drop(offer);
    svc.wait_status("the offer gone", |s| s["subscribers"] == json!([]))
        .await;

    let mut c = WsClient::connect(&changes_url(&svc, "big", "&wsBatched=true")).await;
    let (id, _) = payloads(&frame(&mut c).await);
    c.ack(id).await;
    let big = "x".repeat(2 << 20);
    let data = format!(
        r#"{{"tag":"insert","relation":{{"schema":"public","name":"items","keyColumns":["id"]}},"new":{{"id":1,"v":"{big}"}}}}"#
    );
    let mut frames = txn(101, 1);
    frames.insert(1, format!(r#"["data",{data}]"#));
    up.send(frames);
    let mut seen = 0;
    while seen < 4 {
        let (id, ps) = payloads(&frame(&mut c).await);
        if ps.iter().any(|p| p[1]["new"]["v"] == json!(big)) {
            assert_eq!(ps.len(), 1, "the large payload is alone in its frame");
        }
        seen += ps.len();
        c.ack(id).await;
    }
    assert_eq!(seen, 4, "begin, two data, commit");
    svc.stop().await;
}

/// PROTOCOL.md §5: a client's frame may be up to 64 KiB; a larger one closes with 1002.
#[actix_rt::test]
async fn a_client_frame_over_64_kib_closes_with_1002() {
    let (svc, _up) = service_with_upstream(&[]).await;
    let mut c = WsClient::connect(&changes_url(&svc, "a", "&wsBatched=true")).await;
    frame(&mut c).await;
    let padded = format!(r#"{{"ack":1{}}}"#, " ".repeat(64 << 10));
    c.send_text(padded).await;
    let (code, reason) = c.closed().await;
    assert_eq!(code, 1002, "{reason}");
    svc.stop().await;
}
