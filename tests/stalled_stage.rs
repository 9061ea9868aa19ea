//! PROTOCOL.md §11.1 (issue 41, item 5), end to end against the binary: the upstream reader held
//! by a tracked send that its one subscriber never acks (`--slow-subscriber-grace-ms 0`: never
//! evicted) is a stalled stage: past `--stall-alarm-ms`, `/readyz` answers 503 `stalled:
//! upstream for N ms`, `change_streamer_stage_stalled{stage="upstream"}` is 1 and one ERROR line
//! says so; once the subscriber acks, all three clear.

use std::path::Path;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::upstream::{txn, FakeUpstream};

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

#[actix_rt::test]
async fn an_upstream_reader_held_by_an_unacked_tracked_send_is_a_stalled_stage() {
    let up = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = up.url();
    let svc = ServiceProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_change-streamer")),
        0,
        dir.path(),
        &[
            "--upstream",
            &url,
            "--stall-alarm-ms",
            "1000",
            "--slow-subscriber-grace-ms",
            "0",
        ],
    );
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    svc.wait_status("the initial sync", |s| s["replicaVersion"].is_string())
        .await;
    let mut sub = WsClient::connect(&svc.ws(&format!(
        "/replication/v6/changes?id=frozen&replicaVersion={}&watermark={}",
        w(100),
        w(100)
    )))
    .await;
    let (status, _) = sub.msg().await;
    sub.ack(status).await;
    svc.wait_status("the subscriber live", |s| {
        s["subscribers"][0]["phase"] == "live"
    })
    .await;
    svc.wait_readyz("ready", |code, _| code == 200).await;
    assert_eq!(svc.stalled_gauge("upstream").await.as_deref(), Some("0"));

    // More than one flow-control budget (64 KiB) in one transaction: its commit is tracked.
    up.send(txn(101, 2000));
    let commit = loop {
        let (id, msg) = sub.msg().await;
        if msg[0] == "commit" {
            break id;
        }
    };
    let line = svc
        .wait_readyz("stalled in /readyz", |code, line| {
            code == 503 && line.starts_with("stalled: ")
        })
        .await;
    let ms: u64 = line
        .strip_prefix("stalled: upstream for ")
        .and_then(|rest| rest.strip_suffix(" ms"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not `stalled: upstream for N ms`: {line}"));
    assert!(ms >= 1000, "{line}");
    assert_eq!(svc.stalled_gauge("upstream").await.as_deref(), Some("1"));
    let errors = svc
        .wait_logged("stage upstream stalled: work pending and no progress for")
        .await;
    assert!(
        errors.len() == 1 && errors[0].contains("ERROR"),
        "{errors:?}"
    );

    sub.ack(commit).await;
    svc.wait_readyz("ready again once acked", |code, _| code == 200)
        .await;
    assert_eq!(svc.stalled_gauge("upstream").await.as_deref(), Some("0"));
    svc.wait_logged("stage upstream is no longer stalled").await;
    svc.terminate().await;
}
