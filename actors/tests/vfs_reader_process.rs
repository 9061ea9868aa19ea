//! Actor-level tests of the VFS source's reader process (PROTOCOL.md §8.1b) against REAL stock
//! litestream 0.5.17: the `change-streamer-vfs-reader` process that the [`MonitorActor`] reads
//! the backed-up watermark through is killed and replaced when wedged, gets up under a poll
//! timeout shorter than its load, dies with the monitor, reports an unloadable extension at
//! start, and is the one the service's environment names.
//!
//! litestream is installed on first use by `scripts/install-litestream.sh` (through
//! [`stock_litestream::install`], into `CHANGE_STREAMER_LITESTREAM_DIR` or `.tools/litestream`
//! at the repository root); these tests never skip.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use change_streamer_actors::monitor::{BackupSource, Check, PollOutcome, Stop};
use change_streamer_actors::vfs::{
    HelperCommand, VfsError, VfsReader, DEFAULT_WATERMARK_QUERY, ENV_READER,
};
use change_streamer_actors::vfs_reader::SUBCOMMAND;
use common::vfs_harness::{reader_pids, readers_after_kill, Harness, Replicated, READER, READ_ONE};

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
