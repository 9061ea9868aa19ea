//! The in-process rig of `fanout`, `stall` and `changelog`: a real [`Streamer`] on a real
//! change log, with sessions on a second thread that ack every batch as it arrives and report
//! their acks through the real session's [`AckReport`] (tracked frames at once, an acked commit
//! alone at most `COMMIT_REPORT_DELAY` later), so that they cost the streamer what the
//! service's sessions do. And the peer's workload, as upstream messages.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use change_streamer::websocket::acks::{AckReport, AfterAck, COMMIT_REPORT_DELAY};
use change_streamer_actors::changelog::ChangeLog;
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{
    GetStreamerState, Mode, Streamer, StreamerConfig, Subscribe, ToSession, Token,
};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::feed::feed;

/// When each tracked frame (by token) was acked, per subscriber.
pub type AckTimes = Arc<Mutex<HashMap<Token, Vec<Instant>>>>;

/// A session that acks every batch as it arrives (or never, `stalled`): frame ids are the count
/// of frames received, and one ack covers the whole batch.
struct BenchSession {
    streamer: Addr<Streamer>,
    stalled: bool,
    received: u64,
    total: Arc<AtomicU64>,
    ack_times: AckTimes,
    delivered_at: Option<Arc<Mutex<Vec<Instant>>>>,
    acks: AckReport,
}

impl Actor for BenchSession {
    type Context = Context<Self>;
}

impl Handler<ToSession> for BenchSession {
    type Result = ();
    fn handle(&mut self, msg: ToSession, ctx: &mut Context<Self>) {
        let ToSession::Send(frames) = msg else { return };
        self.total.fetch_add(frames.len() as u64, Ordering::Relaxed);
        if let Some(d) = &self.delivered_at {
            d.lock().unwrap().push(Instant::now());
        }
        for f in frames.iter() {
            self.received += 1;
            self.acks.sent(self.received, f);
        }
        if self.stalled {
            return;
        }
        match self.acks.acked(self.received) {
            AfterAck::Report(progress) => {
                let now = Instant::now();
                let mut times = self.ack_times.lock().unwrap();
                for tok in &progress.tokens {
                    times.entry(*tok).or_default().push(now);
                }
                drop(times);
                self.streamer.do_send(progress);
            }
            AfterAck::ReportLater => {
                ctx.run_later(COMMIT_REPORT_DELAY, |act, _| {
                    if let Some(progress) = act.acks.delay_passed() {
                        act.streamer.do_send(progress);
                    }
                });
            }
            AfterAck::Nothing => {}
        }
    }
}

/// A streamer with its sessions, and what they saw.
pub struct Rig {
    _dir: tempfile::TempDir,
    pub log: ChangeLog,
    pub streamer: Addr<Streamer>,
    /// Frames received by all sessions.
    pub total: Arc<AtomicU64>,
    pub ack_times: AckTimes,
    /// When the first session received each batch.
    pub delivered_at: Arc<Mutex<Vec<Instant>>>,
    _arbiter: Arbiter,
}

pub fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

/// The peer's workload: begin, `changes` inserts of `row_bytes`, commit.
pub fn workload(first: u64, txns: u64, changes: u64, row_bytes: usize) -> Vec<UpstreamMessage> {
    let pad = "x".repeat(row_bytes);
    let mut v = Vec::with_capacity((txns * (changes + 2)) as usize);
    for t in first..first + txns {
        v.push(UpstreamMessage::Begin {
            payload: r#"{"tag":"begin"}"#.into(),
            commit_watermark: w(t),
            skip_ack: false,
        });
        for c in 0..changes {
            v.push(UpstreamMessage::Data {
                payload: format!(
                    r#"{{"tag":"insert","relation":{{"schema":"public","name":"issues","rowKey":{{"columns":["id"],"type":"default"}}}},"new":{{"id":"{t}-{c}","title":"{pad}"}}}}"#
                ),
            });
        }
        v.push(UpstreamMessage::Commit {
            payload: r#"{"tag":"commit"}"#.into(),
            watermark: w(t),
        });
    }
    v
}

/// A streamer (initialized at watermark 1) with `stalled.len()` sessions on a second thread,
/// all live.
pub async fn rig(padding: Duration, stalled: &[bool]) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    let stats = log.stats().await.unwrap();
    let streamer = Streamer::new(
        StreamerConfig {
            padding: Some(padding),
            ..StreamerConfig::default()
        },
        log.clone(),
        &stats,
    )
    .start();
    feed(&streamer, workload(1, 1, 1, 10), 512).await;
    let arbiter = Arbiter::new();
    let total = Arc::new(AtomicU64::new(0));
    let ack_times = Arc::new(Mutex::new(HashMap::new()));
    let delivered_at = Arc::new(Mutex::new(Vec::new()));
    for (i, &st) in stalled.iter().enumerate() {
        let session_id = SessionId(10_000 + i as u64);
        let (s2, t2, a2, d2) = (
            streamer.clone(),
            total.clone(),
            ack_times.clone(),
            delivered_at.clone(),
        );
        let session = BenchSession::start_in_arbiter(&arbiter.handle(), move |_| BenchSession {
            streamer: s2,
            stalled: st,
            received: 0,
            total: t2,
            ack_times: a2,
            delivered_at: (i == 0).then_some(d2),
            acks: AckReport::new(session_id),
        });
        streamer
            .send(Subscribe {
                session_id,
                id: format!("s{i}"),
                mode: Mode::Serving,
                backup: None,
                protocol: 6,
                replica_version: w(1).to_string(),
                watermark: w(1),
                session: session.recipient(),
            })
            .await
            .unwrap()
            .unwrap();
    }
    loop {
        let st = streamer.send(GetStreamerState).await.unwrap();
        if st
            .subscribers
            .iter()
            .all(|s| format!("{:?}", s.phase) == "Live")
        {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
    Rig {
        _dir: dir,
        log,
        streamer,
        total,
        ack_times,
        delivered_at,
        _arbiter: arbiter,
    }
}
