//! End to end, the change source's edge cases of PROTOCOL.md §4 against the real server and the
//! fake change source over a real websocket: `reset-required` (shown in `/status` and `/readyz`
//! until a new transaction, the connection kept), a `status` inside a transaction or below the
//! last commit, the third element of a frame rebuilt, an `--upstream` URL with its own query, and
//! pings to the source every `--upstream-ping-interval-ms`, apart from the subscribers'
//! `--ping-interval-ms` (its own answered). Silence itself: `tests/silent_source.rs`.

mod changes_support;

use std::time::Duration;

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::upstream::{insert, txn, FakeUpstream};
use change_streamer_test_support::wait::wait_until;
use changes_support::{changes_url, read_txns, service_with_upstream, w};
use serde_json::json;

fn reset(message: &str) -> String {
    format!(r#"["control",{{"tag":"reset-required","message":"{message}"}}]"#)
}

fn status(n: u64) -> String {
    format!(r#"["status",{{}},{{"watermark":"{}"}}]"#, w(n))
}

fn status_echo(n: u64) -> String {
    format!(r#"["status",{{"ack":true}},{{"watermark":"{}"}}]"#, w(n))
}

fn commit_ack(n: u64) -> String {
    format!(
        r#"["status",{{"tag":"commit"}},{{"watermark":"{}"}}]"#,
        w(n)
    )
}

/// The service with 100 (the initial sync) and 101 stored, and a subscriber at 101 that has
/// acked its `status`.
async fn stored_to_101_and_subscribed() -> (TestService, FakeUpstream, WsClient) {
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    up.send(txn(101, 1));
    svc.wait_status("stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(101))
    })
    .await;
    let mut c = WsClient::connect(&changes_url(&svc, "r1", 101, "")).await;
    let (id, first) = c.msg().await;
    assert_eq!(first[0], "status");
    c.ack(id).await;
    (svc, up, c)
}

#[actix_rt::test]
async fn reset_required_holds_readyz_until_a_new_transaction_and_keeps_the_connection() {
    let (svc, up, mut c) = stored_to_101_and_subscribed().await;
    assert_eq!(svc.get("/readyz").await, (200, "ready\n".to_string()));

    up.send(vec![reset("slot lost"), reset("slot dropped")]);
    let st = svc
        .wait_status("reset shown", |s| {
            s["upstream"]["resetMessage"] == json!("slot dropped")
        })
        .await;
    assert_eq!(st["upstream"]["resetRequired"], true, "{st}");
    assert_eq!(
        st["upstream"]["connected"], true,
        "the connection is kept: {st}"
    );
    assert_eq!(svc.get("/readyz").await, (503, "reset required\n".into()));

    // Still following: a status is echoed; a replayed transaction is acked again, clears nothing.
    up.send(vec![status(101)]);
    up.send(txn(101, 1));
    wait_until("echo and the replay's ack", Duration::from_secs(10), || {
        up.acks().ends_with(&[status_echo(101), commit_ack(101)])
    })
    .await;
    assert_eq!(svc.get("/readyz").await.0, 503);

    // A reconnect keeps it.
    up.drop_connection();
    up.wait_connections(2).await;
    assert_eq!(
        up.queries()[1],
        format!("lastWatermark={}&replicaVersion={}", w(101), w(100))
    );
    svc.wait_status("reconnected", |s| s["upstream"]["connected"] == json!(true))
        .await;
    let st = svc.status().await;
    assert_eq!(st["upstream"]["resetRequired"], true, "{st}");
    assert_eq!(svc.get("/readyz").await.0, 503);

    // A new transaction clears it; the subscriber got nothing about it, only the transaction.
    up.send(txn(102, 2));
    assert_eq!(read_txns(&mut c, 102).await, vec![102]);
    let st = svc
        .wait_status("reset cleared", |s| {
            s["upstream"]["resetRequired"] == json!(false)
        })
        .await;
    assert_eq!(st["upstream"]["resetMessage"], json!(null));
    assert_eq!(svc.get("/readyz").await, (200, "ready\n".to_string()));
    svc.stop().await;
}

#[actix_rt::test]
async fn a_status_inside_a_transaction_or_below_the_last_commit_is_only_echoed() {
    let (svc, up, mut c) = stored_to_101_and_subscribed().await;
    // Below the last commit, then inside transaction 102 (at a watermark above it).
    let mut frames = vec![status(100)];
    let mut t = txn(102, 2);
    t.insert(2, status(105));
    frames.extend(t);
    up.send(frames);
    assert_eq!(read_txns(&mut c, 102).await, vec![102]);
    svc.wait_status("102 stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(102))
    })
    .await;
    wait_until("five answers", Duration::from_secs(10), || {
        up.acks().len() >= 5
    })
    .await;
    // The echoes come in order with the commit acks; the one inside 102 comes before 102's ack
    // and says nothing of it.
    assert_eq!(
        up.acks(),
        vec![
            commit_ack(100),
            commit_ack(101),
            status_echo(100),
            status_echo(105),
            commit_ack(102)
        ]
    );
    // Neither moved the last stored watermark; a subscriber from 101 gets 102 whole, nothing else.
    let mut d = WsClient::connect(&changes_url(&svc, "r2", 101, "")).await;
    assert_eq!(read_txns(&mut d, 102).await, vec![102]);
    svc.stop().await;
}

#[actix_rt::test]
async fn the_third_element_is_rebuilt_and_only_the_watermark_kept() {
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    let wm = w(101);
    up.send(vec![
        format!(
            r#"["begin",{{"tag":"begin"}},{{"commitWatermark":"{wm}","lsn":"0/16B3748","x":[1]}}]"#
        ),
        format!(r#"["data",{},{{"ignored":true}}]"#, insert(1)),
        format!(r#"["commit",{{"tag":"commit"}},  {{ "watermark" : "{wm}", "extra": null }}]"#),
    ]);
    svc.wait_status("stored", |s| s["changeLog"]["maxWatermark"] == json!(wm))
        .await;
    // Live and from the change log alike.
    let mut c = WsClient::connect(&changes_url(&svc, "r1", 100, "")).await;
    let mut got = Vec::new();
    for _ in 0..4 {
        let (id, m) = c.msg().await;
        c.ack(id).await;
        got.push(m);
    }
    assert_eq!(
        got[1],
        json!(["begin", {"tag": "begin"}, {"commitWatermark": wm}])
    );
    assert_eq!(got[2].as_array().map(Vec::len), Some(2), "{}", got[2]);
    assert_eq!(
        got[3],
        json!(["commit", {"tag": "commit"}, {"watermark": wm}])
    );
    svc.stop().await;
}

#[actix_rt::test]
async fn an_upstream_url_keeps_its_own_query_and_gets_the_resume_parameters_after_it() {
    let up = FakeUpstream::start().await;
    let url = format!("{}?shard=a&slot=zero_1", up.url());
    let svc = TestService::start(&["--upstream", &url]).await;
    up.wait_connections(1).await;
    assert_eq!(
        up.queries()[0],
        "shard=a&slot=zero_1",
        "an initial sync: as given"
    );
    up.send(txn(100, 1));
    svc.wait_status("stored", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    up.drop_connection();
    up.wait_connections(2).await;
    assert_eq!(
        up.queries()[1],
        format!(
            "shard=a&slot=zero_1&lastWatermark={}&replicaVersion={}",
            w(100),
            w(100)
        )
    );
    svc.stop().await;
}

#[actix_rt::test]
async fn the_service_pings_the_source_on_its_own_interval_and_answers_its_pings() {
    // Subscribers pinged every 50 ms, the source every 500 ms (PROTOCOL.md §4, §5).
    let (svc, up) = service_with_upstream(&[
        "--ping-interval-ms",
        "50",
        "--upstream-ping-interval-ms",
        "500",
    ])
    .await;
    up.send(txn(100, 1));
    svc.wait_status("stored", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    let mut c = WsClient::connect(&changes_url(&svc, "r1", 100, "")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while c.pings_answered < 12 {
        assert!(
            std::time::Instant::now() < deadline,
            "subscriber pings stopped"
        );
        let _ = c.next(Duration::from_millis(20)).await;
    }
    // 12 subscriber pings take at least 600 ms: the source got at least one ping of its own,
    // and fewer than the subscriber (an interval ten times as long).
    let source_pings = up.pings_and_pongs().0;
    assert!(
        (1..=c.pings_answered as usize / 3).contains(&source_pings),
        "source pinged {source_pings} times while the subscriber was pinged {}",
        c.pings_answered
    );
    up.ping();
    wait_until("the service's pong", Duration::from_secs(10), || {
        up.pings_and_pongs().1 == 1
    })
    .await;
    svc.stop().await;
}
