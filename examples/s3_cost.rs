//! What each backup source costs in requests to the object store (issue 44, BENCHMARKS.md): the
//! real service, a backup replica following it, and real stock litestream 0.5.17 replicating it
//! to a bucket of a local S3 server (moto, `scripts/install-moto.sh`), with litestream's and the
//! service's DEFAULT intervals; one commit a second for `--seconds` (300 by default); then the
//! requests the server's own log holds for that bucket, per hour and per confirmed commit.
//!
//! ```sh
//! benches/s3_cost.sh               # cargo run --release --example s3_cost -- --seconds 300
//! ```
//!
//! Four runs at once, each with its own server, service and litestream:
//! - `none`: no source reads the bucket (the metrics source, on a page nobody serves): what
//!   litestream's own replication costs, the floor of every other run;
//! - `vfs`: `--litestream-vfs` (PROTOCOL.md §8.1b), a VFS open per `--backup-check-interval-ms`;
//! - `control`: `--litestream-control-url` (§8.1c), a sync per acked commit;
//! - `control+audit`: the control source with `--litestream-vfs` (§8.1d), an audit a minute.
//!
//! A commit is confirmed once the backed-up watermark in `/status` reaches it. Each run prints
//! one JSON line; a last line sums up for people.

use std::time::{Duration, Instant};

use change_streamer_actors::vfs_reader;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_files::{flag_refs, BackupFiles, Store};
use change_streamer_test_support::backup_replica::BackupReplica;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::stock_litestream::{self, Litestream};
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use serde_json::json;

/// The runs, by the source they measure.
const RUNS: [&str; 4] = ["none", "vfs", "control", "control+audit"];

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The service's flags for `run` on `files` (every interval at its default).
fn flags(run: &str, files: &BackupFiles, litestream: &Litestream) -> Vec<String> {
    match run {
        "vfs" => files.vfs_flags(litestream),
        "control" => files.control_flags(),
        "control+audit" => files.control_and_vfs_flags(litestream),
        _ => vec![
            "--litestream-backup-url".into(),
            files.url(),
            "--litestream-metrics-url".into(),
            "http://127.0.0.1:9/metrics".into(),
        ],
    }
}

/// litestream.yml for `files` at litestream's default intervals, with the control socket.
fn litestream_yml(files: &BackupFiles) -> String {
    format!(
        "socket:\n  enabled: true\n  path: {}\ndbs:\n  - path: {}\n    replicas:\n      - url: {}\n",
        files.socket().display(),
        files.db().display(),
        files.url()
    )
}

/// One run: `seconds` at one commit a second; its JSON line.
async fn run(name: &'static str, seconds: u64) -> serde_json::Value {
    let litestream = stock_litestream::install();
    let dir = tempfile::tempdir().expect("tempdir");
    let files = BackupFiles::new(dir.path(), Store::S3);
    let bucket = files.bucket().expect("an S3 backup").clone();
    let up = FakeUpstream::start().await;
    let up_url = up.url();
    let flags = flags(name, &files, &litestream);
    let svc = TestService::start(&flag_refs(&flags, &["--upstream", &up_url])).await;
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    svc.wait_status("the initial sync", |s| s["replicaVersion"].is_string())
        .await;
    let rv = w(100);
    let replica = BackupReplica::start(&svc.base(), "backup", &rv, &rv, &files.db()).await;
    let replication = files
        .litestream(&litestream)
        .replicate_with(&files.config(), &litestream_yml(&files));
    replication
        .wait_for_socket(&files.socket(), Duration::from_secs(60))
        .await;
    files
        .wait_for_backup(&replication, Duration::from_secs(60))
        .await;
    // The window starts here: litestream's first snapshot and the service's start are left out.
    let before = bucket.request_count();
    let started = Instant::now();
    let mut n = 100;
    while started.elapsed() < Duration::from_secs(seconds) {
        n += 1;
        up.send(txn(n, 2));
        let next = started + Duration::from_secs(n - 100);
        actix_rt::time::sleep_until(next.into()).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let requests = bucket.requests()[before..].to_vec();
    let st = svc.status().await;
    let confirmed = st["backup"]["monitor"]["backupWatermark"]
        .as_str()
        .and_then(|s| Watermark::parse(s).ok())
        .and_then(|w| w.to_u64())
        .map_or(0, |c| c.saturating_sub(100));
    let count = |m: &str| requests.iter().filter(|r| r.starts_with(m)).count();
    let lists = requests
        .iter()
        .filter(|r| r.contains("list-type=2"))
        .count();
    let per_hour = requests.len() as f64 * 3600.0 / elapsed;
    drop(replication);
    drop(replica);
    svc.stop().await;
    json!({
        "source": name,
        "seconds": elapsed.round(),
        "commits": n - 100,
        "confirmedCommits": confirmed,
        "requests": requests.len(),
        "get": count("GET ") - lists,
        "list": lists,
        "put": count("PUT "),
        "delete": count("DELETE "),
        "other": requests.len() - count("GET ") - count("PUT ") - count("DELETE "),
        "perHour": per_hour.round(),
        "perConfirmedCommit": if confirmed > 0 { requests.len() as f64 / confirmed as f64 } else { f64::NAN },
        "backupReadsTotal": st["backup"]["monitor"]["backupReadsTotal"],
    })
}

fn main() -> std::process::ExitCode {
    // The services in this process start their VFS readers from this binary.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == vfs_reader::SUBCOMMAND)
    {
        return vfs_reader::run();
    }
    let mut seconds = 300;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--seconds", Some(s)) => seconds = s,
            _ => {
                eprintln!("usage: s3_cost [--seconds N]");
                return std::process::ExitCode::from(2);
            }
        }
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error")).init();
    let lines = actix_rt::System::new().block_on(async {
        let runs = RUNS.map(|name| run(name, seconds));
        futures_util::future::join_all(runs).await
    });
    for line in &lines {
        println!("{line}");
    }
    for line in &lines {
        eprintln!(
            "{:>14}: {} requests in {} s ({} an hour), {} confirmed commits ({:.2} requests each)",
            line["source"].as_str().unwrap_or(""),
            line["requests"],
            line["seconds"],
            line["perHour"],
            line["confirmedCommits"],
            line["perConfirmedCommit"].as_f64().unwrap_or(f64::NAN)
        );
    }
    std::process::ExitCode::SUCCESS
}
