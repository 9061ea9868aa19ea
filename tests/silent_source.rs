//! End to end, a silent change source is noticed (PROTOCOL.md §4, "Liveness" and "Connect
//! timeout"; issue 41), against the real binary as a child process and real sockets:
//!
//! - a source behind a proxy that freezes (the connection open, no byte crossing) is closed with
//!   1001 `no pong for N ms` after two intervals, shown in `/status` (`upstream.connected`
//!   false, `upstream.disconnectReason`) and `/readyz` (503 `upstream silent`); after the thaw
//!   the service reconnects and replication resumes with nothing lost or duplicated;
//! - a source that answers the pings but sends nothing is idle, not dead;
//! - a source that accepts TCP but never answers the upgrade: the connect times out, is retried;
//! - a source the service does not read (a tracked send waiting) is not taken for silent.
//!
//! Every wait is for an event (a log line, a status field, a socket's end), never a guessed
//! sleep.

mod changes_support;

use std::path::Path;
use std::time::Duration;

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::freeze::FreezeProxy;
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::wait_until;
use changes_support::{read_txns, w};
use serde_json::json;
use tokio::io::AsyncReadExt;

/// `--upstream-ping-interval-ms` of these tests: two of them (the silence that ends a
/// connection, the connect timeout) are 400 ms.
const INTERVAL_MS: u64 = 200;
/// A generous deadline for what the service does on its own time.
const LIMIT: Duration = Duration::from_secs(20);

fn service(upstream_url: &str, dir: &Path) -> ServiceProcess {
    let interval = INTERVAL_MS.to_string();
    ServiceProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_change-streamer")),
        0,
        dir,
        &[
            "--upstream",
            upstream_url,
            "--upstream-ping-interval-ms",
            &interval,
        ],
    )
}

fn changes_path(id: &str, watermark: u64) -> String {
    format!(
        "/replication/v6/changes?id={id}&replicaVersion={}&watermark={}",
        w(100),
        w(watermark)
    )
}

fn commit_ack(n: u64) -> String {
    format!(
        r#"["status",{{"tag":"commit"}},{{"watermark":"{}"}}]"#,
        w(n)
    )
}

/// N of `no pong for N ms` in `text`.
fn silence_ms(text: &str) -> Option<u64> {
    let rest = text.split("no pong for ").nth(1)?;
    rest.split(" ms").next()?.parse().ok()
}

#[actix_rt::test]
async fn a_frozen_source_is_closed_1001_no_pong_shown_unready_and_resumed_after_the_thaw() {
    let up = FakeUpstream::start().await;
    let proxy = FreezeProxy::start(up.addr).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = service(&format!("ws://{}/changes", proxy.addr), dir.path());
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    up.send(txn(101, 2));
    svc.wait_status("101 stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(101))
    })
    .await;
    let mut c = WsClient::connect(&svc.ws(&changes_path("r1", 100))).await;
    assert_eq!(read_txns(&mut c, 101).await, vec![101]);
    wait_until("101 acked and pings answered", LIMIT, || {
        up.acks().contains(&commit_ack(101)) && up.pings_and_pongs().0 >= 2
    })
    .await;
    assert_eq!(svc.readyz().await, (200, "ready".to_string()));

    proxy.freeze();
    wait_until("the silence logged", LIMIT, || {
        !svc.logged("no pong for").is_empty()
    })
    .await;
    let line = svc.logged("no pong for").remove(0);
    let n = silence_ms(&line).unwrap_or_else(|| panic!("no N in {line:?}"));
    assert!(
        n >= 2 * INTERVAL_MS,
        "closed after {n} ms of silence: {line}"
    );
    // The close frame was written. Whether it reaches the source is the network's business (a
    // dead route drops it; here the source's pong held at the freeze, written to the closed
    // socket at the thaw, can reset the proxy's connection before the close crosses), so the
    // log is where it is checked.
    let logged = format!("upstream connection ended: no pong for {n} ms (closed with 1001); ");
    assert!(line.contains(&logged), "{line}");
    let st = svc
        .wait_status("not connected", |s| {
            s["upstream"]["connected"] == json!(false)
        })
        .await;
    // The silence's reason, or, once the next connect (held by the frozen proxy too) timed out,
    // that one's: both are silences.
    let reason = st["upstream"]["disconnectReason"].as_str().unwrap_or("");
    assert!(
        silence_ms(reason).is_some_and(|n| n >= 2 * INTERVAL_MS)
            || reason == format!("connect timed out after {} ms", 2 * INTERVAL_MS),
        "{st}"
    );
    assert_eq!(svc.readyz().await, (503, "upstream silent".to_string()));

    proxy.thaw();
    svc.wait_status("reconnected", |s| {
        s["upstream"]["connected"] == json!(true) && s["upstream"]["disconnectReason"].is_null()
    })
    .await;
    assert_eq!(svc.readyz().await, (200, "ready".to_string()));
    assert_eq!(
        up.queries().last().cloned(),
        Some(format!(
            "lastWatermark={}&replicaVersion={}",
            w(101),
            w(100)
        ))
    );
    // Handshakes the service gave up on while frozen reach the source at the thaw and end at
    // once; then only the service's connection is open.
    wait_until("one connection open", LIMIT, || up.open_connections() == 1).await;
    assert!(up.send_open(txn(102, 2)));
    assert!(up.send_open(txn(103, 1)));
    // The subscriber, connected throughout, gets the rest once each, in order.
    assert_eq!(read_txns(&mut c, 103).await, vec![102, 103]);
    wait_until("103 acked", LIMIT, || up.acks().contains(&commit_ack(103))).await;
    let acks = up.acks();
    for n in 100..=103 {
        let times = acks.iter().filter(|a| **a == commit_ack(n)).count();
        assert_eq!(times, 1, "commit {n} acked {times} times: {acks:?}");
    }
    // The change log holds each once.
    let mut d = WsClient::connect(&svc.ws(&changes_path("r2", 100))).await;
    assert_eq!(read_txns(&mut d, 103).await, vec![101, 102, 103]);
    svc.terminate().await;
}

#[actix_rt::test]
async fn a_source_that_answers_pings_but_sends_nothing_is_idle_not_dead() {
    let up = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = service(&up.url(), dir.path());
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    svc.wait_status("initialised", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    // Ten intervals, five silences' worth, with nothing from the source but its pongs.
    wait_until("ten pings", LIMIT, || up.pings_and_pongs().0 >= 10).await;
    let st = svc.status().await;
    assert_eq!(st["upstream"]["connected"], json!(true), "{st}");
    assert_eq!(st["upstream"]["disconnectReason"], json!(null), "{st}");
    assert_eq!(svc.readyz().await, (200, "ready".to_string()));
    assert_eq!(up.queries().len(), 1, "never reconnected");
    assert_eq!(up.closes(), vec![]);
    assert!(svc.logged("upstream connection ended").is_empty());
    svc.terminate().await;
}

#[actix_rt::test]
async fn a_source_that_never_answers_the_upgrade_times_out_and_is_retried() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = service(&format!("ws://{addr}/changes"), dir.path());
    // Accepted, read, never answered: the service gives up on it (its end arrives).
    let (mut first, _) = tokio::time::timeout(LIMIT, listener.accept())
        .await
        .expect("a connect")
        .expect("accept");
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(LIMIT, first.read(&mut buf))
            .await
            .expect("the service gives up on the handshake");
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    assert!(
        String::from_utf8_lossy(&request).starts_with("GET /changes"),
        "{}",
        String::from_utf8_lossy(&request)
    );
    // Then, after the backoff, again.
    let (_second, _) = tokio::time::timeout(LIMIT, listener.accept())
        .await
        .expect("retried")
        .expect("accept");
    let timed_out = format!("connect timed out after {} ms", 2 * INTERVAL_MS);
    let st = svc
        .wait_status("the timeout shown", |s| {
            s["upstream"]["disconnectReason"] == json!(timed_out)
        })
        .await;
    assert_eq!(st["upstream"]["connected"], json!(false), "{st}");
    assert!(
        !svc.logged(&format!("upstream connection ended: {timed_out}"))
            .is_empty(),
        "not logged"
    );
    svc.terminate().await;
}

#[actix_rt::test]
async fn a_source_the_service_stops_reading_for_flow_control_is_not_taken_for_silent() {
    let up = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let interval = INTERVAL_MS.to_string();
    let svc = ServiceProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_change-streamer")),
        0,
        dir.path(),
        &[
            "--upstream",
            &up.url(),
            "--upstream-ping-interval-ms",
            &interval,
            // The subscriber's own liveness, an interval a busy machine's round trips fit in.
            "--ping-interval-ms",
            "1000",
        ],
    );
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    svc.wait_status("initialised", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    let mut c = WsClient::connect(&svc.ws(&changes_path("r1", 100))).await;
    let (id, first) = c.msg().await;
    assert_eq!(first[0], "status", "{first}");
    c.ack(id).await;
    // Over 64 KiB in one transaction: its commit goes out tracked (PROTOCOL.md §10), and the
    // only subscriber does not ack it, so ingest waits and the source is not read.
    up.send(txn(101, 1000));
    let mut unacked = Vec::new();
    loop {
        let (id, msg) = c.msg().await;
        unacked.push(id);
        if msg[0] == "commit" {
            break;
        }
    }
    svc.wait_status("the tracked send waiting", |s| {
        s["flowControl"]["trackedSends"].as_u64() >= Some(1)
            && s["flowControl"]["releasesAll"] == json!(0)
            && s["flowControl"]["releasesConsensus"] == json!(0)
    })
    .await;
    // Three subscriber pings: fifteen source intervals, seven silences' worth, unread.
    let pinged = c.pings_answered;
    while c.pings_answered < pinged + 3 {
        match c.next(Duration::from_millis(100)).await {
            None => {}
            Some(other) => panic!("nothing more while the tracked send waits, got {other:?}"),
        }
    }
    let st = svc.status().await;
    assert_eq!(st["upstream"]["connected"], json!(true), "{st}");
    assert_eq!(st["upstream"]["disconnectReason"], json!(null), "{st}");
    assert_eq!(st["flowControl"]["releasesAll"], json!(0), "{st}");
    assert_eq!(up.queries().len(), 1, "never reconnected");
    assert!(svc.logged("upstream connection ended").is_empty());
    // Acked: released, read again, and what comes next arrives.
    for id in unacked {
        c.ack(id).await;
    }
    up.send(txn(102, 1));
    assert_eq!(read_txns(&mut c, 102).await, vec![102]);
    assert_eq!(up.queries().len(), 1, "never reconnected");
    svc.terminate().await;
}
