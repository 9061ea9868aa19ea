//! Actor-level test of the audit (PROTOCOL.md §8.1d): a [`MonitorActor`] with an
//! [`AuditConfig`] reads a backup made by real stock litestream 0.5.17 through the VFS (a new
//! reader process per read) and compares it with what the monitor confirmed. Here the
//! confirmation comes from a metrics page that claims more than the backup holds (the lie);
//! the purge side is a recipient that records each [`AuditBlock`].

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::monitor::{
    AuditConfig, Check, GetMonitorStats, MonitorActor, MonitorConfig, PollOutcome,
};
use change_streamer_actors::purger::AuditBlock;
use change_streamer_actors::vfs::DEFAULT_WATERMARK_QUERY;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::wait::wait_until;
use common::recording_purge::RecordingPurge;
use common::vfs_harness::{Replicated, START};

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// Records each [`AuditBlock`] the monitor sends.
#[derive(Default)]
struct Blocks(Arc<Mutex<Vec<AuditBlock>>>);
impl Actor for Blocks {
    type Context = Context<Self>;
}
impl Handler<AuditBlock> for Blocks {
    type Result = ();
    fn handle(&mut self, m: AuditBlock, _: &mut Context<Self>) {
        self.0.lock().unwrap().push(m);
    }
}

#[actix_rt::test]
async fn audit_a_backup_below_what_was_confirmed_blocks_until_a_read_reaches_it() {
    let mut backup = Replicated::new(&w(10));
    backup.replicate();
    backup.wait_for_backup().await;
    // The page claims 20 is backed up; the backup holds 10.
    let lite = FakeLitestream::start(Answer::default()).await;
    lite.set_body(render_page(
        "/db",
        &[(Some(w(20).as_str()), "s3", "1.0".into())],
    ));

    let clock = Clock::manual(START);
    let cleanup = CleanupActor::new(
        clock.clone(),
        Duration::ZERO,
        Duration::from_secs(30),
        RecordingPurge::default().start().recipient(),
    )
    .start();
    let mut cfg = MonitorConfig::new(lite.url(), Duration::from_secs(3600));
    cfg.clock = clock;
    cfg.poll_automatically = false;
    cfg.audit = Some(AuditConfig {
        backup: "b1".into(),
        vfs: backup.source(DEFAULT_WATERMARK_QUERY),
        interval: Duration::from_millis(100),
    });
    let blocks = Blocks::default();
    let seen = blocks.0.clone();
    let monitor = MonitorActor::new(cfg, cleanup)
        .auditing_to(blocks.start().recipient())
        .start();
    assert!(matches!(
        monitor.send(Check).await.unwrap(),
        PollOutcome::Read { samples: 1, .. }
    ));

    wait_until("the audit catches the lie", Duration::from_secs(20), || {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(
        seen.lock().unwrap()[0],
        AuditBlock {
            backup: "b1".into(),
            below: Some(Watermark::from_u64(20)),
        }
    );
    let stats = monitor.send(GetMonitorStats).await.unwrap();
    let audit = stats.audit.clone().expect("an audit runs");
    assert_eq!(audit.backup, "b1");
    assert_eq!(audit.last_read, Some(Watermark::from_u64(10)));
    assert_eq!(audit.blocked_below, Some(Watermark::from_u64(20)));
    assert!(audit.failures_total >= 1);
    assert!(stats.backup_reads_total >= 1, "{stats:?}");

    // Later audits still read 10: still blocked, no lift.
    let failures = audit.failures_total;
    let m = monitor.clone();
    common::until("another failed audit", || {
        let m = m.clone();
        async move {
            let a = m.send(GetMonitorStats).await.unwrap().audit.unwrap();
            a.failures_total > failures
        }
    })
    .await;
    assert_eq!(seen.lock().unwrap().len(), 1, "the block is sent once");

    // The backup reaches what was confirmed: the next read lifts the block.
    backup.set_watermark(&w(20));
    wait_until("the block is lifted", Duration::from_secs(20), || {
        seen.lock().unwrap().len() == 2
    })
    .await;
    assert_eq!(
        seen.lock().unwrap()[1],
        AuditBlock {
            backup: "b1".into(),
            below: None,
        }
    );
    let audit = monitor.send(GetMonitorStats).await.unwrap().audit.unwrap();
    assert_eq!(audit.blocked_below, None);
    assert_eq!(audit.last_read, Some(Watermark::from_u64(20)));
    assert_eq!(audit.last_error, None);
}
