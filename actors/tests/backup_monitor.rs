//! Actor-level tests of the backup monitor's scheduling: [`MonitorActor`], [`CleanupActor`] and
//! [`ReservationActor`] exchanging their real messages, with an injected manual clock and a real
//! HTTP metrics endpoint on an ephemeral port. Time is moved by hand, never slept through. One
//! test per behaviour of the seed (`backup-monitor.ts` and its tests): cleanup scheduling,
//! watermarks, reservations. The polls themselves are in `backup_monitor_polls.rs`.

mod common;

use std::time::Duration;

use change_streamer_actors::cleanup::GetCleanupState;
use change_streamer_actors::monitor::{Check, GetMonitorStats, PollOutcome, Stop};
use change_streamer_actors::reservation::{
    EndBySubscription, ListReservations, Release, ReservationEvent,
};
use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_test_support::fixtures::litestream_page;
use change_streamer_test_support::litestream::{render_page, Answer};
use common::monitor_harness::{events, Harness};

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
