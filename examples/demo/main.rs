//! A live demo of the whole pipeline on loopback, from one command:
//!
//! ```sh
//! cargo run --release --example demo            # until Ctrl-C
//! cargo run --release --example demo -- --seconds 30
//! cargo run --release --example demo -- --change-db postgres://postgres@127.0.0.1:5432/demo \
//!     [--kill-after 10] [--seconds 30]
//! ```
//!
//! With `--change-db` it is the other demo, [`takeover`]: three service processes sharing that
//! PostgreSQL change DB with subscribers at each, and a `kill -9` of the owner on Enter (or
//! after `--kill-after` seconds) to watch a standby take over with no standby's subscriber
//! dropped. What follows is the default demo.
//!
//! It starts the real service (its embedded change log in a temporary directory) and, around
//! it, stand-ins for the outside world:
//! - an upstream change source writing transactions of 1–5 rows, about 200 a second;
//! - a `backup` replica that follows the stream. When stock litestream 0.5 is installed
//!   (`scripts/install-litestream.sh` puts it in `.tools/litestream`; or `LITESTREAM_BIN` and
//!   `LITESTREAM_VFS` name it), the replica applies the stream to its own SQLite file, a real
//!   `litestream replicate` backs that up to a local `file://` replica (a bucket of a local S3
//!   server when moto is installed too: `scripts/install-moto.sh`), the service asks
//!   litestream's control API (its unix socket, `--litestream-control-url`) to sync and wait at
//!   each commit the backup replica acks, so it learns what is backed up without reading the
//!   backup (PROTOCOL.md §8.1c), and the restoring replicas below really `litestream restore`.
//!   Otherwise a stand-in litestream `/metrics`
//!   endpoint reports, every second, the last watermark that replica applied as backed up. The
//!   first line says which;
//! - three serving replicas that reserve a snapshot, "restore" for a few seconds, subscribe with
//!   `initial=true` from the last backed-up watermark, and follow live changes;
//! - one replica that stops reading after a while: flow control releases the others by
//!   consensus, and liveness drops it.
//!
//! Once a second it prints a compact view of the service, taken only from the service's own
//! `/status` and `/metrics`; on Ctrl-C (or after `--seconds`) a summary line, then it stops
//! everything cleanly.
use std::cell::RefCell;
use std::io::{IsTerminal, Write};
use std::rc::Rc;
use std::time::{Duration, Instant};

use change_streamer_actors::vfs_reader;
use change_streamer_test_support::backup_files::BackupFiles;
use change_streamer_test_support::backup_replica::BackupReplica;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream::{Answer, FakeLitestream};
use change_streamer_test_support::s3;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::stock_litestream;
use change_streamer_test_support::upstream::FakeUpstream;

mod args;
mod takeover;
mod view;
mod world;

use change_streamer_test_support::status::Status;
use view::{commits, departure, metric, view, LEGEND};
use world::{follow, litestream_reports, replica, write_transactions, Applied, Restore};

const REPLICAS: usize = 3;

/// A secret for this run: 32 hex digits from the kernel's random source.
pub fn demo_secret() -> String {
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if let Err(e) = read {
        eprintln!("demo: cannot read /dev/urandom ({e}); using the time as the secret's seed");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        bytes = now.as_nanos().to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
/// Where the demo's backup goes and how the service learns it is backed up: real litestream's
/// control socket (PROTOCOL.md §8.1c), or the stand-in `/metrics` page.
struct Backup {
    real: Option<stock_litestream::Litestream>,
    /// The backup replica's file, litestream's socket and config, and the replica real
    /// litestream writes: a bucket of a local S3 server of its own when moto is installed
    /// (`scripts/install-moto.sh`, kept until the end), else a `file://` folder.
    files: BackupFiles,
    _dir: tempfile::TempDir,
}

/// `/status` read into its one client type (a key the service renamed stops the demo, naming it).
async fn status(svc: &TestService) -> Status {
    Status::from_value(svc.status().await).unwrap_or_else(|e| panic!("demo: {e}"))
}

async fn run(seconds: Option<u64>, source: Option<args::BackupSource>) {
    let backup = Backup::new(source);
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let svc = start_service(&backup, &up, &lite).await;
    let base = svc.base();

    up.wait_connections(1).await;
    actix_rt::spawn(write_transactions(up.clone(), 200));
    // Wait for the initial sync, then start the backup replica and litestream's reports.
    let mut st = status(&svc).await;
    while st.replica_version.is_none() {
        actix_rt::time::sleep(Duration::from_millis(20)).await;
        st = status(&svc).await;
    }
    let rv = st.replica_version.clone().unwrap_or_else(|| "00".into());
    // Kept until the end: dropping it stops litestream.
    let (restore, _replication) = backup.start(&svc, &rv, &lite).await;
    for i in 0..REPLICAS {
        let restore_for = Duration::from_millis(2000 + 1000 * i as u64);
        actix_rt::spawn(replica(
            base.clone(),
            svc.credentials.clone(),
            format!("r{}", i + 1),
            restore_for,
            restore.clone(),
            None,
        ));
    }
    actix_rt::spawn(replica(
        base.clone(),
        svc.credentials.clone(),
        "stalled".into(),
        Duration::from_millis(1500),
        restore,
        Some(Duration::from_secs(4)),
    ));
    let start = watch(&svc, seconds).await;
    print_summary(&svc, start).await;
    svc.stop().await;
    up.stop().await;
}

impl Backup {
    /// Real litestream with `--backup-source control`, the stand-in with `metrics`, else real
    /// litestream if installed; says which.
    fn new(source: Option<args::BackupSource>) -> Backup {
        let real = match source {
            None => stock_litestream::installed(),
            Some(args::BackupSource::Metrics) => None,
            Some(args::BackupSource::Control) => Some(stock_litestream::installed().unwrap_or_else(|| {
                eprintln!("demo: --backup-source control needs stock litestream 0.5: run scripts/install-litestream.sh");
                std::process::exit(2)
            })),
        };
        match &real {
            Some(l) => println!(
                "change-streamer demo with real litestream ({}): the service confirms each backed-up commit through litestream's control API",
                l.bin.display(),
            ),
            None => println!(
                "change-streamer demo with a stand-in litestream /metrics page (scripts/install-litestream.sh installs real litestream 0.5 and its VFS for this demo)"
            ),
        }
        let dir = tempfile::tempdir().expect("tempdir");
        // With real litestream and moto installed, the backup goes where deployments keep it.
        let files = match real.as_ref().and(s3::installed()) {
            Some(_) => {
                let files = BackupFiles::on_own_s3_bucket(dir.path(), "demo");
                println!(
                    "the backup goes to {} (moto, a local S3 server)",
                    files.url()
                );
                files
            }
            None => BackupFiles::in_dir(dir.path()),
        };
        Backup {
            real,
            files,
            _dir: dir,
        }
    }

    /// The service's `--litestream-backup-url`, and the flags of its backup source.
    fn flags(&self, lite: &FakeLitestream) -> (String, Vec<String>) {
        match &self.real {
            // With real litestream: its control socket, and the backup replica's file as
            // litestream.yml names it (PROTOCOL.md §8.1c).
            Some(_) => (self.files.url(), self.files.control_flags()[2..].to_vec()),
            None => (
                "s3://demo-bucket/replica".to_string(),
                vec!["--litestream-metrics-url".to_string(), lite.url()],
            ),
        }
    }

    /// The backup: a backup replica replicated by real litestream, or a backup subscriber
    /// whose last commit the stand-in page reports; how restoring replicas restore, and the
    /// replication (kept until the end: dropping it stops litestream).
    async fn start(
        &self,
        svc: &TestService,
        rv: &str,
        lite: &FakeLitestream,
    ) -> (Restore, Option<stock_litestream::Replication>) {
        let base = svc.base();
        match &self.real {
            Some(l) => {
                let _replica = BackupReplica::start_with(
                    &svc.credentials,
                    &base,
                    "backup",
                    rv,
                    rv,
                    &self.files.db(),
                )
                .await;
                // litestream syncs every second by itself too, and the service asks it on
                // each ack; returned once its control socket accepts connections.
                let replication = self.files.replicate_controlled_every(l, "1s").await;
                let restore = Restore::Real {
                    litestream: self.files.litestream(l),
                    url: self.files.url(),
                    dir: self.files.dir.clone(),
                };
                (restore, Some(replication))
            }
            None => {
                let applied: Applied = Rc::new(RefCell::new(None));
                let backed_up: Applied = Rc::new(RefCell::new(None));
                let backup = WsClient::connect_with(&format!(
                    "ws://{base}/replication/v6/changes?id=backup&mode=backup&replicaVersion={rv}&watermark={rv}"
                ), &svc.credentials)
                .await;
                actix_rt::spawn(follow(backup, Some(applied.clone()), None));
                actix_rt::spawn(litestream_reports(
                    lite.clone(),
                    applied.clone(),
                    backed_up.clone(),
                ));
                (Restore::Reported(backed_up), None)
            }
        }
    }
}

/// The service, with a secret made for this run and the backup's flags; says where it is.
async fn start_service(backup: &Backup, up: &FakeUpstream, lite: &FakeLitestream) -> TestService {
    let up_url = up.url();
    let (backup_url, source_flags) = backup.flags(lite);
    let source = source_flags[1].clone();
    // The service asks for a secret, as a production one should: made here, for this run.
    let secret = demo_secret();
    let mut args: Vec<&str> = vec![
        "--secret",
        &secret,
        "--upstream",
        &up_url,
        "--litestream-backup-url",
        &backup_url,
        "--backup-check-interval-ms",
        "1000",
        "--min-cleanup-delay-ms",
        "3000",
        "--purge-delay-ms",
        "1000",
        "--change-log-retention-ms",
        "3000",
        "--flow-control-consensus-padding-seconds",
        "0.5",
        "--ping-interval-ms",
        "3000",
    ];
    args.extend(source_flags.iter().map(String::as_str));
    let svc = TestService::start(&args).await;
    let base = svc.base();
    println!(
        "  service on http://{base}  (data in {})",
        svc.dir.path().display()
    );
    println!("  upstream {up_url}   litestream {source}   backup {backup_url}   Ctrl-C to stop\n");
    println!("{LEGEND}");
    svc
}

/// The view every second (redrawn on a terminal, appended otherwise) until Ctrl-C or
/// `seconds`; when it started.
async fn watch(svc: &TestService, seconds: Option<u64>) -> Instant {
    let tty = std::io::stdout().is_terminal();
    let start = Instant::now();
    let mut tick = actix_rt::time::interval(Duration::from_secs(1));
    let mut warmed = false;
    let mut subscribers = Subscribers::default();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = tick.tick() => {}
        }
        let t = start.elapsed().as_secs();
        if seconds.is_some_and(|s| t >= s) {
            break;
        }
        let st = status(svc).await;
        let (_, metrics) = svc.get("/metrics").await;
        let subscribed = subscribers.update(t, &st, &metrics, tty);
        if !warmed {
            let total = REPLICAS + 2;
            warmed = subscribed >= total;
            if !warmed {
                let bar: String = (0..total)
                    .map(|i| if i < subscribed { '#' } else { '.' })
                    .collect();
                println!("warming up [{bar}] {subscribed}/{total} replicas subscribed, {} reservation(s) restoring", st.reservations.len());
                continue;
            }
        }
        if tty {
            print!("\x1b[2J\x1b[H");
        }
        print!("{}", view(t, &st, &metrics));
        if tty {
            for line in &subscribers.departures {
                println!("{line}");
            }
        }
        let _ = std::io::stdout().flush();
    }
    start
}

/// Subscribers seen so far, and one line for each that has left since.
#[derive(Default)]
struct Subscribers {
    seen: Vec<String>,
    departures: Vec<String>,
}

impl Subscribers {
    /// The subscribers `/status` lists at second `t`: a line for each gone since (printed at
    /// once unless on a terminal); how many are subscribed.
    fn update(&mut self, t: u64, st: &Status, metrics: &str, tty: bool) -> usize {
        let ids: Vec<String> = st.subscribers.iter().map(|s| s.id.clone()).collect();
        let subscribed = ids.len();
        let consensus = metric(
            metrics,
            "change_streamer_flow_control_releases_total{mode=\"consensus\"}",
        );
        for gone in self.seen.iter().filter(|id| !ids.contains(id)) {
            let line = departure(t, gone, consensus);
            if !tty {
                println!("{line}");
            }
            self.departures.push(line);
        }
        self.seen.retain(|id| ids.contains(id));
        for id in ids {
            if !self.seen.contains(&id) {
                self.seen.push(id);
            }
        }
        subscribed
    }
}

/// The run's summary line: what was stored, purged, cleaned up and released.
async fn print_summary(svc: &TestService, start: Instant) {
    let st = status(svc).await;
    let (_, metrics) = svc.get("/metrics").await;
    let backup = st.backup.as_ref();
    let summary = serde_json::json!({
        "seconds": start.elapsed().as_secs(),
        "transactionsStored": commits(&st),
        "changesStored": metric(&metrics, "change_streamer_changes_stored_total"),
        "rowsPurged": st.purge.as_ref().map_or(0, |p| p.rows_purged),
        "cleanupsScheduled": metric(&metrics, "change_streamer_cleanups_scheduled_total"),
        "cleanupDelayMs": backup.map_or(0, |b| b.cleanup_delay_ms),
        "backupSource": backup.map(|b| b.source.clone()),
        "backupReads": backup.and_then(|b| b.monitor.as_ref()).map_or(0, |m| m.backup_reads_total),
        "backupConfirmed": st.backups.iter().flatten().map(|b| b.watermark.clone()).collect::<Vec<_>>(),
        "subscribersAtEnd": st.subscribers.len(),
        "releasesAll": metric(&metrics, "change_streamer_flow_control_releases_total{mode=\"all\"}"),
        "releasesConsensus": metric(&metrics, "change_streamer_flow_control_releases_total{mode=\"consensus\"}"),
    });
    println!("\nsummary: {summary}");
}

fn main() -> std::process::ExitCode {
    // The service in this process starts its VFS reader from this binary (PROTOCOL.md §8.1b).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == vfs_reader::SUBCOMMAND)
    {
        return vfs_reader::run();
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == takeover::SERVE)
    {
        return takeover::serve();
    }
    let args = args::parse_args();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match args.change_db {
        Some(db) => {
            actix_rt::System::new().block_on(takeover::run(db, args.seconds, args.kill_after))
        }
        None => actix_rt::System::new().block_on(run(args.seconds, args.backup_source)),
    }
    std::process::ExitCode::SUCCESS
}
