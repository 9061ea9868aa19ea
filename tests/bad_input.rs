//! End to end: bad input at the service's edge (PROTOCOL.md §12), with real websocket and HTTP clients
//! against the real server.

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::service::TestService;

/// Opens `path` as a websocket and returns its close (code, reason).
async fn refusal(svc: &TestService, path: &str) -> (u16, String) {
    let mut c = WsClient::connect(&svc.ws(path)).await;
    let (code, reason) = c.closed().await;
    assert!(reason.len() <= 123, "{} bytes: {reason}", reason.len());
    (code, reason)
}

const GOOD: &str = "replicaVersion=1&watermark=0a";

#[actix_rt::test]
async fn a_repeated_query_parameter_is_closed_1002_naming_it() {
    let svc = TestService::start(&[]).await;
    let (code, reason) = refusal(
        &svc,
        "/replication/v6/changes?id=r&replicaVersion=1&watermark=0a&watermark=zz",
    )
    .await;
    assert_eq!(code, 1002, "{reason}");
    assert!(
        reason.contains("watermark") && reason.contains("repeated"),
        "{reason}"
    );
    let (code, reason) = refusal(&svc, "/replication/v6/snapshot?taskID=a&taskID=a").await;
    assert_eq!(code, 1002, "{reason}");
    assert!(reason.contains("taskID"), "{reason}");
    svc.stop().await;
}

#[actix_rt::test]
async fn bad_percent_encoding_is_closed_1002_naming_the_parameter() {
    let svc = TestService::start(&[]).await;
    let (code, reason) = refusal(&svc, &format!("/replication/v6/changes?id=%zz&{GOOD}")).await;
    assert_eq!(code, 1002, "{reason}");
    assert!(
        reason.contains("id") && reason.contains("percent"),
        "{reason}"
    );
    let (code, reason) = refusal(&svc, "/replication/v6/snapshot?taskID=%e9").await;
    assert_eq!(code, 1002, "{reason}");
    assert!(reason.contains("taskID"), "{reason}");
    svc.stop().await;
}

#[actix_rt::test]
async fn a_parameter_over_1_kib_is_closed_1002_naming_it() {
    let svc = TestService::start(&[]).await;
    let id = "x".repeat(10_000);
    let (code, reason) = refusal(&svc, &format!("/replication/v6/changes?id={id}&{GOOD}")).await;
    assert_eq!(code, 1002, "{reason}");
    assert!(
        reason.contains("id") && reason.contains("1 KiB"),
        "{reason}"
    );
    svc.stop().await;
}

#[actix_rt::test]
async fn a_protocol_version_of_any_length_is_upgraded_and_closed_1002() {
    let svc = TestService::start(&[]).await;
    for (path, v) in [
        (
            "/replication/v99999999999999999999/changes",
            "99999999999999999999",
        ),
        ("/replication/v7/snapshot?taskID=t", "7"),
    ] {
        let (code, reason) = refusal(&svc, path).await;
        assert_eq!(code, 1002, "{path}: {reason}");
        assert_eq!(
            reason,
            format!("Cannot service client at protocol v{v}. Supported protocols: [v1 ... v6]")
        );
    }
    svc.stop().await;
}

/// A GET with `count` extra headers of `size` bytes each.
async fn get_with_headers(svc: &TestService, path: &str, count: usize, size: usize) -> u16 {
    let mut req = awc::Client::new().get(format!("http://{}{}", svc.base(), path));
    for i in 0..count {
        req = req.insert_header((format!("x-filler-{i}"), "v".repeat(size)));
    }
    req.send().await.expect("http get").status().as_u16()
}

#[actix_rt::test]
async fn request_headers_over_16_kib_in_total_get_431() {
    let svc = TestService::start(&[]).await;
    assert_eq!(get_with_headers(&svc, "/healthz", 1, 100_000).await, 431);
    // Each header alone is small; together they pass the limit.
    assert_eq!(get_with_headers(&svc, "/healthz", 20, 1_000).await, 431);
    assert_eq!(get_with_headers(&svc, "/status", 20, 1_000).await, 431);
    // Under the limit is served.
    assert_eq!(get_with_headers(&svc, "/healthz", 10, 1_000).await, 200);
    svc.stop().await;
}

#[actix_rt::test]
async fn a_websocket_path_without_an_upgrade_is_400_with_one_line_and_unknown_paths_404() {
    let svc = TestService::start(&[]).await;
    for path in [
        "/replication/v6/changes?id=r&replicaVersion=1&watermark=0a",
        "/replication/v6/snapshot?taskID=t",
    ] {
        let (code, body) = svc.get(path).await;
        assert_eq!(code, 400, "{path}: {body}");
        assert_eq!(body.trim_end().lines().count(), 1, "{body:?}");
    }
    for path in ["/nope", "/replication/6/changes", "/replication/vx/changes"] {
        assert_eq!(svc.get(path).await.0, 404, "{path}");
    }
    svc.stop().await;
}

/// A subscriber id is client input: in `/metrics` it is a label value, escaped per the text
/// format so that a Prometheus parser reads back exactly the id, and the standard `process_*`
/// metrics are there.
#[actix_rt::test]
async fn metrics_parse_with_process_metrics_and_an_escaped_subscriber_id() {
    use change_streamer_actors::watermark::Watermark;
    use change_streamer_test_support::upstream::{txn, FakeUpstream};

    let up = FakeUpstream::start().await;
    let url = up.url();
    let svc = TestService::start(&["--upstream", &url]).await;
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    let rv = Watermark::from_u64(100).to_string();
    let mut polls = 0;
    while svc.status().await["replicaVersion"] != serde_json::json!(rv) {
        polls += 1;
        assert!(polls < 500, "the initial sync never arrived");
        actix_rt::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let id = "a\"b\\c\nd";
    let mut c = WsClient::connect(&svc.ws(&format!(
        "/replication/v6/changes?id=a%22b%5Cc%0Ad&replicaVersion={rv}&watermark={rv}"
    )))
    .await;
    let (first, _) = c.msg().await;
    c.ack(first).await;

    let (code, text) = svc.get("/metrics").await;
    assert_eq!(code, 200, "{text}");
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("/metrics parses");
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
        "change_streamer_subscribers",
        "change_streamer_changes_stored_total",
    ] {
        assert!(
            scrape.samples.iter().any(|s| s.metric == name),
            "{name} missing from\n{text}"
        );
    }
    let pending = scrape
        .samples
        .iter()
        .find(|s| s.metric == "change_streamer_subscriber_pending_messages")
        .unwrap_or_else(|| panic!("no per-subscriber sample in\n{text}"));
    // prometheus-parse hands back the label value as written; undo the text format's escapes.
    let written = pending.labels.get("id").expect("an id label");
    assert_eq!(unescape_label(written), id, "{text}");
    assert_eq!(pending.labels.get("mode"), Some("serving"));
    c.close().await;
    svc.stop().await;
}

/// The Prometheus text format's label value escapes: `\\`, `\"` and `\n`.
fn unescape_label(v: &str) -> String {
    let mut out = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}
