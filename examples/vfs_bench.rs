//! Measures the VFS backup source (PROTOCOL.md §8.1b) and the control source (§8.1c) with real
//! stock litestream 0.5.17, for BENCHMARKS.md:
//!
//! ```sh
//! cargo run --release --example vfs_bench                 # poll and delay
//! cargo run --release --example vfs_bench -- poll --mb 100 --polls 30
//! cargo run --release --example vfs_bench -- delay --seconds 30 --interval-ms 100
//! cargo run --release --example vfs_bench -- compare --seconds 20 --interval-ms 1000 --sync-ms 1000
//! ```
//!
//! - `poll`: one VFS poll (open the backup through the VFS, run the default
//!   `--backup-watermark-query`, in the reader process the service uses) on a backup of a
//!   replica file of `--mb` MB, replicated by `litestream replicate` to a `file://` replica.
//!   Also the one-off load of the extension.
//! - `delay`: the real service with `--litestream-vfs` polling every `--interval-ms`, a backup
//!   replica following it and replicated by `litestream replicate` (50 ms monitor and sync
//!   intervals), transactions 50–150 ms apart: for each watermark the replica commits, the time until
//!   the service's `/status` (read every 5 ms) shows a backed-up watermark at or above it.
//! - `control`: the same with `--litestream-control-url` (litestream's control socket) instead
//!   of the VFS.
//! - `metrics`: the same with `--litestream-metrics-url` (PROTOCOL.md §8.1). Stock litestream
//!   exports no `litestream_replica_progress`, so a stand-in page exports it the way Zero's fork
//!   does, at each of litestream's syncs: every `--sync-ms` it asks the real litestream to sync
//!   and wait (its control socket), and once that answers, the page shows the newest watermark
//!   the replica had committed before the request as backed up. The service polls that page
//!   every `--interval-ms`. This is the best the metrics source could do.
//! - `compare` runs `control`, `delay` (the VFS) and `metrics` in one invocation. `--sync-ms`
//!   sets litestream's sync interval (50 ms by default). Each also counts the reads of the
//!   backup per watermark confirmed (`backupReadsTotal` over the distinct backed-up watermarks
//!   seen).
//!
//! litestream is installed by `scripts/install-litestream.sh` on first use. Each part prints one
//! JSON line and one line for people.

use std::time::{Duration, Instant};

use change_streamer_actors::litestream_control::{ControlClient, ControlUrl};
use change_streamer_actors::vfs::{HelperCommand, VfsReader, VfsSource, DEFAULT_WATERMARK_QUERY};
use change_streamer_actors::vfs_reader;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_replica::{write_large_replica, BackupReplica, Progress};
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::stock_litestream;
use change_streamer_test_support::upstream::{txn, FakeUpstream};

struct Args {
    parts: Vec<String>,
    mb: usize,
    polls: usize,
    seconds: u64,
    interval_ms: u64,
    sync_ms: u64,
}

/// The backup source a delay is measured with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Vfs,
    Control,
    Metrics,
}

fn parse_args() -> Args {
    let mut a = Args {
        parts: Vec::new(),
        mb: 100,
        polls: 30,
        seconds: 30,
        interval_ms: 100,
        sync_ms: 50,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = |name: &str| -> u64 {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage(&format!("{name} takes a whole number")))
        };
        match arg.as_str() {
            "poll" | "delay" | "control" | "metrics" => a.parts.push(arg),
            "compare" => a
                .parts
                .extend(["control".into(), "delay".into(), "metrics".into()]),
            "--mb" => a.mb = num("--mb") as usize,
            "--polls" => a.polls = num("--polls").max(1) as usize,
            "--seconds" => a.seconds = num("--seconds"),
            "--interval-ms" => a.interval_ms = num("--interval-ms").max(1),
            "--sync-ms" => a.sync_ms = num("--sync-ms").max(1),
            "--bench" => {} // passed by `cargo bench`-style runners
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    if a.parts.is_empty() {
        a.parts = vec!["poll".into(), "delay".into()];
    }
    a
}

fn usage(why: &str) -> ! {
    eprintln!("vfs_bench: {why}\nusage: cargo run --release --example vfs_bench [-- poll|delay|control|metrics|compare] [--mb N] [--polls N] [--seconds N] [--interval-ms N] [--sync-ms N]");
    std::process::exit(2)
}

/// The `q` quantile (0..=1) of `xs`, in ms.
fn quantile(xs: &mut [f64], q: f64) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    if xs.is_empty() {
        return f64::NAN;
    }
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

async fn poll_part(a: &Args) {
    let litestream = stock_litestream::install();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("replica.db");
    let url = format!("file://{}", dir.path().join("backup").display());
    let watermark = Watermark::from_u64(123_456_789).to_string();
    eprintln!("writing a {} MB replica file…", a.mb);
    write_large_replica(&db, &watermark, a.mb << 20);
    eprintln!("litestream replicate…");
    let replication = litestream.replicate(&db, &url, &dir.path().join("litestream.yml"));
    replication
        .wait_for_backup(&url, Duration::from_secs(300))
        .await;
    // Let the snapshot finish, then stop litestream so that only the reads are timed.
    actix_rt::time::sleep(Duration::from_secs(3)).await;
    drop(replication);
    let backup_mb = dir_bytes(&dir.path().join("backup")) as f64 / (1 << 20) as f64;
    let db_mb = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0) as f64 / (1 << 20) as f64;

    let mut reader = VfsReader::new(VfsSource {
        helper: HelperCommand::for_service().expect("this executable"),
        extension: litestream.vfs.clone(),
        backup_url: url,
        query: DEFAULT_WATERMARK_QUERY.into(),
        env: Vec::new(),
    });
    let t = Instant::now();
    reader
        .start(Duration::from_secs(30))
        .await
        .expect("load the VFS extension");
    let load_ms = ms(t.elapsed());
    let mut polls = Vec::new();
    for _ in 0..a.polls {
        let t = Instant::now();
        let read = reader.read(Duration::from_secs(30)).await;
        polls.push(ms(t.elapsed()));
        let read = read.map(|r| r.watermark);
        assert_eq!(read.as_deref(), Ok(watermark.as_str()), "the poll read");
    }
    let first = polls[0];
    let mut rest = polls[1..].to_vec();
    if rest.is_empty() {
        rest.push(first);
    }
    let (p50, p90) = (quantile(&mut rest, 0.5), quantile(&mut rest, 0.9));
    println!(
        "{}",
        serde_json::json!({"bench": "vfs_poll", "dbMB": db_mb, "backupMB": backup_mb, "polls": a.polls,
            "loadMs": load_ms, "firstPollMs": first, "p50Ms": p50, "p90Ms": p90})
    );
    println!(
        "vfs poll on a {db_mb:.0} MB replica ({backup_mb:.0} MB backup): extension load {load_ms:.0} ms once; first poll {first:.1} ms, then p50 {p50:.1} ms, p90 {p90:.1} ms ({} polls)",
        a.polls
    );
}

/// One delay measure (`delay`, `control`, `metrics`): the service with `source`, a backup
/// replica replicated by litestream, transactions 50–150 ms apart; printed as two lines.
async fn delay_part(a: &Args, source: Source) {
    let litestream = stock_litestream::install();
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}", dir.path().join("backup").display());
    let db = dir.path().join("replica.db");
    let socket = dir.path().join("ls.sock");
    let up = FakeUpstream::start().await;
    let page = FakeLitestream::start(Answer::default()).await;
    let control = format!("unix:{}", socket.display());
    let db_path = db.display().to_string();
    let flags = service_flags(
        a,
        source,
        &up.url(),
        &url,
        &litestream,
        &control,
        &db_path,
        &page.url(),
    );
    let svc = TestService::start(&flags.iter().map(String::as_str).collect::<Vec<_>>()).await;
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    svc.wait_status("the initial sync", |s| s["replicaVersion"].is_string())
        .await;
    let rv = Watermark::from_u64(100).to_string();
    let replica = BackupReplica::start(&svc.base(), "backup", &rv, &rv, &db).await;
    let sync = format!("{}ms", a.sync_ms);
    let config = dir.path().join("litestream.yml");
    let replication = match source {
        Source::Vfs => litestream.replicate_with(
            &config,
            &stock_litestream::replicate_config(&replica.db, &url, &sync),
        ),
        Source::Control | Source::Metrics => {
            litestream.replicate_controlled(&replica.db, &url, &config, &socket, &sync)
        }
    };
    if source != Source::Vfs {
        replication
            .wait_for_socket(&socket, Duration::from_secs(30))
            .await;
    }
    let exporter = (source == Source::Metrics).then(|| {
        let control = ControlClient::new(ControlUrl::parse(&control).expect("the socket's URL"));
        actix_rt::spawn(export_progress(
            control,
            db_path.clone(),
            replica.progress.clone(),
            page.clone(),
            Duration::from_millis(a.sync_ms),
        ))
    });
    // The control source confirms acked commits only: one before the measure starts.
    up.send(txn(101, 1));
    svc.wait_status("the first backup confirmed", |s| confirmed(s).is_some())
        .await;
    let reads_before = backup_reads(&svc).await;
    let writer = write_every_50_to_150_ms(&up);
    let seen = watch_confirmed(&svc, Duration::from_secs(a.seconds)).await;
    writer.abort();
    if let Some(exporter) = exporter {
        exporter.abort();
    }
    let reads = backup_reads(&svc).await - reads_before;
    let reads_per = reads as f64 / seen.len().max(1) as f64;
    let mut delays = delays(&replica.progress.borrow(), &seen);
    print_delays(a, source, &mut delays, reads_per);
    drop(replication);
    svc.stop().await;
    up.stop().await;
}

/// The service's flags for a delay measure with `source`.
#[allow(clippy::too_many_arguments)]
fn service_flags(
    a: &Args,
    source: Source,
    up_url: &str,
    backup_url: &str,
    litestream: &stock_litestream::Litestream,
    control: &str,
    db_path: &str,
    page_url: &str,
) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--upstream",
        up_url,
        "--litestream-backup-url",
        backup_url,
        "--backup-check-interval-ms",
        &a.interval_ms.to_string(),
        "--min-cleanup-delay-ms",
        "3600000",
    ]
    .map(String::from)
    .into();
    let vfs = litestream.vfs.to_string_lossy().into_owned();
    let more: Vec<&str> = match source {
        Source::Vfs => vec!["--litestream-vfs", &vfs],
        Source::Control => vec![
            "--litestream-control-url",
            control,
            "--litestream-db-path",
            db_path,
        ],
        Source::Metrics => vec!["--litestream-metrics-url", page_url],
    };
    flags.extend(more.into_iter().map(String::from));
    flags
}

/// The service's backup reads so far (`/status`'s `backupReadsTotal`).
async fn backup_reads(svc: &TestService) -> u64 {
    svc.status().await["backup"]["monitor"]["backupReadsTotal"]
        .as_u64()
        .unwrap_or(0)
}

/// Sends transactions from 102 on, until aborted.
fn write_every_50_to_150_ms(up: &FakeUpstream) -> actix_rt::task::JoinHandle<()> {
    let up = up.clone();
    actix_rt::spawn(async move {
        // 50–150 ms apart, pseudo-randomly, so that commits fall at every phase of the
        // poll and sync periods (a fixed period would lock onto one).
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for n in 102.. {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            actix_rt::time::sleep(Duration::from_millis(50 + state % 101)).await;
            up.send(txn(n, 1));
        }
    })
}

/// Each backed-up watermark the service's `/status` shows (read every 5 ms for `long`), with
/// when it first showed.
async fn watch_confirmed(svc: &TestService, long: Duration) -> Vec<(Instant, String)> {
    let start = Instant::now();
    let mut seen: Vec<(Instant, String)> = Vec::new();
    while start.elapsed() < long {
        let st = svc.status().await;
        if let Some(w) = confirmed(&st) {
            if seen.last().is_none_or(|(_, last)| *last != w) {
                seen.push((Instant::now(), w));
            }
        }
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    seen
}

/// For each watermark the replica committed, ms until the service showed one at or above it.
fn delays(progress: &Progress, seen: &[(Instant, String)]) -> Vec<f64> {
    let committed: Vec<(String, Instant)> = progress
        .committed_at
        .iter()
        .map(|(w, t)| (w.clone(), *t))
        .collect();
    committed
        .iter()
        .filter_map(|(w, at)| {
            seen.iter()
                .find(|(t, s)| t >= at && s.as_str() >= w.as_str())
                .map(|(t, _)| ms(*t - *at))
        })
        .collect()
}

/// The delay measure's JSON line and line for people.
fn print_delays(a: &Args, source: Source, delays: &mut [f64], reads_per: f64) {
    let n = delays.len();
    let (p50, p99) = (quantile(delays, 0.5), quantile(delays, 0.99));
    let (bench, through) = match source {
        Source::Vfs => ("vfs_delay", "through the VFS"),
        Source::Control => ("control_delay", "through the control socket"),
        Source::Metrics => (
            "metrics_delay",
            "through a /metrics page updated at each litestream sync",
        ),
    };
    println!(
        "{}",
        serde_json::json!({"bench": bench, "pollIntervalMs": a.interval_ms, "litestreamSyncMs": a.sync_ms,
            "watermarks": n, "p50Ms": p50, "p99Ms": p99, "backupReadsPerConfirmation": reads_per})
    );
    println!(
        "watermark committed in the backup replica -> confirmed by the service {through}: p50 {p50:.0} ms, p99 {p99:.0} ms ({n} watermarks; poll every {} ms, litestream sync every {} ms; {reads_per:.2} backup reads per watermark confirmed)",
        a.interval_ms, a.sync_ms
    );
}

/// The newest watermark the service counts as backed up: what the latest poll read or
/// litestream confirmed, or (the metrics source, whose monitor reports none) the newest one
/// recorded from the page (the bench's cleanup delay keeps every one recorded).
fn confirmed(st: &serde_json::Value) -> Option<String> {
    let polled = st["backup"]["monitor"]["backupWatermark"].as_str();
    let recorded = st["backup"]["pendingWatermarks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["watermark"].as_str())
        .max();
    polled.max(recorded).map(str::to_string)
}

/// The stand-in for Zero's litestream fork's `litestream_replica_progress` (see the module
/// documentation): every `period`, a sync of the replica's file through the real litestream,
/// then the newest watermark committed before it, shown on `page` as backed up now.
async fn export_progress(
    control: ControlClient,
    db_path: String,
    progress: std::rc::Rc<std::cell::RefCell<Progress>>,
    page: FakeLitestream,
    period: Duration,
) {
    let mut tick = actix_rt::time::interval(period);
    loop {
        tick.tick().await;
        let newest = progress.borrow().committed_at.keys().max().cloned();
        let Some(w) = newest else { continue };
        if control
            .sync_wait(&db_path, Duration::from_secs(10))
            .await
            .is_err()
        {
            continue;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        page.set_body(render_page(
            &db_path,
            &[(Some(&w), "file", format!("{:.3}", now.as_secs_f64()))],
        ));
    }
}

fn main() -> std::process::ExitCode {
    // The service and the reader in this process start their VFS reader from this binary.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == vfs_reader::SUBCOMMAND)
    {
        return vfs_reader::run();
    }
    let args = parse_args();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error")).init();
    actix_rt::System::new().block_on(async {
        for part in &args.parts {
            match part.as_str() {
                "poll" => poll_part(&args).await,
                "control" => delay_part(&args, Source::Control).await,
                "metrics" => delay_part(&args, Source::Metrics).await,
                _ => delay_part(&args, Source::Vfs).await,
            }
        }
    });
    std::process::ExitCode::SUCCESS
}
