//! One connection to the change source, from the handshake to its end (PROTOCOL.md §4): frames
//! read and handed to the streamer in batches, acks written back in order, pings sent and
//! silence judged ([`Liveness`]), and the close frame of an end the service decides on.

use std::collections::VecDeque;

use actix::prelude::*;
use awc::ws::{Frame, Message as WsMessage};
use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::sync::oneshot;

use super::connect::Framed;
use super::fragments::{utf8, Fragments};
use super::liveness::{Check, Liveness};
use super::protocol::{parse_frame, UpstreamMessage};
use super::{ConnectionEnd, MAX_BATCH};
use crate::changelog::ChangeLogError;
use crate::streamer::{Streamer, UpstreamBatch};

type AckFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<String>, ChangeLogError>>>>;

type UpstreamSink = futures_util::stream::SplitSink<Framed, WsMessage>;
type UpstreamStream = futures_util::stream::SplitStream<Framed>;

/// The longest the service waits for the source's answer to its close frame.
const CLOSE_HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(1);

/// One connection to the change source, until it ends; an end the service decides on (a broken
/// rule, a change log that failed, the streamer gone, a silence) is said to the source in a
/// close frame (PROTOCOL.md §4: 1002 with the rule, 1011, 1001 `no pong for N ms`) before the
/// connection drops. Returns the end and the code of the close frame written, if one was.
pub(super) async fn session(
    framed: Framed,
    streamer: &Addr<Streamer>,
    stop: &mut oneshot::Receiver<()>,
    live: Liveness,
) -> (ConnectionEnd, Option<u16>) {
    let (mut sink, mut stream) = framed.split();
    let mut conn = Conn {
        sink: &mut sink,
        streamer,
        live,
        acks: FuturesOrdered::new(),
        waiting: VecDeque::new(),
        release: None,
        fragments: Fragments::default(),
    };
    let end = conn.drive(&mut stream, stop).await;
    let limit = conn.live.limit();
    let mut closed_with = None;
    if let Some((code, reason)) = end.close_frame() {
        let close = awc::ws::CloseReason {
            code: awc::ws::CloseCode::from(code),
            description: Some(reason),
        };
        // Bounded: a silent source may not take even this.
        let sent = tokio::time::timeout(limit, sink.send(WsMessage::Close(Some(close)))).await;
        if matches!(sent, Ok(Ok(()))) {
            closed_with = Some(code);
        }
        if closed_with.is_some() && !matches!(end, ConnectionEnd::Silent(_)) {
            // The closing handshake (RFC 6455 §7.1.1): read on until the source's close, so
            // that what it sent meanwhile is not left unread, which would make the socket's
            // end a reset that can lose the close frame at the source; bounded. Not after a
            // silence: nothing is coming.
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
    (end, closed_with)
}

/// What one connection holds while it runs.
struct Conn<'a> {
    sink: &'a mut UpstreamSink,
    streamer: &'a Addr<Streamer>,
    live: Liveness,
    /// The acks the streamer handed back, each ready once its transaction is durable.
    acks: FuturesOrdered<AckFuture>,
    /// Messages read and not yet handed over (read earlier, or left behind by a tracked send).
    waiting: VecDeque<UpstreamMessage>,
    /// Set while a tracked send waits: the socket is not read until it fires.
    release: Option<oneshot::Receiver<()>>,
    fragments: Fragments,
}

impl Conn<'_> {
    async fn drive(
        &mut self,
        stream: &mut UpstreamStream,
        stop: &mut oneshot::Receiver<()>,
    ) -> ConnectionEnd {
        loop {
            if self.release.is_none() && !self.waiting.is_empty() {
                if let Err(e) = self.hand_over().await {
                    return e;
                }
            }
            let reading = self.release.is_none();
            // Biased: the frames already read and due acks before the liveness check, so that
            // a check run late by a busy runtime sees what arrived meanwhile.
            tokio::select! {
                biased;
                _ = &mut *stop => {
                    let away = WsMessage::Close(Some(awc::ws::CloseCode::Away.into()));
                    let _ = tokio::time::timeout(self.live.limit(), self.sink.send(away)).await;
                    return ConnectionEnd::Stopped;
                }
                Some(ack) = self.acks.next(), if !self.acks.is_empty() => {
                    let limit = self.live.limit();
                    match tokio::time::timeout(limit, send_acks(self.sink, &mut self.acks, ack)).await {
                        Err(_) => return ConnectionEnd::Silent(self.live.silence()),
                        Ok(Err(e)) => return e,
                        Ok(Ok(())) => {}
                    }
                }
                _ = async { if let Some(r) = self.release.as_mut() { let _ = r.await; } }, if !reading => {
                    self.release = None;
                    // Not read while the tracked send waited: the silence counts from now.
                    self.live.resumed();
                }
                frame = stream.next(), if reading => {
                    if let Err(e) = self.read(frame, stream).await {
                        return e;
                    }
                }
                _ = tokio::time::sleep_until(self.live.due()), if reading => {
                    let end = match self.live.check() {
                        Check::Silent(silence) => Some(ConnectionEnd::Silent(silence)),
                        Check::Ping => self.write(WsMessage::Ping(Default::default())).await.err(),
                    };
                    if let Some(e) = end {
                        return e;
                    }
                }
            }
        }
    }

    /// Hands what is waiting to the streamer; keeps its acks and what a tracked send left.
    async fn hand_over(&mut self) -> Result<(), ConnectionEnd> {
        let batch: Vec<UpstreamMessage> = self.waiting.drain(..).collect();
        let reply = match self.streamer.send(UpstreamBatch(batch)).await {
            Err(_) => return Err(ConnectionEnd::StreamerGone),
            Ok(Err(v)) => return Err(ConnectionEnd::Violation(v.0)),
            Ok(Ok(reply)) => reply,
        };
        for ack in reply.acks {
            self.acks.push_back(Box::pin(async move {
                if let Some(d) = ack.durable {
                    d.await?;
                }
                Ok(ack.frame)
            }));
        }
        self.waiting.extend(reply.rest);
        self.release = reply.release;
        // Not read while the streamer took the batch: the silence counts from now.
        self.live.resumed();
        Ok(())
    }

    /// Takes `first` and every further frame already read, up to a batch: pings answered,
    /// text messages parsed into [`Conn::waiting`].
    async fn read(
        &mut self,
        first: Option<Result<Frame, awc::error::WsProtocolError>>,
        stream: &mut UpstreamStream,
    ) -> Result<(), ConnectionEnd> {
        let mut next = Some(first);
        let mut heard = false;
        while let Some(frame) = next.take() {
            let frame = match frame {
                None => return Err(ConnectionEnd::Closed(String::new())),
                Some(Err(e)) => return Err(ConnectionEnd::Ws(e.to_string())),
                Some(Ok(f)) => f,
            };
            if !heard {
                // Any frame, a pong as much as a change, says the source is there.
                self.live.heard();
                heard = true;
            }
            if let Frame::Ping(p) = &frame {
                self.write(WsMessage::Pong(p.clone())).await?;
            }
            match self.fragments.take(frame)? {
                None => {}
                Some(bytes) => match utf8(&bytes).and_then(|text| {
                    parse_frame(text).map_err(|e| ConnectionEnd::Violation(e.to_string()))
                }) {
                    Ok(m) => self.waiting.push_back(m),
                    Err(e) => {
                        // Hand over what came before, so it is not lost, then drop.
                        let before: Vec<_> = self.waiting.drain(..).collect();
                        if !before.is_empty() {
                            let _ = self.streamer.send(UpstreamBatch(before)).await;
                        }
                        return Err(e);
                    }
                },
            }
            if self.waiting.len() < MAX_BATCH {
                next = stream.next().now_or_never();
            }
        }
        Ok(())
    }

    /// Writes one message; one the source does not take within two intervals is a silence.
    async fn write(&mut self, msg: WsMessage) -> Result<(), ConnectionEnd> {
        match tokio::time::timeout(self.live.limit(), self.sink.send(msg)).await {
            Err(_) => Err(ConnectionEnd::Silent(self.live.silence())),
            Ok(Err(e)) => Err(ConnectionEnd::Ws(e.to_string())),
            Ok(Ok(())) => Ok(()),
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
