//! Actor-level tests of the backup monitor's polls of the litestream metrics endpoint: every
//! kind of failed poll (500, garbage, hang-up, too slow, down) is a counted error that still
//! schedules on what was recorded, and the monitor polls by itself every interval without
//! overlapping polls. Manual clock, real HTTP endpoint on an ephemeral port; the cases
//! PROTOCOL.md adds to the seed's `backup-monitor.ts`.

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::monitor::{
    Check, GetMonitorStats, MonitorActor, MonitorConfig, PollOutcome, Stop,
};
use change_streamer_test_support::fixtures::litestream_page;
use change_streamer_test_support::litestream::{Answer, FakeLitestream};
use common::monitor_harness::{Harness, START};
use common::recording_purge::RecordingPurge;

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
