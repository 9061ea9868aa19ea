//! End to end: the shared secret (PROTOCOL.md §15). Every `/replication/*` request and `/status`
//! must carry `Authorization: Bearer <secret>`; otherwise 401 with `WWW-Authenticate: Bearer`
//! and one line, before any websocket upgrade; each refusal is counted by reason. `/healthz` and
//! `/metrics` stay open. A bad secret flag stops the start, naming the flag, not the value.

use std::time::Duration;

use change_streamer_test_support::access::{Credentials, TEST_SECRET};
use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::service::TestService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHANGES: &str = "/replication/v6/changes?id=s1&mode=serving&replicaVersion=00&watermark=00";
const SNAPSHOT: &str = "/replication/v6/snapshot?taskID=t1";

/// One HTTP/1.1 request written by hand on a fresh connection (so nothing a client library
/// adds or hides), and the raw response: status line, headers and body as read.
async fn raw(base: &str, path: &str, extra_headers: &str) -> String {
    let mut tcp = TcpStream::connect(base).await.expect("connect");
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {base}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         {extra_headers}\r\n"
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // The headers, then as much body as they announce.
    loop {
        let n = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut buf))
            .await
            .expect("a response within 20 s")
            .expect("read the response");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length || text.starts_with("HTTP/1.1 101") {
                return text;
            }
        }
        assert!(n > 0, "connection closed mid-response: {text}");
    }
}

fn assert_refused_before_upgrade(response: &str, what: &str) {
    assert!(response.starts_with("HTTP/1.1 401"), "{what}: {response}");
    let lower = response.to_ascii_lowercase();
    assert!(
        lower.contains("\r\nwww-authenticate: bearer\r\n"),
        "{what}: {response}"
    );
    assert!(
        !lower.contains("sec-websocket-accept"),
        "{what}: {response}"
    );
    let body = &response[response.find("\r\n\r\n").unwrap() + 4..];
    assert!(
        body.ends_with('\n') && body.trim_end().lines().count() == 1,
        "{what}: the body is one line: {body:?}"
    );
}

async fn with_secret() -> TestService {
    TestService::start(&["--secret", TEST_SECRET]).await
}

#[actix_rt::test]
async fn missing_secret_is_401_before_any_upgrade() {
    let svc = with_secret().await;
    for path in [CHANGES, SNAPSHOT, "/status", "/replication/v99/changes"] {
        assert_refused_before_upgrade(&raw(&svc.base(), path, "").await, path);
    }
    svc.stop().await;
}

#[actix_rt::test]
async fn wrong_secret_is_401() {
    let svc = with_secret().await;
    for header in [
        "Authorization: Bearer not-the-secret-at-all-00\r\n".to_string(),
        format!("Authorization: Basic {TEST_SECRET}\r\n"),
        format!("Authorization: {TEST_SECRET}\r\n"),
        "Authorization: Bearer \r\n".to_string(),
        // The right one beside a wrong one: which would count is a guess, so neither does.
        format!("Authorization: Bearer {TEST_SECRET}\r\nAuthorization: Bearer x\r\n"),
    ] {
        for path in [CHANGES, "/status"] {
            assert_refused_before_upgrade(&raw(&svc.base(), path, &header).await, &header);
        }
    }
    svc.stop().await;
}

#[actix_rt::test]
async fn prefix_or_extension_of_the_secret_is_401() {
    let svc = with_secret().await;
    let prefix = &TEST_SECRET[..TEST_SECRET.len() - 1];
    for presented in [
        prefix.to_string(),
        format!("{TEST_SECRET}x"),
        TEST_SECRET[..1].into(),
    ] {
        let header = format!("Authorization: Bearer {presented}\r\n");
        assert_refused_before_upgrade(&raw(&svc.base(), CHANGES, &header).await, &presented);
    }
    svc.stop().await;
}

#[actix_rt::test]
async fn the_right_secret_is_served() {
    let svc = with_secret().await;
    let header = format!("Authorization: bearer {TEST_SECRET}\r\n");
    let upgraded = raw(&svc.base(), CHANGES, &header).await;
    assert!(upgraded.starts_with("HTTP/1.1 101"), "{upgraded}");
    // The test clients present it (TestService took it from its flags).
    let status = svc.status().await;
    assert_eq!(status["role"], "owner");
    let mut sub = WsClient::connect_with(
        &svc.ws("/replication/v6/snapshot?taskID=t1"),
        &svc.credentials,
    )
    .await;
    // No --litestream-backup-url: the reservation is refused, after the upgrade.
    let seen = sub.next(Duration::from_secs(10)).await;
    assert!(matches!(seen, Some(Seen::Closed { .. })), "{seen:?}");
    svc.stop().await;
}

#[actix_rt::test]
async fn healthz_and_metrics_stay_open() {
    let svc = with_secret().await;
    let open = TestService {
        credentials: Credentials::default(),
        ..svc
    };
    assert_eq!(open.get("/healthz").await.0, 200);
    assert_eq!(open.get("/metrics").await.0, 200);
    assert_eq!(open.get("/status").await.0, 401);
    open.stop().await;
}

#[actix_rt::test]
async fn auth_failures_are_counted_by_reason() {
    let svc = with_secret().await;
    raw(&svc.base(), CHANGES, "").await;
    raw(&svc.base(), "/status", "").await;
    raw(
        &svc.base(),
        CHANGES,
        "Authorization: Bearer wrong-wrong-wrong-wrong\r\n",
    )
    .await;
    let (_, text) = svc.get("/metrics").await;
    let metric = |reason: &str| {
        let line = format!("change_streamer_auth_failures_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {line} in {text}"))
            .to_string()
    };
    assert_eq!(metric("missing"), "2");
    assert_eq!(metric("wrong"), "1");
    assert_eq!(metric("not-loopback"), "0");
    svc.stop().await;
}

#[actix_rt::test]
async fn too_short_or_long_secret_is_a_start_error() {
    let short = "fifteen-bytes!!";
    let e = TestService::start_error(&["--secret", short]).await;
    assert!(e.contains("--secret") && e.contains("16 to 4096"), "{e}");
    assert!(!e.contains(short), "{e}");
    let long = "x".repeat(4097);
    let e = TestService::start_error(&["--secret", &long]).await;
    assert!(e.contains("--secret") && !e.contains(&long), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, format!("{short}\n")).unwrap();
    let e = TestService::start_error(&["--secret-file", file.to_str().unwrap()]).await;
    assert!(e.contains("--secret-file") && !e.contains(short), "{e}");
}

#[actix_rt::test]
async fn both_secret_flags_are_a_start_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, TEST_SECRET).unwrap();
    let e = TestService::start_error(&[
        "--secret-file",
        file.to_str().unwrap(),
        "--secret",
        TEST_SECRET,
    ])
    .await;
    assert!(e.contains("--secret and --secret-file"), "{e}");
    assert!(!e.contains(TEST_SECRET), "{e}");
}

#[actix_rt::test]
async fn secret_file_loses_one_trailing_newline() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, format!("{TEST_SECRET}\n")).unwrap();
    let svc = TestService::start(&["--secret-file", file.to_str().unwrap()]).await;
    let svc = TestService {
        credentials: Credentials::bearer(TEST_SECRET),
        ..svc
    };
    assert_eq!(svc.get("/status").await.0, 200);
    svc.stop().await;
}

/// PROTOCOL.md §15: without a secret, an `Authorization` header is not looked at: a loopback
/// client that presents one anyway is served as one that does not.
#[actix_rt::test]
async fn without_a_secret_a_bearer_token_is_ignored() {
    let svc = TestService::start(&[]).await;
    let base = svc.base();
    let upgraded = raw(
        &base,
        SNAPSHOT,
        "Authorization: Bearer not-a-secret-of-ours\r\n",
    )
    .await;
    // Upgraded, then closed by §6.1's rule (no backup URL): the token changed nothing.
    assert!(upgraded.starts_with("HTTP/1.1 101"), "{upgraded}");
    let mut status = change_streamer_test_support::client::http_client()
        .get(format!("http://{base}/status"))
        .insert_header(("Authorization", "Bearer not-a-secret-of-ours"))
        .send()
        .await
        .expect("GET /status");
    assert_eq!(status.status().as_u16(), 200);
    let (_, metrics) = svc.get("/metrics").await;
    assert!(
        metrics
            .lines()
            .filter(|l| l.starts_with("change_streamer_auth_failures_total"))
            .all(|l| l.ends_with(" 0")),
        "{metrics}"
    );
    let _ = status.body().await;
    svc.stop().await;
}
