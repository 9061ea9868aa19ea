//! Actor-level tests of consensus flow control (SPEC §10): the real [`Streamer`] and change
//! log, fed upstream batches directly, broadcasting to fake subscriber sessions that ack at once
//! or never. Every change is sent tracked here (a 1-byte flow-control budget), so each batch
//! waits for its release, and the release time can be measured.
//!
//! The flow-control tests pause the runtime's clock (`tokio::time::pause()`): the streamer's
//! timers and "now" run on it, so a release due `padding` after the third ack comes exactly
//! then, and "still held after 300 ms" takes no real time. The change log's writes are real I/O
//! on their own thread: each test awaits the durability of what it stored before relying on it.

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::ChangeLog;
use change_streamer_actors::session::SessionId;
use change_streamer_actors::streamer::{
    GetStreamerState, Streamer, StreamerConfig, Subscribe, UpstreamBatch,
};
use change_streamer_actors::streamer::{
    Mode, Phase, SessionGone, SessionProgress, ToSession, Token,
};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use change_streamer_actors::watermark::Watermark;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// A subscriber session that acks everything at once, or nothing (`stalled`).
struct FakeSession {
    session_id: SessionId,
    streamer: Addr<Streamer>,
    stalled: bool,
    received: u64,
    unacked_tokens: Vec<Token>,
    last_commit: Option<Watermark>,
    commits: Vec<Watermark>,
}

impl Actor for FakeSession {
    type Context = Context<Self>;
}

impl Handler<ToSession> for FakeSession {
    type Result = ();
    fn handle(&mut self, msg: ToSession, _: &mut Context<Self>) {
        if let ToSession::Send(frames) = msg {
            for f in frames.iter() {
                self.received += 1;
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
            acked_commit: self.last_commit.take(),
            tokens: std::mem::take(&mut self.unacked_tokens),
        });
    }
}

#[derive(Message)]
#[rtype(result = "u64")]
struct AckNow;
impl Handler<AckNow> for FakeSession {
    type Result = u64;
    fn handle(&mut self, _: AckNow, _: &mut Context<Self>) -> u64 {
        self.ack_all();
        self.received
    }
}

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

fn begin(n: u64) -> UpstreamMessage {
    UpstreamMessage::Begin {
        payload: r#"{"tag":"begin"}"#.into(),
        commit_watermark: w(n),
        skip_ack: false,
    }
}
fn data(i: u64) -> UpstreamMessage {
    UpstreamMessage::Data {
        payload: format!(r#"{{"tag":"insert","i":{i}}}"#),
    }
}
fn commit(n: u64) -> UpstreamMessage {
    UpstreamMessage::Commit {
        payload: r#"{"tag":"commit"}"#.into(),
        watermark: w(n),
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    streamer: Addr<Streamer>,
    sessions: Vec<Addr<FakeSession>>,
}

/// A streamer with an initialized change log (watermark 100) and `stalled.len()` subscribers.
async fn setup(padding_ms: f64, stalled: &[bool]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    let stats = log.stats().await.unwrap();
    let cfg = StreamerConfig {
        padding_ms,
        flow_control_bytes: 1,
        catchup_batch: 100,
        ..StreamerConfig::default()
    };
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
    for (i, &stalled) in stalled.iter().enumerate() {
        let session_id = SessionId(1000 + i as u64);
        let s = FakeSession {
            session_id,
            streamer: streamer.clone(),
            stalled,
            received: 0,
            unacked_tokens: vec![],
            last_commit: None,
            commits: vec![],
        }
        .start();
        streamer
            .send(Subscribe {
                session_id,
                id: format!("sub-{i}"),
                mode: Mode::Serving,
                protocol: 6,
                replica_version: w(100).to_string(),
                watermark: w(100),
                session: s.clone().recipient(),
            })
            .await
            .unwrap()
            .expect("subscribed");
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

/// Asserts that `release` does not come within `ms` milliseconds.
async fn still_held(release: &mut oneshot::Receiver<()>, ms: u64, why: &str) {
    assert!(
        tokio::time::timeout(Duration::from_millis(ms), release)
            .await
            .is_err(),
        "{why}"
    );
}

/// Asserts that `release` comes within a second.
async fn released(release: oneshot::Receiver<()>, why: &str) {
    tokio::time::timeout(Duration::from_secs(1), release)
        .await
        .expect(why)
        .expect(why);
}

/// Waits until `done` holds, yielding to the actors in between: for waits on the change log's
/// reads, real I/O that the runtime's clock does not drive. Fails after 10 s of real time.
async fn until<F, Fut>(what: &str, mut done: F)
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
async fn send_one(s: &Setup, m: UpstreamMessage) -> Option<oneshot::Receiver<()>> {
    let reply = s
        .streamer
        .send(UpstreamBatch(vec![m]))
        .await
        .unwrap()
        .expect("no violation");
    assert_eq!(reply.consumed, 1);
    reply.release
}

#[actix_rt::test]
async fn five_subscribers_two_stalled_release_padding_after_the_third_ack() {
    tokio::time::pause();
    let padding = 100.0;
    let s = setup(padding, &[false, false, false, true, true]).await;
    let mut latencies = Vec::new();
    for n in 101..106 {
        for m in [begin(n), data(n), commit(n)] {
            let t0 = Instant::now();
            let release = send_one(&s, m)
                .await
                .expect("a tracked send waits for the stalled two");
            release.await.expect("released");
            latencies.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
    }
    // The three fast ones ack at the send's instant (the clock is paused): the release comes
    // padding after the third ack, give or take the timer's millisecond resolution.
    for l in &latencies {
        assert!(
            *l >= padding && *l <= padding + 1.0,
            "release after {l:.1} ms: {latencies:?}"
        );
    }
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.releases_consensus, 15);
    // The fast ones got everything; the stalled ones stay pending.
    for (i, sess) in s.sessions.iter().enumerate().take(3) {
        assert_eq!(sess.send(AckNow).await.unwrap(), 1 + 15, "subscriber {i}");
    }
}

#[actix_rt::test]
async fn a_lone_stalled_subscriber_holds_the_release_until_it_acks() {
    tokio::time::pause();
    let s = setup(0.0, &[true]).await;
    let mut release = send_one(&s, begin(101)).await.expect("waits");
    still_held(
        &mut release,
        300,
        "one subscriber is its own majority: no early release",
    )
    .await;
    s.sessions[0].send(AckNow).await.unwrap();
    released(release, "released after the ack").await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    // Three releases of the initial sync (no subscriber: released at once), then this one.
    assert_eq!((st.releases_all, st.releases_consensus), (4, 0));
}

#[actix_rt::test]
async fn a_lone_stalled_subscriber_that_drops_releases_the_send() {
    tokio::time::pause();
    let s = setup(0.0, &[true]).await;
    let mut release = send_one(&s, begin(101)).await.expect("waits");
    still_held(&mut release, 200, "released too early").await;
    s.streamer
        .send(SessionGone {
            session_id: SessionId(1000),
        })
        .await
        .unwrap();
    released(release, "released when it left").await;
}

#[actix_rt::test]
async fn negative_padding_waits_for_all() {
    tokio::time::pause();
    let s = setup(-1000.0, &[false, false, true]).await;
    let mut release = send_one(&s, begin(101)).await.expect("waits");
    still_held(
        &mut release,
        500,
        "negative padding: a majority is not enough",
    )
    .await;
    s.sessions[2].send(AckNow).await.unwrap();
    released(release, "released").await;
}

#[actix_rt::test]
async fn no_subscribers_means_no_wait() {
    let s = setup(1000.0, &[]).await;
    assert!(send_one(&s, begin(101)).await.is_none());
    assert!(send_one(&s, commit(101)).await.is_none());
}

#[actix_rt::test]
async fn two_subscribers_one_stalled_never_release_early() {
    tokio::time::pause();
    let s = setup(0.0, &[false, true]).await;
    let mut release = send_one(&s, begin(101)).await.expect("waits");
    still_held(&mut release, 300, "majority of 2 is 2").await;
    s.sessions[1].send(AckNow).await.unwrap();
    released(release, "released").await;
}

#[actix_rt::test]
async fn a_commit_that_was_never_stored_is_not_skipped_when_it_comes_again() {
    use change_streamer_actors::streamer::UpstreamEvent;
    let s = setup(0.0, &[]).await;
    // 101 is forwarded; pretend its append failed: the reconnect resumes after 100.
    let reply = s
        .streamer
        .send(UpstreamBatch(vec![begin(101), data(1), commit(101)]))
        .await
        .unwrap()
        .unwrap();
    assert!(
        reply.acks[0].durable.is_some(),
        "a new transaction is acked once durable"
    );
    s.streamer.send(UpstreamEvent::Disconnected).await.unwrap();
    s.streamer
        .send(UpstreamEvent::Connected {
            resume_after: Some(w(100)),
        })
        .await
        .unwrap();
    let reply = s
        .streamer
        .send(UpstreamBatch(vec![begin(101), data(1), commit(101)]))
        .await
        .unwrap()
        .unwrap();
    assert!(
        reply.acks[0].durable.is_some(),
        "stored again, not skipped as a replay"
    );
    // Resuming after what was stored changes nothing: 101 is then a replay, acked at once.
    s.streamer
        .send(UpstreamEvent::Connected {
            resume_after: Some(w(101)),
        })
        .await
        .unwrap();
    let reply = s
        .streamer
        .send(UpstreamBatch(vec![begin(101), data(1), commit(101)]))
        .await
        .unwrap()
        .unwrap();
    assert!(
        reply.acks[0].durable.is_none(),
        "a replay is acked again at once"
    );
}

#[derive(Message)]
#[rtype(result = "Vec<Watermark>")]
struct Commits;
impl Handler<Commits> for FakeSession {
    type Result = Vec<Watermark>;
    fn handle(&mut self, _: Commits, _: &mut Context<Self>) -> Vec<Watermark> {
        self.commits.clone()
    }
}

#[actix_rt::test]
async fn a_slow_catch_up_keeps_a_bounded_backlog_and_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    let stats = log.stats().await.unwrap();
    let cfg = StreamerConfig {
        padding_ms: 0.0,
        flow_control_bytes: usize::MAX,
        catchup_batch: 10,
        backlog_limit: 20,
    };
    let streamer = Streamer::new(cfg, log, &stats).start();
    let txn = |n: u64| vec![begin(n), data(n), commit(n)];
    for n in 100..=130 {
        streamer.send(UpstreamBatch(txn(n))).await.unwrap().unwrap();
    }
    // A subscriber at 100 that does not ack: its catch-up stops after the first batch.
    let session = FakeSession {
        session_id: SessionId(1),
        streamer: streamer.clone(),
        stalled: true,
        received: 0,
        unacked_tokens: vec![],
        last_commit: None,
        commits: vec![],
    }
    .start();
    streamer
        .send(Subscribe {
            session_id: SessionId(1),
            id: "slow".into(),
            mode: Mode::Serving,
            protocol: 6,
            replica_version: w(100).to_string(),
            watermark: w(100),
            session: session.clone().recipient(),
        })
        .await
        .unwrap()
        .unwrap();
    // Its first catch-up batch is read from the change log and sent.
    until("the first catch-up batch", || {
        let session = session.clone();
        async move { !session.send(Commits).await.unwrap().is_empty() }
    })
    .await;
    // Live changes keep coming; its backlog never holds more than the limit plus a transaction.
    for n in 131..=200 {
        streamer.send(UpstreamBatch(txn(n))).await.unwrap().unwrap();
        let st = streamer.send(GetStreamerState).await.unwrap();
        let sub = &st.subscribers[0];
        assert!(sub.pending <= 10 + 20 + 3, "backlog not bounded: {sub:?}");
    }
    // It now acks as fast as it is fed, and ends up with every transaction once, in order.
    until("the catch-up to end", || {
        let (session, streamer) = (session.clone(), streamer.clone());
        async move {
            session.send(AckNow).await.unwrap();
            let st = streamer.send(GetStreamerState).await.unwrap();
            st.subscribers[0].phase == Phase::Live
                && session.send(Commits).await.unwrap().len() == 100
        }
    })
    .await;
    let commits = session.send(Commits).await.unwrap();
    assert_eq!(commits, (101..=200).map(w).collect::<Vec<_>>());
}
