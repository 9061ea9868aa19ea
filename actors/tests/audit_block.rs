//! Actor-level tests of the audit's block in the [`Purger`] (PROTOCOL.md §8.1d, §9): while any
//! backup's audit blocks, nothing scheduled is checked and `blockedBy` is `audit`, whatever is
//! scheduled; a backup lifts only its own block. The streamer's side of the check is a stand-in
//! that counts the checks and purges; the purger's delay runs on tokio's paused clock, which
//! moves to the next timer whenever the test waits.

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::cleanup::ScheduleCleanup;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::purger::{AuditBlock, BlockedBy, GetPurgeState, Purger};
use change_streamer_actors::streamer::{PurgeAnswer, PurgeIfSafe};
use change_streamer_actors::watermark::Watermark;

const DELAY: Duration = Duration::from_secs(1);

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

/// Answers every check with a purge, and counts them.
#[derive(Default)]
struct Checks(Vec<Watermark>);
impl Actor for Checks {
    type Context = Context<Self>;
}
impl Handler<PurgeIfSafe> for Checks {
    type Result = MessageResult<PurgeIfSafe>;
    fn handle(&mut self, msg: PurgeIfSafe, _: &mut Context<Self>) -> Self::Result {
        self.0.push(msg.watermark);
        MessageResult(PurgeAnswer::Purged(1))
    }
}

#[derive(Message)]
#[rtype(result = "Vec<Watermark>")]
struct Checked;
impl Handler<Checked> for Checks {
    type Result = MessageResult<Checked>;
    fn handle(&mut self, _: Checked, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.0.clone())
    }
}

fn block(backup: &str, below: Option<u64>) -> AuditBlock {
    AuditBlock {
        backup: backup.into(),
        below: below.map(w),
    }
}

/// Lets several purge delays pass on the paused clock.
async fn delays_pass(n: u32) {
    tokio::time::sleep(DELAY * n).await;
}

#[actix_rt::test]
async fn audit_a_failing_backup_stops_every_purge_until_its_own_block_is_lifted() {
    tokio::time::pause();
    let checks = Checks::default().start();
    let purger = Purger::new(
        checks.clone().recipient(),
        DELAY,
        Duration::ZERO,
        Clock::manual(0),
    )
    .start();
    // Blocked with nothing scheduled: still shown.
    purger.do_send(block("default", Some(20)));
    let s = purger.send(GetPurgeState).await.unwrap();
    assert_eq!(s.blocked_by, Some(BlockedBy::Audit));
    assert!(s.waiting.as_deref().unwrap().contains("default"), "{s:?}");

    purger.do_send(ScheduleCleanup { watermark: w(10) });
    purger.do_send(block("other", Some(30)));
    delays_pass(5).await;
    assert_eq!(checks.send(Checked).await.unwrap(), Vec::<Watermark>::new());
    let s = purger.send(GetPurgeState).await.unwrap();
    assert_eq!(s.scheduled, vec![w(10)]);
    assert_eq!(s.blocked_by, Some(BlockedBy::Audit));

    // One backup lifts its block: the other's still holds.
    purger.do_send(block("default", None));
    delays_pass(5).await;
    assert_eq!(checks.send(Checked).await.unwrap(), Vec::<Watermark>::new());
    assert_eq!(
        purger.send(GetPurgeState).await.unwrap().blocked_by,
        Some(BlockedBy::Audit)
    );

    // The last block lifted: the scheduled purge is checked and done.
    purger.do_send(block("other", None));
    delays_pass(2).await;
    assert_eq!(checks.send(Checked).await.unwrap(), vec![w(10)]);
    let s = purger.send(GetPurgeState).await.unwrap();
    assert_eq!(s.blocked_by, None);
    assert_eq!(s.last_purged_before, Some(w(10)));
    assert!(s.scheduled.is_empty());
}
