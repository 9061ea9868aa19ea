//! The soak's change source: the fake change source of `change-streamer-test-support` driven at a
//! steady rate, resending from the `lastWatermark` each new connection names (PROTOCOL.md §4), so
//! that whatever the service lost in a `kill -9` before it was durable comes again. Transaction `n`
//! has [`rows`]`(n)` inserts with the ids `txn` gives them, so a subscriber can check each one whole.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::upstream::{txn, FakeUpstream};

/// The watermark of the first transaction (the initial sync: the replicaVersion).
pub const FIRST: u64 = 100;

/// How many inserts transaction `n` holds (1 to 3).
pub fn rows(n: u64) -> u64 {
    1 + n % 3
}

/// The watermark `n` as the wire spells it.
pub fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// A wire watermark as a number.
pub fn num(s: &str) -> Option<u64> {
    Watermark::parse(s).ok().and_then(|m| m.to_u64())
}

/// The watermark of an ack to the source (`["status",{"tag":"commit"},{"watermark":"0b"}]`).
pub fn acked_watermark(ack: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(ack).ok()?;
    (v[0] == "status" && v[1]["tag"] == "commit")
        .then(|| v[2]["watermark"].as_str().and_then(num))
        .flatten()
}

/// The `lastWatermark` of a connection's query, if it has one.
pub fn last_watermark(query: &str) -> Option<u64> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("lastWatermark="))
        .and_then(num)
}

/// What the source did and saw, shared with the rest of the driver.
#[derive(Default)]
pub struct SourceState {
    /// The next watermark it will send.
    pub next: Cell<u64>,
    /// The newest commit the service acked, over all its lives.
    pub acked: Cell<u64>,
    /// Connections the service made so far.
    pub connections: Cell<usize>,
    /// The `lastWatermark` of the newest connection.
    pub resumed_from: Cell<Option<u64>>,
    /// Transactions sent (resent ones included).
    pub sent: Cell<u64>,
}

/// Sends `rate` transactions a second on the current connection while fewer than `window` sent
/// are unacked; on each new connection starts again after its `lastWatermark`. Runs until `stop`.
pub async fn run(
    up: FakeUpstream,
    state: Rc<SourceState>,
    rate: u64,
    window: u64,
    stop: Rc<Cell<bool>>,
) {
    state.next.set(FIRST);
    let tick = Duration::from_millis(10);
    let mut last = Instant::now();
    let mut credit = 0f64;
    while !stop.get() {
        actix_rt::time::sleep(tick).await;
        let now = Instant::now();
        credit = (credit + now.duration_since(last).as_secs_f64() * rate as f64).min(rate as f64);
        last = now;
        let (_, newest) = up.last_ack();
        if let Some(a) = newest.as_deref().and_then(acked_watermark) {
            state.acked.set(state.acked.get().max(a));
        }
        let queries = up.queries();
        if queries.len() > state.connections.get() {
            state.connections.set(queries.len());
            let from = last_watermark(queries.last().map(String::as_str).unwrap_or(""));
            state.resumed_from.set(from);
            state.next.set(from.map_or(FIRST, |l| l + 1));
        }
        let conn = state.connections.get();
        if conn == 0 {
            continue;
        }
        while credit >= 1.0 {
            let n = state.next.get();
            if n > FIRST && n.saturating_sub(state.acked.get()) > window {
                break;
            }
            if !up.send_on(conn, txn(n, rows(n))) {
                break;
            }
            state.next.set(n + 1);
            state.sent.set(state.sent.get() + 1);
            credit -= 1.0;
        }
    }
}
