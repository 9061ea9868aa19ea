//! PROTOCOL.md §8.1c, §8.3 (issue 41, item 4): a frozen backup never delays the scheduling
//! step. A fake litestream ([`FakeLitestream`]) holds the monitor's request (metrics page or
//! control API `sync`) unanswered while the test moves the injected clock past the cleanup
//! delay of a watermark recorded earlier: the step schedules it on the monitor's next period,
//! the held request still in flight (its timeout, an hour here, is untouched and no second
//! request overlaps it); released, that request ends as a normal poll.

mod common;

use std::time::{Duration, Instant};

use actix::prelude::*;
use change_streamer_actors::cleanup::{CleanupActor, PollResult};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::litestream::BackupSample;
use change_streamer_actors::litestream_control::ControlUrl;
use change_streamer_actors::monitor::{
    BackupSource, ControlSource, GetMonitorStats, MonitorActor, MonitorConfig,
};
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use common::monitor_harness::START;
use common::recording_purge::RecordingPurge;

/// The cleanup delay: the recorded watermark is due once the clock passed it.
const DELAY: Duration = Duration::from_secs(30);

/// Far longer than the test: a step that waited for the request would never come.
const HELD_FOR: Duration = Duration::from_secs(3600);

/// A safety net against a test that would hang, not what the test waits for.
const LIMIT: Duration = Duration::from_secs(60);

const SYNCED: &str =
    r#"{"status":"synced","path":"/data/replica.db","txid":7,"replicated_txid":7}"#;

/// Which source the monitor asks, and what a released request answers.
fn source(lite: &FakeLitestream, control: bool) -> (BackupSource, String) {
    if control {
        let url = ControlUrl::parse(&format!("http://{}", lite.addr)).expect("a control URL");
        let source = ControlSource {
            url,
            db_path: "/data/replica.db".into(),
        };
        (BackupSource::Control(source), SYNCED.into())
    } else {
        let page = render_page("/db", &[(Some("0b"), "file", format!("{}", START / 1000))]);
        (BackupSource::Metrics { url: lite.url() }, page)
    }
}

async fn until<F: std::future::Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < LIMIT, "{what} within {LIMIT:?}");
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn scheduling_runs_while_the_request_is_held(control: bool) {
    let lite = FakeLitestream::start(Answer {
        hang: true,
        ..Answer::default()
    })
    .await;
    let clock = Clock::manual(START);
    let purge = RecordingPurge::default();
    let scheduled = purge.scheduled();
    let cleanup = CleanupActor::new(clock.clone(), DELAY, DELAY, purge.start().recipient()).start();
    // Recorded earlier: backed up at START, due at START + DELAY.
    cleanup
        .send(PollResult {
            samples: vec![BackupSample {
                watermark: Watermark::parse("0a").unwrap(),
                replica: "file".into(),
                backed_up_at_ms: START,
            }],
        })
        .await
        .unwrap();
    let (source, answer) = source(&lite, control);
    let mut cfg = MonitorConfig::with_source(source, Duration::from_millis(50));
    cfg.clock = clock.clone();
    cfg.timeout = HELD_FOR;
    let monitor = MonitorActor::new(cfg, cleanup.clone()).start();
    lite.wait_for_request(0, LIMIT).await;
    assert_eq!(lite.requests(), 1, "the first period's request is held");

    clock.set_ms(START + DELAY.as_millis() as i64);
    until("the step scheduled 0a while the request is held", || {
        let done = scheduled.lock().unwrap().contains(&"0a".to_string());
        async move { done }
    })
    .await;
    let stats = monitor.send(GetMonitorStats).await.unwrap();
    assert_eq!(stats.polls_total, 0, "the held request is still in flight");
    assert_eq!(lite.requests(), 1, "no request overlaps the held one");

    lite.set(Answer {
        body: answer,
        ..Answer::default()
    });
    lite.release();
    until("the held request ends as a poll", || {
        let m = monitor.clone();
        async move {
            let s = m.send(GetMonitorStats).await.unwrap();
            s.polls_total >= 1 && s.last_poll_ok == Some(true)
        }
    })
    .await;
}

#[actix_rt::test]
async fn a_frozen_metrics_page_never_delays_the_scheduling_step() {
    scheduling_runs_while_the_request_is_held(false).await;
}

#[actix_rt::test]
async fn a_frozen_control_api_never_delays_the_scheduling_step() {
    scheduling_runs_while_the_request_is_held(true).await;
}
