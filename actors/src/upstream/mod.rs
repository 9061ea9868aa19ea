//! The upstream client: reads the custom change source over a websocket (PROTOCOL.md §4).
//!
//! A task on the actix runtime connects to `--upstream`, resuming from the change log's last
//! durable watermark, and passes what it reads to the [`Streamer`] in batches (whatever frames
//! are already available, so that a busy stream costs one message per batch, not per change).
//! It writes the acks the streamer hands back, in order, each once its transaction is durable.
//! When the streamer says a tracked send is waiting, it stops reading until the release: the
//! upstream is read no faster than the subscribers' majority can take.
//!
//! Any end of the connection, a protocol violation or an unreadable frame is logged; the task
//! tells the streamer (which rolls back a transaction in progress) and reconnects with capped
//! exponential backoff. Nothing of a broken transaction is ever stored.
//!
//! The source is pinged every [`UpstreamConfig::ping_interval`]; nothing heard from it for two
//! intervals ends the connection with 1001 `no pong for N ms` ([`liveness`]), and a connect
//! must complete within two intervals ([`connect`]). Why the service is not connected, and
//! whether that is a silence, is told to the streamer ([`UpstreamLink`]) for `/status` and
//! `/readyz` (PROTOCOL.md §4, "Liveness" and "Connect timeout").
//!
//! A `wss://` change source is verified against the roots in [`UpstreamConfig::tls`]; with a
//! [`UpstreamConfig::secret`] every handshake carries `Authorization: Bearer <secret>`. A
//! handshake the change source refuses (401, 403) is logged, without the secret, and retried
//! with the same backoff as any failed connection (PROTOCOL.md §4, §15).

mod connect;
mod fragments;
pub mod liveness;
pub mod protocol;
mod session;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use log::{info, warn};
use tokio::sync::oneshot;

use crate::changelog::{ChangeLog, ChangeLogError};
use crate::secret::LiveSecret;
use crate::session_end::truncate_reason;
use crate::streamer::{Streamer, UpstreamDown, UpstreamEvent, UpstreamLink};
use connect::connect_within;
use liveness::Liveness;

/// Most messages passed to the streamer in one batch.
const MAX_BATCH: usize = 512;
/// Largest frame accepted from the change source.
const MAX_FRAME: usize = 256 << 20;

/// How the client connects and retries.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `ws://` or `wss://` URL of the change source.
    pub url: String,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// `--upstream-ping-interval-ms`: the source is pinged this often; two of them without a
    /// word from it end the connection, and bound a connect (PROTOCOL.md §4).
    pub ping_interval: Duration,
    /// Sent as `Authorization: Bearer <secret>` on every handshake: the one last published
    /// when the handshake begins, so a secret re-read (PROTOCOL.md §15.1) is used from the next
    /// connect.
    pub secret: Option<LiveSecret>,
    /// The roots a `wss://` change source is verified against (its ALPN must offer http/1.1
    /// only); `None`: awc's own (webpki).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl UpstreamConfig {
    pub fn new(url: impl Into<String>) -> Self {
        UpstreamConfig {
            url: url.into(),
            first_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(10),
            ping_interval: Duration::from_secs(30),
            secret: None,
            tls: None,
        }
    }
}

/// Stops the client when dropped or told to.
pub struct UpstreamHandle {
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<()>>,
}

impl UpstreamHandle {
    /// Closes the connection and waits for the task to end.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            let _ = d.await;
        }
    }
}

/// Starts the client on the current actix runtime.
pub fn start(cfg: UpstreamConfig, log: ChangeLog, streamer: Addr<Streamer>) -> UpstreamHandle {
    let (stop_tx, stop_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    actix_rt::spawn(async move {
        run(cfg, log, streamer, stop_rx).await;
        let _ = done_tx.send(());
    });
    UpstreamHandle {
        stop: Some(stop_tx),
        done: Some(done_rx),
    }
}

/// Why a connection to the change source ended.
#[derive(Debug, thiserror::Error)]
enum ConnectionEnd {
    #[error("stopped")]
    Stopped,
    #[error("change source closed the connection{0}")]
    Closed(String),
    #[error("websocket error: {0}")]
    Ws(String),
    #[error("the change source refused the handshake with {0} (is --upstream-secret-file the secret it expects?)")]
    Refused(awc::http::StatusCode),
    #[error("protocol violation: {0}")]
    Violation(String),
    #[error("{0}")]
    ChangeLog(#[from] ChangeLogError),
    #[error("streamer is gone")]
    StreamerGone,
    /// Nothing heard from the source (no pong, no frame) for this long, at least two intervals.
    #[error("no pong for {} ms", .0.as_millis())]
    Silent(Duration),
    /// The connect (TCP, TLS, upgrade) did not complete within this limit.
    #[error("connect timed out after {} ms", .0.as_millis())]
    ConnectTimeout(Duration),
}

impl ConnectionEnd {
    /// The close frame the service sends the source for this end: `None` where the connection
    /// is already gone (closed by the source, a websocket error), never made, or the stop sent
    /// its own.
    fn close_frame(&self) -> Option<(u16, String)> {
        let code = match self {
            ConnectionEnd::Violation(_) => 1002,
            ConnectionEnd::ChangeLog(_) | ConnectionEnd::StreamerGone => 1011,
            ConnectionEnd::Silent(_) => 1001,
            ConnectionEnd::Stopped
            | ConnectionEnd::Closed(_)
            | ConnectionEnd::Ws(_)
            | ConnectionEnd::Refused(_)
            | ConnectionEnd::ConnectTimeout(_) => return None,
        };
        Some((code, truncate_reason(&self.to_string()).to_string()))
    }

    /// A silence (PROTOCOL.md §4): `/readyz` says `upstream silent` until a connection succeeds.
    fn is_silence(&self) -> bool {
        matches!(
            self,
            ConnectionEnd::Silent(_) | ConnectionEnd::ConnectTimeout(_)
        )
    }
}

/// The URL for the next connection: bare for an initial sync, else resuming (PROTOCOL.md §4).
fn resume_url(base: &str, log_state: &crate::changelog::LogStats) -> String {
    let (Some(rv), Some(last)) = (&log_state.replica_version, &log_state.max_watermark) else {
        return base.to_string();
    };
    match url::Url::parse(base) {
        Ok(mut u) => {
            u.query_pairs_mut()
                .append_pair("lastWatermark", last.as_str())
                .append_pair("replicaVersion", rv.as_str());
            u.to_string()
        }
        Err(_) => base.to_string(),
    }
}

async fn run(
    cfg: UpstreamConfig,
    log: ChangeLog,
    streamer: Addr<Streamer>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut backoff = cfg.first_backoff;
    loop {
        let state = match log.stats().await {
            Ok(s) => s,
            Err(e) => {
                warn!("upstream: cannot read the change log ({e}); not connecting");
                return;
            }
        };
        let url = resume_url(&cfg.url, &state);
        info!("connecting to change source {url}");
        let (end, closed_with) = tokio::select! {
            _ = &mut stop => (ConnectionEnd::Stopped, None),
            res = connect_within(&cfg, &url, cfg.ping_interval * 2) => match res {
                Err(e) => (e.into(), None),
                Ok((_, framed)) => {
                    info!("connected to change source (resuming after watermark={:?})", state.max_watermark.as_ref().map(|w| w.to_string()));
                    backoff = cfg.first_backoff;
                    streamer.do_send(UpstreamEvent::Connected { resume_after: state.max_watermark.clone() });
                    streamer.do_send(UpstreamLink::Up);
                    let live = Liveness::new(cfg.ping_interval);
                    let end = session::session(framed, &streamer, &mut stop, live).await;
                    streamer.do_send(UpstreamEvent::Disconnected);
                    end
                }
            },
        };
        match end {
            ConnectionEnd::Stopped => {
                info!("upstream client stopped");
                return;
            }
            e => {
                let closed = closed_with.map(|c| format!(" (closed with {c})"));
                warn!(
                    "upstream connection ended: {e}{}; reconnecting in {} ms",
                    closed.unwrap_or_default(),
                    backoff.as_millis()
                );
                streamer.do_send(UpstreamLink::Down(UpstreamDown {
                    reason: e.to_string(),
                    silent: e.is_silence(),
                }));
            }
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = actix_rt::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(cfg.max_backoff);
    }
}
