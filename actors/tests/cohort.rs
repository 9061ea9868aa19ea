//! The cohort (`streamer/cohort.rs`): live subscribers that take a transaction's changes as
//! one get exactly what each would get alone, in order, and are counted as holding it
//! (PROTOCOL.md §10.2): across a turn that ends inside a transaction, and up to a bound reached
//! inside one. The real [`Streamer`] and change log, fed upstream batches directly, with fake
//! sessions that never ack, so that what each holds stays visible.
//!
//! [`Streamer`]: change_streamer_actors::streamer::Streamer

mod common;

use change_streamer_actors::streamer::{GetStreamerState, StreamerConfig, UpstreamBatch};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use common::*;

/// No tracked send (the cohort takes untracked changes only); `changes` per subscriber at most.
fn config(changes: usize) -> StreamerConfig {
    StreamerConfig {
        flow_control_bytes: usize::MAX / 2,
        max_queue_changes: changes,
        ..StreamerConfig::default()
    }
}

async fn batch(s: &Setup, messages: Vec<UpstreamMessage>) {
    let n = messages.len();
    let reply = s
        .streamer
        .send(UpstreamBatch(messages))
        .await
        .unwrap()
        .expect("no violation");
    assert_eq!(reply.consumed, n);
}

/// Every session's messages, and each subscriber's (pending, queued bytes) in `/status`.
async fn seen(s: &Setup) -> (Vec<Vec<String>>, Vec<(u64, u64)>) {
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    let held = st
        .subscribers
        .iter()
        .map(|i| (i.pending, i.queued_bytes))
        .collect();
    let mut messages = Vec::new();
    for session in &s.sessions {
        messages.push(session.send(Received).await.unwrap().0);
    }
    (messages, held)
}

#[actix_rt::test]
async fn cohort_members_get_every_change_in_order_and_hold_what_they_were_sent() {
    let s = setup_with(config(20_000), &[true, true, true]).await;
    batch(
        &s,
        [begin(101)].into_iter().chain((0..5).map(data)).collect(),
    )
    .await;
    // The turn ended inside the transaction: its rest comes in the next one.
    batch(&s, (5..10).map(data).chain([commit(101)]).collect()).await;
    batch(
        &s,
        [begin(102), data(10), data(11), data(12), commit(102)].to_vec(),
    )
    .await;
    let (messages, held) = seen(&s).await;
    let kinds = |m: &[String], tag: &str| m.iter().filter(|t| t.starts_with(tag)).count();
    let first = &messages[0];
    assert_eq!(kinds(first, r#"["begin""#), 2, "{first:?}");
    assert_eq!(kinds(first, r#"["data""#), 13, "{first:?}");
    assert_eq!(kinds(first, r#"["commit""#), 2, "{first:?}");
    assert!(messages.iter().all(|m| m == first), "{messages:?}");
    assert!(
        held.iter()
            .all(|h| *h == held[0] && h.0 == first.len() as u64),
        "each holds what it was sent: {held:?}, {} messages",
        first.len()
    );
}

#[actix_rt::test]
async fn cohort_members_overflow_at_the_bound_as_each_would_alone() {
    // 8 changes at most each: the 11 of the transaction do not fit, and none acks.
    let s = setup_with(config(8), &[true, true, true]).await;
    batch(
        &s,
        [begin(101)]
            .into_iter()
            .chain((0..10).map(data))
            .chain([commit(101)])
            .collect(),
    )
    .await;
    let (messages, held) = seen(&s).await;
    assert!(messages.iter().all(|m| m == &messages[0]), "{messages:?}");
    assert!(
        held.iter().all(|h| *h == held[0] && h.0 <= 8),
        "within the bound, each the same: {held:?}"
    );
    assert!(
        messages[0].len() < 12,
        "the rest is read from the change log once acks make room: {:?}",
        messages[0]
    );
}
