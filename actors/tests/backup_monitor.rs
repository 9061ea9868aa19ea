//! Actor-level tests of the backup monitor: [`MonitorActor`], [`CleanupActor`] and
//! [`ReservationActor`] exchanging their real messages, with an injected manual clock and a real
//! HTTP metrics endpoint on an ephemeral port. Time is moved by hand, never slept through. One
//! test per behaviour of the seed (`backup-monitor.ts` and its tests), then the cases PROTOCOL.md adds.

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::cleanup::{CleanupActor, GetCleanupState};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::monitor::{
    Check, GetMonitorStats, MonitorActor, MonitorConfig, PollOutcome, Stop,
};
use change_streamer_actors::reservation::{
    EndBySubscription, ListReservations, Release, ReservationActor, ReservationEvent, Reserve,
};
use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_test_support::fixtures::litestream_page;
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use common::fake_log::FakeLog;
use common::recording_purge::{RecordingPurge, Take};
use common::reservation_session::{Events, Session};

const START: i64 = 1_745_452_800_000; // 2025-04-24T00:00:00Z

struct Harness {
    clock: Clock,
    metrics: FakeLitestream,
    purge: Addr<RecordingPurge>,
    cleanup: Addr<CleanupActor>,
    reservations: Addr<ReservationActor>,
    monitor: Addr<MonitorActor>,
}

impl Harness {
    async fn new(initial_delay_ms: i64) -> Harness {
        Self::with_timeout(initial_delay_ms, Duration::from_secs(10)).await
    }

    async fn with_timeout(initial_delay_ms: i64, timeout: Duration) -> Harness {
        let clock = Clock::manual(START);
        let metrics = FakeLitestream::start(Answer::default()).await;
        let purge = RecordingPurge::default().start();
        let cleanup = CleanupActor::new(
            clock.clone(),
            Duration::from_millis(initial_delay_ms.max(0) as u64),
            Duration::from_secs(30),
            purge.clone().recipient(),
        )
        .start();
        let reservations = ReservationActor::new(
            clock.clone(),
            "s3://foo/bar".into(),
            FakeLog {
                replica_version: "123",
                min_watermark: "1ab",
            }
            .start()
            .recipient(),
            cleanup.clone(),
        )
        .start();
        let mut cfg = MonitorConfig::new(metrics.url(), Duration::from_secs(60));
        cfg.poll_automatically = false;
        cfg.timeout = timeout;
        let monitor = MonitorActor::new(cfg, cleanup.clone()).start();
        Harness {
            clock,
            metrics,
            purge,
            cleanup,
            reservations,
            monitor,
        }
    }

    fn at(&self, ms: i64) {
        self.clock.set_ms(START + ms);
    }

    /// litestream reports `watermark` backed up at `offset_ms` from now.
    fn backed_up(&self, watermark: &str, offset_ms: i64) {
        let v = format!("{}", (self.clock.now_ms() + offset_ms) as f64 / 1000.0);
        self.metrics
            .set_body(render_page("/db", &[(Some(watermark), "file", v)]));
    }

    async fn check(&self) -> PollOutcome {
        self.monitor.send(Check).await.expect("monitor")
    }

    async fn scheduled(&self) -> Vec<String> {
        self.purge.send(Take).await.expect("purge")
    }

    async fn reserve(&self, task: &str, session_id: u64) -> Addr<Session> {
        let s = Session::default().start();
        self.reservations
            .send(Reserve {
                task_id: task.into(),
                session_id: SessionId(session_id),
                session: s.clone().recipient(),
            })
            .await
            .unwrap();
        s
    }

    async fn delay(&self) -> i64 {
        self.cleanup
            .send(GetCleanupState)
            .await
            .unwrap()
            .cleanup_delay_ms
    }
}

async fn events(s: &Addr<Session>) -> Vec<ReservationEvent> {
    // Let the status answer travel: log → reservations → session.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    s.send(Events).await.unwrap()
}

#[actix_rt::test]
async fn schedules_overdue_cleanup() {
    let h = Harness::new(100_000).await;
    h.clock.set_ms(1_746_057_600_000); // 2025-05-01
    h.metrics.set_body(render_page(
        "/db",
        &[(Some("618ocqq8"), "file", "1.74545644476593e+09".into())],
    ));
    assert_eq!(
        h.check().await,
        PollOutcome::Read {
            samples: 1,
            invalid: 0
        }
    );
    assert_eq!(h.scheduled().await, vec!["618ocqq8"]);
}

#[actix_rt::test]
async fn schedules_new_cleanup_at_exactly_the_delay_and_not_1ms_before() {
    let h = Harness::new(100_000).await;
    h.backed_up("618p0bw8", 0);
    h.check().await;
    h.at(99_999);
    h.check().await;
    assert_eq!(h.scheduled().await, Vec::<String>::new());
    h.at(100_000);
    h.check().await;
    assert_eq!(h.scheduled().await, vec!["618p0bw8"]);
    h.at(100_001);
    h.check().await;
    assert_eq!(
        h.scheduled().await,
        Vec::<String>::new(),
        "scheduled once only"
    );
}

#[actix_rt::test]
async fn drops_obsolete_watermarks() {
    let h = Harness::new(100_000).await;
    h.backed_up("618ocqq8", 0);
    h.check().await;
    h.at(10_000);
    h.backed_up("618p0bw8", 0);
    h.check().await;
    h.at(110_000);
    h.check().await;
    assert_eq!(h.scheduled().await, vec!["618p0bw8"]);
    // The smaller watermark was forgotten, and is not recorded again when seen again.
    h.backed_up("618ocqq8", -200_000);
    h.at(300_000);
    h.check().await;
    assert_eq!(h.scheduled().await, Vec::<String>::new());
    assert!(h
        .cleanup
        .send(GetCleanupState)
        .await
        .unwrap()
        .pending_watermarks
        .is_empty());
}

#[actix_rt::test]
async fn only_keeps_one_reservation_per_id() {
    let h = Harness::new(100_000).await;
    let a = h.reserve("foo-bar", 1).await;
    let b1 = h.reserve("bar-foo", 2).await;
    let b2 = h.reserve("bar-foo", 3).await;
    assert!(matches!(
        events(&a).await.as_slice(),
        [ReservationEvent::Status(_)]
    ));
    let e = events(&b1).await;
    assert_eq!(
        e.last(),
        Some(&ReservationEvent::Closed(SessionEnd::Replaced)),
        "{e:?}"
    );
    match events(&b2).await.as_slice() {
        [ReservationEvent::Status(s)] => {
            assert_eq!(
                s.to_message(),
                r#"["status",{"tag":"status","backupURL":"s3://foo/bar","replicaVersion":"123","minWatermark":"1ab"}]"#
            )
        }
        other => panic!("{other:?}"),
    }
    let tasks: Vec<_> = h
        .reservations
        .send(ListReservations)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.task_id)
        .collect();
    assert_eq!(tasks, vec!["bar-foo", "foo-bar"]);
}

#[actix_rt::test]
async fn replaced_reservations_late_stop_does_not_end_the_newer_one() {
    let h = Harness::new(100_000).await;
    h.reserve("t", 1).await;
    h.reserve("t", 2).await;
    // Session 1 stops after being replaced: it names itself, so session 2 keeps the task.
    h.reservations
        .send(Release {
            task_id: "t".into(),
            session_id: SessionId(1),
        })
        .await
        .unwrap();
    assert_eq!(
        h.reservations.send(ListReservations).await.unwrap().len(),
        1
    );
    assert!(h.cleanup.send(GetCleanupState).await.unwrap().paused);
    h.reservations
        .send(Release {
            task_id: "t".into(),
            session_id: SessionId(2),
        })
        .await
        .unwrap();
    assert!(h
        .reservations
        .send(ListReservations)
        .await
        .unwrap()
        .is_empty());
    assert!(!h.cleanup.send(GetCleanupState).await.unwrap().paused);
}

#[actix_rt::test]
async fn pauses_cleanup_during_reservation() {
    let h = Harness::new(100_000).await;
    h.backed_up("618p0bw8", 0);
    h.check().await;
    let s = h.reserve("foo-bar", 1).await;
    h.at(100_000);
    h.check().await;
    assert_eq!(
        h.scheduled().await,
        Vec::<String>::new(),
        "paused while reserved"
    );
    assert_eq!(
        h.reservations
            .send(EndBySubscription {
                task_id: "foo-bar".into()
            })
            .await
            .unwrap(),
        Some(Duration::from_secs(100))
    );
    assert_eq!(
        events(&s).await.last(),
        Some(&ReservationEvent::Closed(SessionEnd::EndedBySubscription))
    );
    h.check().await;
    assert_eq!(h.scheduled().await, vec!["618p0bw8"]);
    assert_eq!(
        h.delay().await,
        100_000,
        "held exactly the delay: not raised"
    );
}

#[actix_rt::test]
async fn extends_cleanup_delay_due_to_reservation() {
    let h = Harness::new(100_000).await;
    h.reserve("boo-far", 1).await;
    h.at(50_000);
    h.backed_up("618p0bw8", 0);
    h.check().await;
    h.at(125_000);
    h.reservations
        .send(EndBySubscription {
            task_id: "boo-far".into(),
        })
        .await
        .unwrap();
    assert_eq!(h.delay().await, 125_000);
    for at in [125_000, 150_000, 174_999] {
        h.at(at);
        h.check().await;
        assert_eq!(h.scheduled().await, Vec::<String>::new(), "at {at}");
    }
    h.at(175_000);
    h.check().await;
    assert_eq!(h.scheduled().await, vec!["618p0bw8"]);
}

#[actix_rt::test]
async fn does_not_extend_cleanup_delay_on_prematurely_terminated_reservation() {
    let h = Harness::new(100_000).await;
    h.reserve("boo-far", 1).await;
    h.at(50_000);
    h.backed_up("618p0bw8", 0);
    h.check().await;
    h.at(125_000);
    // The client drops the connection: its session's stop releases it.
    h.reservations
        .send(Release {
            task_id: "boo-far".into(),
            session_id: SessionId(1),
        })
        .await
        .unwrap();
    assert_eq!(h.delay().await, 100_000);
    h.at(149_999);
    h.check().await;
    assert_eq!(h.scheduled().await, Vec::<String>::new());
    h.at(150_000);
    h.check().await;
    assert_eq!(h.scheduled().await, vec!["618p0bw8"]);
    // Ending it afterwards is a no-op.
    assert_eq!(
        h.reservations
            .send(EndBySubscription {
                task_id: "boo-far".into()
            })
            .await
            .unwrap(),
        None
    );
    assert_eq!(h.delay().await, 100_000);
}

#[actix_rt::test]
async fn aborts_inflight_fetch_on_stop() {
    let h = Harness::new(100_000).await;
    h.clock.set_ms(1_746_057_600_000);
    h.metrics.set(Answer {
        body: render_page(
            "/db",
            &[(Some("618ocqq8"), "file", "1.74545644476593e+09".into())],
        ),
        hang: true,
        ..Answer::default()
    });
    let m = h.monitor.clone();
    let check = actix_rt::spawn(async move { m.send(Check).await });
    h.metrics.wait_for_request(0, Duration::from_secs(2)).await;
    assert_eq!(h.metrics.requests(), 1);
    h.monitor.send(Stop).await.unwrap();
    h.metrics.release();
    let outcome = check.await.unwrap();
    assert!(
        matches!(outcome, Ok(PollOutcome::Aborted) | Err(_)),
        "{outcome:?}"
    );
    assert_eq!(h.scheduled().await, Vec::<String>::new());
    assert!(h
        .cleanup
        .send(GetCleanupState)
        .await
        .unwrap()
        .pending_watermarks
        .is_empty());
}

#[actix_rt::test]
async fn records_watermarks_from_two_replicas() {
    let h = Harness::new(100_000).await;
    h.clock.set_ms(1_745_456_500_000);
    let body = litestream_page("litestream-two-replicas.txt");
    h.metrics.set_body(body);
    assert_eq!(
        h.check().await,
        PollOutcome::Read {
            samples: 2,
            invalid: 0
        }
    );
    let st = h.cleanup.send(GetCleanupState).await.unwrap();
    let got: Vec<_> = st
        .pending_watermarks
        .iter()
        .map(|p| (p.watermark.to_string(), p.replica.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("618ocqq8".to_string(), "s3".to_string()),
            ("618p0bw8".to_string(), "file".to_string())
        ]
    );
    // 618ocqq8 was backed up at ...444.765 s, 618p0bw8 at ...500 s: 100 s later only the first is due.
    h.clock.set_ms(1_745_456_444_765 + 100_000);
    h.check().await;
    assert_eq!(h.scheduled().await, vec!["618ocqq8"]);
    h.clock.set_ms(1_745_456_500_000 + 100_000);
    h.check().await;
    assert_eq!(h.scheduled().await, vec!["618p0bw8"]);
}

#[actix_rt::test]
async fn ignores_and_counts_invalid_watermarks() {
    let h = Harness::new(100_000).await;
    h.clock.set_ms(1_746_057_600_000);
    let body = litestream_page("litestream-bad-watermarks.txt");
    h.metrics.set_body(body);
    assert_eq!(
        h.check().await,
        PollOutcome::Read {
            samples: 0,
            invalid: 6
        }
    );
    assert_eq!(h.scheduled().await, Vec::<String>::new());
    let stats = h.monitor.send(GetMonitorStats).await.unwrap();
    assert_eq!(
        (stats.invalid_watermarks_total, stats.poll_errors_total),
        (6, 0)
    );
}

/// A failed poll is a counted error and an empty observation, and scheduling still runs on
/// what was recorded before.
async fn failed_poll_still_schedules(answer: Answer, timeout: Duration) {
    let h = Harness::with_timeout(100_000, timeout).await;
    h.backed_up("618p0bw8", 0);
    h.check().await;
    h.metrics.set(answer);
    h.at(100_000);
    let outcome = h.check().await;
    assert!(matches!(outcome, PollOutcome::Failed(_)), "{outcome:?}");
    assert_eq!(h.scheduled().await, vec!["618p0bw8"]);
    let stats = h.monitor.send(GetMonitorStats).await.unwrap();
    assert_eq!((stats.polls_total, stats.poll_errors_total), (2, 1));
    h.metrics.release();
}

#[actix_rt::test]
async fn metrics_endpoint_returning_500_is_a_poll_error() {
    failed_poll_still_schedules(
        Answer {
            status: 500,
            body: "boom".into(),
            ..Answer::default()
        },
        Duration::from_secs(10),
    )
    .await;
}

#[actix_rt::test]
async fn metrics_endpoint_returning_garbage_is_a_poll_error() {
    let garbage = litestream_page("litestream-garbage.txt");
    failed_poll_still_schedules(
        Answer {
            body: garbage,
            ..Answer::default()
        },
        Duration::from_secs(10),
    )
    .await;
}

#[actix_rt::test]
async fn metrics_endpoint_that_hangs_up_is_a_poll_error() {
    failed_poll_still_schedules(
        Answer {
            reset: true,
            ..Answer::default()
        },
        Duration::from_secs(10),
    )
    .await;
}

#[actix_rt::test]
async fn metrics_endpoint_too_slow_is_a_poll_error() {
    failed_poll_still_schedules(
        Answer {
            hang: true,
            ..Answer::default()
        },
        Duration::from_millis(200),
    )
    .await;
}

/// A cleanup actor at delay 0 (floor 30 s) whose decisions go nowhere.
fn plain_cleanup(clock: Clock) -> Addr<CleanupActor> {
    CleanupActor::new(
        clock,
        Duration::ZERO,
        Duration::from_secs(30),
        RecordingPurge::default().start().recipient(),
    )
    .start()
}

#[actix_rt::test]
async fn metrics_endpoint_down_is_a_poll_error() {
    let clock = Clock::manual(START);
    let cleanup = plain_cleanup(clock);
    // Nothing listens on port 9 of loopback.
    let mut cfg = MonitorConfig::new("http://127.0.0.1:9/metrics", Duration::from_secs(60));
    cfg.poll_automatically = false;
    let monitor = MonitorActor::new(cfg, cleanup).start();
    assert!(matches!(
        monitor.send(Check).await.unwrap(),
        PollOutcome::Failed(_)
    ));
    assert_eq!(
        monitor
            .send(GetMonitorStats)
            .await
            .unwrap()
            .poll_errors_total,
        1
    );
}

#[actix_rt::test]
async fn polls_by_itself_every_interval() {
    let clock = Clock::manual(START);
    let metrics = FakeLitestream::start(Answer::default()).await;
    let cleanup = plain_cleanup(clock);
    let monitor = MonitorActor::new(
        MonitorConfig::new(metrics.url(), Duration::from_millis(50)),
        cleanup,
    )
    .start();
    actix_rt::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(
        metrics.requests(),
        0,
        "the first poll comes one interval after start"
    );
    actix_rt::time::sleep(Duration::from_millis(200)).await;
    assert!(metrics.requests() >= 2);
    monitor.send(Stop).await.unwrap();
}

#[actix_rt::test]
async fn polls_never_overlap() {
    let h = Harness::new(100_000).await;
    h.metrics.set(Answer {
        hang: true,
        ..Answer::default()
    });
    let (m1, m2) = (h.monitor.clone(), h.monitor.clone());
    let first = actix_rt::spawn(async move { m1.send(Check).await });
    h.metrics.wait_for_request(0, Duration::from_secs(2)).await;
    let second = actix_rt::spawn(async move { m2.send(Check).await });
    actix_rt::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.metrics.requests(), 1, "a check during a poll joins it");
    h.metrics.release();
    let (a, b) = (
        first.await.unwrap().unwrap(),
        second.await.unwrap().unwrap(),
    );
    assert_eq!(a, b);
    assert_eq!(h.metrics.requests(), 1);
}
