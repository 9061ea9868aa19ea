//! The control source (PROTOCOL.md §8.1c): litestream's control API is asked, each time the
//! backup replicator acks a commit W, to sync the replica's database file and wait until the
//! backup has it; its success makes W one observation of replica [`CONTROL_REPLICA`], backed up
//! when litestream answered. Nothing of the backup is read.
//!
//! The streamer tells the monitor of each ack ([`BackupAcked`]). One request is in flight at a
//! time ([`MonitorActor::start_poll`]'s rule for every source): acks that arrive meanwhile only
//! move the newest acked watermark, which the next request asks about as soon as the one in
//! flight ends. After a failed request the next one waits a backoff ([`backoff`]); the periodic
//! poll still runs (it asks for the newest acked watermark, or only whether litestream
//! answers), and so does the scheduling step after each request.

use std::time::Duration;

use actix::prelude::*;
use log::{debug, info};

use super::{BackupSource, MonitorActor, Observed, PollOutcome};
use crate::litestream::BackupSample;
use crate::litestream_control::{ControlClient, ControlError, ControlUrl, Synced};
use crate::streamer::BackupAcked;
use crate::watermark::Watermark;

/// The replica name of the observations the control source confirms.
pub const CONTROL_REPLICA: &str = "control";

/// How long a `sync` may take before it counts as failed (PROTOCOL.md §8.1c); litestream is
/// asked to keep to it too.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// The wait after a first failed request, doubled after each further one.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);

/// The longest wait between failed requests, if the poll interval is not shorter.
const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// `--litestream-control-url` and `--litestream-db-path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlSource {
    pub url: ControlUrl,
    /// The backup replica's database file, as `litestream.yml` names it.
    pub db_path: String,
}

/// What the control source keeps between requests.
#[derive(Default)]
pub(super) struct ControlState {
    /// Made on first use, on the monitor's runtime.
    client: Option<ControlClient>,
    /// The newest commit the backup replicator acked.
    acked: Option<Watermark>,
    /// The newest watermark litestream confirmed backed up.
    confirmed: Option<Watermark>,
    /// Failed requests in a row.
    failures: u32,
    /// The request that ends a backoff, while one runs.
    retry: Option<SpawnHandle>,
}

/// The wait before the request that follows `failures` failed ones in a row (≥ 1): 250 ms,
/// doubling each time, at most min(`interval`, 4 s) (PROTOCOL.md §8.1c).
pub fn backoff(failures: u32, interval: Duration) -> Duration {
    let doubled = FIRST_BACKOFF.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled.min(MAX_BACKOFF.min(interval))
}

impl MonitorActor {
    /// One `sync` with `wait` of the replica's file, about the newest acked watermark (if any);
    /// a backoff in progress ends here, since a request is being sent anyway.
    pub(super) fn poll_control(
        &mut self,
        ctx: &mut Context<Self>,
        source: ControlSource,
    ) -> ResponseActFuture<Self, Observed> {
        if let Some(h) = self.control.retry.take() {
            ctx.cancel_future(h);
        }
        let client = self
            .control
            .client
            .get_or_insert_with(|| ControlClient::new(source.url.clone()))
            .clone();
        let asked = self.control.acked.clone();
        let timeout = self.cfg.timeout;
        let ask = async move { client.sync_wait(&source.db_path, timeout).await };
        Box::pin(
            ask.into_actor(self)
                .map(move |res, act, _| act.control_answered(asked, res)),
        )
    }

    /// Turns litestream's answer to the request about `asked` into what is observed.
    fn control_answered(
        &mut self,
        asked: Option<Watermark>,
        res: Result<Synced, ControlError>,
    ) -> Observed {
        let synced = match res {
            Ok(synced) => synced,
            Err(e) => return self.failed(e.to_string()),
        };
        self.stats.last_poll_ok = Some(true);
        debug!(
            watermark:% = asked.as_ref().map_or("(none acked yet)", |w| w.as_str()); "litestream synced ({}, txid {}, replicated {}) through watermark {}",
            synced.status,
            synced.txid,
            synced.replicated_txid,
            asked.as_ref().map_or("(none acked yet)", |w| w.as_str())
        );
        if asked > self.control.confirmed {
            self.control.confirmed = asked.clone();
        }
        self.stats.backup_watermark = self.control.confirmed.clone();
        let samples: Vec<BackupSample> = asked
            .into_iter()
            .map(|watermark| BackupSample {
                watermark,
                replica: CONTROL_REPLICA.to_string(),
                backed_up_at_ms: self.cfg.clock.now_ms(),
            })
            .collect();
        let outcome = PollOutcome::Read {
            samples: samples.len(),
            invalid: 0,
        };
        (samples, outcome)
    }

    /// After each request: a backoff when it failed, else the next request if an ack came in
    /// meanwhile.
    pub(super) fn control_poll_ended(&mut self, ctx: &mut Context<Self>, outcome: &PollOutcome) {
        match outcome {
            PollOutcome::Failed(_) => {
                self.control.failures += 1;
                let wait = backoff(self.control.failures, self.cfg.interval);
                info!(
                    "asking litestream again in {} ms ({} failed request(s) in a row)",
                    wait.as_millis(),
                    self.control.failures
                );
                let retry = ctx.run_later(wait, |act, ctx| {
                    act.control.retry = None;
                    act.ask_if_behind(ctx);
                });
                self.control.retry = Some(retry);
            }
            PollOutcome::Read { .. } => {
                self.control.failures = 0;
                self.ask_if_behind(ctx);
            }
            PollOutcome::StillInFlight | PollOutcome::Aborted => {}
        }
    }

    /// Whether an acked watermark is not confirmed yet: work waits on the backup.
    pub(super) fn control_behind(&self) -> bool {
        self.control.acked > self.control.confirmed
    }

    /// Asks litestream, unless a backoff runs, when an acked watermark is not confirmed yet
    /// (the request in flight, if any, is joined: [`MonitorActor::start_poll`]).
    fn ask_if_behind(&mut self, ctx: &mut Context<Self>) {
        if self.control.retry.is_none() && self.control_behind() {
            self.start_poll(ctx);
        }
    }
}

impl Handler<BackupAcked> for MonitorActor {
    type Result = ();
    fn handle(&mut self, msg: BackupAcked, ctx: &mut Context<Self>) {
        if !matches!(self.cfg.source, BackupSource::Control(_)) {
            return;
        }
        if Some(&msg.watermark) > self.control.acked.as_ref() {
            self.control.acked = Some(msg.watermark);
        }
        if self.control_behind() {
            self.stall.pending();
        }
        self.ask_if_behind(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_250_ms_up_to_the_interval_or_4_s() {
        let long = Duration::from_secs(60);
        let ms = |n| backoff(n, long).as_millis();
        assert_eq!(
            [ms(1), ms(2), ms(3), ms(4), ms(5), ms(6), ms(99)],
            [250, 500, 1000, 2000, 4000, 4000, 4000]
        );
        assert_eq!(
            backoff(3, Duration::from_millis(600)),
            Duration::from_millis(600)
        );
        assert_eq!(
            backoff(1, Duration::from_millis(100)),
            Duration::from_millis(100)
        );
    }
}
