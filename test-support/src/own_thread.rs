//! Running a test's websocket client on a thread of its own.
//!
//! ### Why
//! The in-process service runs its streamer, change log handle and upstream client on the
//! test's own thread (the actix system the test runs in); only its HTTP workers have threads of
//! their own. A client on the test's thread answers pings and acks only when the streamer's
//! turn is over and the test itself awaits: on a busy machine a large catch-up or a `/status`
//! poll keeps it silent for longer than a short `--ping-interval-ms`, and liveness (PROTOCOL.md
//! §5) rightly drops it. A real client is another process; on a thread of its own, with its own
//! actix system, the test's client reads and answers on its own time too.

use std::future::Future;

use tokio::sync::oneshot;

/// Runs `f` on a new thread in an actix system of its own; await the receiver for what it
/// returns (an error if it panicked: its panic message is printed by the thread).
pub fn on_own_thread<T, F, Fut>(f: F) -> oneshot::Receiver<T>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let out = actix_rt::System::new().block_on(f());
        let _ = tx.send(out);
    });
    rx
}
