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
//! A `wss://` change source is verified against the roots in [`UpstreamConfig::tls`]; with a
//! [`UpstreamConfig::secret`] every handshake carries `Authorization: Bearer <secret>`. A
//! handshake the change source refuses (401, 403) is logged, without the secret, and retried
//! with the same backoff as any failed connection (PROTOCOL.md §4, §15).

pub mod protocol;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_http::ws::Item;
use awc::ws::{Frame, Message as WsMessage};
use bytes::{Bytes, BytesMut};
use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, SinkExt, StreamExt};
use log::{info, warn};
use tokio::sync::oneshot;

use crate::changelog::{ChangeLog, ChangeLogError};
use crate::secret::LiveSecret;
use crate::session_end::truncate_reason;
use crate::streamer::{Streamer, UpstreamBatch, UpstreamEvent};
use protocol::{parse_frame, UpstreamMessage};

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
        let end = tokio::select! {
            _ = &mut stop => ConnectionEnd::Stopped,
            res = connect(&cfg, &url) => match res {
                Err(awc::error::WsClientError::InvalidResponseStatus(code))
                    if code == awc::http::StatusCode::UNAUTHORIZED || code == awc::http::StatusCode::FORBIDDEN =>
                {
                    ConnectionEnd::Refused(code)
                }
                Err(e) => ConnectionEnd::Ws(format!("connecting: {e}")),
                Ok((_, framed)) => {
                    info!("connected to change source (resuming after watermark={:?})", state.max_watermark.as_ref().map(|w| w.to_string()));
                    backoff = cfg.first_backoff;
                    streamer.do_send(UpstreamEvent::Connected { resume_after: state.max_watermark.clone() });
                    let end = session(framed, &streamer, &mut stop).await;
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
            e => warn!(
                "upstream connection ended: {e}; reconnecting in {} ms",
                backoff.as_millis()
            ),
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = actix_rt::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(cfg.max_backoff);
    }
}

/// One websocket handshake with the change source at `url`, over `cfg`'s TLS roots and with
/// its secret. (An error of awc names the URL and the status, never a header.)
async fn connect(
    cfg: &UpstreamConfig,
    url: &str,
) -> Result<
    (
        awc::ClientResponse,
        actix_codec::Framed<awc::BoxedSocket, awc::ws::Codec>,
    ),
    awc::error::WsClientError,
> {
    // With TLS, the roots and the ALPN (http/1.1 only) are the given configuration's: the
    // builder's `max_http_version` would replace it with awc's own.
    let client = match &cfg.tls {
        Some(tls) => awc::Client::builder()
            .connector(awc::Connector::new().rustls_0_23(tls.clone()))
            .finish(),
        None => awc::Client::builder()
            .max_http_version(awc::http::Version::HTTP_11)
            .finish(),
    };
    let mut request = client.ws(url).max_frame_size(MAX_FRAME);
    if let Some(secret) = &cfg.secret {
        let header = secret.borrow().bearer_header();
        request = request.header(awc::http::header::AUTHORIZATION, header);
    }
    request.connect().await
}

type AckFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<String>, ChangeLogError>>>>;

/// Reassembles fragmented text messages.
#[derive(Default)]
struct Fragments(Option<BytesMut>);

/// The text of a whole message, checked as UTF-8 where it lies: a frame's bytes are not
/// copied to be read.
fn utf8(bytes: &[u8]) -> Result<&str, ConnectionEnd> {
    std::str::from_utf8(bytes)
        .map_err(|_| ConnectionEnd::Violation("text frame is not UTF-8".into()))
}

impl Fragments {
    /// Returns the bytes of a whole text message, `Ok(None)` for a non-text frame to ignore, or
    /// an error.
    fn take(&mut self, frame: Frame) -> Result<Option<Bytes>, ConnectionEnd> {
        match frame {
            Frame::Text(b) => Ok(Some(b)),
            Frame::Continuation(Item::FirstText(b)) => {
                self.0 = Some(BytesMut::from(&b[..]));
                Ok(None)
            }
            Frame::Continuation(Item::Continue(b)) => {
                self.0
                    .as_mut()
                    .ok_or_else(|| ConnectionEnd::Violation("stray continuation".into()))?
                    .extend_from_slice(&b);
                Ok(None)
            }
            Frame::Continuation(Item::Last(b)) => {
                let mut all = self
                    .0
                    .take()
                    .ok_or_else(|| ConnectionEnd::Violation("stray continuation".into()))?;
                all.extend_from_slice(&b);
                Ok(Some(all.freeze()))
            }
            Frame::Binary(_) | Frame::Continuation(Item::FirstBinary(_)) => {
                Err(ConnectionEnd::Violation("binary frame".into()))
            }
            Frame::Ping(_) | Frame::Pong(_) => Ok(None),
            Frame::Close(reason) => Err(ConnectionEnd::Closed(
                reason
                    .map(|r| format!(" ({:?} {})", r.code, r.description.unwrap_or_default()))
                    .unwrap_or_default(),
            )),
        }
    }
}

/// Writes `first` and every further ack already due to `sink`, then flushes once.
///
/// Why: a commit group makes many transactions durable at once, so their acks are due
/// together; one write for all of them instead of one each (a write to a loopback socket
/// costs the kernel's work of both ends).
async fn send_acks(
    sink: &mut UpstreamSink,
    acks: &mut FuturesOrdered<AckFuture>,
    first: Result<Option<String>, ChangeLogError>,
) -> Result<(), ConnectionEnd> {
    let mut next = Some(first);
    let mut fed = false;
    // An ack that failed (its transaction was not stored) ends the connection, but the acks
    // before it are still written.
    let mut failed = None;
    while let Some(ack) = next.take() {
        match ack {
            Ok(Some(frame)) => {
                sink.feed(WsMessage::Text(frame.into()))
                    .await
                    .map_err(|e| ConnectionEnd::Ws(e.to_string()))?;
                fed = true;
            }
            Ok(None) => {}
            Err(e) => {
                failed = Some(ConnectionEnd::ChangeLog(e));
                break;
            }
        }
        next = acks.next().now_or_never().flatten();
    }
    if fed {
        sink.flush()
            .await
            .map_err(|e| ConnectionEnd::Ws(e.to_string()))?;
    }
    failed.map_or(Ok(()), Err)
}

type UpstreamSink = futures_util::stream::SplitSink<
    actix_codec::Framed<awc::BoxedSocket, awc::ws::Codec>,
    WsMessage,
>;

/// One connection to the change source, until it ends; an end the service decides on (a broken
/// rule, a change log that failed, the streamer gone) is said to the source in a close frame
/// (PROTOCOL.md §4: 1002 with the rule, 1011 otherwise) before the connection drops.
async fn session(
    framed: actix_codec::Framed<awc::BoxedSocket, awc::ws::Codec>,
    streamer: &Addr<Streamer>,
    stop: &mut oneshot::Receiver<()>,
) -> ConnectionEnd {
    let (mut sink, mut stream) = framed.split();
    let end = drive(&mut sink, &mut stream, streamer, stop).await;
    if let Some((code, reason)) = end.close_frame() {
        let close = awc::ws::CloseReason {
            code: awc::ws::CloseCode::from(code),
            description: Some(reason),
        };
        if sink.send(WsMessage::Close(Some(close))).await.is_ok() {
            // The closing handshake (RFC 6455 §7.1.1): read on until the source's close, so
            // that what it sent meanwhile is not left unread, which would make the socket's
            // end a reset that can lose the close frame at the source; bounded.
            let _ = tokio::time::timeout(CLOSE_HANDSHAKE, async {
                while let Some(Ok(frame)) = stream.next().await {
                    if matches!(frame, Frame::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
    }
    end
}

/// The longest the service waits for the source's answer to its close frame.
const CLOSE_HANDSHAKE: Duration = Duration::from_secs(1);

impl ConnectionEnd {
    /// The close frame the service sends the source for this end: `None` where the connection
    /// is already gone (closed by the source, a websocket error) or the stop sent its own.
    fn close_frame(&self) -> Option<(u16, String)> {
        let code = match self {
            ConnectionEnd::Violation(_) => 1002,
            ConnectionEnd::ChangeLog(_) | ConnectionEnd::StreamerGone => 1011,
            ConnectionEnd::Stopped
            | ConnectionEnd::Closed(_)
            | ConnectionEnd::Ws(_)
            | ConnectionEnd::Refused(_) => return None,
        };
        Some((code, truncate_reason(&self.to_string()).to_string()))
    }
}

async fn drive(
    sink: &mut UpstreamSink,
    stream: &mut futures_util::stream::SplitStream<
        actix_codec::Framed<awc::BoxedSocket, awc::ws::Codec>,
    >,
    streamer: &Addr<Streamer>,
    stop: &mut oneshot::Receiver<()>,
) -> ConnectionEnd {
    let mut acks: FuturesOrdered<AckFuture> = FuturesOrdered::new();
    let mut waiting: VecDeque<UpstreamMessage> = VecDeque::new();
    let mut release: Option<oneshot::Receiver<()>> = None;
    let mut fragments = Fragments::default();

    loop {
        // Hand over what is waiting (read earlier, or left behind by a tracked send).
        if release.is_none() && !waiting.is_empty() {
            let batch: Vec<UpstreamMessage> = waiting.drain(..).collect();
            match streamer.send(UpstreamBatch(batch)).await {
                Err(_) => return ConnectionEnd::StreamerGone,
                Ok(Err(v)) => return ConnectionEnd::Violation(v.0),
                Ok(Ok(reply)) => {
                    for ack in reply.acks {
                        acks.push_back(Box::pin(async move {
                            if let Some(d) = ack.durable {
                                d.await?;
                            }
                            Ok(ack.frame)
                        }));
                    }
                    waiting.extend(reply.rest);
                    release = reply.release;
                }
            }
        }
        tokio::select! {
            biased;
            _ = &mut *stop => {
                let _ = sink.send(WsMessage::Close(Some(awc::ws::CloseCode::Away.into()))).await;
                return ConnectionEnd::Stopped;
            }
            Some(ack) = acks.next(), if !acks.is_empty() => {
                if let Err(e) = send_acks(sink, &mut acks, ack).await {
                    return e;
                }
            }
            _ = async { if let Some(r) = release.as_mut() { let _ = r.await; } }, if release.is_some() => {
                release = None;
            }
            frame = stream.next(), if release.is_none() => {
                let mut next = Some(frame);
                while let Some(frame) = next.take() {
                    let frame = match frame {
                        None => return ConnectionEnd::Closed(String::new()),
                        Some(Err(e)) => return ConnectionEnd::Ws(e.to_string()),
                        Some(Ok(f)) => f,
                    };
                    if let Frame::Ping(p) = &frame {
                        if let Err(e) = sink.send(WsMessage::Pong(p.clone())).await {
                            return ConnectionEnd::Ws(e.to_string());
                        }
                    }
                    match fragments.take(frame) {
                        Err(e) => return e,
                        Ok(None) => {}
                        Ok(Some(bytes)) => match utf8(&bytes).and_then(|text| {
                            parse_frame(text).map_err(|e| ConnectionEnd::Violation(e.to_string()))
                        }) {
                            Ok(m) => waiting.push_back(m),
                            Err(e) => {
                                // Hand over what came before, so it is not lost, then drop.
                                let before: Vec<_> = waiting.drain(..).collect();
                                if !before.is_empty() {
                                    let _ = streamer.send(UpstreamBatch(before)).await;
                                }
                                return e;
                            }
                        },
                    }
                    if waiting.len() < MAX_BATCH {
                        next = stream.next().now_or_never();
                    }
                }
            }
        }
    }
}
