//! The takeover demo's stand-ins around the two instances: a change source that resumes after
//! the `lastWatermark` each new connection asks for, and subscribers that reconnect on any close
//! from their last acked commit, counting gaps and commits seen twice.

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
    pub last: Option<u64>,
    pub commits: u64,
    pub gaps: u64,
    pub twice: u64,
    pub reconnects: u64,
    /// Lines for the event log.
    pub events: Vec<String>,
}

pub type Shared<T> = Rc<RefCell<T>>;

/// A subscriber that follows whichever instance owns the change DB: on a close or a lost
/// connection it connects again (to either instance; a standby closes it at once with 1011)
/// from the last commit it acked.
pub async fn subscriber(
    name: String,
    addrs: Shared<Vec<Option<String>>>,
    rv: String,
    seen: Shared<Followed>,
) {
    let mut turn = 0usize;
    loop {
        let candidates: Vec<String> = addrs.borrow().iter().flatten().cloned().collect();
        if candidates.is_empty() {
            actix_rt::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let addr = candidates[turn % candidates.len()].clone();
        turn += 1;
        let from = seen
            .borrow()
            .last
            .map(|w| Watermark::from_u64(w).to_string())
            .unwrap_or(rv.clone());
        let url = format!(
            "ws://{addr}/replication/v6/changes?id={name}&replicaVersion={rv}&watermark={from}"
        );
        // A killed instance's port refuses, a standby handing over may drop the connection:
        // try again, on the other one.
        let Ok((_, mut c)) = awc::Client::new()
            .ws(&url)
            .header("authorization", format!("Bearer {}", secret()))
            .connect()
            .await
        else {
            actix_rt::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut served = false;
        loop {
            match next(&mut c).await {
                Got::Msg(id, msg) => {
                    if !served {
                        served = true;
                        let mut s = seen.borrow_mut();
                        if s.last.is_some() {
                            s.reconnects += 1;
                            let line = format!("{name} subscribed again on {addr} from {from}");
                            s.events.push(line);
                        }
                    }
                    if msg[0] == "commit" {
                        if let Some(w) = wm_u64(&msg[2]["watermark"]) {
                            let mut s = seen.borrow_mut();
                            match s.last {
                                Some(l) if w <= l => s.twice += 1,
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
                    if served {
                        let line = format!("{name} closed by {addr}: {code} {reason}");
                        seen.borrow_mut().events.push(line);
                    }
                    break;
                }
            }
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
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
