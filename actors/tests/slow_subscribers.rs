//! Actor-level tests of slow subscribers (PROTOCOL.md §10.1) and bounded memory per subscriber
//! (PROTOCOL.md §10.2): the real [`Streamer`] and change log, fed upstream batches directly, with fake
//! sessions that ack at once, never, or from some moment on.
//!
//! The lag and eviction tests pause the runtime's clock: the grace period and the padding run
//! on it, so "evicted 5 s after it began lagging" takes no real time. The memory tests run on
//! real time, as catch-up reads are real I/O on the change log's reader thread.

mod common;

use std::time::Duration;

use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_actors::streamer::{
    GetStreamerState, Phase, QueuedBytesPeak, SessionGone, StreamerConfig, UpstreamBatch,
};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use common::*;

/// Tracked sends of every commit, `padding_ms` of padding, evicting after `grace_ms` (0: never).
fn config(padding_ms: u64, grace_ms: u64) -> StreamerConfig {
    StreamerConfig {
        padding: Some(Duration::from_millis(padding_ms)),
        flow_control_bytes: 1,
        catchup_batch: 100,
        slow_grace: (grace_ms > 0).then(|| Duration::from_millis(grace_ms)),
        ..StreamerConfig::default()
    }
}

#[actix_rt::test]
async fn a_subscriber_lagging_past_the_grace_is_evicted_with_1013() {
    tokio::time::pause();
    let s = setup_with(config(100, 5000), &[false, false, true]).await;
    let release = send_txn(&s, 101).await.expect("waits");
    released(release, "released by consensus").await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    let lag = st.subscribers[2]
        .lagging
        .clone()
        .expect("the stalled one lags");
    assert_eq!(lag.watermark, w(101));
    // It keeps answering nothing; at the grace it is closed.
    tokio::time::sleep(Duration::from_millis(4800)).await;
    assert_eq!(s.sessions[2].send(Received).await.unwrap().1, None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, closed) = s.sessions[2].send(Received).await.unwrap();
    let Some(end) = closed else {
        panic!("not evicted after the grace")
    };
    let (code, reason) = end.close_frame();
    assert_eq!(code, 1013);
    assert!(
        reason.starts_with("too slow: lagging 5")
            && reason.ends_with(&format!(" ms on watermark {}", w(101))),
        "{reason}"
    );
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.subscribers_evicted, 1);
    assert_eq!(st.subscribers.len(), 2, "forgotten at once: {st:?}");
}

#[actix_rt::test]
async fn acking_the_send_it_lagged_on_ends_the_lag_and_the_eviction() {
    tokio::time::pause();
    let s = setup_with(config(100, 5000), &[false, false, true]).await;
    released(send_txn(&s, 101).await.expect("waits"), "released").await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    s.sessions[2].send(SetStalled(false)).await.unwrap();
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.subscribers[2].lagging, None, "{st:?}");
    tokio::time::sleep(Duration::from_millis(10_000)).await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!((st.subscribers.len(), st.subscribers_evicted), (3, 0));
    assert_eq!(s.sessions[2].send(Received).await.unwrap().1, None);
}

#[actix_rt::test]
async fn a_lagging_subscriber_holds_only_the_send_it_lags_on() {
    tokio::time::pause();
    let padding = 500;
    let s = setup_with(config(padding, 0), &[false, false, true]).await;
    let t0 = tokio::time::Instant::now();
    released(send_txn(&s, 101).await.expect("waits"), "first").await;
    assert!(t0.elapsed() >= Duration::from_millis(500));
    // Later sends: released as soon as the two healthy ones ack, without the padding.
    for m in [begin(102)]
        .into_iter()
        .chain((0..50).map(data))
        .chain([commit(102)])
    {
        let t = tokio::time::Instant::now();
        if let Some(r) = send_one(&s, m).await {
            released(r, "later").await;
        }
        assert!(t.elapsed() < Duration::from_millis(1), "{:?}", t.elapsed());
    }
    // Grace 0 never evicts.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.subscribers.len(), 3);
    assert_eq!(st.releases_consensus, 1);
}

#[actix_rt::test]
async fn with_two_subscribers_a_stalled_one_holds_the_first_send_until_evicted() {
    tokio::time::pause();
    let s = setup_with(config(0, 1000), &[false, true]).await;
    let mut release = send_txn(&s, 101).await.expect("waits");
    still_held(&mut release, 900, "the majority of two is both").await;
    released(release, "released by the eviction").await;
    let (_, closed) = s.sessions[1].send(Received).await.unwrap();
    assert!(matches!(closed, Some(SessionEnd::Evicted(_))), "{closed:?}");
}

#[actix_rt::test]
async fn a_lagging_subscriber_that_leaves_before_the_grace_is_not_counted_as_evicted() {
    tokio::time::pause();
    let s = setup_with(config(0, 1000), &[false, false, true]).await;
    released(send_txn(&s, 101).await.expect("waits"), "released").await;
    s.streamer
        .send(SessionGone {
            session_id: SessionId(1002),
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!((st.subscribers.len(), st.subscribers_evicted), (2, 0));
}

/// Transactions `from..=to`, each with `rows(n)` inserts.
/// Subscriber 1 starts reading and acking: it gets the rest from the change log, then goes live,
/// up to the commit of `last`.
async fn reads_again_up_to(s: &Setup, last: u64) {
    s.sessions[1].send(SetStalled(false)).await.unwrap();
    until("the slow subscriber to catch up", || {
        let (session, streamer) = (s.sessions[1].clone(), s.streamer.clone());
        async move {
            session.send(AckNow).await.unwrap();
            let st = streamer.send(GetStreamerState).await.unwrap();
            st.subscribers[1].phase == Phase::Live
                && session.send(Commits).await.unwrap().last() == Some(&w(last))
        }
    })
    .await;
}

/// A data message whose payload is about `bytes` long.
fn sized_data(i: u64, bytes: usize) -> UpstreamMessage {
    UpstreamMessage::Data {
        payload: format!(r#"{{"tag":"insert","i":{i},"s":"{}"}}"#, "x".repeat(bytes)),
    }
}

fn txns(from: u64, to: u64, rows: impl Fn(u64) -> u64) -> Vec<UpstreamMessage> {
    (from..=to)
        .flat_map(|n| {
            std::iter::once(begin(n))
                .chain((0..rows(n)).map(move |i| data(n * 1000 + i)))
                .chain([commit(n)])
        })
        .collect()
}

/// Checks that `messages` (after the status frame) are the transactions `from..=to` whole, in
/// order, each once; returns how many.
fn assert_whole_transactions(messages: &[String], from: u64, to: u64) -> usize {
    let mut expected = from;
    let mut open = None;
    for m in messages.iter().filter(|m| !m.starts_with("[\"status\"")) {
        if m.starts_with("[\"begin\"") {
            assert_eq!(open, None, "begin inside a transaction: {m}");
            assert!(
                m.contains(&format!("\"{}\"", w(expected))),
                "expected {expected}: {m}"
            );
            open = Some(expected);
        } else if m.starts_with("[\"commit\"") {
            assert_eq!(open, Some(expected), "commit without its begin: {m}");
            assert!(m.contains(&format!("\"{}\"", w(expected))), "{m}");
            open = None;
            expected += 1;
        } else {
            assert!(open.is_some(), "data outside a transaction: {m}");
        }
    }
    assert_eq!(open, None);
    assert_eq!(expected, to + 1, "transactions missing");
    (to + 1 - from) as usize
}

#[actix_rt::test]
async fn a_subscriber_that_never_reads_holds_at_most_the_limit_and_later_gets_everything() {
    let limit = 50;
    let cfg = StreamerConfig {
        padding: Some(Duration::ZERO),
        flow_control_bytes: usize::MAX,
        catchup_batch: 20,
        max_queue_changes: limit,
        slow_grace: None,
        ..StreamerConfig::default()
    };
    let s = setup_with(cfg, &[false, true]).await;
    // Transactions of 0–7 rows, and every 25th one larger than the limit on its own.
    let rows = |n: u64| if n % 25 == 0 { 120 } else { n % 8 };
    for n in 101..=400 {
        s.streamer
            .send(UpstreamBatch(txns(n, n, rows)))
            .await
            .unwrap()
            .unwrap();
        let st = s.streamer.send(GetStreamerState).await.unwrap();
        let slow = &st.subscribers[1];
        assert!(slow.pending <= limit as u64, "holds too much: {slow:?}");
    }
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.subscribers[1].phase, Phase::CatchingUp, "{st:?}");
    assert!(st.subscribers[1].lag_seconds >= 0.0);
    // The healthy one got every transaction (those larger than the limit from the change log:
    // it cannot ack them within the streamer's turn).
    until("the healthy subscriber to get everything", || {
        let session = s.sessions[0].clone();
        async move { session.send(Commits).await.unwrap().last() == Some(&w(400)) }
    })
    .await;
    let (healthy, _) = s.sessions[0].send(Received).await.unwrap();
    assert_whole_transactions(&healthy, 101, 400);
    // The slow one starts reading: it receives the rest from the change log, then live.
    reads_again_up_to(&s, 400).await;
    s.streamer
        .send(UpstreamBatch(txns(401, 402, rows)))
        .await
        .unwrap()
        .unwrap();
    until("live again", || {
        let session = s.sessions[1].clone();
        async move { session.send(Commits).await.unwrap().last() == Some(&w(402)) }
    })
    .await;
    let (slow, _) = s.sessions[1].send(Received).await.unwrap();
    assert_whole_transactions(&slow, 101, 402);
}

#[actix_rt::test]
async fn a_rolled_back_transaction_is_closed_for_a_subscriber_that_overflowed_in_it() {
    let limit = 10;
    let cfg = StreamerConfig {
        padding: Some(Duration::ZERO),
        flow_control_bytes: usize::MAX,
        catchup_batch: 5,
        max_queue_changes: limit,
        slow_grace: None,
        ..StreamerConfig::default()
    };
    let s = setup_with(cfg, &[true]).await;
    let mut msgs = vec![begin(101)];
    msgs.extend((0..30).map(data));
    msgs.push(UpstreamMessage::Rollback {
        payload: r#"{"tag":"rollback"}"#.into(),
    });
    msgs.extend(txns(102, 102, |_| 3));
    s.streamer.send(UpstreamBatch(msgs)).await.unwrap().unwrap();
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert!(st.subscribers[0].pending <= limit as u64, "{st:?}");
    s.sessions[0].send(SetStalled(false)).await.unwrap();
    until("102", || {
        let session = s.sessions[0].clone();
        async move {
            session.send(AckNow).await.unwrap();
            session.send(Commits).await.unwrap().last() == Some(&w(102))
        }
    })
    .await;
    let (got, _) = s.sessions[0].send(Received).await.unwrap();
    let rollback = got
        .iter()
        .position(|m| m.starts_with("[\"rollback\""))
        .expect("the rollback closes what it began");
    assert!(got[1].starts_with("[\"begin\""), "{got:?}");
    assert_whole_transactions(&got[rollback + 1..], 102, 102);
}

/// Transactions `from..=to` of `rows` data messages of about `bytes` each.
fn sized_txns(from: u64, to: u64, rows: u64, bytes: usize) -> Vec<UpstreamMessage> {
    (from..=to)
        .flat_map(|n| {
            std::iter::once(begin(n))
                .chain((0..rows).map(move |i| sized_data(n * 1000 + i, bytes)))
                .chain([commit(n)])
        })
        .collect()
}

/// Feeds `batches` to a streamer whose subscriber 1 never reads, checking after each that it
/// holds at most `bound` bytes (or one change alone); then lets it read and checks that it got
/// every transaction whole, in order, once.
async fn holds_at_most_the_byte_bound(
    s: &Setup,
    batches: Vec<Vec<UpstreamMessage>>,
    bound: u64,
    last: u64,
) {
    let mut most = 0;
    for b in batches {
        s.streamer.send(UpstreamBatch(b)).await.unwrap().unwrap();
        let st = s.streamer.send(GetStreamerState).await.unwrap();
        let slow = &st.subscribers[1];
        assert!(
            slow.queued_bytes <= bound || slow.pending == 1,
            "holds too much: {slow:?}"
        );
        most = most.max(slow.queued_bytes);
    }
    assert!(most > bound / 2, "the bound was never approached: {most}");
    until("the healthy subscriber to get everything", || {
        let session = s.sessions[0].clone();
        async move { session.send(Commits).await.unwrap().last() == Some(&w(last)) }
    })
    .await;
    reads_again_up_to(s, last).await;
    for session in &s.sessions {
        let (got, _) = session.send(Received).await.unwrap();
        assert_whole_transactions(&got, 101, last);
    }
}

fn byte_bound_config(bytes: usize) -> StreamerConfig {
    StreamerConfig {
        padding: Some(Duration::ZERO),
        flow_control_bytes: usize::MAX,
        catchup_batch: 50,
        max_queue_changes: 1_000_000,
        max_queue_bytes: bytes,
        slow_grace: None,
        ..StreamerConfig::default()
    }
}

#[actix_rt::test]
async fn the_byte_bound_holds_with_large_changes_and_catch_up_misses_nothing() {
    let bound = 64 * 1024;
    let s = setup_with(byte_bound_config(bound), &[false, true]).await;
    // 10 KiB changes, 5 to a transaction, and one 100 KiB change (larger than the bound alone).
    let mut batches: Vec<_> = (101..=160)
        .map(|n| sized_txns(n, n, 5, 10 * 1024))
        .collect();
    batches.push(sized_txns(161, 161, 1, 100 * 1024));
    batches.push(sized_txns(162, 170, 5, 10 * 1024));
    holds_at_most_the_byte_bound(&s, batches, bound as u64, 170).await;
}

#[actix_rt::test]
async fn the_byte_bound_holds_with_small_changes_and_catch_up_misses_nothing() {
    let bound = 64 * 1024;
    let s = setup_with(byte_bound_config(bound), &[false, true]).await;
    // 100-byte changes, 20 to a transaction: the bound in bytes, not the count, stops it.
    let batches: Vec<_> = (101..=300).map(|n| sized_txns(n, n, 20, 100)).collect();
    holds_at_most_the_byte_bound(&s, batches, bound as u64, 300).await;
}

#[actix_rt::test]
async fn the_global_budget_bounds_all_subscribers_together_and_moves_the_largest_first() {
    let budget = 200 * 1024;
    let cfg = StreamerConfig {
        max_queued_bytes: budget,
        ..byte_bound_config(1 << 20)
    };
    // One healthy subscriber and three that never read, each allowed 1 MiB alone.
    let s = setup_with(cfg, &[false, true, true, true]).await;
    let last = 200;
    for n in 101..=last {
        s.streamer
            .send(UpstreamBatch(sized_txns(n, n, 5, 4 * 1024)))
            .await
            .unwrap()
            .unwrap();
        // Within the budget, but for the one change one that holds nothing may take.
        let peak = s.streamer.send(QueuedBytesPeak).await.unwrap();
        assert!(peak <= budget as u64 + ONE_CHANGE_4K, "{peak}");
    }
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    let stalled: Vec<u64> = st.subscribers[1..].iter().map(|s| s.queued_bytes).collect();
    assert!(stalled.iter().all(|&b| b > 0), "{stalled:?}");
    until("the healthy subscriber to get everything", || {
        let session = s.sessions[0].clone();
        async move { session.send(Commits).await.unwrap().last() == Some(&w(last)) }
    })
    .await;
    all_catch_up(&s, 101, last).await;
}

/// The largest message of `sized_txns(…, 4 * 1024)`: its payload and the `["data",…]` envelope.
const ONE_CHANGE_4K: u64 = 4 * 1024 + 64;

/// Every subscriber of `s` reads and acks from now on, until all have everything up to `last`
/// live; each got every transaction from `from` whole, in order, once.
async fn all_catch_up(s: &Setup, from: u64, last: u64) {
    for session in &s.sessions {
        session.send(SetStalled(false)).await.unwrap();
    }
    until("every subscriber to catch up", || {
        let (sessions, streamer) = (s.sessions.clone(), s.streamer.clone());
        async move {
            let mut all = true;
            for session in &sessions {
                session.send(AckNow).await.unwrap();
                all &= session.send(Commits).await.unwrap().last() == Some(&w(last));
            }
            let st = streamer.send(GetStreamerState).await.unwrap();
            all && st.subscribers.iter().all(|s| s.phase == Phase::Live)
        }
    })
    .await;
    for session in &s.sessions {
        let (got, _) = session.send(Received).await.unwrap();
        assert_whole_transactions(&got, from, last);
    }
}

/// PROTOCOL.md §10.2: the global budget is held at every admission, not per burst: with four
/// healthy subscribers and three that read nothing, 20 KB changes in bursts of ten (one
/// upstream batch each) never take what all hold past `--max-queued-bytes` by more than one
/// change, and nobody misses anything.
#[actix_rt::test]
async fn the_global_budget_is_held_at_every_admission_under_bursts() {
    let budget = 1536 * 1024;
    let cfg = StreamerConfig {
        max_queued_bytes: budget,
        ..byte_bound_config(16 << 20)
    };
    let s = setup_with(cfg, &[false, false, false, false, true, true, true]).await;
    let change = 20_000;
    let one_change = change as u64 + 64;
    let last = 100 + 10 * 60;
    for first in (101..=last).step_by(10) {
        let burst = (first..first + 10)
            .flat_map(|n| sized_txns(n, n, 1, change))
            .collect();
        s.streamer
            .send(UpstreamBatch(burst))
            .await
            .unwrap()
            .unwrap();
        let peak = s.streamer.send(QueuedBytesPeak).await.unwrap();
        assert!(
            peak <= budget as u64 + one_change,
            "{peak} bytes held, past {budget} by more than one change"
        );
    }
    let peak = s.streamer.send(QueuedBytesPeak).await.unwrap();
    assert!(peak > budget as u64 * 9 / 10, "never approached: {peak}");
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    let stalled: Vec<u64> = st.subscribers[4..].iter().map(|s| s.queued_bytes).collect();
    assert!(stalled.iter().all(|&b| b > 0), "{stalled:?}");
    all_catch_up(&s, 101, last).await;
    let peak = s.streamer.send(QueuedBytesPeak).await.unwrap();
    assert!(
        peak <= budget as u64 + one_change,
        "{peak} while catching up"
    );
}
