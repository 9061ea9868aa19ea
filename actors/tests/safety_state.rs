//! Actor-level tests of the safety state across restarts (PROTOCOL.md §3, §6.6, §6.7, §13): the
//! [`CleanupActor`] and [`ReservationActor`] write what protects a restoring replica to a real
//! change log, a "restart" opens the same database with new actors, and what was written comes
//! back. Time is a manual clock moved by hand; expiry is checked by message at the moment the
//! test chooses (the actor's own timer does the same in the service).

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::{ChangeLog, SafetyState};
use change_streamer_actors::cleanup::{
    CleanupActor, GetCleanupState, PollResult, ReservationClosed,
};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::litestream::BackupSample;
use change_streamer_actors::reservation::{
    BackupRead, EndBySubscription, ExpireReservations, GetReservationStats, ListReservations,
    ReservationActor, ReservationEvent, Reserve, Stop,
};
use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_actors::watermark::Watermark;
use common::fake_log::FakeLog;
use common::recording_purge::RecordingPurge;
use common::reservation_session::{Events, Session};

const START: i64 = 1_745_452_800_000; // 2025-04-24T00:00:00Z
const FLOOR: i64 = 30_000;
const POLL: std::time::Duration = std::time::Duration::from_millis(2);

/// One run of the service's backup side on the change log in `dir`.
struct Run {
    log: ChangeLog,
    cleanup: Addr<CleanupActor>,
    reservations: Addr<ReservationActor>,
}

impl Run {
    async fn start(
        dir: &std::path::Path,
        clock: &Clock,
        tune: fn(ReservationActor) -> ReservationActor,
    ) -> Run {
        let log = ChangeLog::open(dir).unwrap();
        let state = log.load_state().await.unwrap();
        let cleanup = CleanupActor::new(
            clock.clone(),
            Duration::ZERO,
            Duration::from_millis(FLOOR as u64),
            RecordingPurge::default().start().recipient(),
        )
        .restore(&state, log.clone());
        let delay = cleanup_delay(&state);
        let cleanup = cleanup.start();
        let reservations = tune(
            ReservationActor::new(
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
            .restore(&state.reservations, delay, log.clone()),
        )
        .start();
        Run {
            log,
            cleanup,
            reservations,
        }
    }

    async fn reserve(&self, task: &str, session_id: SessionId) -> Addr<Session> {
        let session = Session::default().start();
        self.reservations
            .send(Reserve {
                task_id: task.into(),
                session_id,
                session: session.clone().recipient(),
            })
            .await
            .unwrap();
        session
    }

    /// Waits until everything queued on the change log is durable.
    async fn settle(&self) -> SafetyState {
        // Messages already handed to the actors are handled before these answer.
        self.cleanup.send(GetCleanupState).await.unwrap();
        self.reservations.send(ListReservations).await.unwrap();
        self.log.load_state().await.unwrap()
    }
}

fn cleanup_delay(state: &SafetyState) -> Duration {
    state
        .cleanup_delay
        .unwrap_or_default()
        .max(Duration::from_millis(FLOOR as u64))
}

fn sample(w: u64, at_ms: i64) -> BackupSample {
    BackupSample {
        watermark: Watermark::from_u64(w),
        replica: "s3".into(),
        backed_up_at_ms: at_ms,
    }
}

/// Moves the manual clock.
async fn advance(clock: &Clock, ms: i64) {
    clock.advance_ms(ms);
}

/// What `session` is told next (waiting until it is told something).
async fn next_events(session: &Addr<Session>) -> Vec<ReservationEvent> {
    for _ in 0..2500 {
        let events = session.send(Events).await.unwrap();
        if !events.is_empty() {
            return events;
        }
        // The change log is real: its fsync takes real time.
        tokio::time::sleep(POLL).await;
    }
    panic!("the session was told nothing");
}

/// Waits until `n` reservations are open (or orphaned).
async fn wait_reservations(reservations: &Addr<ReservationActor>, n: usize) {
    for _ in 0..2500 {
        if reservations.send(ListReservations).await.unwrap().len() == n {
            return;
        }
        // The change log is real: its fsync takes real time.
        tokio::time::sleep(POLL).await;
    }
    panic!("never {n} reservation(s)");
}

fn no_tuning(r: ReservationActor) -> ReservationActor {
    r
}

#[actix_rt::test]
async fn cleanup_state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    {
        let run = Run::start(dir.path(), &clock, no_tuning).await;
        // The delay grows to 50 s through a restore that took that long.
        run.cleanup.do_send(ReservationClosed {
            task_id: "t".into(),
            ended_by_subscription_after: Some(Duration::from_secs(50)),
        });
        // 10 is due (backed up 60 s ago), 20 not yet.
        run.cleanup.do_send(PollResult {
            samples: vec![sample(10, START - 60_000), sample(20, START)],
        });
        let s = run.settle().await;
        assert_eq!(s.cleanup_delay, Some(Duration::from_secs(50)));
    }
    let run = Run::start(dir.path(), &clock, no_tuning).await;
    let state = run.cleanup.send(GetCleanupState).await.unwrap();
    assert_eq!(state.cleanup_delay_ms, 50_000);
    assert_eq!(
        state.last_scheduled_watermark,
        Some(Watermark::from_u64(10))
    );
    let pending: Vec<_> = state
        .pending_watermarks
        .iter()
        .map(|p| p.watermark.to_u64())
        .collect();
    assert_eq!(pending, vec![Some(20)]);
    assert_eq!(state.pending_watermarks[0].backed_up_at_ms, START);
    assert_eq!(
        run.log.load_state().await.unwrap().scheduled,
        vec![Watermark::from_u64(10)]
    );
}

#[actix_rt::test]
async fn a_reservation_open_at_a_stop_is_orphaned_and_keeps_cleanup_paused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    {
        let run = Run::start(dir.path(), &clock, no_tuning).await;
        let session = run.reserve("restoring", SessionId(1)).await;
        let events = next_events(&session).await;
        assert!(matches!(events.as_slice(), [ReservationEvent::Status(_)]));
        // A graceful stop closes the socket but leaves the reservation written down.
        run.reservations
            .send(Stop {
                end: Some(SessionEnd::ServiceStop),
            })
            .await
            .unwrap();
        // The actor is stopped: read what it left written down directly.
        let state = run.log.load_state().await.unwrap();
        assert_eq!(state.reservations.len(), 1);
    }
    advance(&clock, 5_000).await;
    let run = Run::start(dir.path(), &clock, no_tuning).await;
    let list = run.reservations.send(ListReservations).await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(
        (list[0].task_id.as_str(), list[0].held_ms, list[0].orphaned),
        ("restoring", 5_000, true)
    );
    // Cleanup stays paused: a due watermark is not scheduled.
    run.cleanup.do_send(PollResult {
        samples: vec![sample(10, START - 600_000)],
    });
    let state = run.cleanup.send(GetCleanupState).await.unwrap();
    assert!(state.paused);
    assert_eq!(state.last_scheduled_watermark, None);
}

#[actix_rt::test]
async fn an_orphan_ended_by_subscription_grows_the_delay_from_its_original_start() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    {
        let run = Run::start(dir.path(), &clock, no_tuning).await;
        run.reserve("restoring", SessionId(1)).await;
        run.settle().await;
    } // kill -9: nothing more is written
    advance(&clock, 40_000).await;
    let run = Run::start(dir.path(), &clock, no_tuning).await;
    advance(&clock, 5_000).await;
    let held = run
        .reservations
        .send(EndBySubscription {
            task_id: "restoring".into(),
        })
        .await
        .unwrap();
    assert_eq!(held, Some(Duration::from_secs(45)));
    let s = run.settle().await;
    assert_eq!(s.cleanup_delay, Some(Duration::from_secs(45)));
    assert!(s.reservations.is_empty());
    assert!(!run.cleanup.send(GetCleanupState).await.unwrap().paused);
}

#[actix_rt::test]
async fn an_orphan_ends_once_the_cleanup_delay_passed_since_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    {
        let run = Run::start(dir.path(), &clock, no_tuning).await;
        run.reserve("gone", SessionId(1)).await;
        run.settle().await;
    }
    let run = Run::start(dir.path(), &clock, no_tuning).await;
    advance(&clock, FLOOR - 1).await;
    assert_eq!(
        run.reservations.send(ListReservations).await.unwrap().len(),
        1
    );
    advance(&clock, 1).await;
    run.reservations.do_send(ExpireReservations);
    wait_reservations(&run.reservations, 0).await;
    let s = run.settle().await;
    assert!(s.reservations.is_empty());
    assert_eq!(
        s.cleanup_delay, None,
        "an orphan that expires does not grow the delay"
    );
    assert!(!run.cleanup.send(GetCleanupState).await.unwrap().paused);
}

#[actix_rt::test]
async fn a_new_reservation_of_the_same_task_replaces_its_orphan() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    {
        let run = Run::start(dir.path(), &clock, no_tuning).await;
        run.reserve("retry", SessionId(1)).await;
        run.settle().await;
    }
    advance(&clock, 7_000).await;
    let run = Run::start(dir.path(), &clock, no_tuning).await;
    run.reserve("retry", SessionId(2)).await;
    let s = run.settle().await;
    assert_eq!(s.reservations.len(), 1);
    assert_eq!(s.reservations[0].started_ms, START + 7_000);
    let list = run.reservations.send(ListReservations).await.unwrap();
    assert_eq!((list[0].held_ms, list[0].orphaned), (0, false));
}

#[actix_rt::test]
async fn a_reservation_held_longer_than_the_cap_is_ended_without_growth() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    let run = Run::start(dir.path(), &clock, |r| {
        r.with_max_reservation(Some(Duration::from_secs(90)))
    })
    .await;
    let session = run.reserve("stuck", SessionId(1)).await;
    run.settle().await;
    advance(&clock, 89_999).await;
    assert_eq!(
        run.reservations.send(ListReservations).await.unwrap().len(),
        1
    );
    advance(&clock, 1).await;
    run.reservations.do_send(ExpireReservations);
    wait_reservations(&run.reservations, 0).await;
    let events = next_events(&session).await;
    assert_eq!(
        events.last(),
        Some(&ReservationEvent::Closed(SessionEnd::Unavailable(
            "reservation held longer than --max-reservation-ms (90000 ms)".into()
        )))
    );
    assert_eq!(
        run.reservations
            .send(GetReservationStats)
            .await
            .unwrap()
            .expired_total,
        1
    );
    let s = run.settle().await;
    assert!(s.reservations.is_empty());
    assert_eq!(s.cleanup_delay, None);
}

#[actix_rt::test]
async fn the_cap_also_ends_an_orphan_counted_from_its_original_start() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    {
        let run = Run::start(dir.path(), &clock, no_tuning).await;
        run.reserve("old", SessionId(1)).await;
        run.settle().await;
    }
    advance(&clock, 15_000).await;
    // The cap (20 s) comes before the orphan's end (30 s after this start).
    let run = Run::start(dir.path(), &clock, |r| {
        r.with_max_reservation(Some(Duration::from_secs(20)))
    })
    .await;
    advance(&clock, 4_999).await;
    assert_eq!(
        run.reservations.send(ListReservations).await.unwrap().len(),
        1
    );
    advance(&clock, 1).await;
    run.reservations.do_send(ExpireReservations);
    wait_reservations(&run.reservations, 0).await;
    assert_eq!(
        run.reservations
            .send(GetReservationStats)
            .await
            .unwrap()
            .expired_total,
        1
    );
}

#[actix_rt::test]
async fn with_backup_verification_the_status_waits_for_a_backup_the_log_can_serve() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    let run = Run::start(dir.path(), &clock, |r| r.verifying_backups()).await;
    let session = run.reserve("new-replica", SessionId(1)).await;
    run.settle().await;
    assert!(session.send(Events).await.unwrap().is_empty());
    let list = run.reservations.send(ListReservations).await.unwrap();
    assert!(!list[0].verified);
    // A backup older than the change log's minWatermark (0b) cannot be served from.
    run.reservations.do_send(BackupRead {
        watermark: Watermark::from_u64(10), // "0a"
        replica_size: None,
    });
    run.settle().await;
    assert!(session.send(Events).await.unwrap().is_empty());
    run.reservations.do_send(BackupRead {
        watermark: Watermark::from_u64(11), // "0b"
        replica_size: None,
    });
    run.settle().await;
    assert!(matches!(
        session.send(Events).await.unwrap().as_slice(),
        [ReservationEvent::Status(s)] if s.min_watermark == "0b"
    ));
    assert!(run.reservations.send(ListReservations).await.unwrap()[0].verified);
}
