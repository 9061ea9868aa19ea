//! Actor-level tests of the catch-up's window (PROTOCOL.md §5 "When to ack", §10.2): the real
//! [`Streamer`] and change log, a stored range of transactions, and fake sessions that ack only
//! at commits, or never. They run on real time, as catch-up reads are real I/O on the change
//! log's reader thread.

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{
    GetStreamerState, Mode, Phase, SessionProgress, Streamer, StreamerConfig, Subscribe, ToSession,
    Token, UpstreamBatch,
};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use common::*;

/// Transactions 101..=`last`, each a `begin`, `rows` inserts of about 100 bytes and a `commit`,
/// stored (durable) before any subscriber comes.
async fn store(streamer: &Addr<Streamer>, last: u64, rows: u64) {
    for n in 101..=last {
        let mut msgs = vec![begin(n)];
        msgs.extend((0..rows).map(|i| UpstreamMessage::Data {
            payload: format!(r#"{{"tag":"insert","i":{i},"v":"{}"}}"#, "x".repeat(64)),
        }));
        msgs.push(commit(n));
        let reply = streamer
            .send(UpstreamBatch(msgs))
            .await
            .unwrap()
            .expect("no violation");
        for ack in reply.acks {
            if let Some(durable) = ack.durable {
                durable.await.expect("stored");
            }
        }
    }
}

/// A session that acks only frames that end a transaction (PROTOCOL.md §5: cumulatively, every
/// frame through the last `commit` it received), as an applier that acks once it has applied a
/// whole transaction does. Records whether a list of frames handed to it ended inside a
/// transaction.
struct CommitAcker {
    session_id: SessionId,
    streamer: Addr<Streamer>,
    received: u64,
    received_bytes: u64,
    /// Tokens of the frames received since the last commit acked.
    tokens: Vec<Token>,
    commits: Vec<String>,
    lists_ending_inside: u64,
}

impl Actor for CommitAcker {
    type Context = Context<Self>;
}

impl Handler<ToSession> for CommitAcker {
    type Result = ();
    fn handle(&mut self, msg: ToSession, _: &mut Context<Self>) {
        let ToSession::Send(frames) = msg else {
            return;
        };
        let mut ack = None;
        for f in frames.iter() {
            self.received += 1;
            self.received_bytes += f.message.len() as u64;
            self.tokens.extend(f.token);
            if let Some(c) = &f.commit {
                self.commits.push(c.to_string());
                ack = Some(SessionProgress {
                    session_id: self.session_id,
                    acked_messages: self.received,
                    acked_bytes: self.received_bytes,
                    acked_commit: Some(c.clone()),
                    tokens: std::mem::take(&mut self.tokens),
                });
            }
        }
        if frames
            .last()
            .is_some_and(|f| f.commit.is_none() && !f.message.starts_with(r#"["status""#))
        {
            self.lists_ending_inside += 1;
        }
        if let Some(p) = ack {
            self.streamer.do_send(p);
        }
    }
}

#[derive(Message)]
#[rtype(result = "(Vec<String>, u64)")]
struct Seen;
impl Handler<Seen> for CommitAcker {
    type Result = MessageResult<Seen>;
    fn handle(&mut self, _: Seen, _: &mut Context<Self>) -> Self::Result {
        MessageResult((self.commits.clone(), self.lists_ending_inside))
    }
}

/// A streamer with an initialized change log (watermark 100) and no subscriber, with a
/// `window`-byte catch-up window.
async fn streamer(window: usize) -> Setup {
    let cfg = StreamerConfig {
        catchup_window_bytes: window,
        ..StreamerConfig::default()
    };
    setup_with(cfg, &[]).await
}

#[actix_rt::test]
async fn a_client_acking_only_at_commits_catches_up_fully_where_batches_end_inside_transactions() {
    // 300 transactions of 30 inserts (~3 KiB each) through an 8 KiB window: each read holds a
    // few transactions and most end inside one, whose commit comes only in the next read.
    let s = streamer(8 * 1024).await;
    store(&s.streamer, 400, 30).await;
    let session_id = SessionId(2000);
    let acker = CommitAcker {
        session_id,
        streamer: s.streamer.clone(),
        received: 0,
        received_bytes: 0,
        tokens: Vec::new(),
        commits: Vec::new(),
        lists_ending_inside: 0,
    }
    .start();
    s.streamer
        .send(Subscribe {
            session_id,
            id: "commit-acker".into(),
            mode: Mode::Serving,
            backup: None,
            protocol: 6,
            replica_version: w(100).to_string(),
            watermark: w(100),
            session: acker.clone().recipient(),
        })
        .await
        .unwrap()
        .expect("subscribed");
    until("the commit-only acker to catch up", || {
        let (acker, streamer) = (acker.clone(), s.streamer.clone());
        async move {
            let st = streamer.send(GetStreamerState).await.unwrap();
            let (commits, _) = acker.send(Seen).await.unwrap();
            st.subscribers[0].phase == Phase::Live && commits.last() == Some(&w(400).to_string())
        }
    })
    .await;
    let (commits, inside) = acker.send(Seen).await.unwrap();
    let expected: Vec<String> = (101..=400).map(|n| w(n).to_string()).collect();
    assert_eq!(commits, expected, "every transaction once, in order");
    assert!(
        inside > 10,
        "reads ended inside transactions only {inside} times"
    );
}

#[actix_rt::test]
async fn a_client_that_never_acks_receives_up_to_the_window_and_then_waits() {
    let window = 64 * 1024;
    let s = streamer(window).await;
    store(&s.streamer, 200, 30).await;
    let (session, subscribed) = subscribe(
        &s.streamer,
        SessionId(2000),
        Mode::Serving,
        &w(100).to_string(),
        true,
    )
    .await;
    subscribed.expect("subscribed");
    // Every insert is about 100 bytes: the window is full once a row of the usual size (and
    // its envelope) would not fit.
    let margin = 400;
    let received_bytes = |session: Addr<FakeSession>| async move {
        let (messages, _) = session.send(Received).await.unwrap();
        messages.iter().map(|m| m.len() as u64).sum::<u64>()
    };
    until("the window to fill", || {
        let session = session.clone();
        async move { received_bytes(session).await + margin > window as u64 }
    })
    .await;
    // It waits: nothing more comes while nothing is acked.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = received_bytes(session.clone()).await;
    assert!(
        got <= window as u64 && got + margin > window as u64,
        "{got} bytes unacked, window {window}"
    );
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.subscribers[0].phase, Phase::CatchingUp);
    assert!(st.subscribers[0].queued_bytes <= window as u64, "{st:?}");
    // Once it acks, the rest streams.
    session.send(SetStalled(false)).await.unwrap();
    until("the acking subscriber to catch up", || {
        let (session, streamer) = (session.clone(), s.streamer.clone());
        async move {
            session.send(AckNow).await.unwrap();
            let st = streamer.send(GetStreamerState).await.unwrap();
            st.subscribers[0].phase == Phase::Live
                && session.send(Commits).await.unwrap().last() == Some(&w(200))
        }
    })
    .await;
    let commits = session.send(Commits).await.unwrap();
    assert_eq!(commits, (101..=200).map(w).collect::<Vec<_>>());
}
