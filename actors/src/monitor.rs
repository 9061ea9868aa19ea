//! `MonitorActor`: the backup monitor's eyes (SPEC §8.1).
//!
//! Every poll interval it GETs litestream's `/metrics`, reads the `litestream_replica_progress`
//! samples (see [`crate::litestream`]) and hands them to the [`CleanupActor`] as one
//! [`PollResult`], which records them and then schedules. A failed poll (network error, non-2xx,
//! no answer within the timeout, garbage) is a warning, a counted error and an *empty* result:
//! scheduling still runs, because watermarks recorded earlier may have become due.
//!
//! Polls never overlap: a [`Check`] that arrives while one is in flight waits for that one's
//! outcome instead of starting another. [`Stop`] aborts the request in flight (dropping the
//! future closes the connection) and stops the actor, so nothing from a half-read answer is
//! ever recorded.
//!
//! [`CleanupActor`]: crate::cleanup::CleanupActor

use std::time::Duration;

use actix::prelude::*;
use log::{debug, warn};
use serde::Serialize;
use tokio::sync::oneshot;

use crate::cleanup::{CleanupActor, PollResult};
use crate::litestream::{parse_progress_page, BackupSample};

/// The most a metrics page may weigh; litestream's is a few KiB per database.
const MAX_PAGE_BYTES: usize = 64 << 20;

/// How the monitor polls.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    pub metrics_url: String,
    /// Period of the automatic polls; the first comes one interval after start.
    pub interval: Duration,
    /// No answer within this is a failed poll (SPEC: `min(interval, 10 s)`).
    pub timeout: Duration,
    /// `false` leaves polling to explicit [`Check`]s (tests, replay).
    pub poll_automatically: bool,
}

impl MonitorConfig {
    pub fn new(metrics_url: impl Into<String>, interval: Duration) -> Self {
        MonitorConfig {
            metrics_url: metrics_url.into(),
            interval,
            timeout: interval.min(Duration::from_secs(10)),
            poll_automatically: true,
        }
    }
}

/// How a poll ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PollOutcome {
    /// The page was read: `samples` valid progress samples, `invalid` rejected ones.
    Read { samples: usize, invalid: usize },
    /// Network error, non-2xx, timeout or garbage.
    Failed(String),
    /// The monitor stopped before the poll finished.
    Aborted,
}

/// Polls now (or joins the poll in flight) and answers once the [`CleanupActor`] has acted on
/// the result.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "PollOutcome")]
pub struct Check;

/// Aborts any poll in flight and stops the monitor.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Stop;

/// Counters for `/metrics` and `/status`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "MonitorStats")]
pub struct GetMonitorStats;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MonitorStats {
    pub polls_total: u64,
    pub poll_errors_total: u64,
    pub invalid_watermarks_total: u64,
    pub last_poll_ok: Option<bool>,
}

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("{0}")]
    Send(String),
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("reading the body: {0}")]
    Body(String),
    #[error("{0}")]
    Page(#[from] crate::litestream::PageError),
}

/// See the module documentation.
pub struct MonitorActor {
    cfg: MonitorConfig,
    cleanup: Addr<CleanupActor>,
    client: Option<awc::Client>,
    in_flight: Option<SpawnHandle>,
    waiters: Vec<oneshot::Sender<PollOutcome>>,
    stats: MonitorStats,
    stopping: bool,
}

impl MonitorActor {
    pub fn new(cfg: MonitorConfig, cleanup: Addr<CleanupActor>) -> Self {
        MonitorActor {
            cfg,
            cleanup,
            client: None,
            in_flight: None,
            waiters: Vec::new(),
            stats: MonitorStats::default(),
            stopping: false,
        }
    }

    fn start_poll(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight.is_some() || self.stopping {
            return;
        }
        let client = self.client.get_or_insert_with(awc::Client::default).clone();
        let url = self.cfg.metrics_url.clone();
        let timeout = self.cfg.timeout;
        let fetch = async move {
            let mut resp = client
                .get(&url)
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| FetchError::Send(e.to_string()))?;
            let body = resp
                .body()
                .limit(MAX_PAGE_BYTES)
                .await
                .map_err(|e| FetchError::Body(e.to_string()))?;
            let text = String::from_utf8_lossy(&body).into_owned();
            if !resp.status().is_success() {
                let first_line = text
                    .lines()
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect();
                return Err(FetchError::Status {
                    status: resp.status().as_u16(),
                    body: first_line,
                });
            }
            Ok(parse_progress_page(&text)?)
        };
        let handle = ctx.spawn(fetch.into_actor(self).then(|res, act, _| {
            act.stats.polls_total += 1;
            let (samples, outcome): (Vec<BackupSample>, PollOutcome) = match res {
                Ok(page) => {
                    for reason in &page.invalid {
                        warn!("ignoring litestream sample: {reason}");
                    }
                    act.stats.invalid_watermarks_total += page.invalid.len() as u64;
                    act.stats.last_poll_ok = Some(true);
                    debug!("metrics poll read {} sample(s)", page.samples.len());
                    let outcome = PollOutcome::Read {
                        samples: page.samples.len(),
                        invalid: page.invalid.len(),
                    };
                    (page.samples, outcome)
                }
                Err(e) => {
                    warn!("unable to fetch metrics at {}: {e}", act.cfg.metrics_url);
                    act.stats.poll_errors_total += 1;
                    act.stats.last_poll_ok = Some(false);
                    (Vec::new(), PollOutcome::Failed(e.to_string()))
                }
            };
            act.cleanup
                .send(PollResult { samples })
                .into_actor(act)
                .map(move |_, act, _| {
                    act.in_flight = None;
                    for w in act.waiters.drain(..) {
                        let _ = w.send(outcome.clone());
                    }
                })
        }));
        self.in_flight = Some(handle);
    }
}

impl Actor for MonitorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        log::info!(
            "monitoring backups at {} every {} ms",
            self.cfg.metrics_url,
            self.cfg.interval.as_millis()
        );
        if self.cfg.poll_automatically {
            ctx.run_interval(self.cfg.interval, |act, ctx| act.start_poll(ctx));
        }
    }
}

impl Handler<Check> for MonitorActor {
    type Result = ResponseFuture<PollOutcome>;
    fn handle(&mut self, _: Check, ctx: &mut Context<Self>) -> Self::Result {
        if self.stopping {
            return Box::pin(async { PollOutcome::Aborted });
        }
        let (tx, rx) = oneshot::channel();
        self.waiters.push(tx);
        self.start_poll(ctx);
        Box::pin(async move { rx.await.unwrap_or(PollOutcome::Aborted) })
    }
}

impl Handler<Stop> for MonitorActor {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        self.stopping = true;
        if let Some(h) = self.in_flight.take() {
            log::info!(
                "aborting the metrics request in flight to {}",
                self.cfg.metrics_url
            );
            ctx.cancel_future(h);
        }
        self.waiters.clear();
        ctx.stop();
    }
}

impl Handler<GetMonitorStats> for MonitorActor {
    type Result = MessageResult<GetMonitorStats>;
    fn handle(&mut self, _: GetMonitorStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}
