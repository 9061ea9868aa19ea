//! Actor-level tests of the VFS source (PROTOCOL.md §8.1b) against REAL stock litestream 0.5.17: a
//! SQLite file holding `"_zero.replicationState"(stateVersion, writeTimeMs)` is replicated by a
//! `litestream replicate` process to a `file://` replica, and the [`MonitorActor`] reads the
//! watermark back through litestream's VFS extension, in the `change-streamer-vfs-reader`
//! process. Also the metrics source's PROTOCOL.md §8.1 rule for stock litestream's page.
//!
//! litestream is installed on first use by `scripts/install-litestream.sh` (through
//! [`stock_litestream::install`], into `CHANGE_STREAMER_LITESTREAM_DIR` or `.tools/litestream`
//! at the repository root); these tests never skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use change_streamer_actors::cleanup::{CleanupActor, GetCleanupState};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::monitor::{
    BackupSource, Check, GetMonitorStats, MonitorActor, MonitorConfig, PollOutcome, Stop,
    VFS_REPLICA,
};
use change_streamer_actors::reservation::BackupRead;
use change_streamer_actors::vfs::{
    HelperCommand, VfsError, VfsReader, VfsSource, DEFAULT_WATERMARK_QUERY, ENV_READER,
};
use change_streamer_actors::vfs_reader::SUBCOMMAND;
use change_streamer_test_support::stock_litestream::{self, Replication};
use change_streamer_test_support::wait::wait_until;
use common::recording_purge::RecordingPurge;
use rusqlite::Connection;
use tempfile::TempDir;

const START: i64 = 1_745_452_800_000; // 2025-04-24T00:00:00Z
const READER: &str = env!("CARGO_BIN_EXE_change-streamer-vfs-reader");

fn extension() -> PathBuf {
    stock_litestream::install().vfs
}

/// A SQLite database replicated by a real `litestream replicate` to a `file://` replica.
struct Replicated {
    dir: TempDir,
    db: Connection,
    litestream: Option<Replication>,
}

impl Replicated {
    /// The database with `stateVersion` = `watermark`; litestream is not started yet.
    fn new(watermark: &str) -> Replicated {
        let dir = tempfile::tempdir().unwrap();
        let db = Connection::open(dir.path().join("replica.db")).unwrap();
        db.execute_batch(
            r#"PRAGMA journal_mode=WAL;
               CREATE TABLE "_zero.replicationState"(stateVersion TEXT NOT NULL, writeTimeMs INTEGER);"#,
        )
        .unwrap();
        db.execute(
            r#"INSERT INTO "_zero.replicationState" VALUES (?1, 0)"#,
            [watermark],
        )
        .unwrap();
        Replicated {
            dir,
            db,
            litestream: None,
        }
    }

    fn backup_url(&self) -> String {
        format!("file://{}", self.dir.path().join("backup").display())
    }

    /// Starts `litestream replicate` with short intervals.
    fn replicate(&mut self) {
        self.litestream = Some(stock_litestream::install().replicate(
            &self.dir.path().join("replica.db"),
            &self.backup_url(),
            &self.dir.path().join("litestream.yml"),
        ));
    }

    /// Waits until litestream has written a snapshot to the replica.
    async fn wait_for_backup(&self) {
        let replication = self.litestream.as_ref().expect("litestream runs");
        replication
            .wait_for_backup(&self.backup_url(), Duration::from_secs(8))
            .await;
    }

    fn set_watermark(&self, watermark: &str) {
        self.db
            .execute(
                r#"UPDATE "_zero.replicationState" SET stateVersion = ?1"#,
                [watermark],
            )
            .unwrap();
    }

    fn source(&self, query: &str) -> VfsSource {
        VfsSource {
            helper: HelperCommand::program(READER),
            extension: extension(),
            backup_url: self.backup_url(),
            query: query.into(),
        }
    }
}

/// Records the backups the monitor reports to the reservations.
#[derive(Default)]
struct Reads(Arc<Mutex<Vec<String>>>);
impl Actor for Reads {
    type Context = Context<Self>;
}
impl Handler<BackupRead> for Reads {
    type Result = ();
    fn handle(&mut self, m: BackupRead, _: &mut Context<Self>) {
        self.0.lock().unwrap().push(m.watermark.to_string());
    }
}

struct Harness {
    clock: Clock,
    scheduled: Arc<Mutex<Vec<String>>>,
    cleanup: Addr<CleanupActor>,
    monitor: Addr<MonitorActor>,
}

impl Harness {
    fn start(source: BackupSource, timeout: Duration) -> Harness {
        let clock = Clock::manual(START);
        let purge = RecordingPurge::default();
        let scheduled = purge.scheduled();
        let cleanup = CleanupActor::new(
            clock.clone(),
            Duration::ZERO,
            Duration::from_secs(30),
            purge.start().recipient(),
        )
        .start();
        let mut cfg = MonitorConfig::with_source(source, Duration::from_secs(60));
        cfg.clock = clock.clone();
        cfg.timeout = timeout;
        cfg.poll_automatically = false;
        let monitor = MonitorActor::new(cfg, cleanup.clone()).start();
        Harness {
            clock,
            scheduled,
            cleanup,
            monitor,
        }
    }

    fn vfs(r: &Replicated) -> Harness {
        Self::start(
            BackupSource::Vfs(r.source(DEFAULT_WATERMARK_QUERY)),
            Duration::from_secs(3),
        )
    }

    async fn check(&self) -> PollOutcome {
        self.monitor.send(Check).await.expect("monitor")
    }

    /// (watermark, replica, backedUpAt ms) of every recorded, unscheduled watermark.
    async fn pending(&self) -> Vec<(String, String, i64)> {
        let state = self.cleanup.send(GetCleanupState).await.unwrap();
        state
            .pending_watermarks
            .into_iter()
            .map(|p| (p.watermark.to_string(), p.replica, p.backed_up_at_ms))
            .collect()
    }

    async fn errors(&self) -> u64 {
        self.monitor
            .send(GetMonitorStats)
            .await
            .unwrap()
            .poll_errors_total
    }
}

const READ_ONE: PollOutcome = PollOutcome::Read {
    samples: 1,
    invalid: 0,
};

/// The pids of this test process's VFS readers of `backup_url`.
fn reader_pids(backup_url: &str) -> Vec<u32> {
    let env = format!("LITESTREAM_REPLICA_URL={backup_url}");
    let me = std::process::id().to_string();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if fields.get(1) == Some(&me.as_str())
            && fields.first() != Some(&"Z")
            && exe == Path::new(READER)
            && std::fs::read(format!("/proc/{pid}/environ"))
                .unwrap_or_default()
                .split(|b| *b == 0)
                .any(|v| v == env.as_bytes())
        {
            pids.push(pid);
        }
    }
    pids
}

/// The readers left once a SIGKILL has had a moment to land.
async fn readers_after_kill(backup_url: &str) -> Vec<u32> {
    for _ in 0..20 {
        if reader_pids(backup_url).is_empty() {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    reader_pids(backup_url)
}

#[actix_rt::test]
async fn reads_the_backed_up_watermark_through_the_vfs() {
    let mut r = Replicated::new("0a");
    r.replicate();
    r.wait_for_backup().await;
    let h = Harness::vfs(&r);

    assert_eq!(h.check().await, READ_ONE);
    assert_eq!(
        h.pending().await,
        vec![("0a".into(), VFS_REPLICA.into(), START)]
    );
    let stats = h.monitor.send(GetMonitorStats).await.unwrap();
    assert_eq!(
        stats.backup_watermark.map(|w| w.to_string()),
        Some("0a".into())
    );
}

#[actix_rt::test]
async fn each_watermark_read_through_the_vfs_is_reported_to_the_reservations() {
    let mut r = Replicated::new("0a");
    r.replicate();
    r.wait_for_backup().await;
    let reads = Reads::default();
    let seen = reads.0.clone();
    let clock = Clock::manual(START);
    let cleanup = CleanupActor::new(
        clock.clone(),
        Duration::ZERO,
        Duration::from_secs(30),
        RecordingPurge::default().start().recipient(),
    )
    .start();
    let mut cfg = MonitorConfig::with_source(
        BackupSource::Vfs(r.source(DEFAULT_WATERMARK_QUERY)),
        Duration::from_secs(60),
    );
    cfg.clock = clock;
    cfg.timeout = Duration::from_secs(3);
    cfg.poll_automatically = false;
    let monitor = MonitorActor::new(cfg, cleanup)
        .reporting_backups_to(reads.start().recipient())
        .start();
    assert_eq!(monitor.send(Check).await.unwrap(), READ_ONE);
    assert_eq!(monitor.send(Check).await.unwrap(), READ_ONE);
    wait_until("two reports", Duration::from_secs(5), || {
        seen.lock().unwrap().len() >= 2
    })
    .await;
    assert_eq!(
        *seen.lock().unwrap(),
        vec!["0a".to_string(), "0a".to_string()]
    );
}

#[actix_rt::test]
async fn backup_time_is_the_first_poll_that_read_the_watermark() {
    let mut r = Replicated::new("0a");
    r.replicate();
    r.wait_for_backup().await;
    let h = Harness::vfs(&r);
    assert_eq!(h.check().await, READ_ONE);

    r.set_watermark("0b");
    // Until litestream has synced the update, polls still read 0a, first read at START.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut t = 0;
    loop {
        t += 100;
        h.clock.set_ms(START + t);
        assert_eq!(h.check().await, READ_ONE);
        let pending = h.pending().await;
        assert_eq!(pending[0], ("0a".into(), VFS_REPLICA.into(), START));
        if pending.len() == 2 {
            assert_eq!(pending[1], ("0b".into(), VFS_REPLICA.into(), START + t));
            break;
        }
        assert!(Instant::now() < deadline, "0b never read back");
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    // Later polls keep 0b's first read time: 0a is due 30 s after START, 0b 30 s after t.
    h.clock.set_ms(START + t + 29_999);
    assert_eq!(h.check().await, READ_ONE);
    assert_eq!(*h.scheduled.lock().unwrap(), vec!["0a".to_string()]);
    h.clock.set_ms(START + t + 30_000);
    assert_eq!(h.check().await, READ_ONE);
    assert_eq!(
        *h.scheduled.lock().unwrap(),
        vec!["0a".to_string(), "0b".to_string()]
    );
}

#[actix_rt::test]
async fn no_backup_yet_is_a_poll_error_then_read_once_it_exists() {
    let mut r = Replicated::new("0a");
    let h = Harness::start(
        BackupSource::Vfs(r.source(DEFAULT_WATERMARK_QUERY)),
        Duration::from_millis(2500),
    );
    let started = Instant::now();
    let outcome = h.check().await;
    assert!(
        matches!(&outcome, PollOutcome::Failed(e) if e.contains("no backup yet")),
        "{outcome:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(3500));
    assert_eq!(h.errors().await, 1);
    assert_eq!(h.pending().await, vec![]);
    assert_eq!(
        readers_after_kill(&r.backup_url()).await,
        Vec::<u32>::new(),
        "the waiting reader is killed"
    );

    r.replicate();
    r.wait_for_backup().await;
    assert_eq!(h.check().await, READ_ONE);
    assert_eq!(
        h.pending().await,
        vec![("0a".into(), VFS_REPLICA.into(), START)]
    );
}

#[actix_rt::test]
async fn a_wedged_reader_is_killed_and_replaced() {
    let mut r = Replicated::new("0a");
    r.replicate();
    r.wait_for_backup().await;
    let h = Harness::start(
        BackupSource::Vfs(r.source(DEFAULT_WATERMARK_QUERY)),
        Duration::from_millis(2500),
    );
    assert_eq!(h.check().await, READ_ONE);
    let wedged = reader_pids(&r.backup_url());
    assert_eq!(wedged.len(), 1);
    let stopped = Command::new("kill")
        .args(["-STOP", &wedged[0].to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());

    let started = Instant::now();
    let outcome = h.check().await;
    assert!(matches!(outcome, PollOutcome::Failed(_)), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_millis(3500));
    assert_eq!(h.errors().await, 1);

    assert_eq!(readers_after_kill(&r.backup_url()).await, Vec::<u32>::new());
    h.clock.advance_ms(1000);
    assert_eq!(h.check().await, READ_ONE);
    let replaced = reader_pids(&r.backup_url());
    assert_eq!(replaced.len(), 1);
    assert_ne!(replaced, wedged, "a new reader answered");
}

#[actix_rt::test]
async fn a_poll_timeout_shorter_than_the_load_still_gets_a_reader_up() {
    let mut r = Replicated::new("0a");
    r.replicate();
    r.wait_for_backup().await;
    // Loading takes ~0.3 s; each poll may wait 100 ms.
    let h = Harness::start(
        BackupSource::Vfs(r.source(DEFAULT_WATERMARK_QUERY)),
        Duration::from_millis(100),
    );
    let outcome = h.check().await;
    assert!(
        matches!(&outcome, PollOutcome::Failed(e) if e.contains("still loading")),
        "{outcome:?}"
    );
    // Each poll that finds the reader still loading must find the same reader: it was kept.
    // Once it has loaded, a read that runs past the 100 ms is a timeout like any other (the
    // machine may be busy) and the next poll starts a new reader, loaded the same way.
    let mut loading = reader_pids(&r.backup_url());
    assert_eq!(loading.len(), 1);
    let mut was_loading = true;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let outcome = h.check().await;
        if outcome == READ_ONE {
            break;
        }
        assert!(Instant::now() < deadline, "the reader never answered");
        let now = reader_pids(&r.backup_url());
        match &outcome {
            PollOutcome::Failed(e) if e.contains("still loading") => {
                if was_loading {
                    assert!(
                        now.iter().any(|p| loading.contains(p)),
                        "the loading reader was kept: {loading:?} then {now:?}"
                    );
                }
                loading = now;
                was_loading = true;
            }
            _ => was_loading = false,
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_rt::test]
async fn stopping_the_monitor_kills_the_reader_in_flight() {
    let r = Replicated::new("0a");
    let h = Harness::start(
        BackupSource::Vfs(r.source(DEFAULT_WATERMARK_QUERY)),
        Duration::from_secs(30),
    );
    let monitor = h.monitor.clone();
    let poll = actix_rt::spawn(async move { monitor.send(Check).await });
    // No backup: the reader waits in the extension.
    let deadline = Instant::now() + Duration::from_secs(5);
    while reader_pids(&r.backup_url()).is_empty() {
        assert!(Instant::now() < deadline, "no reader started");
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    h.monitor.send(Stop).await.unwrap();
    let aborted = poll.await.unwrap();
    assert!(
        matches!(aborted, Ok(PollOutcome::Aborted) | Err(_)),
        "{aborted:?}"
    );
    assert_eq!(readers_after_kill(&r.backup_url()).await, Vec::<u32>::new());
}

#[actix_rt::test]
async fn a_failing_query_a_non_text_watermark_or_no_row_is_a_poll_error() {
    let mut r = Replicated::new("0a");
    r.replicate();
    r.wait_for_backup().await;
    for (query, reason) in [
        ("SELECT nope FROM nowhere", "no such table"),
        ("SELECT 42", "integer, not text"),
        (
            r#"SELECT stateVersion FROM "_zero.replicationState" WHERE 0"#,
            "no row",
        ),
    ] {
        let h = Harness::start(BackupSource::Vfs(r.source(query)), Duration::from_secs(3));
        let outcome = h.check().await;
        assert!(
            matches!(&outcome, PollOutcome::Failed(e) if e.contains(reason)),
            "{query}: {outcome:?}"
        );
        assert_eq!(h.errors().await, 1);
        assert_eq!(h.pending().await, vec![]);
    }
}

#[actix_rt::test]
async fn an_extension_that_cannot_be_loaded_is_reported_at_start() {
    let r = Replicated::new("0a");
    let mut source = r.source(DEFAULT_WATERMARK_QUERY);
    source.extension = r.dir.path().join("not-an-extension.so");
    let mut reader = VfsReader::new(source);
    let err = reader.start(Duration::from_secs(3)).await.unwrap_err();
    assert!(
        matches!(&err, VfsError::Spawn { reason, .. } if reason.contains("cannot load")),
        "{err:?}"
    );
    assert!(reader.start(Duration::from_secs(3)).await.is_err());
    let mut good = VfsReader::new(r.source(DEFAULT_WATERMARK_QUERY));
    good.start(Duration::from_secs(3)).await.unwrap();
}

#[actix_rt::test]
async fn the_service_runs_the_reader_named_by_its_environment() {
    std::env::set_var(ENV_READER, READER);
    let helper = HelperCommand::for_service().unwrap();
    assert_eq!(
        (helper.program.as_path(), helper.args.as_slice()),
        (Path::new(READER), &[SUBCOMMAND.into()][..])
    );
    let r = Replicated::new("0a");
    let mut source = r.source(DEFAULT_WATERMARK_QUERY);
    source.helper = helper;
    VfsReader::new(source)
        .start(Duration::from_secs(3))
        .await
        .unwrap();
}

#[actix_rt::test]
async fn metrics_page_without_progress_is_a_poll_error_naming_litestream_vfs() {
    use actix_web::{web, App, HttpServer};
    // What stock litestream 0.5 exports: no litestream_replica_progress.
    let server = HttpServer::new(|| {
        App::new().route(
            "/metrics",
            web::get().to(|| async {
                "# TYPE litestream_db_size gauge\nlitestream_db_size{db=\"/x.db\"} 4096\n\
                 litestream_txid{db=\"/x.db\"} 7\n"
            }),
        )
    })
    .workers(1)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    actix_rt::spawn(server.run());

    let h = Harness::start(
        BackupSource::Metrics {
            url: format!("http://{addr}/metrics"),
        },
        Duration::from_secs(3),
    );
    let outcome = h.check().await;
    assert!(
        matches!(&outcome, PollOutcome::Failed(e)
            if e.contains("litestream_replica_progress") && e.contains("--litestream-vfs")),
        "{outcome:?}"
    );
    assert_eq!(h.errors().await, 1);
}
