//! A measurement, not a check (`#[ignore]`): the longest gap in forwarding to a live subscriber
//! while the PostgreSQL change log purges 1 M rows, the PostgreSQL counterpart of the SQLite
//! line in BENCHMARKS.md (`cargo bench --bench bench -- changelog`). Run with
//! `cargo test --release -p change-streamer-actors --test postgres_purge_gap -- --ignored --nocapture`.
//!
//! The change log is filled directly (10,000 transactions of 100 rows), then a streamer on it
//! forwards small transactions, one every millisecond, to one subscriber that acks each batch,
//! while the streamer purges everything below the newest of the 10,000. A purge drops whole
//! partitions in the writer's own transaction, so forwarding (which only waits for its
//! transactions to be durable) should stall no longer than one group commit behind the drop.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use change_streamer_actors::changelog::{ChangeLog, PgOptions};
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{
    GetStreamerState, Mode, PurgeAnswer, PurgeIfSafe, SessionProgress, Streamer, StreamerConfig,
    Subscribe, ToSession,
};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::feed::feed;
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::stored::stored_txn;

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

/// A subscriber that records when each batch arrived and acks it at once.
struct Recorder {
    session_id: SessionId,
    streamer: Addr<Streamer>,
    received: u64,
    received_bytes: u64,
    delivered_at: Arc<Mutex<Vec<Instant>>>,
}

impl Actor for Recorder {
    type Context = Context<Self>;
}

impl Handler<ToSession> for Recorder {
    type Result = ();
    fn handle(&mut self, msg: ToSession, _: &mut Context<Self>) {
        let ToSession::Send(frames) = msg else { return };
        self.received += frames.len() as u64;
        self.received_bytes += frames.iter().map(|f| f.message.len() as u64).sum::<u64>();
        self.delivered_at.lock().unwrap().push(Instant::now());
        let commit = frames.iter().rev().find_map(|f| f.commit.clone());
        let tokens: Vec<_> = frames.iter().filter_map(|f| f.token).collect();
        if commit.is_some() || !tokens.is_empty() {
            self.streamer.do_send(SessionProgress {
                session_id: self.session_id,
                acked_messages: self.received,
                acked_bytes: self.received_bytes,
                acked_commit: commit,
                tokens,
            });
        }
    }
}

/// One transaction of `rows` changes at watermark `t`, as the upstream client passes it.
fn upstream_txn(t: u64, rows: u64) -> Vec<UpstreamMessage> {
    let mut v = vec![UpstreamMessage::Begin {
        payload: r#"{"tag":"begin"}"#.into(),
        commit_watermark: w(t),
        skip_ack: false,
    }];
    for c in 0..rows {
        v.push(UpstreamMessage::Data {
            payload: format!(r#"{{"tag":"insert","new":{{"id":"{t}-{c}"}}}}"#),
        });
    }
    v.push(UpstreamMessage::Commit {
        payload: r#"{"tag":"commit"}"#.into(),
        watermark: w(t),
    });
    v
}

#[actix_rt::test]
#[ignore = "a measurement: cargo test --release -p change-streamer-actors --test postgres_purge_gap -- --ignored --nocapture"]
async fn measure_the_longest_forwarding_gap_during_a_purge_of_1m_rows() {
    let db = TestDb::create("purge_gap").await;
    let log = ChangeLog::open_postgres(PgOptions::new(&db.url, Duration::from_secs(1)))
        .await
        .unwrap();
    let row = format!(
        r#"{{"tag":"insert","new":{{"id":1,"v":"{}"}}}}"#,
        "x".repeat(80)
    );
    let make = |n: u64| stored_txn(n, &row, 98);
    const BIG: u64 = 10_000;
    for chunk in (1..=BIG).collect::<Vec<_>>().chunks(2000) {
        let pending: Vec<_> = chunk.iter().map(|&n| log.append(make(n))).collect();
        for p in pending {
            p.await.unwrap();
        }
    }
    let stats = log.stats().await.unwrap();
    assert_eq!(stats.rows, 1_000_000);

    let streamer = Streamer::new(StreamerConfig::default(), log.clone(), &stats).start();
    let delivered_at = Arc::new(Mutex::new(Vec::new()));
    let session_id = SessionId(1);
    let arbiter = Arbiter::new();
    let (s2, d2) = (streamer.clone(), delivered_at.clone());
    let session = Recorder::start_in_arbiter(&arbiter.handle(), move |_| Recorder {
        session_id,
        streamer: s2,
        received: 0,
        received_bytes: 0,
        delivered_at: d2,
    });
    streamer
        .send(Subscribe {
            session_id,
            id: "s0".into(),
            mode: Mode::Serving,
            backup: None,
            protocol: 6,
            replica_version: w(1).to_string(),
            watermark: w(BIG),
            session: session.recipient(),
        })
        .await
        .unwrap()
        .unwrap();
    while !streamer
        .send(GetStreamerState)
        .await
        .unwrap()
        .subscribers
        .iter()
        .all(|s| format!("{:?}", s.phase) == "Live")
    {
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }

    let feeder_streamer = streamer.clone();
    let feeder = actix_rt::spawn(async move {
        let mut t = BIG + 1;
        let stop = Instant::now() + Duration::from_secs(4);
        while Instant::now() < stop {
            feed(&feeder_streamer, upstream_txn(t, 3), usize::MAX).await;
            t += 1;
            actix_rt::time::sleep(Duration::from_millis(1)).await;
        }
    });
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    delivered_at.lock().unwrap().clear();
    let t0 = Instant::now();
    let answer = streamer
        .send(PurgeIfSafe {
            watermark: w(BIG),
            stored_by_ms: i64::MAX,
        })
        .await
        .unwrap();
    let purge_ms = t0.elapsed().as_secs_f64() * 1000.0;
    feeder.await.unwrap();
    let deliveries = delivered_at.lock().unwrap().clone();
    let max_gap = deliveries
        .windows(2)
        .map(|p| (p[1] - p[0]).as_secs_f64() * 1000.0)
        .fold(0.0, f64::max);
    let purged = match answer {
        PurgeAnswer::Purged(n) => n,
        other => panic!("purge refused: {other:?}"),
    };
    assert_eq!(purged, 999_900);
    println!(
        "PostgreSQL change log: purge of {purged} rows {purge_ms:.0} ms while forwarding; longest forwarding gap meanwhile {max_gap:.1} ms ({} deliveries)",
        deliveries.len()
    );
    arbiter.stop();
}
