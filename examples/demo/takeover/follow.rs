//! The takeover demo's stand-ins around the instances: a change source that resumes after the
//! `lastWatermark` each new connection asks for, and subscribers that each follow one instance
//! and, when dropped, subscribe again from their last acked commit, counting commits, gaps,
//! repeats and drops.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use actix_codec::Framed;
use awc::ws::{Codec, Frame, Message};
use awc::BoxedSocket;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::upstream::{self, FakeUpstream};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;

use super::instance::secret;

/// Writes about `per_second` transactions a second, numbered one after another; on each new
/// connection it goes on after the `lastWatermark` asked for, as a real change source does.
pub async fn write_transactions(up: FakeUpstream, per_second: u64) {
    let mut n = 1_000_000u64;
    let mut connections = 0;
    let mut tick = actix_rt::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let queries = up.queries();
        if queries.len() != connections {
            connections = queries.len();
            if let Some(last) = queries.last().and_then(|q| last_watermark(q)) {
                n = last;
            }
        }
        if connections == 0 {
            continue;
        }
        let frames: Vec<String> = (0..per_second / 20)
            .flat_map(|_| {
                n += 1;
                upstream::txn(n, 1 + n % 5)
            })
            .collect();
        up.send(frames);
    }
}

pub fn last_watermark(query: &str) -> Option<u64> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("lastWatermark="))
        .and_then(|w| Watermark::parse(w).ok()?.to_u64())
}

pub fn wm_u64(v: &Value) -> Option<u64> {
    Watermark::parse(v.as_str()?).ok()?.to_u64()
}

/// What one subscriber saw.
#[derive(Default)]
pub struct Followed {
    /// `s1`, `s2`, …: also its id at the service.
    pub name: String,
    /// The instances that served it, in order (indexes into the demo's instances): the first
    /// is the one it was started at.
    pub on: Vec<usize>,
    pub last: Option<u64>,
    pub commits: u64,
    /// Its commits when the takeover was announced (`None` before any).
    pub at_takeover: Option<u64>,
    /// Commits that were not the one after the last.
    pub gaps: u64,
    /// Commits at or below the last one seen: seen again.
    pub repeats: u64,
    /// Subscriptions that ended (a close or a lost connection), each followed by a new one.
    pub drops: u64,
    /// Lines for the event log.
    pub events: Vec<String>,
}

impl Followed {
    /// The instance serving it now, or last.
    pub fn now_on(&self) -> Option<usize> {
        self.on.last().copied()
    }
}

pub type Shared<T> = Rc<RefCell<T>>;

/// The instances' addresses, `None` while one is down; and their names.
pub struct Addrs {
    pub addrs: Vec<Option<String>>,
    pub names: Vec<char>,
}

/// A subscriber that follows the instance it connected to (`home` first), acking every
/// message. When that instance closes it or the connection is lost, it is dropped: it
/// subscribes again from the last commit it acked, at the same instance if that one is still
/// up, else at another live one (any: `spread` picks which, so that a dead instance's
/// subscribers do not all go to one).
pub async fn subscriber(
    home: usize,
    spread: usize,
    addrs: Shared<Addrs>,
    rv: String,
    seen: Shared<Followed>,
) {
    let name = seen.borrow().name.clone();
    let mut at = home;
    loop {
        let Some((i, addr)) = pick(&addrs.borrow(), at, spread) else {
            actix_rt::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        at = i;
        let inst = addrs.borrow().names[i];
        let from = seen
            .borrow()
            .last
            .map(|w| Watermark::from_u64(w).to_string())
            .unwrap_or(rv.clone());
        let url = format!(
            "ws://{addr}/replication/v6/changes?id={name}&replicaVersion={rv}&watermark={from}"
        );
        // A killed instance's port refuses: try again, at another one.
        let Ok((_, mut c)) = awc::Client::new()
            .ws(&url)
            .header("authorization", format!("Bearer {}", secret()))
            .connect()
            .await
        else {
            actix_rt::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        {
            let mut s = seen.borrow_mut();
            if s.drops > 0 {
                let line = format!("{name} subscribed again at {inst} from {from}");
                s.events.push(line);
            }
            if s.now_on() != Some(i) {
                s.on.push(i);
            }
        }
        loop {
            match next(&mut c).await {
                Got::Msg(id, msg) => {
                    if msg[0] == "commit" {
                        if let Some(w) = wm_u64(&msg[2]["watermark"]) {
                            let mut s = seen.borrow_mut();
                            match s.last {
                                Some(l) if w <= l => s.repeats += 1,
                                Some(l) if w != l + 1 => s.gaps += 1,
                                _ => {}
                            }
                            s.last = Some(s.last.map_or(w, |l| l.max(w)));
                            s.commits += 1;
                        }
                    }
                    let ack = Message::Text(format!(r#"{{"ack":{id}}}"#).into());
                    if c.send(ack).await.is_err() {
                        break;
                    }
                }
                Got::Closed(code, reason) => {
                    let mut s = seen.borrow_mut();
                    s.drops += 1;
                    let why = if code == 1006 {
                        "connection lost (1006)".to_string()
                    } else {
                        format!("closed {code} {reason}")
                    };
                    s.events.push(format!("{name} dropped by {inst}: {why}"));
                    break;
                }
            }
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where to subscribe: instance `at` while it is up, else the `spread`-th of the live others.
fn pick(addrs: &Addrs, at: usize, spread: usize) -> Option<(usize, String)> {
    if let Some(a) = &addrs.addrs[at] {
        return Some((at, a.clone()));
    }
    let live: Vec<(usize, String)> = addrs
        .addrs
        .iter()
        .enumerate()
        .filter_map(|(i, a)| Some((i, a.clone()?)))
        .collect();
    (!live.is_empty()).then(|| live[spread % live.len()].clone())
}

/// What a subscription read next.
pub enum Got {
    Msg(u64, Value),
    /// The close code and reason; 1006 for a connection that ended without one.
    Closed(u16, String),
}

/// The next message or close of a subscription (PROTOCOL.md §5 framing), answering pings.
pub async fn next(c: &mut Framed<BoxedSocket, Codec>) -> Got {
    let lost = || Got::Closed(1006, String::new());
    loop {
        let frame = match tokio::time::timeout(Duration::from_secs(30), c.next()).await {
            Ok(Some(Ok(f))) => f,
            _ => return lost(),
        };
        match frame {
            Frame::Text(t) => {
                let Ok(v) = serde_json::from_slice::<Value>(&t) else {
                    return lost();
                };
                let Some(id) = v["id"].as_u64() else {
                    return lost();
                };
                return Got::Msg(id, v["msg"].clone());
            }
            Frame::Ping(p) => {
                let _ = c.send(Message::Pong(p)).await;
            }
            Frame::Close(r) => {
                let _ = c.send(Message::Close(None)).await;
                return r.map_or(Got::Closed(1005, String::new()), |r| {
                    Got::Closed(u16::from(r.code), r.description.unwrap_or_default())
                });
            }
            _ => {}
        }
    }
}
