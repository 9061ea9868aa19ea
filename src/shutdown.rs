//! The graceful stop's bookkeeping: knowing when every websocket session has ended, and
//! stopping the actors that never stop by themselves.
//!
//! Why a channel rather than a count or a sleep: each session holds a clone of one
//! `mpsc::Sender` (its [`ShutdownGuard`]) for exactly as long as it lives. The receiver's
//! `recv()` returns `None` only once every sender is gone, so after the close-all notice the
//! stop awaits that, bounded, instead of guessing how long the close frames take (the shape of
//! tokio-rs/mini-redis's `shutdown_complete`). The HTTP handlers reach the channel through a
//! [`Guards`] (a weak sender), so the application's own copies, which live until the HTTP server
//! is gone, do not count: the stop learns that the sessions ended without stopping the server.
//!
//! The same wrapper lets a deposed owner close every session with one close frame of its own
//! ([`Drain::stop`] with a close) without asking each actor: see [`Guarded`].
//!
//! How an owner's phase ends is one typed value, [`StopMode`]: gracefully, or stepping down to
//! a standby.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::HttpResponse;
use bytes::{BufMut, Bytes, BytesMut};
use change_streamer_actors::session_end::SessionEnd;
use tokio::sync::{mpsc, watch};

/// The longest a stop waits for the sessions to end after the stop notice.
pub const SESSION_DRAIN: Duration = Duration::from_secs(10);

/// How an owner's phase ends (the instance's one HTTP server outlives a step-down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// SIGINT/SIGTERM: every session is closed by the actor holding it with 1001, the open
    /// connections may finish (bounded), and the change log is flushed.
    Graceful,
    /// A deposed owner steps down to a standby (PROTOCOL.md §14): every session is closed at
    /// once with 1011 `standby: not the owner` and nothing is flushed (the change log refuses
    /// writes). Were the instance to stop this way, its open connections would be closed at
    /// once too, so that a client keeping its connection alive does not hold the stop back.
    StepDown,
}

impl StopMode {
    /// Whether the HTTP server lets its open connections finish (actix-web's `graceful`).
    pub fn finishes_connections(self) -> bool {
        self == StopMode::Graceful
    }
}

/// Held by each websocket session for as long as it lives.
#[derive(Clone, Debug)]
pub struct ShutdownGuard {
    _held: mpsc::Sender<()>,
    /// The close frame every session is to end with at once, once there is one.
    closing_frame: watch::Receiver<Option<Bytes>>,
}

/// Hands out [`ShutdownGuard`]s while the stop has not begun; holding one does not delay it.
#[derive(Clone, Debug)]
pub struct Guards {
    held: mpsc::WeakSender<()>,
    closing_frame: watch::Receiver<Option<Bytes>>,
}

impl Guards {
    /// A guard for a new session; `None` once the stop has begun and every session has gone.
    pub fn guard(&self) -> Option<ShutdownGuard> {
        self.held.upgrade().map(|tx| ShutdownGuard {
            _held: tx,
            closing_frame: self.closing_frame.clone(),
        })
    }
}

/// Waits until every [`ShutdownGuard`] handed out is dropped.
#[derive(Debug)]
pub struct Drain {
    guard: ShutdownGuard,
    done: mpsc::Receiver<()>,
    closing_frame: watch::Sender<Option<Bytes>>,
}

impl Default for Drain {
    fn default() -> Self {
        let (tx, done) = mpsc::channel(1);
        let (closing_frame, close_rx) = watch::channel(None);
        Drain {
            guard: ShutdownGuard {
                _held: tx,
                closing_frame: close_rx,
            },
            done,
            closing_frame,
        }
    }
}

impl Drain {
    pub fn guards(&self) -> Guards {
        Guards {
            held: self.guard._held.downgrade(),
            closing_frame: self.closing_frame.subscribe(),
        }
    }

    /// Ends the sessions: with `closing`, every session's connection, now and opened from now
    /// on, ends with its close frame (see [`Guarded`]), and the sessions' actors stop as their
    /// connections end; without, the actors holding them were told to close them. Then drops
    /// its own guard and waits until every other one is dropped, at most `limit`. Returns
    /// whether they all were.
    pub async fn stop(self, closing: Option<&SessionEnd>, limit: Duration) -> bool {
        let Drain {
            guard,
            mut done,
            closing_frame,
        } = self;
        if let Some(end) = closing {
            let (code, reason) = end.close_frame();
            closing_frame.send_replace(Some(close_frame(code, &reason)));
        }
        drop(guard);
        tokio::time::timeout(limit, done.recv()).await.is_ok()
    }
}

/// A server's close frame (RFC 6455 §5.2, §5.5.1): FIN and opcode 8, an unmasked payload of
/// the code (big-endian) and the reason, which [`SessionEnd::close_frame`] cut to 123 bytes so
/// that the payload fits a control frame's 125.
fn close_frame(code: u16, reason: &str) -> Bytes {
    let mut frame = BytesMut::with_capacity(4 + reason.len());
    frame.put_u8(0x88);
    frame.put_u8((2 + reason.len()) as u8);
    frame.put_u16(code);
    frame.put_slice(reason.as_bytes());
    frame.freeze()
}

/// Resolves once [`Drain::stop`] gave a close frame; never if the drain is dropped first.
fn closing(mut rx: watch::Receiver<Option<Bytes>>) -> Pin<Box<dyn Future<Output = Bytes>>> {
    Box::pin(async move {
        match rx.wait_for(Option::is_some).await {
            Ok(frame) => frame.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    })
}

/// A response body that holds a [`ShutdownGuard`] until the body ends. A websocket's body is
/// its session actor's context, so the guard lives exactly as long as the session, whatever
/// ends it (close, error, dropped connection), and the session code needs no change.
///
/// Why the close-all notice is here rather than a message to each session: a deposed owner
/// must end every session at once with one code and reason (PROTOCOL.md §14), whichever actor holds
/// it. The body yields the session's frames whole, one encoded batch per chunk, so a close
/// frame put between two chunks is a well-formed frame; after it the body ends, which closes
/// the connection and drops the session's context, and actix then stops the actor (its
/// `stopped` runs, as on any other end).
struct Guarded {
    body: BoxBody,
    closing: Option<Pin<Box<dyn Future<Output = Bytes>>>>,
    ended: bool,
    _guard: Option<ShutdownGuard>,
}

impl MessageBody for Guarded {
    type Error = <BoxBody as MessageBody>::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some(closing) = &mut this.closing {
            if let Poll::Ready(frame) = closing.as_mut().poll(cx) {
                this.closing = None;
                this.ended = true;
                return Poll::Ready(Some(Ok(frame)));
            }
        }
        let next = Pin::new(&mut this.body).poll_next(cx);
        if matches!(next, Poll::Ready(None)) {
            this.ended = true;
        }
        next
    }
}

/// `response` (a websocket upgrade) holding `guard` until its session ends.
pub fn hold_until_closed(response: HttpResponse, guard: Option<ShutdownGuard>) -> HttpResponse {
    response
        .map_body(|_, body| Guarded {
            body,
            closing: guard.as_ref().map(|g| closing(g.closing_frame.clone())),
            ended: false,
            _guard: guard,
        })
        .map_into_boxed_body()
}

/// Resolves on the first SIGINT or SIGTERM (Ctrl-C elsewhere than unix).
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => log::info!("SIGINT received"),
                    _ = term.recv() => log::info!("SIGTERM received"),
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_rt::test]
    async fn the_drain_waits_until_every_session_guard_is_dropped() {
        let drain = Drain::default();
        let guards = drain.guards();
        let session = guards.guard().expect("a guard before the stop");
        let waiting = actix_rt::spawn(drain.stop(None, Duration::from_secs(10)));
        for _ in 0..10 {
            actix_rt::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "returned while a session lives");
        drop(session);
        assert!(waiting.await.expect("join"), "all guards dropped");
        assert!(
            guards.guard().is_none(),
            "no new guard once the stop is done"
        );
    }

    #[test]
    fn the_closing_frame_frame_is_an_unmasked_close_with_code_and_reason() {
        let end = SessionEnd::Unavailable("standby: not the owner".into());
        let (code, reason) = end.close_frame();
        let frame = close_frame(code, &reason);
        assert_eq!(&frame[..4], &[0x88, 24, 0x03, 0xF3]);
        assert_eq!(&frame[4..], b"standby: not the owner");
        let longest = close_frame(1011, &"x".repeat(123));
        assert_eq!(
            (frame.len(), longest[1]),
            (26, 125),
            "a control frame's payload limit"
        );
    }

    #[actix_rt::test]
    async fn the_drain_gives_up_at_its_bound() {
        let drain = Drain::default();
        let _session = drain.guards().guard();
        assert!(!drain.stop(None, Duration::ZERO).await);
    }
}
