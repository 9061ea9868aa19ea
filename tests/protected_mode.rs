//! End to end: protected mode (PROTOCOL.md §15) with a client that is really not on loopback.
//!
//! Each test makes a network namespace joined to this one by a veth pair, with addresses of
//! its own in 10.213.0.0/16 (a /30 per test), starts the service on the host end's address, and
//! runs `curl` inside the namespace (`ip netns exec`); all traffic goes to the addresses the test
//! made, and the namespace (with its end of the pair) is deleted at the end. Needs root and
//! `ip` (iproute2) and `curl`, as CI has.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use change_streamer_test_support::access::TEST_SECRET;
use change_streamer_test_support::service::TestService;

/// A namespace with one end of a veth pair at `.2`, the other end here at `.1`.
struct Namespace {
    name: String,
    host: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {} (these tests need root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Namespace {
    fn new() -> Namespace {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("csa{}x{k}", pid % 100_000);
        let (outside, inside) = (format!("{name}h"), format!("{name}n"));
        // A /30 of its own: the third octet from the process, the fourth from the test.
        let (c, d) = (pid % 250, (k % 60) * 4);
        let host = format!("10.213.{c}.{}", d + 1);
        let peer = format!("10.213.{c}.{}", d + 2);
        ip(&["netns", "add", &name]);
        let ns = Namespace { name, host };
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &inside,
        ]);
        ip(&["link", "set", &inside, "netns", &ns.name]);
        ip(&["addr", "add", &format!("{}/30", ns.host), "dev", &outside]);
        ip(&["link", "set", &outside, "up"]);
        let in_ns = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &ns.name, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        in_ns(&["addr", "add", &format!("{peer}/30"), "dev", &inside]);
        in_ns(&["link", "set", &inside, "up"]);
        in_ns(&["link", "set", "lo", "up"]);
        ns
    }

    /// `curl` inside the namespace: a websocket upgrade request for `path` on the service at
    /// `port`, with `headers`; the status code and the body.
    async fn request(&self, port: u16, path: &str, headers: &[String]) -> (u16, String) {
        let upgrade = [
            "Connection: Upgrade",
            "Upgrade: websocket",
            "Sec-WebSocket-Version: 13",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        ]
        .map(String::from);
        self.curl(port, path, upgrade.iter().chain(headers)).await
    }

    /// A plain GET (no upgrade: a websocket path answers 400 once past the access rule, and
    /// curl does not stay on an upgraded socket).
    async fn get(&self, port: u16, path: &str, headers: &[String]) -> (u16, String) {
        self.curl(port, path, headers.iter()).await
    }

    async fn curl(
        &self,
        port: u16,
        path: &str,
        headers: impl Iterator<Item = &String>,
    ) -> (u16, String) {
        let url = format!("http://{}:{port}{path}", self.host);
        let mut args: Vec<String> = ["netns", "exec", &self.name, "curl", "--noproxy", "*"]
            .map(String::from)
            .into();
        args.extend(["-s", "--max-time", "20", "-w", "\n%{http_code}"].map(String::from));
        for h in headers {
            args.extend(["-H".to_string(), h.clone()]);
        }
        args.push(url);
        let out = tokio::task::spawn_blocking(move || Command::new("ip").args(&args).output())
            .await
            .unwrap()
            .expect("run curl in the namespace");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').expect("curl printed the status");
        (code.trim().parse().unwrap_or(0), body.to_string())
    }
}

impl Drop for Namespace {
    /// Deleting the namespace deletes its end of the pair, and so the pair.
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
    }
}

const CHANGES: &str = "/replication/v6/changes?id=s1&mode=serving&replicaVersion=00&watermark=00";

#[actix_rt::test]
async fn protected_mode_refuses_a_peer_not_on_loopback() {
    let ns = Namespace::new();
    let svc = TestService::start_on(&ns.host, &[]).await;
    let port = svc.service.as_ref().unwrap().addr().port();
    // The namespace reaches the service: the open endpoints answer it.
    assert_eq!(ns.request(port, "/healthz", &[]).await.0, 200);
    assert_eq!(ns.request(port, "/metrics", &[]).await.0, 200);
    for path in [CHANGES, "/replication/v6/snapshot?taskID=t1", "/status"] {
        let (code, body) = ns.request(port, path, &[]).await;
        assert_eq!(code, 403, "{path}: {body}");
        assert!(
            body.contains("--secret-file") && body.contains("--allow-unauthenticated"),
            "{body}"
        );
        assert_eq!(body.trim_end().lines().count(), 1, "{body}");
    }
    let (_, metrics) = ns.request(port, "/metrics", &[]).await;
    assert!(
        metrics.contains("change_streamer_auth_failures_total{reason=\"not-loopback\"} 3"),
        "{metrics}"
    );
    svc.stop().await;
}

#[actix_rt::test]
async fn allow_unauthenticated_serves_a_peer_not_on_loopback() {
    let ns = Namespace::new();
    let svc = TestService::start_on(&ns.host, &["--allow-unauthenticated"]).await;
    let port = svc.service.as_ref().unwrap().addr().port();
    assert_eq!(ns.request(port, "/status", &[]).await.0, 200);
    assert_eq!(ns.get(port, CHANGES, &[]).await.0, 400);
    svc.stop().await;
}

#[actix_rt::test]
async fn with_a_secret_a_peer_not_on_loopback_needs_it() {
    let ns = Namespace::new();
    let svc = TestService::start_on(&ns.host, &["--secret", TEST_SECRET]).await;
    let port = svc.service.as_ref().unwrap().addr().port();
    assert_eq!(ns.request(port, "/status", &[]).await.0, 401);
    let bearer = vec![format!("Authorization: Bearer {TEST_SECRET}")];
    assert_eq!(ns.request(port, "/status", &bearer).await.0, 200);
    assert_eq!(ns.get(port, CHANGES, &bearer).await.0, 400);
    assert_eq!(ns.get(port, CHANGES, &[]).await.0, 401);
    svc.stop().await;
}
