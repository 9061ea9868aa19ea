//! What the `/replication/v{N}/changes` end-to-end tests share: watermarks by number, the
//! subscription URL, reading (and acking) whole transactions, and a service following a fake
//! change source.
#![allow(dead_code)] // each test file uses a part

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::upstream::FakeUpstream;

pub fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

pub fn changes_url(svc: &TestService, id: &str, watermark: u64, extra: &str) -> String {
    svc.ws(&format!(
        "/replication/v6/changes?id={id}&replicaVersion={}&watermark={}{extra}",
        w(100),
        w(watermark)
    ))
}

/// Reads (and acks) messages until the commit of `last`; returns the transactions' commit
/// watermarks in order, checking each arrived whole.
pub async fn read_txns(c: &mut WsClient, last: u64) -> Vec<u64> {
    let mut txns = Vec::new();
    let mut open: Option<String> = None;
    loop {
        let (id, msg) = c.msg().await;
        c.ack(id).await;
        match msg[0].as_str() {
            Some("status") => {}
            Some("begin") => {
                assert!(open.is_none(), "begin inside a transaction: {msg}");
                open = Some(msg[2]["commitWatermark"].as_str().unwrap().to_string());
            }
            Some("data") => assert!(open.is_some(), "data outside a transaction: {msg}"),
            Some("commit") => {
                let wm = msg[2]["watermark"].as_str().unwrap().to_string();
                assert_eq!(
                    open.take().as_deref(),
                    Some(wm.as_str()),
                    "commit without its begin"
                );
                let n = Watermark::parse(&wm).unwrap().to_u64().unwrap();
                txns.push(n);
                if n >= last {
                    return txns;
                }
            }
            Some("rollback") => {
                open = None;
            }
            _ => panic!("unexpected message {msg}"),
        }
    }
}

pub async fn service_with_upstream(extra: &[&str]) -> (TestService, FakeUpstream) {
    let up = FakeUpstream::start().await;
    let url = up.url();
    let mut args = vec!["--upstream", url.as_str()];
    args.extend_from_slice(extra);
    let svc = TestService::start(&args).await;
    up.wait_connections(1).await;
    (svc, up)
}
