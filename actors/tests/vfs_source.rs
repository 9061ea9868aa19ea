//! Actor-level tests of the VFS source (PROTOCOL.md §8.1b) against REAL stock litestream 0.5.17: a
//! SQLite file holding `"_zero.replicationState"(stateVersion, writeTimeMs)` is replicated by a
//! `litestream replicate` process to a `file://` replica, and the [`MonitorActor`] reads the
//! watermark back through litestream's VFS extension, in the `change-streamer-vfs-reader`
//! process: what is read, when, and what a failed read is. Also the metrics source's
//! PROTOCOL.md §8.1 rule for stock litestream's page. The reader process's life (killed,
//! replaced, stopped, named by the environment) is in `vfs_reader_process.rs`.
//!
//! litestream is installed on first use by `scripts/install-litestream.sh` (through
//! [`stock_litestream::install`], into `CHANGE_STREAMER_LITESTREAM_DIR` or `.tools/litestream`
//! at the repository root); these tests never skip.

mod common;

use std::time::{Duration, Instant};

use actix::prelude::*;
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::monitor::{
    BackupSource, Check, GetMonitorStats, MonitorActor, MonitorConfig, PollOutcome, VFS_REPLICA,
};
use change_streamer_actors::vfs::DEFAULT_WATERMARK_QUERY;
use change_streamer_test_support::wait::wait_until;
use common::recording_purge::RecordingPurge;
use common::vfs_harness::{readers_after_kill, Harness, Reads, Replicated, READ_ONE, START};

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
