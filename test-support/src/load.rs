//! What the tests that load the real binary share: the binary on a fake change source with its
//! first transaction stored, subscribers to it, transactions of one large change, a subscriber
//! that reads and acks through a commit, and the process's anonymous resident memory (`RssAnon`
//! of `/proc/PID/status`).

use std::path::Path;
use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use serde_json::json;

use crate::client::{Seen, WsClient};
use crate::process::ServiceProcess;
use crate::upstream::{txn, FakeUpstream};

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// `RssAnon` of process `pid`, in bytes.
pub fn rss_anon(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon");
    kib * 1024
}

/// The frames of transaction `n`: one insert of a ~`bytes` payload.
pub fn large_txn(n: u64, bytes: usize) -> Vec<String> {
    let wm = Watermark::from_u64(n);
    vec![
        format!(r#"["begin",{{"tag":"begin"}},{{"commitWatermark":"{wm}"}}]"#),
        format!(
            r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"t"}},"new":{{"id":{n},"s":"{}"}}}}]"#,
            "x".repeat(bytes)
        ),
        format!(r#"["commit",{{"tag":"commit"}},{{"watermark":"{wm}"}}]"#),
    ]
}

/// The binary `bin` in `dir` on a fake change source, with `args`, flow control's padding at 0,
/// eviction and pings off (a memory test's subscribers stall on purpose), once it stored
/// transaction 100.
pub async fn on_fake_upstream(
    bin: &Path,
    dir: &Path,
    args: &[&str],
) -> (ServiceProcess, FakeUpstream) {
    let up = FakeUpstream::start().await;
    let url = up.url();
    let mut all = vec![
        "--upstream",
        &url,
        "--flow-control-consensus-padding-seconds",
        "0",
        "--slow-subscriber-grace-ms",
        "0",
        "--ping-interval-ms",
        "600000",
    ];
    all.extend_from_slice(args);
    let svc = ServiceProcess::spawn(bin, 0, dir, &all);
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    svc.wait_status("initial sync", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    (svc, up)
}

/// Subscribers `ids` from transaction 100, once all are live.
pub async fn subscribers(svc: &ServiceProcess, ids: &[&str]) -> Vec<WsClient> {
    let mut clients = Vec::new();
    for id in ids {
        let url = svc.ws(&format!(
            "/replication/v6/changes?id={id}&replicaVersion={}&watermark={}",
            w(100),
            w(100)
        ));
        clients.push(WsClient::connect(&url).await);
    }
    svc.wait_status("all live", |s| {
        s["subscribers"]
            .as_array()
            .is_some_and(|a| a.len() >= ids.len() && a.iter().all(|s| s["phase"] == "live"))
    })
    .await;
    clients
}

/// `c` reads and acks every message through the commit of transaction `last`, calling `each`
/// at every message; panics on a close or a 60 s silence.
pub async fn read_through(c: &mut WsClient, last: u64, mut each: impl FnMut()) {
    loop {
        each();
        match c.next(Duration::from_secs(60)).await {
            Some(Seen::Msg { id, msg }) => {
                c.ack(id).await;
                if msg[0] == "commit" && msg[2]["watermark"] == json!(w(last)) {
                    return;
                }
            }
            other => panic!("a subscriber reading through {last} got {other:?}"),
        }
    }
}
