//! End to end: only a commit is ever sent tracked (PROTOCOL.md §10 "Only commits are tracked"),
//! so a live subscriber that acks only at commits (PROTOCOL.md §5 "When to ack") never wedges
//! flow control: the real server, a fake change source and a real websocket client.

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{follow_acking_commits, WsClient};
use change_streamer_test_support::service::service_with_upstream;
use change_streamer_test_support::upstream::txn;
use serde_json::json;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// A lone batched subscriber (a majority of one: every tracked change waits for its ack) acks
/// only frames holding a `commit`, through live transactions each larger than the 64 KiB
/// flow-control budget and than a frame (256 payloads), so the budget runs out inside
/// transactions, in frames that hold no commit. Were a `begin` or a `data` tracked, ingest
/// would wait for an ack this client never sends, and the next commit would never come
/// ([`frame`] fails after 10 s without one).
#[actix_rt::test]
async fn a_client_acking_only_at_commits_never_wedges_live_flow_control() {
    let (svc, up) = service_with_upstream(&[]).await;
    let url = svc.ws(&format!(
        "/replication/v6/changes?id=commit-acker&replicaVersion={}&watermark={}&wsBatched=true",
        w(100),
        w(100)
    ));
    let mut c = WsClient::connect(&url).await;
    svc.wait_status("the commit-acker live", |s| {
        s["subscribers"][0]["phase"] == json!("live")
    })
    .await;
    // 20 transactions of 1000 inserts, ~150 KiB each: about two tracked changes in each.
    let last = 120;
    for n in 101..=last {
        up.send(txn(n, 1000));
    }
    follow_acking_commits(&mut c, 101, last).await;
    let st = svc
        .wait_status("every commit acked", |s| {
            s["subscribers"][0]["acked"] == json!(w(last))
        })
        .await;
    assert_eq!(st["subscribers"][0]["phase"], json!("live"), "{st}");
}
