//! The soak's subscribers: each slot joins `/changes` from the last commit it applied, reads and
//! acks for a while, then leaves (a close), is killed (its socket dropped unread), or stalls (reads
//! nothing, answers no ping, for some seconds) and reads on; whatever the service closes it with is
//! counted, and it joins again. Every stream is checked by [`StreamCheck`]. A restoring task's
//! one subscription (`initial=true`) is read the same way ([`read_stream`]).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use actix_codec::Framed;
use awc::ws::{Codec, Frame, Message};
use awc::BoxedSocket;
use change_streamer_test_support::client::payloads;
use futures_util::{SinkExt, StreamExt};
use tokio::time::Instant;

use crate::check::{StreamCheck, Tally};
use crate::rng::Rng;
use crate::source::{w, FIRST};

pub type Socket = Framed<BoxedSocket, Codec>;

/// What the subscribers saw, over the whole soak.
#[derive(Default)]
pub struct Stats {
    pub joins: Cell<u64>,
    /// Sockets open now (subscribers and reservations): the fds they account for.
    pub open: Cell<i64>,
    pub leaves: Cell<u64>,
    pub kills: Cell<u64>,
    pub stalls: Cell<u64>,
    /// Closes by the service, by code (1006: the connection dropped without one, as in a kill).
    pub closed_by_service: RefCell<BTreeMap<u16, u64>>,
    /// Error messages (PROTOCOL.md §7) by type.
    pub refused: RefCell<BTreeMap<u64, u64>>,
}

impl Stats {
    pub fn count_close(&self, code: u16) {
        *self.closed_by_service.borrow_mut().entry(code).or_default() += 1;
    }
}

/// Opens a websocket (within 5 s), or `None`.
pub async fn connect(url: &str) -> Option<Socket> {
    let conn = awc::Client::new()
        .ws(url)
        .max_frame_size(64 << 20)
        .connect();
    match tokio::time::timeout(Duration::from_secs(5), conn).await {
        Ok(Ok((_, framed))) => Some(framed),
        _ => None,
    }
}

/// How a stream ended.
pub enum End {
    /// Its time was up (the socket is still open).
    Time(Socket),
    /// The service closed it (code; 1006 for a drop without a close frame).
    Closed(u16, String),
    /// An error message (PROTOCOL.md §7): its type and message.
    Refused(u64, String),
}

/// Reads and acks until `until`, checking every payload; stalls (reads nothing) from `stall.0`
/// for `stall.1`. `applied` follows the commits received.
pub async fn read_stream(
    mut ws: Socket,
    check: &mut StreamCheck,
    until: Instant,
    stall: Option<(Instant, Duration)>,
    applied: &Cell<u64>,
    tally: &Tally,
) -> End {
    let mut stall = stall;
    loop {
        let now = Instant::now();
        if now >= until {
            return End::Time(ws);
        }
        if let Some((at, len)) = stall {
            if now >= at {
                stall = None;
                actix_rt::time::sleep(len).await;
                continue;
            }
        }
        let wake = stall.map_or(until, |(at, _)| at.min(until));
        let frame = match tokio::time::timeout_at(wake, ws.next()).await {
            Err(_) => continue,
            Ok(None) | Ok(Some(Err(_))) => return End::Closed(1006, String::new()),
            Ok(Some(Ok(f))) => f,
        };
        match frame {
            Frame::Text(t) => {
                let Ok(v) = serde_json::from_slice::<serde_json::Value>(&t) else {
                    return End::Closed(0, "frame is not JSON".into());
                };
                if v["msg"][0] == "error" {
                    let e = &v["msg"][1];
                    let _ = ws
                        .send(Message::Text(format!(r#"{{"ack":{}}}"#, v["id"]).into()))
                        .await;
                    return End::Refused(e["type"].as_u64().unwrap_or(0), e["message"].to_string());
                }
                let (id, ps) = payloads(&v);
                for p in &ps {
                    if let Some(c) = check.feed(p, tally) {
                        applied.set(c);
                    }
                }
                if ws
                    .send(Message::Text(format!(r#"{{"ack":{id}}}"#).into()))
                    .await
                    .is_err()
                {
                    return End::Closed(1006, String::new());
                }
            }
            Frame::Ping(p) => {
                let _ = ws.send(Message::Pong(p)).await;
            }
            Frame::Close(r) => {
                let (code, reason) = r
                    .map(|r| (u16::from(r.code), r.description.unwrap_or_default()))
                    .unwrap_or((1005, String::new()));
                return End::Closed(code, reason);
            }
            _ => {}
        }
    }
}

/// Closes from the client side, waiting at most a second for the answer.
pub async fn leave(mut ws: Socket) {
    let _ = ws.send(Message::Close(None)).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(f)) = ws.next().await {
            if matches!(f, Frame::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// One subscriber slot.
pub struct Slot {
    pub name: String,
    /// `mode=backup`: stays until the service closes it, never stalls.
    pub backup: bool,
    pub batched: bool,
    /// The last commit it applied (where it joins again).
    pub applied: Rc<Cell<u64>>,
}

/// Runs `slot` until `stop`: join, read, end one of the ways above, stay away a little, again.
pub async fn run_slot(
    port: u16,
    slot: Slot,
    mut rng: Rng,
    tally: Rc<Tally>,
    stats: Rc<Stats>,
    stop: Rc<Cell<bool>>,
) {
    if slot.applied.get() == 0 {
        slot.applied.set(FIRST);
    }
    while !stop.get() {
        let url = format!(
            "ws://127.0.0.1:{port}/replication/v6/changes?id={}&replicaVersion={}&watermark={}{}{}",
            slot.name,
            w(FIRST),
            w(slot.applied.get()),
            if slot.backup { "&mode=backup" } else { "" },
            if slot.batched { "&wsBatched=true" } else { "" },
        );
        let Some(ws) = connect(&url).await else {
            actix_rt::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        stats.joins.set(stats.joins.get() + 1);
        stats.open.set(stats.open.get() + 1);
        let mut check = StreamCheck::new(slot.name.clone(), slot.applied.get());
        let now = Instant::now();
        let (until, stall, how) = if slot.backup {
            (now + Duration::from_secs(3600 * 24), None, 0)
        } else {
            let life = Duration::from_millis(rng.between(5_000, 40_000));
            let how = rng.between(0, 4);
            let stall = (how == 3).then(|| {
                (
                    now + life / 2,
                    Duration::from_millis(rng.between(2_000, 12_000)),
                )
            });
            (now + life, stall, how)
        };
        if stall.is_some() {
            stats.stalls.set(stats.stalls.get() + 1);
        }
        let stopping = stop.clone();
        let end = tokio::select! {
            e = read_stream(ws, &mut check, until, stall, &slot.applied, &tally) => Some(e),
            _ = wait_stop(stopping) => None,
        };
        stats.open.set(stats.open.get() - 1);
        match end {
            None => return,
            Some(End::Time(ws)) if how == 1 => {
                stats.kills.set(stats.kills.get() + 1);
                drop(ws);
            }
            Some(End::Time(ws)) => {
                stats.leaves.set(stats.leaves.get() + 1);
                leave(ws).await;
            }
            Some(End::Closed(code, reason)) => {
                log::info!("{}: closed by the service: {code} {reason}", slot.name);
                stats.count_close(code);
            }
            Some(End::Refused(kind, message)) => {
                log::error!(
                    "{}: refused at {}: type {kind} {message}",
                    slot.name,
                    w(slot.applied.get())
                );
                *stats.refused.borrow_mut().entry(kind).or_default() += 1;
            }
        }
        if !slot.backup {
            actix_rt::time::sleep(Duration::from_millis(rng.between(200, 4_000))).await;
        }
    }
}

/// Resolves once `stop` is set.
pub async fn wait_stop(stop: Rc<Cell<bool>>) {
    while !stop.get() {
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
}
