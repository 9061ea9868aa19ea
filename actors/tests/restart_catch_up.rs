//! Actor-level tests of PROTOCOL.md §13.1, no backward walk after a restart: the
//! [`CleanupActor`] reads back the watermark recorded before the stop, judges each
//! [`PollResult`] against it, and tells the [`ReservationActor`] once the backup covers it;
//! until then no status is sent. The actors are wired as the service wires them
//! (`src/owner.rs`), on a real change log that a "restart" opens again.

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::ChangeLog;
use change_streamer_actors::cleanup::{CleanupActor, GetCleanupState, PollResult};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::litestream::BackupSample;
use change_streamer_actors::reservation::{ListReservations, ReservationActor, ReservationEvent};
use change_streamer_actors::restart_catch_up::{CatchUpView, RestartCatchUp};
use change_streamer_actors::watermark::Watermark;
use common::fake_log::FakeLog;
use common::recording_purge::RecordingPurge;
use common::reservation_session::{reserve, Events, Session};

const START: i64 = 1_745_452_800_000;
const DELAY_MS: i64 = 30_000;

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

fn sample(n: u64, at_ms: i64) -> BackupSample {
    BackupSample {
        watermark: w(n),
        replica: "control".into(),
        backed_up_at_ms: at_ms,
    }
}

/// One run of the backup side on the change log in `dir`, wired as `src/owner.rs` does.
struct Run {
    log: ChangeLog,
    cleanup: Addr<CleanupActor>,
    reservations: Addr<ReservationActor>,
}

impl Run {
    async fn start(dir: &std::path::Path, clock: &Clock) -> Run {
        let log = ChangeLog::open(dir).unwrap();
        let state = log.load_state().await.unwrap();
        let ctx = Context::<ReservationActor>::new();
        let cleanup = CleanupActor::new(
            clock.clone(),
            Duration::ZERO,
            Duration::from_millis(DELAY_MS as u64),
            RecordingPurge::default().start().recipient(),
        )
        .restore(&state, log.clone())
        .telling_covered(ctx.address().recipient())
        .start();
        let mut reservations = ReservationActor::new(
            clock.clone(),
            "s3://b/r".into(),
            FakeLog {
                replica_version: "0a",
                min_watermark: "0b",
            }
            .start()
            .recipient(),
            cleanup.clone(),
        )
        .restore(
            &state.reservations,
            Duration::from_millis(DELAY_MS as u64),
            log.clone(),
        );
        if RestartCatchUp::from_state(&state).is_some() {
            reservations = reservations.held_until_backup_covers();
        }
        Run {
            log,
            cleanup,
            reservations: ctx.run(reservations),
        }
    }

    async fn catch_up(&self) -> Option<CatchUpView> {
        self.cleanup
            .send(GetCleanupState)
            .await
            .unwrap()
            .restart_catch_up
    }

    /// Until what was queued on the change log is durable and the actors handled it.
    async fn settle(&self) {
        self.cleanup.send(GetCleanupState).await.unwrap();
        self.reservations.send(ListReservations).await.unwrap();
        self.log.load_state().await.unwrap();
        self.reservations.send(ListReservations).await.unwrap();
    }

    async fn verified(&self) -> bool {
        self.reservations.send(ListReservations).await.unwrap()[0].verified
    }
}

/// What `session` is told next, waiting for it.
async fn next_events(session: &Addr<Session>) -> Vec<ReservationEvent> {
    for _ in 0..2500 {
        let events = session.send(Events).await.unwrap();
        if !events.is_empty() {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("the session was told nothing");
}

#[actix_rt::test]
async fn no_backward_walk_a_status_waits_until_the_backup_covers_the_recorded_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    {
        let run = Run::start(dir.path(), &clock).await;
        assert_eq!(run.catch_up().await, None, "a first start owes nothing");
        // 10 is due and scheduled, 20 recorded only.
        run.cleanup.do_send(PollResult {
            samples: vec![sample(10, START - 60_000), sample(20, START)],
        });
        run.settle().await;
    } // kill -9: nothing more is written

    let run = Run::start(dir.path(), &clock).await;
    assert_eq!(
        run.catch_up().await,
        Some(CatchUpView {
            recorded: w(20),
            backup: None
        })
    );
    let session = reserve(&run.reservations, "restoring", 1).await;
    run.settle().await;
    assert!(session.send(Events).await.unwrap().is_empty());
    assert!(!run.verified().await);

    // A failed poll observes nothing: the wait goes on.
    run.cleanup.do_send(PollResult::default());
    // The backup walked back: it shows 15, below the 20 recorded before the stop.
    run.cleanup.do_send(PollResult {
        samples: vec![sample(15, START + 1)],
    });
    run.settle().await;
    let view = run.catch_up().await.expect("still behind");
    assert_eq!(view.backup, Some(w(15)));
    assert_eq!(
        view.reason(),
        format!(
            "backup behind its recorded watermark (recorded {}, backup shows {})",
            w(20),
            w(15)
        )
    );
    assert!(session.send(Events).await.unwrap().is_empty());
    assert!(!run.verified().await);

    // Reaching the recorded watermark ends the wait: the status goes out.
    run.cleanup.do_send(PollResult {
        samples: vec![sample(20, START + 2)],
    });
    assert!(matches!(
        next_events(&session).await.as_slice(),
        [ReservationEvent::Status(s)] if s.min_watermark == "0b"
    ));
    assert_eq!(run.catch_up().await, None);
    assert!(run.verified().await);

    // A later reservation gets its status at once.
    let later = reserve(&run.reservations, "later", 2).await;
    assert!(matches!(
        next_events(&later).await.as_slice(),
        [ReservationEvent::Status(_)]
    ));
}

#[actix_rt::test]
async fn no_backward_walk_the_last_scheduled_watermark_counts_as_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    {
        let run = Run::start(dir.path(), &clock).await;
        run.cleanup.do_send(PollResult {
            samples: vec![sample(30, START - 60_000)],
        });
        run.settle().await;
        let s = run.log.load_state().await.unwrap();
        assert!(s.recorded.is_empty(), "30 was scheduled, not kept recorded");
        assert_eq!(s.last_scheduled, Some(w(30)));
    }
    let run = Run::start(dir.path(), &clock).await;
    assert_eq!(run.catch_up().await.map(|v| v.recorded), Some(w(30)));
    // An observation above it covers it at once.
    run.cleanup.do_send(PollResult {
        samples: vec![sample(29, START), sample(31, START)],
    });
    run.settle().await;
    assert_eq!(run.catch_up().await, None);
}
