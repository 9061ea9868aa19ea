//! End to end: the client writer's kit, `examples/python/replica_client.py` (PROTOCOL.md §5, §7),
//! run by a real Python interpreter against the real service while the fake change source writes.
//! It catches up, follows live, has its connection cut and the service restarted under it, and
//! must have applied every transaction once, whole and in order: no gap, no duplicate.
//!
//! The interpreter is `scripts/install-python-websockets.sh`'s: the system's python3 when it
//! imports `websockets` 15 or later, otherwise a venv under `target/` that the script installs
//! it into from PyPI. When neither works the test fails saying what is missing.

mod changes_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use change_streamer_test_support::forward::Forward;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::upstream::{insert, txn, FakeUpstream};
use change_streamer_test_support::wait::wait_until;
use changes_support::{service_with_upstream, w};
use serde_json::{json, Value};

/// Rows of transaction `n`: one to four, so that batches end anywhere; and every 250th one 700
/// rows (about 80 KiB), so that a tracked change (§10) falls inside it: as the only subscriber,
/// the client acking at commits must ack before that commit (it does after a quiet 100 ms).
fn rows(n: u64) -> u64 {
    if n % 250 == 0 {
        700
    } else {
        n % 4 + 1
    }
}

fn write(up: &FakeUpstream, from: u64, to: u64) {
    let frames = (from..=to).flat_map(|n| txn(n, rows(n))).collect();
    up.send(frames);
}

/// A python3 that imports `websockets`, installed into `target/` when needed.
fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("scripts/install-python-websockets.sh"))
        .output()
        .expect("run bash scripts/install-python-websockets.sh");
    assert!(
        out.status.success(),
        "no python3 with websockets for examples/python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Whether subscriber `id` has acked `watermark` (or later) in `/status`.
fn acked(status: &Value, id: &str, watermark: &str) -> bool {
    status["subscribers"].as_array().is_some_and(|subs| {
        subs.iter()
            .any(|s| s["id"] == id && s["acked"].as_str().is_some_and(|a| a >= watermark))
    })
}

async fn wait_exit(child: &mut Child, stderr: &Path) -> std::process::ExitStatus {
    let mut status = None;
    wait_until("the Python client's exit", Duration::from_secs(60), || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    })
    .await;
    let status = status.expect("exited");
    assert!(
        status.success(),
        "python client failed ({status}): {}",
        std::fs::read_to_string(stderr).unwrap_or_default()
    );
    status
}

#[actix_rt::test]
async fn the_python_client_gets_every_change_once_across_a_cut_and_a_restart() {
    let python = python();
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    write(&up, 101, 300);
    svc.wait_status("stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(300))
    })
    .await;
    let base: SocketAddr = svc.base().parse().expect("service address");
    let forward = Forward::start(base).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let (stdout, stderr) = (dir.path().join("out"), dir.path().join("err"));
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python/replica_client.py");
    let mut child = Command::new(&python)
        .arg(&client)
        .args(["--url", &format!("ws://{}", forward.addr)])
        .args([
            "--id",
            "py-1",
            "--replica-version",
            &w(100),
            "--watermark",
            &w(100),
        ])
        .args(["--exit-at", &w(1000), "--print"])
        .stdout(Stdio::from(std::fs::File::create(&stdout).expect("out")))
        .stderr(Stdio::from(std::fs::File::create(&stderr).expect("err")))
        .spawn()
        .expect("start the Python client");

    // A cut once it is past the start of its catch-up; it resumes and follows live.
    svc.wait_status("catching up", |s| acked(s, "py-1", &w(102)))
        .await;
    forward.cut();
    write(&up, 301, 600);
    svc.wait_status("live after the cut", |s| acked(s, "py-1", &w(600)))
        .await;

    // The service restarted (on another port, behind the same address) between two writes.
    let data = svc.stop().await;
    let url = up.url();
    let svc = TestService::start_in(data, &["--upstream", &url]).await;
    forward.retarget(svc.base().parse().expect("service address"));
    up.wait_connections(2).await;
    // Back and live (it acked 600 again on its new connection), so 750 reaches it live.
    svc.wait_status("resubscribed", |s| acked(s, "py-1", &w(600)))
        .await;
    write(&up, 601, 1000);
    wait_exit(&mut child, &stderr).await;

    let text = std::fs::read_to_string(&stdout).expect("client output");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let (summary, txns) = lines.split_last().expect("a summary line");
    let got: Vec<String> = txns
        .iter()
        .map(|t| t["watermark"].as_str().expect("watermark").to_string())
        .collect();
    let want: Vec<String> = (101..=1000).map(w).collect();
    assert_eq!(got, want, "every transaction once, in order");
    for (t, n) in txns.iter().zip(101..) {
        let changes: Vec<Value> = (0..rows(n))
            .map(|i| serde_json::from_str(&insert(n * 1000 + i)).expect("insert"))
            .collect();
        assert_eq!(t["changes"], json!(changes), "transaction {n} whole");
    }
    let summary = &summary["summary"];
    eprintln!("python client: {summary}");
    assert_eq!(summary["watermark"], json!(w(1000)), "{summary}");
    assert!(summary["connections"].as_u64() >= Some(3), "{summary}");
    svc.stop().await;
}
