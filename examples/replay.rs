//! Differential replay: runs one scenario of `test-support/fixtures/scenarios/` (vendored from
//! the peer harness's `scenarios/`) against the real backup-monitor actors and prints the same
//! JSON lines as the peer's `backup-monitor-replay.mjs`, so the two can be compared line for
//! line.
//!
//! ```sh
//! cargo run --example replay -- test-support/fixtures/scenarios/06-extends-cleanup-delay.json
//! ```
//!
//! The actors are the production ones: [`MonitorActor`] polling a real HTTP endpoint (the
//! fake litestream of `change-streamer-test-support`, on an ephemeral loopback port),
//! [`CleanupActor`] and [`ReservationActor`], all reading an injected manual clock set to each
//! step's `at`. Around them sit only recorders: the purge side (records `ScheduleCleanup`), each
//! reservation's session (records what it is told), and the change log (answers the status, or
//! fails with the scenario's `changeLogStateError` as an engine's own error, which the
//! reservation's close says as it is, or holds the answer until `releaseStatus`, as the scenario
//! says). Checks are explicit `check` steps, as in the seed's tests; the monitor does not poll
//! by itself here.
//!
//! Events of one step are printed in the peer's canonical order: cleanups first, then each
//! reservation's events by reservation number.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::LogRange;
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::monitor::{Check, MonitorActor, MonitorConfig, PollOutcome, Stop};
use change_streamer_actors::reservation;
use change_streamer_actors::reservation::{
    EndBySubscription, Release, ReservationActor, ReservationEvent, Reserve,
};
use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use serde_json::{json, Value};

#[path = "replay/output.rs"]
mod output;
#[path = "replay/recorders.rs"]
mod recorders;

use output::{flush, Out, Output};
use recorders::{
    Cancel, CleanupRecorder, FakeChangeLog, Plan, ReleaseStatus, SessionRecorder, SetPlan,
};

fn parse_time(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_f64().map(|f| f as i64),
        Value::String(s) => humantime::parse_rfc3339_weak(s.trim_end_matches('Z'))
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64),
        _ => None,
    }
}

/// JavaScript's `String(n)` for the sample values the peer generates.
fn js_number(ms: i64) -> String {
    let v = ms as f64 / 1000.0;
    format!("{v}")
}

fn change_log_state(v: Option<&Value>) -> Option<LogRange> {
    let v = v?;
    Some(LogRange {
        replica_version: v.get("replicaVersion")?.as_str()?.to_string(),
        min_watermark: v.get("minWatermark")?.as_str()?.to_string(),
    })
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    actix_rt::time::sleep(Duration::from_millis(5)).await;
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// What a scenario's `config` sets, with the original's defaults.
struct Config {
    initial_delay: i64,
    start: i64,
    backup_url: String,
    db: String,
    default_state: LogRange,
}

impl Config {
    fn read(cfg: &Value) -> Result<Config, String> {
        Ok(Config {
            initial_delay: cfg
                .get("initialCleanupDelayMs")
                .and_then(Value::as_i64)
                .unwrap_or(100_000),
            start: cfg
                .get("startTime")
                .map(|v| parse_time(v).ok_or(format!("bad config.startTime: {v}")))
                .transpose()?
                .unwrap_or(1_745_452_800_000),
            backup_url: cfg
                .get("backupURL")
                .and_then(Value::as_str)
                .unwrap_or("s3://foo/bar")
                .to_string(),
            db: cfg
                .get("db")
                .and_then(Value::as_str)
                .unwrap_or("/tmp/zbugs-sync-replica.db")
                .to_string(),
            default_state: change_log_state(cfg.get("changeLogState")).unwrap_or(LogRange {
                replica_version: "123".into(),
                min_watermark: "1ab".into(),
            }),
        })
    }
}

/// The real actors a scenario drives, the recorders around them, and the reservations opened.
struct Replay {
    clock: Clock,
    start: i64,
    db: String,
    out: Out,
    metrics: FakeLitestream,
    change_log: Addr<FakeChangeLog>,
    reservations: Addr<ReservationActor>,
    monitor: Addr<MonitorActor>,
    sessions: Vec<(String, Addr<SessionRecorder>)>,
    pending: Vec<actix_rt::task::JoinHandle<Result<PollOutcome, MailboxError>>>,
}

async fn run(scenario: Value) -> Result<(), String> {
    let cfg = scenario.get("config").cloned().unwrap_or(json!({}));
    let mut replay = Replay::start(Config::read(&cfg)?).await;
    let steps = scenario
        .get("steps")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, step) in steps.iter().enumerate() {
        replay.step(i, step).await?;
        settle().await;
        flush(&replay.out);
    }
    replay.finish(steps.len()).await;
    Ok(())
}

impl Replay {
    /// The actors at the scenario's start, on a manual clock, the metrics page unconfigured.
    async fn start(cfg: Config) -> Replay {
        let clock = Clock::manual(cfg.start);
        let out: Out = Rc::new(RefCell::new(Output::default()));
        let metrics = FakeLitestream::start(Answer {
            body: "unconfigured".into(),
            ..Answer::default()
        })
        .await;
        let recorder = CleanupRecorder(out.clone()).start();
        let cleanup = CleanupActor::new(
            clock.clone(),
            Duration::from_millis(cfg.initial_delay.max(0) as u64),
            Duration::from_secs(30),
            recorder.recipient(),
        )
        .start();
        let change_log = FakeChangeLog {
            default: cfg.default_state,
            next: Plan::default(),
            deferred: HashMap::new(),
        }
        .start();
        let reservations = ReservationActor::new(
            clock.clone(),
            cfg.backup_url,
            change_log.clone().recipient(),
            cleanup.clone(),
        )
        .start();
        let mut monitor_cfg = MonitorConfig::new(metrics.url(), Duration::from_secs(60));
        monitor_cfg.poll_automatically = false;
        let monitor = MonitorActor::new(monitor_cfg, cleanup.clone()).start();
        Replay {
            clock,
            start: cfg.start,
            db: cfg.db,
            out,
            metrics,
            change_log,
            reservations,
            monitor,
            sessions: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Step `i`: the clock set to its `at`, then its `op`.
    async fn step(&mut self, i: usize, step: &Value) -> Result<(), String> {
        if let Some(at) = step.get("at").and_then(Value::as_i64) {
            self.clock.set_ms(self.start + at);
        }
        {
            let mut o = self.out.borrow_mut();
            o.step = i as i64;
            o.at = self.clock.now_ms() - self.start;
        }
        let op = step.get("op").and_then(Value::as_str).unwrap_or("");
        match op {
            "metrics" => self.metrics_page(step),
            "check" => self.check(step).await,
            "settle" => {
                for p in self.pending.drain(..) {
                    let _ = p.await;
                }
            }
            "releaseMetrics" => self.metrics.release(),
            "reserve" => self.reserve(step).await,
            "releaseStatus" => {
                let (res, _) = self.find(i, step)?;
                if !self
                    .change_log
                    .send(ReleaseStatus(res))
                    .await
                    .unwrap_or(false)
                {
                    return Err(format!(
                        "step {i}: reservation #{res} has no deferred status"
                    ));
                }
            }
            "end" => self.end(i, step).await,
            "cancel" => {
                let (res, session) = self.find(i, step)?;
                let _ = session.send(Cancel).await;
                let t = self.sessions[res as usize - 1].0.clone();
                let _ = self
                    .reservations
                    .send(Release {
                        task_id: t,
                        session_id: SessionId(res),
                    })
                    .await;
            }
            "stop" => {
                let _ = self.monitor.send(Stop).await;
                let _ = self
                    .reservations
                    .send(reservation::Stop {
                        end: Some(SessionEnd::ServiceStop),
                    })
                    .await;
                settle().await;
                self.metrics.release();
            }
            other => return Err(format!("step {i}: unknown op {other:?}")),
        }
        Ok(())
    }

    /// The reservation step `i` names: by number (`res`), else the task's latest.
    fn find(&self, i: usize, step: &Value) -> Result<(u64, Addr<SessionRecorder>), String> {
        if let Some(res) = step.get("res").and_then(Value::as_u64) {
            let (_, a) = (self.sessions.get(res as usize - 1))
                .ok_or(format!("step {i}: no reservation #{res}"))?;
            return Ok((res, a.clone()));
        }
        let t = task(step);
        (self.sessions.iter().enumerate().rev())
            .find(|(_, (tt, _))| *tt == t)
            .map(|(k, (_, a))| (k as u64 + 1, a.clone()))
            .ok_or(format!("step {i}: no reservation for {t}"))
    }

    /// `metrics`: what the stand-in page answers from now on.
    fn metrics_page(&self, step: &Value) {
        let samples: Vec<Value> = match step.get("samples").and_then(Value::as_array) {
            Some(s) => s.clone(),
            None if step.get("watermark").is_some() || step.get("value").is_some() => {
                vec![step.clone()]
            }
            None => vec![],
        };
        let rendered: Vec<(Option<String>, String, String)> =
            samples.iter().map(|s| self.sample(s)).collect();
        let refs: Vec<(Option<&str>, &str, String)> = rendered
            .iter()
            .map(|(w, n, v)| (w.as_deref(), n.as_str(), v.clone()))
            .collect();
        let mut body = match step.get("body").and_then(Value::as_str) {
            Some(b) => b.to_string(),
            None => {
                let mut b = render_page(&self.db, &refs);
                if step
                    .get("trailingNewline")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                {
                    b.push('\n');
                }
                b
            }
        };
        if let Some(a) = step.get("appendBody").and_then(Value::as_str) {
            body.push_str(a);
        }
        self.metrics.set(Answer {
            status: step.get("status").and_then(Value::as_u64).unwrap_or(200) as u16,
            body,
            reset: step.get("reset").and_then(Value::as_bool).unwrap_or(false),
            hang: step.get("hang").and_then(Value::as_bool).unwrap_or(false),
        });
    }

    /// One sample of the page: its watermark, file name and value (given, or a backup time).
    fn sample(&self, s: &Value) -> (Option<String>, String, String) {
        let value = if let Some(v) = s.get("value") {
            v.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string())
        } else if let Some(t) = s.get("backupTime") {
            js_number(parse_time(t).unwrap_or(0))
        } else {
            js_number(
                self.clock.now_ms()
                    + s.get("backupTimeOffsetMs")
                        .and_then(Value::as_i64)
                        .unwrap_or(0),
            )
        };
        (
            s.get("watermark")
                .and_then(Value::as_str)
                .map(str::to_string),
            s.get("name")
                .and_then(Value::as_str)
                .unwrap_or("file")
                .to_string(),
            value,
        )
    }

    /// `check`: one poll of the page, awaited unless `wait` is false (then pending until a
    /// `settle`, once the page got the request).
    async fn check(&mut self, step: &Value) {
        if step.get("wait").and_then(Value::as_bool) == Some(false) {
            let before = self.metrics.requests();
            let m = self.monitor.clone();
            self.pending
                .push(actix_rt::spawn(async move { m.send(Check).await }));
            self.metrics
                .wait_for_request(before, Duration::from_secs(2))
                .await;
        } else {
            let _ = self.monitor.send(Check).await;
        }
    }

    /// `reserve`: the change log's next answer planned, then a reservation by a new session.
    async fn reserve(&mut self, step: &Value) {
        let res = self.sessions.len() as u64 + 1;
        let plan = Plan {
            state: change_log_state(step.get("changeLogState")),
            // `new Error(x)` in the original: its message is `String(x)`.
            error: step.get("changeLogStateError").map(|e| {
                e.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| e.to_string())
            }),
            defer_for: step
                .get("deferStatus")
                .and_then(Value::as_bool)
                .unwrap_or(false)
                .then_some(res),
        };
        let _ = self.change_log.send(SetPlan(plan)).await;
        let session = SessionRecorder {
            out: self.out.clone(),
            task: task(step),
            res,
            closed: false,
        }
        .start();
        self.sessions.push((task(step), session.clone()));
        let _ = self
            .reservations
            .send(Reserve {
                task_id: task(step),
                session_id: SessionId(res),
                session: session.recipient(),
            })
            .await;
    }

    /// `end`: the task's reservation ended by its subscription, or (`updateCleanupDelay`
    /// false) released without growing the delay, its session closed.
    async fn end(&mut self, i: usize, step: &Value) {
        if step
            .get("updateCleanupDelay")
            .and_then(Value::as_bool)
            .unwrap_or(true)
        {
            let _ = self
                .reservations
                .send(EndBySubscription {
                    task_id: task(step),
                })
                .await;
        } else if let Ok((res, _)) = self.find(i, step) {
            // Ends the task's reservation without growing the delay, closing its session.
            let _ = self
                .reservations
                .send(Release {
                    task_id: task(step),
                    session_id: SessionId(res),
                })
                .await;
            if let Some((_, s)) = self.sessions.get(res as usize - 1) {
                s.do_send(ReservationEvent::Closed(
                    change_streamer_actors::session_end::SessionEnd::Replaced,
                ));
            }
        }
    }

    /// After the last step: pending polls answered, the page released, the `end` line.
    async fn finish(mut self, steps: usize) {
        self.out.borrow_mut().step = steps as i64;
        for p in self.pending.drain(..) {
            let _ = p.await;
        }
        settle().await;
        self.metrics.release();
        settle().await;
        flush(&self.out);
        println!(
            "{{\"event\":\"end\",\"at\":{},\"metricsRequests\":{}}}",
            self.clock.now_ms() - self.start,
            self.metrics.requests()
        );
    }
}

/// A step's `taskID` ("" without one).
fn task(step: &Value) -> String {
    step.get("taskID")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("off"))
        .target(env_logger::Target::Stderr)
        .init();
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: cargo run --example replay -- SCENARIO.json");
        std::process::exit(2);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("replay: {path}: {e}");
            std::process::exit(2);
        }
    };
    let scenario: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("replay: {path} is not JSON: {e}");
            std::process::exit(2);
        }
    };
    let system = actix_rt::System::new();
    if let Err(e) = system.block_on(run(scenario)) {
        eprintln!("replay: {e}");
        std::process::exit(1);
    }
}
