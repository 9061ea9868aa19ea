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

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix::prelude::*;
use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::HttpResponse;
use bytes::Bytes;
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::reservation::ReservationActor;
use change_streamer_actors::streamer::Purger;
use change_streamer_actors::streamer::Streamer;
use tokio::sync::mpsc;

/// Held by each websocket session for as long as it lives.
#[derive(Clone, Debug)]
pub struct ShutdownGuard {
    _held: mpsc::Sender<()>,
}

/// Hands out [`ShutdownGuard`]s while the stop has not begun; holding one does not delay it.
#[derive(Clone, Debug)]
pub struct Guards(mpsc::WeakSender<()>);

impl Guards {
    /// A guard for a new session; `None` once the stop has begun and every session has gone.
    pub fn guard(&self) -> Option<ShutdownGuard> {
        self.0.upgrade().map(|tx| ShutdownGuard { _held: tx })
    }
}

/// Waits until every [`ShutdownGuard`] handed out is dropped.
#[derive(Debug)]
pub struct Drain {
    guard: ShutdownGuard,
    done: mpsc::Receiver<()>,
}

impl Default for Drain {
    fn default() -> Self {
        let (tx, done) = mpsc::channel(1);
        Drain {
            guard: ShutdownGuard { _held: tx },
            done,
        }
    }
}

impl Drain {
    pub fn guards(&self) -> Guards {
        Guards(self.guard._held.downgrade())
    }

    /// Drops its own guard, then waits until every other one is dropped, at most `limit`.
    /// Returns whether they all were.
    pub async fn wait(self, limit: Duration) -> bool {
        let Drain { guard, mut done } = self;
        drop(guard);
        tokio::time::timeout(limit, done.recv()).await.is_ok()
    }
}

/// A response body that holds a [`ShutdownGuard`] until the body ends. A websocket's body is
/// its session actor's context, so the guard lives exactly as long as the session, whatever
/// ends it (close, error, dropped connection), and the session code needs no change.
struct Guarded {
    body: BoxBody,
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
        Pin::new(&mut self.get_mut().body).poll_next(cx)
    }
}

/// `response` (a websocket upgrade) holding `guard` until its session ends.
pub fn hold_until_closed(response: HttpResponse, guard: Option<ShutdownGuard>) -> HttpResponse {
    response
        .map_body(|_, body| Guarded {
            body,
            _guard: guard,
        })
        .map_into_boxed_body()
}

/// Stops an actor that has no stop message of its own (its timers keep it alive otherwise).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Halt;

macro_rules! halts {
    ($($actor:ty),*) => {$(
        impl Handler<Halt> for $actor {
            type Result = ();
            fn handle(&mut self, _: Halt, ctx: &mut Context<Self>) {
                ctx.stop();
            }
        }
    )*};
}

halts!(Streamer, Purger, CleanupActor, ReservationActor);

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_rt::test]
    async fn the_drain_waits_until_every_session_guard_is_dropped() {
        let drain = Drain::default();
        let guards = drain.guards();
        let session = guards.guard().expect("a guard before the stop");
        let waiting = actix_rt::spawn(drain.wait(Duration::from_secs(10)));
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

    #[actix_rt::test]
    async fn the_drain_gives_up_at_its_bound() {
        let drain = Drain::default();
        let _session = drain.guards().guard();
        assert!(!drain.wait(Duration::ZERO).await);
    }
}
