//! PROTOCOL.md §3.0 "an open transaction is stored as it arrives", at the change log, on both
//! engines (SQLite in a temporary directory, PostgreSQL on test-support's server): an open
//! transaction's chunks are stored pending, invisible to reads, to a standby's reads and to the
//! purge until its commit, which makes it visible whole, once; a rollback or a restart in its
//! middle leaves nothing visible and no pending row; a commit missing pending changes is
//! refused. Through the streamer: `open_txn_streamer.rs`.

mod common;

use change_streamer_actors::changelog::{ChangeLog, PendingChunk, Transaction};
use common::engine::{assert_none_visible, assert_whole, read_all, whole, Engine};
use common::w;

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
