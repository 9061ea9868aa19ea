//! Actor-level tests of a serving standby's streamer (PROTOCOL.md §14.1): the real [`Streamer`],
//! following (it forwards what it is fed and stores nothing), on a real change log that an
//! owner's streamer filled.

mod common;

use actix::prelude::*;
use change_streamer_actors::changelog::{ChangeLog, LogStats};
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{
    Mode, RecordSubscribers, Streamer, StreamerConfig, Subscribe, UpstreamBatch,
};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use common::*;

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

/// Stores `batches` through an owner's streamer on `log`, waiting until each is durable.
async fn store(log: &ChangeLog, batches: Vec<Vec<UpstreamMessage>>) {
    let stats = log.stats().await.unwrap();
    let owner = Streamer::new(StreamerConfig::default(), log.clone(), &stats).start();
    for batch in batches {
        let reply = owner.send(UpstreamBatch(batch)).await.unwrap().unwrap();
        for ack in reply.acks {
            if let Some(durable) = ack.durable {
                durable.await.expect("stored");
            }
        }
    }
}

/// The replicaVersion is the change log's first commit, which the owner stored: a standby
/// whose follower began after it (its first forwarded commit is a later one) still answers a
/// subscriber of that replicaVersion, and does not take the first commit it forwarded for it.
#[actix_rt::test]
async fn a_standby_takes_the_replica_version_from_the_change_log_not_its_first_forwarded_commit() {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    store(
        &log,
        vec![
            vec![begin(100), data(0), commit(100)],
            vec![begin(101), data(1), commit(101)],
        ],
    )
    .await;
    // The standby's streamer started before it could read a replicaVersion; its follower
    // hands on what comes after the initial sync.
    let standby = Streamer::new(StreamerConfig::default(), log.clone(), &LogStats::default())
        .following(Recorded.start().recipient())
        .start();
    standby
        .send(UpstreamBatch(vec![begin(101), data(1), commit(101)]))
        .await
        .unwrap()
        .expect("forwarded");
    let session_id = SessionId(1);
    let session = FakeSession::new(session_id, standby.clone(), false).start();
    let subscribed = standby
        .send(Subscribe {
            session_id,
            id: "restored-from-100".into(),
            mode: Mode::Serving,
            backup: None,
            protocol: 6,
            replica_version: w(100).to_string(),
            watermark: w(100),
            session: session.recipient(),
        })
        .await
        .unwrap();
    assert!(subscribed.is_ok(), "{subscribed:?}");
}
