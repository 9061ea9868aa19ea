//! Actor-level tests of consensus flow control (PROTOCOL.md §10): the real [`Streamer`] and change
//! log, fed upstream batches directly, broadcasting to fake subscriber sessions that ack at once
//! or never. Every commit is sent tracked here (a 1-byte flow-control budget; only commits are
//! tracked), so each transaction waits for its release, and the release time can be measured.
//!
//! The flow-control tests pause the runtime's clock (`tokio::time::pause()`): the streamer's
//! timers and "now" run on it, so a release due `padding` after the third ack comes exactly
//! then, and "still held after 300 ms" takes no real time. The change log's writes are real I/O
//! on their own thread: each test awaits the durability of what it stored before relying on it.

mod common;

use actix::prelude::*;
use change_streamer_actors::changelog::ChangeLog;
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{
    GetStreamerState, Mode, Phase, SessionGone, Streamer, StreamerConfig, Subscribe, UpstreamBatch,
};
use common::*;
use std::time::Duration;

use tokio::time::Instant;

#[actix_rt::test]
async fn a_stalled_minority_costs_one_padding_then_counts_as_finished() {
    tokio::time::pause();
    let padding = Duration::from_millis(100);
    let s = setup(Some(padding), &[false, false, false, true, true]).await;
    let mut latencies = Vec::new();
    for n in 101..106 {
        let t0 = Instant::now();
        let release = send_txn(&s, n)
            .await
            .expect("a tracked send waits for the acks");
        release.await.expect("released");
        latencies.push(t0.elapsed());
    }
    // The first tracked send: the three fast ones ack at once (the clock is paused), the
    // release comes padding after the third ack, give or take the timer's millisecond.
    assert!(
        latencies[0] >= padding && latencies[0] <= padding + Duration::from_millis(1),
        "first release after {:?}",
        latencies[0]
    );
    // The two stalled ones now lag on it (PROTOCOL.md §10.1): every later send is released as soon
    // as the three fast ones ack.
    for l in &latencies[1..] {
        assert!(
            *l < Duration::from_millis(1),
            "a later release waited {l:?}: {latencies:?}"
        );
    }
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.releases_consensus, 1);
    assert!(st.subscribers[3].lagging.is_some() && st.subscribers[4].lagging.is_some());
    // The fast ones got everything; the stalled ones stay pending.
    for (i, sess) in s.sessions.iter().enumerate().take(3) {
        assert_eq!(sess.send(AckNow).await.unwrap(), 1 + 15, "subscriber {i}");
    }
}

#[actix_rt::test]
async fn a_lone_stalled_subscriber_holds_the_release_until_it_acks() {
    tokio::time::pause();
    let s = setup(Some(Duration::ZERO), &[true]).await;
    let mut release = send_txn(&s, 101).await.expect("waits");
    still_held(
        &mut release,
        300,
        "one subscriber is its own majority: no early release",
    )
    .await;
    s.sessions[0].send(AckNow).await.unwrap();
    released(release, "released after the ack").await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    // The release of the initial sync's commit (no subscriber: released at once), then this one.
    assert_eq!((st.releases_all, st.releases_consensus), (2, 0));
}

#[actix_rt::test]
async fn a_lone_stalled_subscriber_that_drops_releases_the_send() {
    tokio::time::pause();
    let s = setup(Some(Duration::ZERO), &[true]).await;
    let mut release = send_txn(&s, 101).await.expect("waits");
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
    let s = setup(None, &[false, false, true]).await;
    let mut release = send_txn(&s, 101).await.expect("waits");
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
    let s = setup(Some(Duration::from_secs(1)), &[]).await;
    assert!(send_one(&s, begin(101)).await.is_none());
    assert!(send_one(&s, commit(101)).await.is_none());
}

#[actix_rt::test]
async fn two_subscribers_one_stalled_never_release_early() {
    tokio::time::pause();
    let s = setup(Some(Duration::ZERO), &[false, true]).await;
    let mut release = send_txn(&s, 101).await.expect("waits");
    still_held(&mut release, 300, "majority of 2 is 2").await;
    s.sessions[1].send(AckNow).await.unwrap();
    released(release, "released").await;
}

#[actix_rt::test]
async fn a_commit_that_was_never_stored_is_not_skipped_when_it_comes_again() {
    use change_streamer_actors::streamer::UpstreamEvent;
    let s = setup(Some(Duration::ZERO), &[]).await;
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

#[actix_rt::test]
async fn a_slow_catch_up_keeps_a_bounded_backlog_and_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    let stats = log.stats().await.unwrap();
    let cfg = StreamerConfig {
        padding: Some(Duration::ZERO),
        flow_control_bytes: usize::MAX,
        catchup_batch: 10,
        max_queue_changes: 20,
        slow_grace: None,
        ..StreamerConfig::default()
    };
    let streamer = Streamer::new(cfg, log, &stats).start();
    let txn = |n: u64| vec![begin(n), data(n), commit(n)];
    for n in 100..=130 {
        streamer.send(UpstreamBatch(txn(n))).await.unwrap().unwrap();
    }
    // A subscriber at 100 that does not ack: its catch-up stops after the first batch.
    let session = FakeSession::new(SessionId(1), streamer.clone(), true).start();
    streamer
        .send(Subscribe {
            session_id: SessionId(1),
            id: "slow".into(),
            mode: Mode::Serving,
            backup: None,
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
        assert!(sub.pending <= 20, "backlog not bounded: {sub:?}");
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
