//! End to end: TLS (PROTOCOL.md §15, §4). With `--tls-cert`/`--tls-key` every endpoint is served
//! over TLS on `--port`; a plain-HTTP request or a failed handshake closes that connection only.
//! A bad TLS flag stops the start naming it. The service reaches a `wss://` change source with
//! `--upstream-ca-file` and `--upstream-secret-file`, and retries a handshake refused with 401.
//! Certificates are self-signed, made inside each test.

use std::time::Duration;

use change_streamer_test_support::access::{Credentials, TestCert, TEST_SECRET};
use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::upstream::{txn, FakeUpstream, UpstreamOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn tls_service(cert: &TestCert, args: &[&str]) -> TestService {
    let flags = cert.flags();
    let mut all: Vec<&str> = flags.iter().map(String::as_str).collect();
    all.extend_from_slice(args);
    let mut svc = TestService::start(&all).await;
    svc.credentials.tls = Some(cert.client_config());
    svc
}

/// A service over TLS fed by a fake change source, initialised, and one subscriber over
/// `wss://` from its replica version.
async fn subscribed_over_tls(cert: &TestCert) -> (TestService, FakeUpstream, WsClient) {
    let up = FakeUpstream::start().await;
    let svc = tls_service(cert, &["--upstream", &up.url()]).await;
    up.wait_connections(1).await;
    up.send(txn(1, 1));
    let st = svc
        .wait_status("the initial sync stored", |s| {
            !s["replicaVersion"].is_null()
        })
        .await;
    let rv = st["replicaVersion"].as_str().unwrap().to_string();
    let url = svc.ws(&format!(
        "/replication/v6/changes?id=s1&mode=serving&replicaVersion={rv}&watermark={rv}"
    ));
    assert!(url.starts_with("wss://"), "{url}");
    let sub = WsClient::connect_with(&url, &svc.credentials).await;
    (svc, up, sub)
}

/// Writes a plain-HTTP request on a raw connection to the TLS port; what comes back before
/// the service closes it.
async fn plain_http(base: &str) -> Vec<u8> {
    let mut tcp = TcpStream::connect(base).await.expect("connect");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection was not closed");
    got
}

#[actix_rt::test]
async fn tls_serves_https_and_wss() {
    let cert = TestCert::localhost();
    let (svc, up, mut sub) = subscribed_over_tls(&cert).await;
    assert_eq!(svc.get("/healthz").await, (200, "ok".to_string()));
    assert_eq!(svc.get("/status").await.0, 200);
    up.send(txn(2, 1));
    assert_eq!(next_change(&mut sub).await[0], "begin");
    svc.stop().await;
}

#[actix_rt::test]
async fn plain_http_or_a_failed_handshake_closes_only_that_connection() {
    let cert = TestCert::localhost();
    let (svc, up, mut sub) = subscribed_over_tls(&cert).await;

    // Plain HTTP on the TLS port: no HTTP answer, the connection is closed.
    let got = plain_http(&svc.base()).await;
    assert!(
        !got.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    // A client that does not trust the certificate fails its handshake.
    let untrusting = Credentials {
        secret: None,
        tls: Some(TestCert::localhost().client_config()),
    };
    let refused = untrusting
        .client()
        .get(format!("https://{}/healthz", svc.base()))
        .send()
        .await;
    assert!(refused.is_err(), "an untrusted certificate was accepted");

    // The subscriber opened before both goes on, and new clients are served.
    up.send(txn(2, 1));
    assert_eq!(next_change(&mut sub).await[0], "begin");
    assert_eq!(svc.get("/healthz").await.0, 200);
    svc.stop().await;
}

/// The next message that is not a `status` (the first one is).
async fn next_change(sub: &mut WsClient) -> serde_json::Value {
    loop {
        match sub.next(Duration::from_secs(20)).await {
            Some(Seen::Msg { msg, .. }) if msg[0] != "status" => return msg,
            Some(Seen::Msg { .. }) => {}
            other => panic!("no change: {other:?}"),
        }
    }
}

#[actix_rt::test]
async fn tls_flags_are_checked_at_start() {
    let cert = TestCert::localhost();
    let other = TestCert::localhost();
    let (c, k) = (cert.cert.to_str().unwrap(), cert.key.to_str().unwrap());
    let e = TestService::start_error(&["--tls-cert", c]).await;
    assert!(e.starts_with("--tls-key: missing"), "{e}");
    let e = TestService::start_error(&["--tls-key", k]).await;
    assert!(e.starts_with("--tls-cert: missing"), "{e}");
    let e =
        TestService::start_error(&["--tls-cert", "/nonexistent/cert.pem", "--tls-key", k]).await;
    assert!(e.starts_with("--tls-cert: cannot read"), "{e}");
    let e = TestService::start_error(&["--tls-cert", k, "--tls-key", k]).await;
    assert!(e.starts_with("--tls-cert:"), "{e}");
    let e = TestService::start_error(&["--tls-cert", c, "--tls-key", c]).await;
    assert!(e.starts_with("--tls-key:"), "{e}");
    let e = TestService::start_error(&["--tls-cert", c, "--tls-key", other.key.to_str().unwrap()])
        .await;
    assert!(
        e.starts_with("--tls-key: does not go with --tls-cert"),
        "{e}"
    );
    let e = TestService::start_error(&["--upstream-ca-file", k]).await;
    assert!(e.starts_with("--upstream-ca-file:"), "{e}");
}

#[actix_rt::test]
async fn upstream_over_wss_with_a_secret_after_a_401() {
    let cert = TestCert::localhost();
    let up =
        FakeUpstream::start_with(UpstreamOptions::guarded(TEST_SECRET, cert.server_config())).await;
    assert!(up.url().starts_with("wss://127.0.0.1:"), "{}", up.url());
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("upstream-secret");
    std::fs::write(&secret, format!("{TEST_SECRET}\n")).unwrap();
    let svc = TestService::start(&[
        "--upstream",
        &up.url(),
        "--upstream-ca-file",
        cert.cert.to_str().unwrap(),
        "--upstream-secret-file",
        secret.to_str().unwrap(),
    ])
    .await;
    // The first handshake is refused; the retry (after the backoff) carries the secret.
    up.wait_connections(1).await;
    assert_eq!(up.refused(), 1);
    up.send(txn(1, 2));
    let st = svc
        .wait_status("the transaction over wss:// stored", |s| {
            s["changeLog"]["rows"].as_u64() >= Some(2)
        })
        .await;
    assert_eq!(st["upstream"]["connected"], true);
    svc.stop().await;
}

#[actix_rt::test]
async fn upstream_without_its_secret_is_refused_and_retried() {
    let up = FakeUpstream::start_with(UpstreamOptions {
        secret: Some(TEST_SECRET.into()),
        ..UpstreamOptions::default()
    })
    .await;
    let svc = TestService::start(&["--upstream", &up.url()]).await;
    change_streamer_test_support::wait::wait_until(
        "two refused handshakes",
        Duration::from_secs(20),
        || up.refused() >= 2,
    )
    .await;
    assert!(up.queries().is_empty());
    assert_eq!(svc.status().await["upstream"]["connected"], false);
    svc.stop().await;
}
