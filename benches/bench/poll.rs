//! `poll`: one backup-monitor poll of a 10,000-series litestream `/metrics` page: the parse
//! alone and the whole poll (HTTP, parse, record), medians of 20.

use std::time::{Duration, Instant};

use actix::prelude::*;
use change_streamer_actors::monitor::{Check, MonitorActor, MonitorConfig};
use change_streamer_test_support::litestream;
use serde_json::json;

use crate::report::{median, report};
use crate::rig::w;

pub async fn poll() {
    let series = 10_000usize;
    let mut samples: Vec<(Option<String>, String, String)> = Vec::new();
    for i in 0..series {
        samples.push((
            Some(w(1_000_000 + i as u64).to_string()),
            format!("r{}", i % 7),
            "1745456444.765".into(),
        ));
    }
    let refs: Vec<(Option<&str>, &str, String)> = samples
        .iter()
        .map(|(a, b, c)| (a.as_deref(), b.as_str(), c.clone()))
        .collect();
    let body = litestream::render_page("/data/replica.db", &refs);
    let mut parse = Vec::new();
    for _ in 0..20 {
        let t0 = Instant::now();
        let page = change_streamer_actors::litestream::parse_progress_page(&body).unwrap();
        assert_eq!(page.samples.len(), series);
        parse.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    let lite = litestream::FakeLitestream::start(litestream::Answer {
        body: body.clone(),
        ..Default::default()
    })
    .await;
    struct Sink;
    impl Actor for Sink {
        type Context = Context<Self>;
    }
    impl Handler<change_streamer_actors::cleanup::ScheduleCleanup> for Sink {
        type Result = ();
        fn handle(
            &mut self,
            _: change_streamer_actors::cleanup::ScheduleCleanup,
            _: &mut Context<Self>,
        ) {
        }
    }
    let cleanup = change_streamer_actors::cleanup::CleanupActor::new(
        change_streamer_actors::clock::Clock::System,
        Duration::from_secs(30),
        Duration::from_secs(30),
        Sink.start().recipient(),
    )
    .start();
    let mut cfg = MonitorConfig::new(lite.url(), Duration::from_secs(60));
    cfg.poll_automatically = false;
    let monitor = MonitorActor::new(cfg, cleanup).start();
    let mut full = Vec::new();
    for _ in 0..20 {
        let t0 = Instant::now();
        monitor.send(Check).await.unwrap();
        full.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    let (p, f) = (median(&mut parse), median(&mut full));
    report(
        json!({"bench": "poll", "series": series, "body_bytes": body.len(), "parse_ms_median": (p * 100.0).round() / 100.0,
               "poll_ms_median": (f * 100.0).round() / 100.0}),
        format!("metrics poll of {series} series ({} KiB): parse {p:.2} ms, whole poll (HTTP + parse + record) {f:.2} ms, medians of 20", body.len() / 1024),
    );
}
