//! What the actor-level tests share: the backup side's test doubles (a purge that records what
//! it is told, a change log with a fixed answer, a reservation's session) and the backup
//! monitor's harness, and for the streamer
//! tests fake subscriber sessions that ack at once or
//! never (and can be told to ack later), a streamer with an initialized change log, upstream
//! messages, and waiting on releases and on the change log's real I/O.
#![allow(dead_code)] // each test file uses a part

pub mod engine;
pub mod fake_log;
pub mod monitor_harness;
pub mod recording_purge;
pub mod reservation_session;
pub mod vfs_harness;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::ChangeLog;
use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_actors::streamer::{
    GetStreamerState, Streamer, StreamerConfig, Subscribe, SubscribeError, UpstreamBatch,
};
use change_streamer_actors::streamer::{Mode, Phase, SessionProgress, ToSession, Token};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use change_streamer_actors::watermark::Watermark;
use tokio::sync::oneshot;

/// A subscriber session that acks everything at once, or nothing (`stalled`).
pub struct FakeSession {
    session_id: SessionId,
    streamer: Addr<Streamer>,
    stalled: bool,
    received: u64,
    received_bytes: u64,
    unacked_tokens: Vec<Token>,
    last_commit: Option<Watermark>,
    commits: Vec<Watermark>,
    /// Every message received, in order (`["begin",…]`…).
    messages: Vec<String>,
    closed: Option<SessionEnd>,
}

impl FakeSession {
    pub fn new(session_id: SessionId, streamer: Addr<Streamer>, stalled: bool) -> FakeSession {
        FakeSession {
            session_id,
            streamer,
            stalled,
            received: 0,
            received_bytes: 0,
            unacked_tokens: vec![],
            last_commit: None,
            commits: vec![],
            messages: vec![],
            closed: None,
        }
    }
}

impl Actor for FakeSession {
    type Context = Context<Self>;
}

impl Handler<ToSession> for FakeSession {
    type Result = ();
    fn handle(&mut self, msg: ToSession, _: &mut Context<Self>) {
        if let ToSession::Close(end) = msg {
            self.closed = Some(end);
            return;
        }
        if let ToSession::Send(frames) = msg {
            for f in frames.iter() {
                self.messages.push(f.message.to_string());
                self.received += 1;
                self.received_bytes += f.message.len() as u64;
                self.unacked_tokens.extend(f.token);
                if let Some(c) = &f.commit {
                    self.last_commit = Some(c.clone());
                    self.commits.push(c.clone());
                }
            }
            if !self.stalled {
                self.ack_all();
            }
        }
    }
}

impl FakeSession {
    fn ack_all(&mut self) {
        self.streamer.do_send(SessionProgress {
            session_id: self.session_id,
            acked_messages: self.received,
            acked_bytes: self.received_bytes,
            acked_commit: self.last_commit.take(),
            tokens: std::mem::take(&mut self.unacked_tokens),
        });
    }
}

#[derive(Message)]
#[rtype(result = "u64")]
pub struct AckNow;
impl Handler<AckNow> for FakeSession {
    type Result = u64;
    fn handle(&mut self, _: AckNow, _: &mut Context<Self>) -> u64 {
        self.ack_all();
        self.received
    }
}

pub fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

pub fn begin(n: u64) -> UpstreamMessage {
    UpstreamMessage::Begin {
        payload: r#"{"tag":"begin"}"#.into(),
        commit_watermark: w(n),
        skip_ack: false,
    }
}
pub fn data(i: u64) -> UpstreamMessage {
    UpstreamMessage::Data {
        payload: format!(r#"{{"tag":"insert","i":{i}}}"#),
    }
}
pub fn commit(n: u64) -> UpstreamMessage {
    UpstreamMessage::Commit {
        payload: r#"{"tag":"commit"}"#.into(),
        watermark: w(n),
    }
}

pub struct Setup {
    pub _dir: tempfile::TempDir,
    pub streamer: Addr<Streamer>,
    pub sessions: Vec<Addr<FakeSession>>,
}

/// A streamer with an initialized change log (watermark 100) and `stalled.len()` subscribers;
/// every commit is sent tracked.
pub async fn setup(padding: Option<Duration>, stalled: &[bool]) -> Setup {
    let cfg = StreamerConfig {
        padding,
        flow_control_bytes: 1,
        catchup_batch: 100,
        ..StreamerConfig::default()
    };
    setup_with(cfg, stalled).await
}

/// [`setup`] with `cfg`.
pub async fn setup_with(cfg: StreamerConfig, stalled: &[bool]) -> Setup {
    let subs: Vec<(Mode, bool)> = stalled.iter().map(|&s| (Mode::Serving, s)).collect();
    setup_modes(cfg, &subs).await
}

/// [`setup_with`], each subscriber of the given mode (and stalled or not); subscriber `i` is
/// `sub-{i}`, session `1000 + i`.
pub async fn setup_modes(cfg: StreamerConfig, subs: &[(Mode, bool)]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    let stats = log.stats().await.unwrap();
    let streamer = Streamer::new(cfg, log, &stats).start();
    // The initial sync, with no subscriber: nothing to wait for.
    let reply = streamer
        .send(UpstreamBatch(vec![begin(100), data(0), commit(100)]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.consumed, 3);
    assert!(reply.release.is_none());
    for ack in reply.acks {
        if let Some(durable) = ack.durable {
            durable.await.expect("initial sync stored");
        }
    }
    let mut sessions = Vec::new();
    for (i, &(mode, stalled)) in subs.iter().enumerate() {
        let session_id = SessionId(1000 + i as u64);
        let (s, subscribed) =
            subscribe(&streamer, session_id, mode, &w(100).to_string(), stalled).await;
        subscribed.expect("subscribed");
        sessions.push(s);
    }
    // Subscribed at the last commit, each is live at once: nothing to catch up.
    let st = streamer.send(GetStreamerState).await.unwrap();
    assert!(
        st.subscribers.iter().all(|s| s.phase == Phase::Live),
        "{st:?}"
    );
    Setup {
        _dir: dir,
        streamer,
        sessions,
    }
}

/// Subscribes a new fake session `session_id` (id `sub-{n}`, `n` its number less 1000) of
/// `mode` at watermark 100 and `replica_version`; returns it with the streamer's answer.
pub async fn subscribe(
    streamer: &Addr<Streamer>,
    session_id: SessionId,
    mode: Mode,
    replica_version: &str,
    stalled: bool,
) -> (Addr<FakeSession>, Result<(), SubscribeError>) {
    let s = FakeSession::new(session_id, streamer.clone(), stalled).start();
    let answer = streamer
        .send(Subscribe {
            session_id,
            id: format!("sub-{}", session_id.0 - 1000),
            mode,
            backup: None,
            protocol: 6,
            replica_version: replica_version.to_string(),
            watermark: w(100),
            session: s.clone().recipient(),
        })
        .await
        .unwrap();
    (s, answer)
}

/// Asserts that `release` does not come within `ms` milliseconds.
pub async fn still_held(release: &mut oneshot::Receiver<()>, ms: u64, why: &str) {
    assert!(
        tokio::time::timeout(Duration::from_millis(ms), release)
            .await
            .is_err(),
        "{why}"
    );
}

/// Asserts that `release` comes within a second.
pub async fn released(release: oneshot::Receiver<()>, why: &str) {
    tokio::time::timeout(Duration::from_secs(1), release)
        .await
        .expect(why)
        .expect(why);
}

/// Waits until `done` holds, yielding to the actors in between: for waits on the change log's
/// reads, real I/O that the runtime's clock does not drive. Fails after 10 s of real time.
pub async fn until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::task::yield_now().await;
    }
}

/// Sends one message; returns the release receiver of its tracked send, if it waits.
pub async fn send_one(s: &Setup, m: UpstreamMessage) -> Option<oneshot::Receiver<()>> {
    let reply = s
        .streamer
        .send(UpstreamBatch(vec![m]))
        .await
        .unwrap()
        .expect("no violation");
    assert_eq!(reply.consumed, 1);
    reply.release
}

/// Sends the transaction `n` (`begin`, one `data`, `commit`) one message at a time; only its
/// commit may be tracked (PROTOCOL.md §10), so returns the commit's release receiver, if it waits.
pub async fn send_txn(s: &Setup, n: u64) -> Option<oneshot::Receiver<()>> {
    for m in [begin(n), data(n)] {
        assert!(send_one(s, m).await.is_none(), "only a commit is tracked");
    }
    send_one(s, commit(n)).await
}

#[derive(Message)]
#[rtype(result = "Vec<Watermark>")]
pub struct Commits;
impl Handler<Commits> for FakeSession {
    type Result = Vec<Watermark>;
    fn handle(&mut self, _: Commits, _: &mut Context<Self>) -> Vec<Watermark> {
        self.commits.clone()
    }
}

/// What a fake session received: every message, and how it was closed.
#[derive(Message)]
#[rtype(result = "(Vec<String>, Option<SessionEnd>)")]
pub struct Received;
impl Handler<Received> for FakeSession {
    type Result = MessageResult<Received>;
    fn handle(&mut self, _: Received, _: &mut Context<Self>) -> Self::Result {
        MessageResult((self.messages.clone(), self.closed.clone()))
    }
}

/// Makes a fake session ack everything from now on (or stop acking).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetStalled(pub bool);
impl Handler<SetStalled> for FakeSession {
    type Result = ();
    fn handle(&mut self, s: SetStalled, _: &mut Context<Self>) {
        self.stalled = s.0;
        if !s.0 {
            self.ack_all();
        }
    }
}
