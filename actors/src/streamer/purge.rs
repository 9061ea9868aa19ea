//! Purge: the [`Purger`], which carries out scheduled cleanups when they are safe (SPEC §9), and
//! the streamer's side of the check ([`PurgeIfSafe`]).
//!
//! The [`CleanupActor`] decides a watermark `W` may go; the purger waits `purge_delay`, then asks
//! the streamer to purge below `W` *if* every connected subscriber has acked `W`
//! ([`PurgeIfSafe`]). A subscriber still behind `W`, or no subscriber at all, means "not yet":
//! the same check runs again after the same delay. A scheduled watermark is never dropped;
//! several are handled smallest first, and a larger one waits while a smaller one is blocked.
//!
//! The streamer knows every subscriber's acked watermark, so [`PurgeIfSafe`] is answered there,
//! and the purge is queued on the change log in the same turn as the decision: no subscriber
//! can be admitted between the check and the delete.
//!
//! [`CleanupActor`]: crate::cleanup::CleanupActor

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use log::{info, warn};
use tokio::time::Instant;

use super::Streamer;
use crate::cleanup::ScheduleCleanup;
use crate::watermark::Watermark;

/// Purge the change log below `watermark` if every connected subscriber has acked it.
#[derive(Message, Debug, Clone)]
#[rtype(result = "PurgeAnswer")]
pub struct PurgeIfSafe {
    pub watermark: Watermark,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeAnswer {
    Purged(u64),
    NoSubscribers,
    Blocked {
        subscriber: String,
        acked: Watermark,
    },
    Failed(String),
}

/// The purger's part of `/status`.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "PurgeState")]
pub struct GetPurgeState;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct PurgeState {
    pub scheduled: Vec<Watermark>,
    pub last_purged_before: Option<Watermark>,
    pub rows_purged: u64,
    pub purges: u64,
    /// Why the smallest scheduled watermark is waiting, if it is.
    pub waiting: Option<String>,
}

/// See the module documentation.
pub struct Purger {
    streamer: Recipient<PurgeIfSafe>,
    delay: Duration,
    /// Each scheduled watermark and when it is next checked, on the runtime's clock (tokio time,
    /// which tests can pause), the clock its timer runs on.
    scheduled: BTreeMap<Watermark, Instant>,
    checking: bool,
    timer: Option<SpawnHandle>,
    state: PurgeState,
}

impl Purger {
    pub fn new(streamer: Recipient<PurgeIfSafe>, delay: Duration) -> Purger {
        Purger {
            streamer,
            delay,
            scheduled: BTreeMap::new(),
            checking: false,
            timer: None,
            state: PurgeState::default(),
        }
    }

    fn arm(&mut self, ctx: &mut Context<Self>) {
        if let Some(t) = self.timer.take() {
            ctx.cancel_future(t);
        }
        if self.checking {
            return;
        }
        if let Some((_, due)) = self.scheduled.first_key_value() {
            let wait = due.saturating_duration_since(Instant::now());
            self.timer = Some(ctx.run_later(wait, |act, ctx| {
                act.timer = None;
                act.check(ctx);
            }));
        }
    }

    fn check(&mut self, ctx: &mut Context<Self>) {
        let Some((w, due)) = self
            .scheduled
            .first_key_value()
            .map(|(w, d)| (w.clone(), *d))
        else {
            return;
        };
        if self.checking {
            return;
        }
        if due > Instant::now() {
            self.arm(ctx);
            return;
        }
        self.checking = true;
        self.streamer
            .send(PurgeIfSafe { watermark: w.clone() })
            .into_actor(self)
            .map(move |answer, act, ctx| {
                act.checking = false;
                let answer = answer.unwrap_or_else(|e| PurgeAnswer::Failed(e.to_string()));
                let retry = |act: &mut Purger, why: String| {
                    act.state.waiting = Some(why);
                    act.scheduled.insert(w.clone(), Instant::now() + act.delay);
                };
                match answer {
                    PurgeAnswer::Purged(n) => {
                        info!("purged {n} change-log row(s) before watermark={w}");
                        act.scheduled.remove(&w);
                        act.state.rows_purged += n;
                        act.state.purges += 1;
                        act.state.last_purged_before = Some(w.clone());
                        act.state.waiting = None;
                        act.check(ctx);
                        return;
                    }
                    PurgeAnswer::NoSubscribers => {
                        info!("purge before watermark={w} waits: no subscriber connected; retrying in {} ms", act.delay.as_millis());
                        retry(act, "no subscriber connected".into());
                    }
                    PurgeAnswer::Blocked { subscriber, acked } => {
                        info!("purge before watermark={w} waits: subscriber {subscriber} acked only {acked}; retrying in {} ms", act.delay.as_millis());
                        retry(act, format!("subscriber {subscriber} acked {acked}"));
                    }
                    PurgeAnswer::Failed(e) => {
                        warn!("purge before watermark={w} failed: {e}; retrying in {} ms", act.delay.as_millis());
                        retry(act, format!("failed: {e}"));
                    }
                }
                act.arm(ctx);
            })
            .spawn(ctx);
    }
}

impl Actor for Purger {
    type Context = Context<Self>;
}

impl Handler<ScheduleCleanup> for Purger {
    type Result = ();
    fn handle(&mut self, msg: ScheduleCleanup, ctx: &mut Context<Self>) {
        info!(
            "cleanup scheduled: purge before watermark={} in {} ms",
            msg.watermark,
            self.delay.as_millis()
        );
        self.scheduled
            .entry(msg.watermark)
            .or_insert_with(|| Instant::now() + self.delay);
        self.arm(ctx);
    }
}

impl Handler<GetPurgeState> for Purger {
    type Result = MessageResult<GetPurgeState>;
    fn handle(&mut self, _: GetPurgeState, _: &mut Context<Self>) -> Self::Result {
        let mut s = self.state.clone();
        s.scheduled = self.scheduled.keys().cloned().collect();
        MessageResult(s)
    }
}

impl Handler<PurgeIfSafe> for Streamer {
    type Result = ResponseFuture<PurgeAnswer>;
    fn handle(&mut self, msg: PurgeIfSafe, _: &mut Context<Self>) -> Self::Result {
        if self.subscribers.is_empty() {
            return Box::pin(async { PurgeAnswer::NoSubscribers });
        }
        if let Some(lagging) = self.subscribers.values().find(|s| s.acked < msg.watermark) {
            let answer = PurgeAnswer::Blocked {
                subscriber: lagging.id.clone(),
                acked: lagging.acked.clone(),
            };
            return Box::pin(async move { answer });
        }
        let purge = self.log.purge(msg.watermark);
        Box::pin(async move {
            match purge.await {
                Ok(n) => PurgeAnswer::Purged(n),
                Err(e) => PurgeAnswer::Failed(e.to_string()),
            }
        })
    }
}
