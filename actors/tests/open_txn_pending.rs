//! PROTOCOL.md §3.0 "an open transaction is stored as it arrives", on both engines (SQLite in a
//! temporary directory, PostgreSQL on test-support's server): an open transaction's chunks are
//! stored pending, invisible to reads, to a standby's reads and to the purge until its commit,
//! which makes it visible whole, once; a rollback, a lost upstream or a restart in its middle
//! leaves nothing visible and no pending row; a commit missing pending changes is refused; a
//! subscriber that falls behind inside a large transaction reads it whole from the change log;
//! a serving standby follows it only once committed, whole.

mod common;

use actix::prelude::*;
use change_streamer_actors::changelog::{
    ChangeKind, ChangeLog, PendingChunk, PgOptions, StoredChange, Transaction,
};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::follower;
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{
    Mode, RecordSubscribers, Streamer, StreamerConfig, UpstreamAck, UpstreamBatch, UpstreamEvent,
};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::pg::TestDb;
use common::{begin, commit, data, subscribe, until, w, AckNow, Received, SetStalled};
use std::time::Duration;

/// A change log on one engine, reopened as a restart would.
enum Engine {
    Sqlite(tempfile::TempDir),
    Pg(TestDb),
}

impl Engine {
    fn sqlite() -> Engine {
        Engine::Sqlite(tempfile::tempdir().unwrap())
    }

    async fn pg(tag: &str) -> Engine {
        Engine::Pg(TestDb::create(tag).await)
    }

    async fn open(&self) -> ChangeLog {
        match self {
            Engine::Sqlite(dir) => ChangeLog::open_with(dir.path(), 50, Clock::System).unwrap(),
            Engine::Pg(db) => ChangeLog::open_postgres(PgOptions {
                url: db.url.clone(),
                takeover_interval: Duration::from_millis(100),
                segment_rows: 50,
                clock: Clock::System,
                instance: None,
            })
            .await
            .unwrap(),
        }
    }

    /// The pending rows stored, read from the database itself.
    async fn pending_rows(&self) -> i64 {
        match self {
            Engine::Sqlite(dir) => {
                let c = rusqlite::Connection::open(dir.path().join("change-log.db")).unwrap();
                c.query_row("SELECT COUNT(*) FROM pending_txn", [], |r| r.get(0))
                    .unwrap()
            }
            Engine::Pg(db) => db
                .connect()
                .await
                .query_one("SELECT count(*) FROM change_streamer.pending_txn", &[])
                .await
                .unwrap()
                .get(0),
        }
    }
}

fn row(i: i64) -> String {
    format!(r#"{{"tag":"insert","i":{i},"pad":"{}"}}"#, "x".repeat(100))
}

fn whole(n: u64, rows: i64) -> Transaction {
    let mut changes = vec![(ChangeKind::Begin, r#"{"tag":"begin"}"#.to_string())];
    changes.extend((0..rows).map(|i| (ChangeKind::Data, row(i))));
    changes.push((ChangeKind::Commit, r#"{"tag":"commit"}"#.to_string()));
    Transaction {
        watermark: w(n),
        pending: 0,
        changes,
    }
}

/// Stores transaction `n` (a begin, `rows` data, a commit) pending in chunks of `chunk`
/// changes, all but its last `tail` changes; returns the transaction's rest, to append.
async fn store_in_chunks(
    log: &ChangeLog,
    n: u64,
    rows: i64,
    chunk: usize,
    tail: usize,
) -> Transaction {
    let all = whole(n, rows).changes;
    let cut = all.len() - tail;
    for (k, run) in all[..cut].chunks(chunk).enumerate() {
        log.store_pending(PendingChunk {
            watermark: w(n),
            first_pos: (k * chunk) as i64,
            changes: run.to_vec(),
        })
        .await
        .expect("chunk stored");
    }
    Transaction {
        watermark: w(n),
        pending: cut as u64,
        changes: all[cut..].to_vec(),
    }
}

/// Asserts no read sees anything of transaction 101, still open. Each read starts at a
/// position of its own: the PostgreSQL reader keeps its reads and answers one with the same
/// start from memory, as catch-ups are only asked up to durable commits (`read_cache.rs`).
async fn assert_none_visible(log: &ChangeLog) {
    use std::sync::atomic::{AtomicI64, Ordering};
    static AFTER: AtomicI64 = AtomicI64::new(1_000_000);
    let after = (w(100), AFTER.fetch_add(1, Ordering::SeqCst));
    let rows = log.read(after, w(u64::MAX >> 1), 100_000).await.unwrap();
    assert!(rows.is_empty(), "no pending row read: {rows:?}");
}

async fn read_all(log: &ChangeLog, up_to: u64) -> Vec<StoredChange> {
    log.read((Watermark::from_u64(0), -1), w(up_to), 100_000)
        .await
        .unwrap()
}

/// Asserts `rows` hold transaction `n` whole, once, in order: `pos` 0.., its data `0..count`.
fn assert_whole(rows: &[StoredChange], n: u64, count: i64) {
    let of: Vec<&StoredChange> = rows.iter().filter(|r| r.watermark == w(n)).collect();
    assert_eq!(
        of.len() as i64,
        count + 2,
        "transaction {n} stored whole, once"
    );
    for (p, r) in of.iter().enumerate() {
        assert_eq!(r.pos, p as i64, "positions in order");
    }
    assert_eq!(of[0].kind, ChangeKind::Begin);
    assert_eq!(of[of.len() - 1].kind, ChangeKind::Commit);
    for i in 0..count {
        assert_eq!(
            &*of[1 + i as usize].json,
            row(i).as_str(),
            "data {i} as sent"
        );
    }
}

/// Pending rows are invisible to reads, to the catalogue and to the purge until the commit,
/// which makes the transaction visible whole.
async fn pending_rows_are_invisible_until_commit(engine: Engine, standby_url: Option<&str>) {
    let log = engine.open().await;
    log.append(whole(100, 1)).await.unwrap();
    let rest = store_in_chunks(&log, 101, 120, 25, 7).await;
    assert!(
        engine.pending_rows().await > 0,
        "chunks stored as they came"
    );
    assert_none_visible(&log).await;
    let stats = log.stats().await.unwrap();
    assert_eq!(
        stats.max_watermark,
        Some(w(100)),
        "the catalogue holds no pending row"
    );
    if let Some(url) = standby_url {
        let standby = ChangeLog::open_standby(url).unwrap();
        assert_none_visible(&standby).await;
    }
    // The purge takes nothing pending (and keeps the newest stored transaction).
    log.purge(w(101)).await.unwrap();
    log.append(rest).await.expect("commit stored");
    assert_eq!(engine.pending_rows().await, 0, "moved by the commit");
    let rows = read_all(&log, 101).await;
    assert_whole(&rows, 101, 120);
    assert_eq!(log.stats().await.unwrap().max_watermark, Some(w(101)));
    // The pending rows moved in count as rows of the change log (the catalogue's counts).
    assert!(log.stats().await.unwrap().rows >= 122);
}

#[actix_rt::test]
async fn pending_rows_are_invisible_until_commit_sqlite() {
    pending_rows_are_invisible_until_commit(Engine::sqlite(), None).await;
}

#[actix_rt::test]
async fn pending_rows_are_invisible_until_commit_postgres() {
    let engine = Engine::pg("pending_invisible").await;
    let url = match &engine {
        Engine::Pg(db) => db.url.clone(),
        Engine::Sqlite(_) => unreachable!(),
    };
    pending_rows_are_invisible_until_commit(engine, Some(&url)).await;
}

/// A rollback deletes the pending rows; a restart in the middle deletes what was left; the
/// transaction sent again is stored whole, once.
async fn an_interrupted_transaction_leaves_nothing(engine: Engine) {
    let log = engine.open().await;
    log.append(whole(100, 1)).await.unwrap();
    store_in_chunks(&log, 101, 60, 20, 5).await;
    log.drop_pending().await.unwrap();
    assert_eq!(
        engine.pending_rows().await,
        0,
        "a rollback leaves no pending row"
    );
    // Cut off again, then the process goes (as with kill -9: no rollback is stored).
    store_in_chunks(&log, 101, 60, 20, 5).await;
    drop(log);
    let log = engine.open().await;
    assert_eq!(engine.pending_rows().await, 0, "deleted at start");
    assert_none_visible(&log).await;
    assert_eq!(
        log.stats().await.unwrap().max_watermark,
        Some(w(100)),
        "resume after 100"
    );
    // Cut off once more without a restart: the resend's first chunk deletes what was left.
    store_in_chunks(&log, 101, 60, 20, 5).await;
    let rest = store_in_chunks(&log, 101, 60, 20, 5).await;
    log.append(rest).await.unwrap();
    assert_whole(&read_all(&log, 101).await, 101, 60);
    assert_eq!(engine.pending_rows().await, 0);
}

#[actix_rt::test]
async fn an_interrupted_transaction_leaves_nothing_sqlite() {
    an_interrupted_transaction_leaves_nothing(Engine::sqlite()).await;
}

#[actix_rt::test]
async fn an_interrupted_transaction_leaves_nothing_postgres() {
    an_interrupted_transaction_leaves_nothing(Engine::pg("pending_interrupted").await).await;
}

/// A commit counting pending changes that are not all stored (a chunk's write failed) is
/// refused, and nothing of it is visible.
async fn a_commit_missing_pending_changes_is_refused(engine: Engine) {
    let log = engine.open().await;
    log.append(whole(100, 1)).await.unwrap();
    let mut rest = store_in_chunks(&log, 101, 40, 10, 2).await;
    rest.pending += 10;
    assert!(log.append(rest).await.is_err(), "refused");
    assert_none_visible(&log).await;
    assert_eq!(log.stats().await.unwrap().max_watermark, Some(w(100)));
    // The change log writes again: the resend is stored whole.
    let rest = store_in_chunks(&log, 101, 40, 10, 2).await;
    log.append(rest).await.unwrap();
    assert_whole(&read_all(&log, 101).await, 101, 40);
}

#[actix_rt::test]
async fn a_commit_missing_pending_changes_is_refused_sqlite() {
    a_commit_missing_pending_changes_is_refused(Engine::sqlite()).await;
}

#[actix_rt::test]
async fn a_commit_missing_pending_changes_is_refused_postgres() {
    a_commit_missing_pending_changes_is_refused(Engine::pg("pending_refused").await).await;
}

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
