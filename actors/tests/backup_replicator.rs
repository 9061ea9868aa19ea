//! Actor-level tests of the backup replicator required (PROTOCOL.md §10.3) and of one backup
//! replicator per backup (PROTOCOL.md §7.1): the real [`Streamer`] and change log, fed upstream
//! batches directly, with fake sessions that ack at once, never, or when told.
//!
//! The flow-control tests pause the runtime's clock: the grace period and the padding run on
//! it, so "not evicted after a minute" takes no real time. The memory test runs on real time,
//! as catch-up reads are real I/O on the change log's reader thread.
//!
//! [`Streamer`]: change_streamer_actors::streamer::Streamer

mod common;

use std::time::Duration;

use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_actors::streamer::{
    GetStreamerState, Mode, Phase, StreamerConfig, SubscribeError, UpstreamBatch,
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

const SERVING: Mode = Mode::Serving;
const BACKUP: Mode = Mode::Backup;

/// How the session `i` of `s` was closed, if it was.
async fn closed(s: &Setup, i: usize) -> Option<SessionEnd> {
    s.sessions[i].send(Received).await.unwrap().1
}

#[actix_rt::test]
async fn a_stalled_backup_replicator_is_never_lagging_nor_evicted_and_ingest_waits_for_it() {
    tokio::time::pause();
    let s = setup_modes(
        config(100, 1000),
        &[(SERVING, false), (SERVING, false), (BACKUP, true)],
    )
    .await;
    let mut release = send_txn(&s, 101).await.expect("waits");
    still_held(
        &mut release,
        60_000,
        "a majority acked, but not the backup replicator",
    )
    .await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    let backup = &st.subscribers[2];
    assert_eq!(
        (backup.mode, backup.required, &backup.lagging),
        (BACKUP, true, &None)
    );
    assert!(st.subscribers[..2].iter().all(|s| !s.required), "{st:?}");
    assert_eq!((st.subscribers.len(), st.subscribers_evicted), (3, 0));
    assert_eq!(closed(&s, 2).await, None);
    let before = (st.releases_all, st.releases_consensus);
    // It acks: the send goes at once, and so does every later one, at its pace.
    s.sessions[2].send(AckNow).await.unwrap();
    released(release, "released by the backup replicator's ack").await;
    for n in [102, 103] {
        let mut release = send_txn(&s, n).await.expect("waits");
        still_held(&mut release, 5_000, "waits for the backup replicator").await;
        s.sessions[2].send(AckNow).await.unwrap();
        released(release, "at its ack").await;
    }
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(
        (st.releases_all, st.releases_consensus),
        (before.0 + 3, before.1),
        "each released by all, at the backup replicator's ack"
    );
}

#[actix_rt::test]
async fn a_tracked_send_waits_for_the_backup_replicator_as_for_a_majority() {
    tokio::time::pause();
    let subs = [
        (BACKUP, true),
        (SERVING, false),
        (SERVING, false),
        (SERVING, true),
        (SERVING, true),
    ];
    let s = setup_modes(config(500, 0), &subs).await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    let before = (st.releases_consensus, st.releases_all);
    let mut release = send_txn(&s, 101).await.expect("waits");
    still_held(&mut release, 10_000, "two of five acked").await;
    // The backup replicator's ack makes the majority: one padding from it, and no sooner.
    s.sessions[0].send(AckNow).await.unwrap();
    still_held(&mut release, 450, "the padding runs from its ack").await;
    released(release, "released by consensus").await;
    // The stalled serving ones lag now and hold nothing more; the backup replicator does.
    let mut release = send_txn(&s, 102).await.expect("waits");
    still_held(&mut release, 10_000, "waits for the backup replicator").await;
    s.sessions[0].send(AckNow).await.unwrap();
    released(release, "at its ack").await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert!(st.subscribers[3].lagging.is_some() && st.subscribers[0].lagging.is_none());
    assert_eq!(
        (st.releases_consensus, st.releases_all),
        (before.0 + 1, before.1 + 1)
    );
}

#[actix_rt::test]
async fn a_stalled_serving_subscriber_is_evicted_while_a_stalled_backup_replicator_is_not() {
    tokio::time::pause();
    let s = setup_modes(
        config(100, 1000),
        &[(SERVING, false), (SERVING, true), (BACKUP, true)],
    )
    .await;
    let mut release = send_txn(&s, 101).await.expect("waits");
    still_held(&mut release, 1_500, "waits for the backup replicator").await;
    let evicted = closed(&s, 1)
        .await
        .expect("the stalled serving one is evicted");
    assert_eq!(evicted.code(), 1013, "{evicted:?}");
    still_held(
        &mut release,
        60_000,
        "still waits for the backup replicator",
    )
    .await;
    assert_eq!(closed(&s, 2).await, None);
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!((st.subscribers.len(), st.subscribers_evicted), (2, 1));
    assert_eq!(st.subscribers[1].lagging, None);
    s.sessions[2].send(AckNow).await.unwrap();
    released(release, "released by the backup replicator's ack").await;
}

#[actix_rt::test]
async fn a_newer_backup_replicator_replaces_its_ghost_with_1000_and_never_waits_behind_it() {
    tokio::time::pause();
    // Never evicting: only the replacement frees the tracked send the ghost holds.
    let s = setup_modes(config(100, 0), &[(SERVING, false), (BACKUP, true)]).await;
    let mut release = send_txn(&s, 101).await.expect("waits");
    still_held(&mut release, 10_000, "the ghost holds the commit").await;
    let (restarted, answer) = subscribe(
        &s.streamer,
        SessionId(1005),
        BACKUP,
        &w(100).to_string(),
        false,
    )
    .await;
    answer.expect("the restarted backup replicator is accepted");
    let ghost = closed(&s, 1).await.expect("the ghost is closed");
    assert_eq!(ghost, SessionEnd::BackupReplaced);
    assert_eq!(
        ghost.close_frame(),
        (
            1000,
            "replaced by a newer backup replicator of the same backup".to_string()
        )
    );
    released(release, "the ghost no longer holds it").await;
    // The restarted one catches up 101 from the change log.
    until("the restarted one to get 101 and go live", || {
        let (restarted, streamer) = (restarted.clone(), s.streamer.clone());
        async move {
            let st = streamer.send(GetStreamerState).await.unwrap();
            st.subscribers
                .get(1)
                .is_some_and(|b| b.phase == Phase::Live)
                && restarted.send(Commits).await.unwrap().last() == Some(&w(101))
        }
    })
    .await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.subscribers.len(), 2, "{st:?}");
    assert!(st.subscribers[1].required, "{st:?}");
}

#[actix_rt::test]
async fn only_an_accepted_backup_subscription_replaces_a_backup_replicator() {
    tokio::time::pause();
    let s = setup_modes(config(100, 0), &[(BACKUP, false), (SERVING, false)]).await;
    let (_, refused) = subscribe(&s.streamer, SessionId(1005), BACKUP, "0z", false).await;
    assert!(
        matches!(refused, Err(SubscribeError::WrongReplicaVersion { .. })),
        "{refused:?}"
    );
    let (_, serving) = subscribe(
        &s.streamer,
        SessionId(1006),
        SERVING,
        &w(100).to_string(),
        false,
    )
    .await;
    serving.expect("a serving subscriber is accepted");
    assert_eq!((closed(&s, 0).await, closed(&s, 1).await), (None, None));
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.subscribers.len(), 3, "{st:?}");
}

#[actix_rt::test]
async fn of_two_backup_subscriptions_at_once_the_newer_stays() {
    tokio::time::pause();
    let s = setup_modes(config(100, 0), &[(SERVING, false)]).await;
    let v = w(100).to_string();
    let ((older, a), (newer, b)) = tokio::join!(
        subscribe(&s.streamer, SessionId(1005), BACKUP, &v, false),
        subscribe(&s.streamer, SessionId(1006), BACKUP, &v, false),
    );
    // Whichever checks ended first, the older is replaced, the newer stays.
    a.expect("the older passed its checks");
    b.expect("the newer passed its checks");
    let (_, older_end) = older.send(Received).await.unwrap();
    let (_, newer_end) = newer.send(Received).await.unwrap();
    assert_eq!(
        (older_end, newer_end),
        (Some(SessionEnd::BackupReplaced), None)
    );
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    let backups: Vec<_> = st.subscribers.iter().filter(|s| s.required).collect();
    assert_eq!(backups.len(), 1, "{st:?}");
    assert_eq!(backups[0].id, "sub-6");
}

/// Transactions `from..=to` of `rows` data messages of about `bytes` each.
fn sized_txns(from: u64, to: u64, rows: u64, bytes: usize) -> Vec<UpstreamMessage> {
    (from..=to)
        .flat_map(|n| {
            std::iter::once(begin(n))
                .chain((0..rows).map(move |i| UpstreamMessage::Data {
                    payload: format!(r#"{{"tag":"insert","i":{i},"s":"{}"}}"#, "x".repeat(bytes)),
                }))
                .chain([commit(n)])
        })
        .collect()
}

/// Feeds `msgs` whole, waiting for each tracked send's release (within a second).
async fn feed(s: &Setup, mut msgs: Vec<UpstreamMessage>) {
    while !msgs.is_empty() {
        let reply = s
            .streamer
            .send(UpstreamBatch(msgs.clone()))
            .await
            .unwrap()
            .expect("no violation");
        msgs.drain(..reply.consumed);
        if let Some(release) = reply.release {
            released(release, "a tracked send waits for no one stalled").await;
        }
    }
}

#[actix_rt::test]
async fn a_backup_replicator_past_its_byte_bound_goes_back_to_catch_up_and_is_not_waited_for_there()
{
    let bound = 4096;
    let cfg = StreamerConfig {
        padding: Some(Duration::from_millis(100)),
        flow_control_bytes: 16 * 1024,
        catchup_batch: 50,
        max_queue_bytes: bound,
        slow_grace: Some(Duration::from_millis(1000)),
        ..StreamerConfig::default()
    };
    let s = setup_modes(cfg, &[(SERVING, false), (BACKUP, true)]).await;
    for n in 101..=140 {
        feed(&s, sized_txns(n, n, 10, 500)).await;
        let st = s.streamer.send(GetStreamerState).await.unwrap();
        let backup = &st.subscribers[1];
        assert!(
            backup.queued_bytes <= bound as u64,
            "holds too much: {backup:?}"
        );
        assert_eq!(backup.lagging, None);
    }
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.subscribers[1].phase, Phase::CatchingUp, "{st:?}");
    assert!(
        st.tracked_sends > 5 && st.subscribers_evicted == 0,
        "{st:?}"
    );
    // It reads again: everything from the change log, then live.
    s.sessions[1].send(SetStalled(false)).await.unwrap();
    until("the backup replicator to catch up", || {
        let (session, streamer) = (s.sessions[1].clone(), s.streamer.clone());
        async move {
            session.send(AckNow).await.unwrap();
            let st = streamer.send(GetStreamerState).await.unwrap();
            st.subscribers[1].phase == Phase::Live
                && session.send(Commits).await.unwrap().last() == Some(&w(140))
        }
    })
    .await;
    let commits = s.sessions[1].send(Commits).await.unwrap();
    assert_eq!(commits, (101..=140).map(w).collect::<Vec<_>>());
    assert_eq!(closed(&s, 1).await, None);
}
