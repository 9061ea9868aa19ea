//! The backup monitor's actor-level harness: a [`MonitorActor`], [`CleanupActor`] and
//! [`ReservationActor`] wired together with a manual clock, a fake litestream metrics endpoint
//! on an ephemeral port, a recording purge and a fixed change log; shared by
//! `backup_monitor.rs` and `backup_monitor_polls.rs`.

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::cleanup::{CleanupActor, GetCleanupState};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::monitor::{Check, MonitorActor, MonitorConfig, PollOutcome};
use change_streamer_actors::reservation::{ReservationActor, ReservationEvent};
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};

use super::fake_log::FakeLog;
use super::recording_purge::{RecordingPurge, Take};
use super::reservation_session::{self, Events, Session};

pub const START: i64 = 1_745_452_800_000; // 2025-04-24T00:00:00Z

pub struct Harness {
    pub clock: Clock,
    pub metrics: FakeLitestream,
    pub purge: Addr<RecordingPurge>,
    pub cleanup: Addr<CleanupActor>,
    pub reservations: Addr<ReservationActor>,
    pub monitor: Addr<MonitorActor>,
}

impl Harness {
    pub async fn new(initial_delay_ms: i64) -> Harness {
        Self::with_timeout(initial_delay_ms, Duration::from_secs(10)).await
    }

    pub async fn with_timeout(initial_delay_ms: i64, timeout: Duration) -> Harness {
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

    pub fn at(&self, ms: i64) {
        self.clock.set_ms(START + ms);
    }

    /// litestream reports `watermark` backed up at `offset_ms` from now.
    pub fn backed_up(&self, watermark: &str, offset_ms: i64) {
        let v = format!("{}", (self.clock.now_ms() + offset_ms) as f64 / 1000.0);
        self.metrics
            .set_body(render_page("/db", &[(Some(watermark), "file", v)]));
    }

    pub async fn check(&self) -> PollOutcome {
        self.monitor.send(Check).await.expect("monitor")
    }

    pub async fn scheduled(&self) -> Vec<String> {
        self.purge.send(Take).await.expect("purge")
    }

    pub async fn reserve(&self, task: &str, session_id: u64) -> Addr<Session> {
        reservation_session::reserve(&self.reservations, task, session_id).await
    }

    pub async fn delay(&self) -> i64 {
        self.cleanup
            .send(GetCleanupState)
            .await
            .unwrap()
            .cleanup_delay_ms
    }
}

pub async fn events(s: &Addr<Session>) -> Vec<ReservationEvent> {
    // Let the status answer travel: log → reservations → session.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    s.send(Events).await.unwrap()
}
