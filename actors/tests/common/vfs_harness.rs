//! The VFS source's actor-level harness: a SQLite database replicated by a real `litestream
//! replicate` to a `file://` replica, a [`MonitorActor`] reading it back through the VFS reader
//! process, and the pids of this test process's readers; shared by `vfs_source.rs` and
//! `vfs_reader_process.rs`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::recording_purge::RecordingPurge;
use actix::prelude::*;
use change_streamer_actors::cleanup::{CleanupActor, GetCleanupState};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::monitor::{
    BackupSource, Check, GetMonitorStats, MonitorActor, MonitorConfig, PollOutcome,
};
use change_streamer_actors::reservation::BackupRead;
use change_streamer_actors::vfs::{HelperCommand, VfsSource, DEFAULT_WATERMARK_QUERY};
use change_streamer_test_support::stock_litestream::{self, Replication};
use rusqlite::Connection;
use tempfile::TempDir;

pub const START: i64 = 1_745_452_800_000; // 2025-04-24T00:00:00Z
pub const READER: &str = env!("CARGO_BIN_EXE_change-streamer-vfs-reader");

pub fn extension() -> PathBuf {
    stock_litestream::install().vfs
}

/// A SQLite database replicated by a real `litestream replicate` to a `file://` replica.
pub struct Replicated {
    pub dir: TempDir,
    pub db: Connection,
    pub litestream: Option<Replication>,
}

impl Replicated {
    /// The database with `stateVersion` = `watermark`; litestream is not started yet.
    pub fn new(watermark: &str) -> Replicated {
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

    pub fn backup_url(&self) -> String {
        format!("file://{}", self.dir.path().join("backup").display())
    }

    /// Starts `litestream replicate` with short intervals.
    pub fn replicate(&mut self) {
        self.litestream = Some(stock_litestream::install().replicate(
            &self.dir.path().join("replica.db"),
            &self.backup_url(),
            &self.dir.path().join("litestream.yml"),
        ));
    }

    /// Waits until litestream has written a snapshot to the replica.
    pub async fn wait_for_backup(&self) {
        let replication = self.litestream.as_ref().expect("litestream runs");
        replication
            .wait_for_backup(&self.backup_url(), Duration::from_secs(8))
            .await;
    }

    pub fn set_watermark(&self, watermark: &str) {
        self.db
            .execute(
                r#"UPDATE "_zero.replicationState" SET stateVersion = ?1"#,
                [watermark],
            )
            .unwrap();
    }

    pub fn source(&self, query: &str) -> VfsSource {
        VfsSource {
            helper: HelperCommand::program(READER),
            extension: extension(),
            backup_url: self.backup_url(),
            query: query.into(),
            env: Vec::new(),
        }
    }
}

/// Records the backups the monitor reports to the reservations.
#[derive(Default)]
pub struct Reads(pub Arc<Mutex<Vec<String>>>);
impl Actor for Reads {
    type Context = Context<Self>;
}
impl Handler<BackupRead> for Reads {
    type Result = ();
    fn handle(&mut self, m: BackupRead, _: &mut Context<Self>) {
        self.0.lock().unwrap().push(m.watermark.to_string());
    }
}

pub struct Harness {
    pub clock: Clock,
    pub scheduled: Arc<Mutex<Vec<String>>>,
    pub cleanup: Addr<CleanupActor>,
    pub monitor: Addr<MonitorActor>,
}

impl Harness {
    pub fn start(source: BackupSource, timeout: Duration) -> Harness {
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

    pub fn vfs(r: &Replicated) -> Harness {
        Self::start(
            BackupSource::Vfs(r.source(DEFAULT_WATERMARK_QUERY)),
            Duration::from_secs(3),
        )
    }

    pub async fn check(&self) -> PollOutcome {
        self.monitor.send(Check).await.expect("monitor")
    }

    /// (watermark, replica, backedUpAt ms) of every recorded, unscheduled watermark.
    pub async fn pending(&self) -> Vec<(String, String, i64)> {
        let state = self.cleanup.send(GetCleanupState).await.unwrap();
        state
            .pending_watermarks
            .into_iter()
            .map(|p| (p.watermark.to_string(), p.replica, p.backed_up_at_ms))
            .collect()
    }

    pub async fn errors(&self) -> u64 {
        self.monitor
            .send(GetMonitorStats)
            .await
            .unwrap()
            .poll_errors_total
    }
}

pub const READ_ONE: PollOutcome = PollOutcome::Read {
    samples: 1,
    invalid: 0,
};

/// The pids of this test process's VFS readers of `backup_url`.
pub fn reader_pids(backup_url: &str) -> Vec<u32> {
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
pub async fn readers_after_kill(backup_url: &str) -> Vec<u32> {
    for _ in 0..20 {
        if reader_pids(backup_url).is_empty() {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    reader_pids(backup_url)
}
