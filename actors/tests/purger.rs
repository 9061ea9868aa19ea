//! Actor-level tests of the [`Purger`] (PROTOCOL.md §9, §13): the real purger, the real [`Streamer`]
//! answering its check, and a real change log whose store times come from a manual clock, so
//! a row's age is set by hand. The purger's delay runs on the runtime's clock, paused here
//! (`tokio::time::pause()`): while the test waits on the change log's real I/O, the runtime
//! moves its clock to the next timer, so a retry "after the purge delay" takes no real time.

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::{
    ChangeKind, ChangeLog, StateChange, Transaction, SEGMENT_ROWS,
};
use change_streamer_actors::cleanup::ScheduleCleanup;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::purger::{BlockedBy, GetPurgeState, PurgeState, Purger};
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{Mode, Streamer, StreamerConfig, Subscribe, ToSession};
use change_streamer_actors::watermark::Watermark;

const START: i64 = 1_745_452_800_000; // 2025-04-24T00:00:00Z
const RETENTION: i64 = 60_000;
const DELAY: Duration = Duration::from_secs(1);

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

fn txn(n: u64) -> Transaction {
    Transaction {
        watermark: w(n),
        pending: 0,
        changes: vec![
            (ChangeKind::Begin, r#"{"tag":"begin"}"#.into()),
            (ChangeKind::Data, format!(r#"{{"tag":"insert","n":{n}}}"#)),
            (ChangeKind::Commit, r#"{"tag":"commit"}"#.into()),
        ],
    }
}

/// A subscriber session that reads nothing (its acked watermark stays where it subscribed).
struct Session;
impl Actor for Session {
    type Context = Context<Self>;
}
impl Handler<ToSession> for Session {
    type Result = ();
    fn handle(&mut self, _: ToSession, _: &mut Context<Self>) {}
}

struct Setup {
    _dir: tempfile::TempDir,
    clock: Clock,
    log: ChangeLog,
    streamer: Addr<Streamer>,
}

/// A change log holding 100..=102 stored at START and 103..=105 stored 50 s later; the clock
/// is then at START + 70 s, so with a 60 s retention only 100..=102 are old enough.
async fn setup() -> Setup {
    tokio::time::pause();
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(START);
    let log = ChangeLog::open_with(dir.path(), SEGMENT_ROWS, clock.clone()).unwrap();
    for n in 100..=105 {
        if n == 103 {
            clock.set_ms(START + 50_000);
        }
        log.append(txn(n)).await.unwrap();
    }
    clock.set_ms(START + 70_000);
    let stats = log.stats().await.unwrap();
    let streamer = Streamer::new(StreamerConfig::default(), log.clone(), &stats).start();
    Setup {
        _dir: dir,
        clock,
        log,
        streamer,
    }
}

impl Setup {
    fn purger(&self) -> Purger {
        Purger::new(
            self.streamer.clone().recipient(),
            DELAY,
            Duration::from_millis(RETENTION as u64),
            self.clock.clone(),
        )
    }

    /// Subscribes a session that has everything up to 105.
    async fn subscribe(&self) {
        self.streamer
            .send(Subscribe {
                session_id: SessionId(1),
                id: "caught-up".into(),
                mode: Mode::Serving,
                backup: None,
                protocol: 6,
                replica_version: w(100).to_string(),
                watermark: w(105),
                session: Session.start().recipient(),
            })
            .await
            .unwrap()
            .expect("subscribed");
    }
}

/// Asks the purger until `done` holds (10 s of real time at most).
async fn until(
    purger: &Addr<Purger>,
    what: &str,
    done: impl Fn(&PurgeState) -> bool,
) -> PurgeState {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let st = purger.send(GetPurgeState).await.unwrap();
        if done(&st) {
            return st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never happened: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[actix_rt::test]
async fn rows_younger_than_the_retention_stay_and_the_watermark_is_retried() {
    let s = setup().await;
    s.subscribe().await;
    // The cleanup wrote the decision down as it scheduled it.
    s.log
        .save_state(StateChange::Scheduled(w(105)))
        .await
        .unwrap();
    let purger = s.purger().start();
    purger.do_send(ScheduleCleanup { watermark: w(105) });
    let st = until(&purger, "blocked by retention", |st| {
        st.blocked_by == Some(BlockedBy::Retention)
    })
    .await;
    assert_eq!(st.rows_purged, 9, "100..=102 went: {st:?}");
    assert_eq!(st.scheduled, vec![w(105)]);
    assert_eq!(st.purges, 0);
    let stats = s.log.stats().await.unwrap();
    assert_eq!(stats.min_watermark, Some(w(103)));
    assert_eq!(
        s.log.load_state().await.unwrap().scheduled,
        vec![w(105)],
        "a watermark held by retention stays scheduled across a restart"
    );
    // 103..=104 come of age: the retried check purges them and the watermark is done.
    s.clock.set_ms(START + 120_000);
    let st = until(&purger, "purged", |st| st.scheduled.is_empty()).await;
    assert_eq!(st.rows_purged, 15, "{st:?}");
    assert_eq!(st.purges, 1);
    assert_eq!(st.blocked_by, None);
    assert_eq!(st.last_purged_before, Some(w(105)));
    assert_eq!(s.log.stats().await.unwrap().min_watermark, Some(w(105)));
    assert!(s.log.load_state().await.unwrap().scheduled.is_empty());
}

#[actix_rt::test]
async fn with_no_subscriber_the_purge_waits_and_is_retried() {
    let s = setup().await;
    let purger = s.purger().start();
    purger.do_send(ScheduleCleanup { watermark: w(102) });
    let st = until(&purger, "blocked by no subscriber", |st| {
        st.blocked_by == Some(BlockedBy::NoSubscriber)
    })
    .await;
    assert_eq!(st.rows_purged, 0);
    assert_eq!(st.scheduled, vec![w(102)]);
    s.subscribe().await;
    let st = until(&purger, "purged", |st| st.scheduled.is_empty()).await;
    assert_eq!(st.rows_purged, 6);
    assert_eq!(st.blocked_by, None);
}

#[actix_rt::test]
async fn a_subscriber_behind_the_watermark_blocks_the_purge() {
    let s = setup().await;
    s.streamer
        .send(Subscribe {
            session_id: SessionId(2),
            id: "behind".into(),
            mode: Mode::Serving,
            backup: None,
            protocol: 6,
            replica_version: w(100).to_string(),
            watermark: w(101),
            session: Session.start().recipient(),
        })
        .await
        .unwrap()
        .expect("subscribed");
    let purger = s.purger().start();
    purger.do_send(ScheduleCleanup { watermark: w(102) });
    let st = until(&purger, "blocked by the subscriber", |st| {
        st.blocked_by == Some(BlockedBy::Subscriber)
    })
    .await;
    assert_eq!(st.rows_purged, 0);
    assert_eq!(s.log.stats().await.unwrap().min_watermark, Some(w(100)));
}

#[actix_rt::test]
async fn restored_watermarks_are_purged_without_a_new_schedule() {
    let s = setup().await;
    s.subscribe().await;
    let purger = s.purger().restore(&[w(101), w(102)]).start();
    let st = until(&purger, "both purged", |st| st.scheduled.is_empty()).await;
    assert_eq!(st.purges, 2, "{st:?}");
    assert_eq!(
        st.last_purged_before,
        Some(w(102)),
        "smallest first: {st:?}"
    );
    assert_eq!(s.log.stats().await.unwrap().min_watermark, Some(w(102)));
}
