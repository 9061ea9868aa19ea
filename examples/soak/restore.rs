//! The soak's restoring tasks (PROTOCOL.md §6): every so often a task opens a reservation
//! (`/snapshot`), reads its status and acks it, takes the backup the stand-in litestream page
//! reports as the one it restores, holds the reservation for a while (answering pings), then
//! either subscribes with `initial=true` from that backup's watermark, which ends the reservation
//! (§6.4) and whose stream is checked like any other, or abandons it (closes). A `kill -9` in the
//! middle leaves the task to subscribe after the restart, as a real one would (§13).

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use awc::ws::{Frame, Message};
use futures_util::{SinkExt, StreamExt};
use tokio::time::Instant;

use crate::check::{StreamCheck, Tally};
use crate::rng::Rng;
use crate::source::{num, w, FIRST};
use crate::subscriber::{connect, leave, read_stream, wait_stop, End, Socket, Stats};

/// What the reservations saw.
#[derive(Default)]
pub struct RestoreStats {
    pub opened: Cell<u64>,
    /// Reservations whose status never came (the service died first, or refused it).
    pub no_status: Cell<u64>,
    /// A backup reported below the status's `minWatermark`: a restore that could not catch up.
    pub backup_below_min: Cell<u64>,
    pub abandoned: Cell<u64>,
    /// Ended by the task's subscription: the reservation socket closed with 1000 as §6.4 says.
    pub ended_by_subscription: Cell<u64>,
    /// Subscriptions with `initial=true` that were served, and refused (with the error's type).
    pub restores_served: Cell<u64>,
    pub restores_refused: Cell<u64>,
}

/// Connects within `limit`, retrying (the service may be restarting).
async fn connect_retrying(url: &str, limit: Duration) -> Option<Socket> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Some(ws) = connect(url).await {
            return Some(ws);
        }
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Reads a reservation socket until `until`, answering pings; the close code if it closed.
async fn hold(ws: &mut Socket, until: Instant) -> Option<u16> {
    loop {
        match tokio::time::timeout_at(until, ws.next()).await {
            Err(_) => return None,
            Ok(None) | Ok(Some(Err(_))) => return Some(1006),
            Ok(Some(Ok(Frame::Ping(p)))) => {
                let _ = ws.send(Message::Pong(p)).await;
            }
            Ok(Some(Ok(Frame::Close(r)))) => {
                return Some(r.map(|r| u16::from(r.code)).unwrap_or(1005));
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// Runs restoring tasks one after another until `stop`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    port: u16,
    k: usize,
    backed_up: Rc<Cell<u64>>,
    mut rng: Rng,
    tally: Rc<Tally>,
    stats: Rc<Stats>,
    rs: Rc<RestoreStats>,
    stop: Rc<Cell<bool>>,
) {
    let tasks = Tasks {
        port,
        backed_up,
        tally,
        stats,
        rs,
        stop,
    };
    let mut i = 0;
    while !tasks.stop.get() {
        actix_rt::time::sleep(Duration::from_millis(rng.between(5_000, 20_000))).await;
        if tasks.stop.get() {
            return;
        }
        i += 1;
        tasks.one(format!("restore-{k}-{i}"), &mut rng).await;
    }
}

/// What every restoring task of one runner shares.
struct Tasks {
    port: u16,
    backed_up: Rc<Cell<u64>>,
    tally: Rc<Tally>,
    stats: Rc<Stats>,
    rs: Rc<RestoreStats>,
    stop: Rc<Cell<bool>>,
}

impl Tasks {
    /// One restoring task: its reservation (status, ack, hold), then abandoned or restored by a
    /// subscription, then the reservation's end.
    async fn one(&self, task: String, rng: &mut Rng) {
        let (port, stats, rs) = (self.port, &self.stats, &self.rs);
        let url = format!("ws://127.0.0.1:{port}/replication/v6/snapshot?taskID={task}");
        let Some(mut res) = connect_retrying(&url, Duration::from_secs(20)).await else {
            return;
        };
        rs.opened.set(rs.opened.get() + 1);
        stats.open.set(stats.open.get() + 1);
        let first = first_text(&mut res).await;
        let Some(min) = first
            .as_ref()
            .filter(|v| v["msg"][0] == "status")
            .and_then(|v| v["msg"][1]["minWatermark"].as_str().and_then(num))
        else {
            log::warn!("{task}: no reservation status: {first:?}");
            rs.no_status.set(rs.no_status.get() + 1);
            stats.open.set(stats.open.get() - 1);
            return;
        };
        let _ = res.send(Message::Text(r#"{"ack":1}"#.into())).await;
        let backup = self.backed_up.get().max(FIRST);
        if backup < min {
            log::error!("{task}: backup {} below minWatermark {}", w(backup), w(min));
            rs.backup_below_min.set(rs.backup_below_min.get() + 1);
        }
        let restored = Instant::now() + Duration::from_millis(rng.between(1_000, 6_000));
        let held = hold(&mut res, restored).await;
        if rng.between(0, 4) == 0 {
            rs.abandoned.set(rs.abandoned.get() + 1);
            stats.open.set(stats.open.get() - 1);
            if held.is_none() {
                leave(res).await;
            }
            return;
        }
        if !self.restore(&task, backup, rng).await {
            return;
        }
        // The reservation socket: closed 1000 by the subscription unless it had died before.
        if held.is_none() {
            if let Some(1000) = hold(&mut res, Instant::now() + Duration::from_secs(2)).await {
                rs.ended_by_subscription
                    .set(rs.ended_by_subscription.get() + 1);
            }
        }
        stats.open.set(stats.open.get() - 1);
    }

    /// The task's subscription with `initial=true` from `backup`, its stream checked for a
    /// while; false when it could not connect (the reservation then counts as closed).
    async fn restore(&self, task: &str, backup: u64, rng: &mut Rng) -> bool {
        let (port, stats, rs) = (self.port, &self.stats, &self.rs);
        let sub = format!(
            "ws://127.0.0.1:{port}/replication/v6/changes?id={task}&taskID={task}&initial=true&replicaVersion={}&watermark={}",
            w(FIRST),
            w(backup)
        );
        let Some(ws) = connect_retrying(&sub, Duration::from_secs(20)).await else {
            stats.open.set(stats.open.get() - 1);
            return false;
        };
        stats.open.set(stats.open.get() + 1);
        let mut check = StreamCheck::new(task.to_string(), backup);
        let applied = Cell::new(backup);
        let until = Instant::now() + Duration::from_millis(rng.between(5_000, 15_000));
        let end = tokio::select! {
            e = read_stream(ws, &mut check, until, None, &applied, &self.tally) => Some(e),
            _ = wait_stop(self.stop.clone()) => None,
        };
        match end {
            Some(End::Refused(kind, message)) => {
                log::error!(
                    "{task}: restore from {} refused: type {kind} {message}",
                    w(backup)
                );
                rs.restores_refused.set(rs.restores_refused.get() + 1);
                *stats.refused.borrow_mut().entry(kind).or_default() += 1;
            }
            Some(End::Time(ws)) => {
                rs.restores_served.set(rs.restores_served.get() + 1);
                leave(ws).await;
            }
            Some(End::Closed(code, _)) => {
                rs.restores_served.set(rs.restores_served.get() + 1);
                stats.count_close(code);
            }
            None => {}
        }
        stats.open.set(stats.open.get() - 1);
        true
    }
}

/// The first text frame of a reservation socket as JSON (pings answered), within 10 s.
async fn first_text(res: &mut Socket) -> Option<serde_json::Value> {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), res.next()).await {
            Ok(Some(Ok(Frame::Ping(p)))) => {
                let _ = res.send(Message::Pong(p)).await;
            }
            Ok(Some(Ok(Frame::Text(t)))) => {
                return serde_json::from_slice::<serde_json::Value>(&t).ok()
            }
            _ => return None,
        }
    }
}
