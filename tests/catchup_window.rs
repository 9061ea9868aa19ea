//! End to end: the catch-up's window (PROTOCOL.md §5 "When to ack", §10.2) and its flag (§2),
//! against the real server with a fake change source and real websocket clients: a batched
//! client that acks only at commits catches up without stalling, one that never acks gets up to
//! the window and no more, and a window above `--max-subscriber-queue-bytes` stops the binary.

use std::process::Command;
use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{
    commit_of, follow_acking_commits, frame, payloads, WsClient,
};
use change_streamer_test_support::service::{service_with_upstream, TestService};
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use serde_json::json;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The smallest window: 64 KiB.
const WINDOW: u64 = 65536;

/// The service with a 64 KiB window and transactions 101..=`last` of `rows` inserts stored.
async fn stored(last: u64, rows: u64) -> (TestService, FakeUpstream) {
    let (svc, up) = service_with_upstream(&["--catchup-window-bytes", &WINDOW.to_string()]).await;
    for n in 101..=last {
        up.send(txn(n, rows));
    }
    svc.wait_status("stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(last))
    })
    .await;
    (svc, up)
}

fn batched_url(svc: &TestService, id: &str) -> String {
    svc.ws(&format!(
        "/replication/v6/changes?id={id}&replicaVersion={}&watermark={}&wsBatched=true",
        w(100),
        w(100)
    ))
}

/// A client that acks only frames holding a `commit` (cumulatively, PROTOCOL.md §5), as an
/// applier that acks once it has applied a whole transaction does, catches up every stored
/// transaction without stalling, though frames end inside transactions.
#[actix_rt::test]
async fn a_client_acking_only_at_commits_catches_up_though_batches_end_inside_transactions() {
    // 200 transactions of 40 inserts (~6 KiB each, 42 payloads) through a 64 KiB window.
    let last = 300;
    let (svc, _up) = stored(last, 40).await;
    let mut c = WsClient::connect(&batched_url(&svc, "commit-acker")).await;
    let ending_inside = follow_acking_commits(&mut c, 101, last).await;
    assert!(
        ending_inside > 10,
        "only {ending_inside} frames ended inside a transaction"
    );
    svc.wait_status("the commit-acker live and acked", |s| {
        s["subscribers"][0]["phase"] == json!("live")
            && s["subscribers"][0]["acked"] == json!(w(last))
    })
    .await;
}

/// A client that never acks receives up to `--catchup-window-bytes` of payload and then
/// nothing more (PROTOCOL.md §10.2); once it acks, the rest streams.
#[actix_rt::test]
async fn a_client_that_never_acks_receives_up_to_the_window_and_then_waits() {
    let last = 200;
    let (svc, _up) = stored(last, 40).await;
    let mut c = WsClient::connect(&batched_url(&svc, "silent")).await;
    // Payload text as the service counts it: each payload's JSON (compact, as the source sent
    // it). An insert is ~130 bytes: the window is full once one more would not fit.
    let margin = 512;
    let (mut bytes, mut last_id) = (0u64, 0);
    while bytes + margin <= WINDOW {
        let (id, ps) = payloads(&frame(&mut c).await);
        bytes += ps.iter().map(|p| p.to_string().len() as u64).sum::<u64>();
        last_id = id;
    }
    // It waits: what still fits in the window may come, then nothing while nothing is acked.
    while let Some(f) = c.next_frame(Duration::from_millis(500)).await {
        let (id, ps) = payloads(&f.expect("a frame, not a close"));
        bytes += ps.iter().map(|p| p.to_string().len() as u64).sum::<u64>();
        last_id = id;
    }
    assert!(
        bytes <= WINDOW,
        "{bytes} bytes came unacked, window {WINDOW}"
    );
    let st = svc.status().await;
    assert_eq!(st["subscribers"][0]["phase"], json!("catchingUp"), "{st}");
    // Once it acks, the rest streams: every transaction, each once.
    c.ack(last_id).await;
    let mut seen = 0;
    loop {
        let (id, ps) = payloads(&frame(&mut c).await);
        c.ack(id).await;
        if ps
            .iter()
            .filter_map(commit_of)
            .inspect(|_| seen += 1)
            .any(|n| n == last)
        {
            break;
        }
    }
    assert!(seen > 0);
}

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_change-streamer"));
    cmd.args(args).env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the binary");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// `--catchup-window-bytes` above `--max-subscriber-queue-bytes` is a start error naming both
/// flags (and the variable a value came from), not a silent cut (PROTOCOL.md §2); below 65536 it
/// is refused like the bounds'.
#[actix_rt::test]
async fn a_window_above_the_subscriber_bound_is_a_start_error_naming_both_flags() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_string_lossy().to_string();
    let base = ["--port", "0", "--host", "127.0.0.1", "--data-dir", &data];
    for (args, env, named) in [
        (
            &[
                "--catchup-window-bytes",
                "1048577",
                "--max-subscriber-queue-bytes",
                "1048576",
            ][..],
            &[][..],
            &["--catchup-window-bytes", "--max-subscriber-queue-bytes"][..],
        ),
        (
            &[][..],
            &[("ZERO_CATCHUP_WINDOW_BYTES", "33554432")][..],
            &[
                "--catchup-window-bytes",
                "--max-subscriber-queue-bytes",
                "ZERO_CATCHUP_WINDOW_BYTES",
            ][..],
        ),
        (
            &["--catchup-window-bytes", "65535"][..],
            &[][..],
            &["--catchup-window-bytes"][..],
        ),
    ] {
        let all: Vec<&str> = base.iter().copied().chain(args.iter().copied()).collect();
        let (code, text) = run(&all, env);
        assert_ne!(code, 0, "{args:?} {env:?} started: {text}");
        assert!(!text.contains("panicked"), "{text}");
        for flag in named {
            assert!(
                text.contains(flag),
                "{args:?} {env:?}: {flag} not named:\n{text}"
            );
        }
    }
    // At the bound it starts (in process: a window equal to what one subscriber may hold).
    let svc = TestService::start(&[
        "--catchup-window-bytes",
        "1048576",
        "--max-subscriber-queue-bytes",
        "1048576",
    ])
    .await;
    let (code, _) = svc.get("/readyz").await;
    assert!(code == 200 || code == 503, "{code}");
}

/// A transaction of `rows` inserts of about `bytes` bytes each, at watermark `n`.
fn wide_txn(n: u64, rows: u64, bytes: usize) -> Vec<String> {
    let w = Watermark::from_u64(n);
    let mut f = vec![format!(
        r#"["begin",{{"tag":"begin"}},{{"commitWatermark":"{w}"}}]"#
    )];
    for i in 0..rows {
        f.push(format!(
            r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"items","keyColumns":["id"]}},"new":{{"id":{},"v":"{}"}}}}]"#,
            n * 1000 + i,
            "v".repeat(bytes)
        ));
    }
    f.push(format!(
        r#"["commit",{{"tag":"commit"}},{{"watermark":"{w}"}}]"#
    ));
    f
}

/// When the room left in the window is under a row of the usual size but no commit waits for
/// its ack (what is unacked is the start of a transaction), the catch-up still reads a row
/// (PROTOCOL.md §10.2): a client acking only at commits would otherwise wait for the commit,
/// and the catch-up for its ack. Transactions of 15 inserts of ~4.2 KiB fill a 64 KiB window
/// but for less than one of their rows, so a read that ends before a commit leaves too little
/// room for the size of a row read before.
#[actix_rt::test]
async fn a_window_with_less_room_than_a_row_still_reads_when_no_commit_ack_is_to_come() {
    let (svc, up) = service_with_upstream(&["--catchup-window-bytes", &WINDOW.to_string()]).await;
    let last = 110;
    for n in 101..=last {
        up.send(wide_txn(n, 15, 4200));
    }
    svc.wait_status("stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(last))
    })
    .await;
    let mut c = WsClient::connect(&batched_url(&svc, "commit-acker")).await;
    let mut next = 101;
    while next <= last {
        let (id, ps) = payloads(&frame(&mut c).await);
        let commits: Vec<u64> = ps.iter().filter_map(commit_of).collect();
        for n in &commits {
            assert_eq!(*n, next, "out of order");
            next += 1;
        }
        if !commits.is_empty() {
            c.ack(id).await;
        }
    }
}

/// The first read of a fresh service's first catch-up is as large as the window allows, not a
/// probe of a few rows (PROTOCOL.md §10.2): with a 64 KiB window and ~140-byte changes, the
/// first frame of changes is a full batch of 256 payloads (PROTOCOL.md §5).
#[actix_rt::test]
async fn the_first_read_of_a_fresh_service_is_as_large_as_the_window_allows() {
    let (svc, _up) = stored(150, 40).await;
    let mut c = WsClient::connect(&batched_url(&svc, "first")).await;
    let first = loop {
        let (_, ps) = payloads(&frame(&mut c).await);
        if ps.iter().any(|p| p[0] == "begin") {
            break ps;
        }
    };
    assert_eq!(first.len(), 256, "the first frame of changes: {first:?}");
}
