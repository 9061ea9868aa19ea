//! End to end: the change source's side of `/replication/v{N}/changes` against the real server
//! (PROTOCOL.md §4, §7, §10): a transaction interrupted by an upstream drop is rolled back, a
//! restart keeps the change log and resumes upstream, a protocol violation drops the upstream and
//! stores nothing of it, and the upstream's status is echoed after durability.

mod changes_support;

use std::time::Duration;

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::upstream::{insert, txn};
use change_streamer_test_support::wait::wait_until;
use changes_support::{changes_url, read_txns, service_with_upstream, w};
use serde_json::json;

#[actix_rt::test]
async fn rolls_back_a_transaction_interrupted_by_an_upstream_drop() {
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    svc.wait_status("initial sync", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    let mut c = WsClient::connect(&changes_url(&svc, "r1", 100, "")).await;
    let (id, _) = c.msg().await; // status
    c.ack(id).await;
    let mut partial = txn(101, 3);
    partial.pop(); // no commit
    up.send(partial);
    let (id, begin) = c.msg().await;
    assert_eq!(begin[0], "begin");
    c.ack(id).await;
    for _ in 0..3 {
        let (id, _) = c.msg().await;
        c.ack(id).await;
    }
    up.drop_connection();
    let (id, rollback) = c.msg().await;
    c.ack(id).await;
    assert_eq!(rollback, json!(["rollback", {"tag": "rollback"}]));
    // Nothing of it was stored; the service reconnects resuming after 100 and gets 101 again.
    up.wait_connections(2).await;
    assert_eq!(
        up.queries()[1],
        format!("lastWatermark={}&replicaVersion={}", w(100), w(100))
    );
    assert_eq!(
        svc.status().await["changeLog"]["maxWatermark"],
        json!(w(100))
    );
    up.send(txn(101, 2));
    assert_eq!(read_txns(&mut c, 101).await, vec![101]);
    svc.stop().await;
}

#[actix_rt::test]
async fn restart_keeps_the_change_log_and_resumes_upstream() {
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    up.send(txn(101, 4));
    svc.wait_status("stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(101))
    })
    .await;
    let dir = svc.stop().await;
    up.drop_connection();
    let url = up.url();
    let svc = TestService::start_in(dir, &["--upstream", &url]).await;
    up.wait_connections(2).await;
    assert_eq!(up.queries()[0], "");
    assert_eq!(
        up.queries()[1],
        format!("lastWatermark={}&replicaVersion={}", w(101), w(100))
    );
    let st = svc.status().await;
    assert_eq!(st["replicaVersion"], json!(w(100)));
    assert_eq!(st["changeLog"]["rows"], 9);
    let mut c = WsClient::connect(&changes_url(&svc, "r", 100, "")).await;
    assert_eq!(read_txns(&mut c, 101).await, vec![101]);
    // A replayed transaction is skipped and acked again.
    up.send(txn(101, 4));
    up.send(txn(102, 1));
    assert_eq!(read_txns(&mut c, 102).await, vec![102]);
    svc.stop().await;
}

#[actix_rt::test]
async fn a_protocol_violation_drops_the_upstream_and_stores_nothing_of_it() {
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    svc.wait_status("initial sync", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    up.send(vec![format!(r#"["data",{}]"#, insert(1))]);
    up.wait_connections(2).await;
    let mut bad = txn(101, 1);
    bad[2] = format!(
        r#"["commit",{{"tag":"commit"}},{{"watermark":"{}"}}]"#,
        w(999)
    );
    up.send(bad);
    up.wait_connections(3).await;
    let st = svc.status().await;
    assert_eq!(st["changeLog"]["maxWatermark"], json!(w(100)));
    assert_eq!(st["changeLog"]["rows"], 3);
    svc.stop().await;
}

/// PROTOCOL.md §4: a connection the service drops because the source broke a rule ends with a
/// close frame 1002 that names the rule, so the source learns why without the service's log.
#[actix_rt::test]
async fn a_broken_upstream_rule_is_said_in_a_1002_close_frame() {
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    svc.wait_status("initial sync", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    // A data message outside a transaction.
    up.send(vec![format!(r#"["data",{}]"#, insert(1))]);
    up.wait_connections(2).await;
    wait_until(
        "the close frame at the source",
        Duration::from_secs(10),
        || !up.closes().is_empty(),
    )
    .await;
    let (code, reason) = up.closes()[0].clone();
    assert_eq!(code, 1002, "{reason}");
    assert!(reason.starts_with("protocol violation: "), "{reason}");
    assert!(reason.len() <= 123, "{reason}");
    svc.stop().await;
}

#[actix_rt::test]
async fn upstream_status_is_echoed_after_durability_and_reset_required_is_shown() {
    let (svc, up) = service_with_upstream(&[]).await;
    let mut frames = txn(100, 1);
    frames.push(format!(r#"["status",{{}},{{"watermark":"{}"}}]"#, w(100)));
    frames.push(format!(
        r#"["status",{{"ack":false}},{{"watermark":"{}"}}]"#,
        w(100)
    ));
    frames.push(
        r#"["control",{"tag":"reset-required","message":"replication slot lost"}]"#.to_string(),
    );
    up.send(frames);
    let st = svc
        .wait_status("reset shown", |s| {
            s["upstream"]["resetRequired"] == json!(true)
        })
        .await;
    assert_eq!(st["upstream"]["resetMessage"], "replication slot lost");
    let echo = format!(r#"["status",{{"ack":true}},{{"watermark":"{}"}}]"#, w(100));
    wait_until("two acks upstream", Duration::from_secs(5), || {
        up.acks().len() >= 2
    })
    .await;
    actix_rt::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        up.acks(),
        vec![
            format!(
                r#"["status",{{"tag":"commit"}},{{"watermark":"{}"}}]"#,
                w(100)
            ),
            echo
        ],
        "the commit's ack, then the echo; no echo for ack:false"
    );
    // Not stored, not forwarded: the acks say the commit is durable, so /status shows it now.
    assert_eq!(svc.status().await["changeLog"]["rows"], 3);
    svc.stop().await;
}
