//! PROTOCOL.md §3.0 "an open transaction is stored as it arrives", through the streamer, on both
//! engines: a subscriber that falls behind inside a large transaction reads it whole from the
//! change log once committed; an upstream drop in its middle leaves nothing and the resend is
//! stored once; a serving standby follows it only once committed, whole. At the change log
//! itself: `open_txn_pending.rs`.

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::ChangeLog;
use change_streamer_actors::follower;
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{
    Mode, RecordSubscribers, Streamer, StreamerConfig, UpstreamAck, UpstreamBatch, UpstreamEvent,
};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use common::engine::{assert_none_visible, assert_whole, read_all, row, Engine};
use common::{begin, commit, data, subscribe, until, w, AckNow, Received, SetStalled};

fn big_data(i: i64) -> UpstreamMessage {
    UpstreamMessage::Data { payload: row(i) }
}

/// Hands `msgs` to the streamer as the upstream client does: waiting for each release.
async fn send_all(streamer: &Addr<Streamer>, msgs: Vec<UpstreamMessage>) -> Vec<UpstreamAck> {
    let mut acks = Vec::new();
    let mut waiting = msgs;
    while !waiting.is_empty() {
        let reply = streamer
            .send(UpstreamBatch(waiting))
            .await
            .unwrap()
            .expect("no violation");
        acks.extend(reply.acks);
        waiting = reply.rest;
        if let Some(release) = reply.release {
            tokio::time::timeout(Duration::from_secs(10), release)
                .await
                .expect("released")
                .ok();
        }
    }
    acks
}

async fn durable(acks: Vec<UpstreamAck>) {
    for ack in acks {
        if let Some(d) = ack.durable {
            d.await.expect("durable");
        }
    }
}

fn chunked_config() -> StreamerConfig {
    StreamerConfig {
        txn_chunk_changes: 16,
        txn_chunk_bytes: 1 << 20,
        max_queue_changes: 40,
        catchup_window_bytes: 8 << 10,
        catchup_batch: 50,
        ..StreamerConfig::default()
    }
}

/// The data `i`s of transaction `n` in a session's messages, in order.
fn data_of(messages: &[String]) -> Vec<i64> {
    messages
        .iter()
        .filter(|m| m.contains(r#""tag":"insert""#))
        .map(|m| {
            let at = m.find(r#""i":"#).unwrap() + 4;
            m[at..].split(',').next().unwrap().parse().unwrap()
        })
        .collect()
}

/// A live subscriber that keeps up gets a large transaction live; one that stops acking inside
/// it goes back to catch-up and, once it reads again, gets it whole from the change log, in
/// byte-limited reads; while the transaction is open its chunks are stored and invisible.
async fn a_lagging_subscriber_reads_a_large_transaction_whole(engine: Engine) {
    let log = engine.open().await;
    let stats = log.stats().await.unwrap();
    let streamer = Streamer::new(chunked_config(), log.clone(), &stats).start();
    durable(send_all(&streamer, vec![begin(100), data(0), commit(100)]).await).await;
    let (keeps_up, ok) = subscribe(
        &streamer,
        SessionId(1000),
        Mode::Serving,
        &w(100).to_string(),
        false,
    )
    .await;
    ok.unwrap();
    let (lags, ok) = subscribe(
        &streamer,
        SessionId(1001),
        Mode::Serving,
        &w(100).to_string(),
        true,
    )
    .await;
    ok.unwrap();
    const N: i64 = 400;
    let mut msgs = vec![begin(101)];
    msgs.extend((0..N).map(big_data));
    let acks = send_all(&streamer, msgs).await;
    assert!(acks.is_empty(), "nothing acked before the commit");
    until("the open transaction's chunks stored", || async {
        engine.pending_rows().await > 0
    })
    .await;
    assert_none_visible(&log).await;
    let acks = send_all(&streamer, vec![commit(101)]).await;
    assert_eq!(acks.len(), 1);
    durable(acks).await;
    assert_whole(&read_all(&log, 101).await, 101, N);
    assert_eq!(engine.pending_rows().await, 0);
    let (held, _) = lags.send(Received).await.unwrap();
    assert!(
        held.len() <= 41,
        "the one not acking got no more than its bound live ({} messages): the rest comes from the change log",
        held.len()
    );
    lags.send(SetStalled(false)).await.unwrap();
    lags.send(AckNow).await.unwrap();
    for s in [&keeps_up, &lags] {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (m, _) = s.send(Received).await.unwrap();
            if m.last().is_some_and(|l| l.contains("commit")) && data_of(&m).len() as i64 >= N {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the whole transaction not received: {} messages, last {:?}",
                m.len(),
                m.last()
            );
            s.send(AckNow).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (m, closed) = s.send(Received).await.unwrap();
        assert!(closed.is_none(), "{closed:?}");
        assert_eq!(
            data_of(&m),
            (0..N).collect::<Vec<_>>(),
            "no gap, no duplicate"
        );
        let of_101 = |tag: &str| {
            m.iter()
                .filter(|x| x.starts_with(&format!(r#"["{tag}""#)))
                .count()
        };
        assert_eq!(
            (of_101("begin"), of_101("commit")),
            (1, 1),
            "one begin, one commit"
        );
    }
}

#[actix_rt::test]
async fn a_lagging_subscriber_reads_a_large_transaction_whole_sqlite() {
    a_lagging_subscriber_reads_a_large_transaction_whole(Engine::sqlite()).await;
}

#[actix_rt::test]
async fn a_lagging_subscriber_reads_a_large_transaction_whole_postgres() {
    a_lagging_subscriber_reads_a_large_transaction_whole(Engine::pg("pending_lagging").await).await;
}

/// An upstream drop in the middle of a large transaction deletes its pending rows; the
/// source's resend is stored whole, once.
async fn an_upstream_drop_leaves_nothing(engine: Engine) {
    let log = engine.open().await;
    let stats = log.stats().await.unwrap();
    let streamer = Streamer::new(chunked_config(), log.clone(), &stats).start();
    durable(send_all(&streamer, vec![begin(100), data(0), commit(100)]).await).await;
    let mut msgs = vec![begin(101)];
    msgs.extend((0..100).map(big_data));
    send_all(&streamer, msgs).await;
    until("chunks stored", || async {
        engine.pending_rows().await > 0
    })
    .await;
    streamer.send(UpstreamEvent::Disconnected).await.unwrap();
    until("pending rows deleted", || async {
        engine.pending_rows().await == 0
    })
    .await;
    assert_none_visible(&log).await;
    streamer
        .send(UpstreamEvent::Connected {
            resume_after: Some(w(100)),
        })
        .await
        .unwrap();
    let mut msgs = vec![begin(101)];
    msgs.extend((0..100).map(big_data));
    msgs.push(commit(101));
    durable(send_all(&streamer, msgs).await).await;
    assert_whole(&read_all(&log, 101).await, 101, 100);
}

#[actix_rt::test]
async fn an_upstream_drop_leaves_nothing_sqlite() {
    an_upstream_drop_leaves_nothing(Engine::sqlite()).await;
}

#[actix_rt::test]
async fn an_upstream_drop_leaves_nothing_postgres() {
    an_upstream_drop_leaves_nothing(Engine::pg("pending_dropped").await).await;
}

/// Answers every [`RecordSubscribers`] as recorded, as the instance recorder does.
struct Recorded;
impl Actor for Recorded {
    type Context = Context<Self>;
}
impl Handler<RecordSubscribers> for Recorded {
    type Result = Result<(), String>;
    fn handle(&mut self, _: RecordSubscribers, _: &mut Context<Self>) -> Result<(), String> {
        Ok(())
    }
}

/// A serving standby follows a large transaction from the change DB only once its commit is
/// stored, and hands it to its subscriber whole (PROTOCOL.md §3.0, §14.1).
#[actix_rt::test]
async fn a_standby_follows_a_large_transaction_once_committed_postgres() {
    let engine = Engine::pg("pending_standby").await;
    let url = match &engine {
        Engine::Pg(db) => db.url.clone(),
        Engine::Sqlite(_) => unreachable!(),
    };
    let log = engine.open().await;
    let stats = log.stats().await.unwrap();
    let owner = Streamer::new(chunked_config(), log.clone(), &stats).start();
    durable(send_all(&owner, vec![begin(100), data(0), commit(100)]).await).await;

    let standby_log = ChangeLog::open_standby(&url).unwrap();
    let standby_stats = standby_log.stats().await.unwrap();
    let standby = Streamer::new(chunked_config(), standby_log.clone(), &standby_stats)
        .following(Recorded.start().recipient())
        .start();
    let follower = follower::start(
        url.clone(),
        standby_log,
        standby.clone(),
        standby_stats.max_watermark.clone(),
    );
    let (session, ok) = subscribe(
        &standby,
        SessionId(2000),
        Mode::Serving,
        &w(100).to_string(),
        false,
    )
    .await;
    ok.unwrap();

    const N: i64 = 300;
    let mut msgs = vec![begin(101)];
    msgs.extend((0..N).map(big_data));
    send_all(&owner, msgs).await;
    until("the open transaction's chunks stored", || async {
        engine.pending_rows().await > 0
    })
    .await;
    let (m, _) = session.send(Received).await.unwrap();
    assert!(
        data_of(&m).is_empty(),
        "nothing of it followed before its commit: {m:?}"
    );
    durable(send_all(&owner, vec![commit(101)]).await).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (m, _) = session.send(Received).await.unwrap();
        if m.last().is_some_and(|l| l.contains("commit")) {
            assert_eq!(
                data_of(&m),
                (0..N).collect::<Vec<_>>(),
                "whole, once, in order"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the standby's subscriber got {} messages",
            m.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    follower.stop().await;
}
