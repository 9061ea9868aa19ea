//! End to end: a full disk under the SQLite change log (PROTOCOL.md §3.1), against the real
//! binary as a child process whose `--data-dir` is on a small tmpfs this test mounts (root
//! only; elsewhere the test says why it skips, and fails instead under CI).
//!
//! The disk is filled by a ballast file beside the data dir while the change source writes,
//! then the ballast is removed. The rules pinned: the failed write is an ERROR naming the data
//! dir; nothing is acked upstream that is not stored; `/readyz` says why while the change log
//! cannot write; a subscriber keeps what it was sent; once space returns, ingest resumes after
//! the last durable commit with no gap and no commit twice; and the file passes
//! `PRAGMA integrity_check`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{frame, payloads, InOrder, Step, WsClient};
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use serde_json::json;

/// How long the test waits for any one event.
const LIMIT: Duration = Duration::from_secs(30);

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// A tmpfs of `size` mounted on a temporary folder, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `Err` says why it could not be mounted (not root, no `mount`).
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the file system of `path` with one file, 16 KiB at a time, until a write fails.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).expect("create the ballast");
    let chunk = vec![0x5a_u8; 16 << 10];
    let mut written = 0;
    while f.write_all(&chunk).is_ok() {
        written += chunk.len() as u64;
    }
    let _ = f.sync_all();
    written
}

/// Polls `cond` until it holds; `Err` names `what` after [`LIMIT`].
async fn until(what: &str, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + LIMIT;
    while !cond() {
        if Instant::now() >= deadline {
            return Err(format!("no {what} within {LIMIT:?}"));
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The highest commit watermark the change source was acked for.
fn acked(up: &FakeUpstream) -> Option<String> {
    up.acks()
        .iter()
        .filter_map(|a| serde_json::from_str::<serde_json::Value>(a).ok())
        .filter_map(|a| a[2]["watermark"].as_str().map(str::to_string))
        .max()
}

/// Reads commits `next..=last`, whole and in order, each once (a transaction rolled back
/// does not count), acking every frame.
async fn read_acking(c: &mut WsClient, next: u64, last: u64) {
    let mut txns = InOrder::at(next);
    while txns.next <= last {
        let (id, ps) = payloads(&frame(c).await);
        for p in ps {
            if txns.payload(&p) == Step::Other {
                panic!("unexpected {p}");
            }
        }
        c.ack(id).await;
    }
}

fn skip_or_fail(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("the full-disk test needs a tmpfs it mounts itself (root): {why}");
    }
    eprintln!("skipping the full-disk test: {why} (it needs root to mount a tmpfs)");
}

#[actix_rt::test]
async fn a_full_disk_stops_acks_says_why_and_ingest_resumes_with_no_gap() {
    let fs = match Tmpfs::mount("6m") {
        Ok(fs) => fs,
        Err(why) => return skip_or_fail(&why),
    };
    let data: PathBuf = fs.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    let up = FakeUpstream::start().await;
    let url = up.url();
    let svc = ServiceProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_change-streamer")),
        0,
        &data,
        &["--upstream", &url],
    );
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    for n in 101..=110 {
        up.send(txn(n, 5));
    }
    svc.wait_status("stored up to 110", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(110))
    })
    .await;
    let mut sub = WsClient::connect(&svc.ws(&format!(
        "/replication/v6/changes?id=r1&replicaVersion={}&watermark={}&wsBatched=true",
        w(100),
        w(100)
    )))
    .await;
    let (id, first) = payloads(&frame(&mut sub).await);
    assert_eq!(first[0][0], "status", "{first:?}");
    sub.ack(id).await;
    read_acking(&mut sub, 101, 110).await;

    // The disk fills; the change source goes on writing.
    let ballast = fs.path().join("ballast");
    fill(&ballast);
    for n in 111..=160 {
        up.send(txn(n, 40));
    }
    let dir = data.display().to_string();
    let named = until("an ERROR naming the data dir", || {
        svc.logged("ERROR").iter().any(|l| l.contains(&dir))
    });
    if let Err(why) = named.await {
        panic!("{why}; logged: {:#?}", svc.logged(" "));
    }
    let (code, body) = svc.get("/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("cannot write"), "{body}");
    assert!(body.contains(&data.display().to_string()), "{body}");
    let stored = svc.status().await["changeLog"]["maxWatermark"]
        .as_str()
        .map(str::to_string);
    assert!(
        acked(&up) <= stored,
        "acked {:?} but stored only {stored:?}",
        acked(&up)
    );
    assert!(
        stored < Some(w(160)),
        "the disk was full, yet all was stored"
    );

    // Space returns: the change source is asked to resume after the last durable commit, and
    // sends everything after it again, as a real one would.
    std::fs::remove_file(&ballast).expect("remove the ballast");
    let connections = up.queries().len();
    up.wait_connections(connections + 1).await;
    let query = up.queries().last().cloned().unwrap_or_default();
    let resume: u64 = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("lastWatermark="))
        .and_then(|v| Watermark::parse(v).ok())
        .and_then(|v| v.to_u64())
        .unwrap_or_else(|| panic!("no lastWatermark in {query:?}"));
    assert_eq!(
        Some(w(resume)),
        stored,
        "resumes after the last durable commit"
    );
    for n in resume + 1..=160 {
        up.send(txn(n, 40));
    }
    svc.wait_status("stored up to 160", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(160))
    })
    .await;
    until("ack of 160", || acked(&up) == Some(w(160)))
        .await
        .unwrap();
    let (code, body) = svc.get("/readyz").await;
    assert_eq!((code, body.as_str()), (200, "ready\n"));
    // The subscriber, never closed, gets every commit after 110 once, in order.
    read_acking(&mut sub, 111, 160).await;
    svc.terminate().await;

    let db = std::fs::read_dir(&data)
        .expect("data dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "db"))
        .expect("the change log's file");
    let conn = rusqlite::Connection::open(&db).expect("open the change log");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok");
}
