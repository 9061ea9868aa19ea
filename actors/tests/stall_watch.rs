//! [`StallWatch`] by message, on paused runtime time (PROTOCOL.md §11.1; issue 41, item 5): a
//! stage with work pending and no progress for the alarm is stalled, progress clears it, an idle
//! stage never is, and a stall is logged at ERROR once when seen and once a minute while it
//! lasts, then at INFO when it ends.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::stall::{
    GetStages, Idle, Pending, Progress, StageState, StallWatch, ERROR_EVERY,
};

const ALARM: Duration = Duration::from_secs(30);

/// Every log line of this test binary, `LEVEL message`.
fn lines() -> &'static Mutex<Vec<String>> {
    static LINES: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    LINES.get_or_init(|| {
        struct Capture;
        impl log::Log for Capture {
            fn enabled(&self, _: &log::Metadata) -> bool {
                true
            }
            fn log(&self, r: &log::Record) {
                lines()
                    .lock()
                    .unwrap()
                    .push(format!("{} {}", r.level(), r.args()));
            }
            fn flush(&self) {}
        }
        static CAPTURE: Capture = Capture;
        let _ = log::set_logger(&CAPTURE);
        log::set_max_level(log::LevelFilter::Info);
        Mutex::new(Vec::new())
    })
}

/// The lines at `level` that name `stage`.
fn logged(level: &str, stage: &str) -> usize {
    let needle = format!("stage {stage} ");
    lines()
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with(level) && l.contains(&needle))
        .count()
}

fn watch() -> Addr<StallWatch> {
    lines();
    tokio::time::pause();
    StallWatch::new(ALARM).start()
}

/// Moves paused time on by `by`, a second at a time so the watch's period runs in between.
async fn pass(w: &Addr<StallWatch>, by: Duration) {
    let mut left = by;
    while !left.is_zero() {
        let step = left.min(Duration::from_secs(1));
        tokio::time::advance(step).await;
        left -= step;
        w.send(GetStages).await.unwrap();
    }
}

async fn stage(w: &Addr<StallWatch>, name: &str) -> Option<StageState> {
    let stages = w.send(GetStages).await.unwrap();
    stages.into_iter().find(|s| s.stage == name)
}

fn named(name: &str) -> String {
    name.to_string()
}

#[actix_rt::test]
async fn pending_with_no_progress_past_the_alarm_is_stalled_and_named() {
    let w = watch();
    w.send(Pending {
        stage: named("writer-a"),
    })
    .await
    .unwrap();
    tokio::time::advance(ALARM - Duration::from_millis(1)).await;
    assert_eq!(stage(&w, "writer-a").await.unwrap().stalled_ms, None);
    tokio::time::advance(Duration::from_millis(1)).await;
    let stages = w.send(GetStages).await.unwrap();
    let s = stages.iter().find(|s| s.stage == "writer-a").unwrap();
    assert_eq!(s.stalled_ms, Some(30_000));
    assert_eq!(
        StageState::readyz_reason(&stages).as_deref(),
        Some("stalled: writer-a for 30000 ms")
    );
    // A second Pending does not restart the clock.
    w.send(Pending {
        stage: named("writer-a"),
    })
    .await
    .unwrap();
    tokio::time::advance(Duration::from_millis(5)).await;
    assert_eq!(
        stage(&w, "writer-a").await.unwrap().stalled_ms,
        Some(30_005)
    );
}

#[actix_rt::test]
async fn progress_clears_a_stall_and_restarts_its_clock() {
    let w = watch();
    w.send(Pending {
        stage: named("purger-b"),
    })
    .await
    .unwrap();
    pass(&w, ALARM).await;
    assert!(stage(&w, "purger-b").await.unwrap().stalled_ms.is_some());
    w.send(Progress {
        stage: named("purger-b"),
    })
    .await
    .unwrap();
    let stages = w.send(GetStages).await.unwrap();
    assert_eq!(StageState::readyz_reason(&stages), None);
    assert_eq!(
        logged("INFO", "purger-b"),
        1,
        "the end of the stall is said"
    );
    // Still pending after its progress: stalled again one alarm later.
    pass(&w, ALARM).await;
    assert_eq!(
        stage(&w, "purger-b").await.unwrap().stalled_ms,
        Some(30_000)
    );
}

#[actix_rt::test]
async fn an_idle_stage_is_never_stalled() {
    let w = watch();
    w.send(Idle {
        stage: named("catchup-c"),
    })
    .await
    .unwrap();
    pass(&w, Duration::from_secs(120)).await;
    assert_eq!(
        stage(&w, "catchup-c").await,
        Some(StageState {
            stage: named("catchup-c"),
            stalled_ms: None
        }),
        "listed (its gauge is 0), not stalled"
    );
    // Pending, then idle before the alarm: never stalled either.
    w.send(Pending {
        stage: named("catchup-c"),
    })
    .await
    .unwrap();
    pass(&w, ALARM / 2).await;
    w.send(Idle {
        stage: named("catchup-c"),
    })
    .await
    .unwrap();
    pass(&w, ALARM * 2).await;
    assert_eq!(stage(&w, "catchup-c").await.unwrap().stalled_ms, None);
    assert_eq!(logged("ERROR", "catchup-c"), 0);
}

#[actix_rt::test]
async fn a_stall_is_logged_at_error_once_a_minute_while_it_lasts() {
    let w = watch();
    w.send(Pending {
        stage: named("backup:d"),
    })
    .await
    .unwrap();
    pass(&w, ALARM - Duration::from_secs(1)).await;
    assert_eq!(logged("ERROR", "backup:d"), 0, "not before the alarm");
    pass(&w, Duration::from_secs(1)).await;
    assert_eq!(logged("ERROR", "backup:d"), 1, "when first seen");
    pass(&w, ERROR_EVERY - Duration::from_secs(1)).await;
    assert_eq!(
        logged("ERROR", "backup:d"),
        1,
        "not again within the minute"
    );
    pass(&w, Duration::from_secs(1)).await;
    assert_eq!(logged("ERROR", "backup:d"), 2, "once a minute");
    pass(&w, ERROR_EVERY).await;
    assert_eq!(logged("ERROR", "backup:d"), 3);
    let line = lines()
        .lock()
        .unwrap()
        .iter()
        .find(|l| l.starts_with("ERROR") && l.contains("stage backup:d "))
        .cloned()
        .unwrap();
    assert!(
        line.contains("no progress for 30000 ms") && line.contains("--stall-alarm-ms 30000"),
        "{line}"
    );
    w.send(Idle {
        stage: named("backup:d"),
    })
    .await
    .unwrap();
    pass(&w, ERROR_EVERY * 2).await;
    assert_eq!(logged("ERROR", "backup:d"), 3, "over once idle");
    assert_eq!(logged("INFO", "backup:d"), 1);
}
