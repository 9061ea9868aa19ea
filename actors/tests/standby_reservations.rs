//! Reservations held at a standby, as the owner's actors see them through a real PostgreSQL
//! change DB (PROTOCOL.md §14.1): the owner's ReservationActor and CleanupActor, each poll sent
//! by hand on a manual clock; the standby's record written through its own record connection,
//! as its refresh writes it. At a takeover, the standby's reservations handed to the owner's
//! actor and kept as its own; the cap at a standby.

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::{ChangeLog, InstanceRecords, PgOptions};
use change_streamer_actors::cleanup::{CleanupActor, GetCleanupState, PollResult};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::instance::recorder::InstanceRecorder;
use change_streamer_actors::instance::{InstanceId, InstanceRecord};
use change_streamer_actors::litestream::BackupSample;
use change_streamer_actors::ownership::Role;
use change_streamer_actors::reservation::records::HeldReservation;
use change_streamer_actors::reservation::standby::{HandOver, StandbyReservations};
use change_streamer_actors::reservation::{
    EndBySubscription, ExpireReservations, ListReservations, Progress, ProgressInfo, Release,
    ReservationActor, ReservationEvent, Reserve,
};
use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::pg::TestDb;
use common::fake_log::FakeLog;
use common::recording_purge::{RecordingPurge, Take};
use common::reservation_session::{Events, Session};

const START: i64 = 1_745_452_800_000; // 2025-04-24T00:00:00Z
const DELAY_MS: u64 = 10_000;
const LIMIT: Duration = Duration::from_secs(10);

/// The owner's backup side on `db`, and a standby's record connection.
struct Owner {
    id: InstanceId,
    recorder: Addr<InstanceRecorder>,
    clock: Clock,
    purge: Addr<RecordingPurge>,
    cleanup: Addr<CleanupActor>,
    reservations: Addr<ReservationActor>,
    log: ChangeLog,
    db: InstanceRecords,
}

fn id(port: u16) -> InstanceId {
    InstanceId::new(([127, 0, 0, 1], port).into(), &Clock::System)
}

impl Owner {
    async fn start(db: &TestDb) -> Owner {
        let clock = Clock::manual(START);
        let owner_id = id(1);
        let log = ChangeLog::open_postgres(PgOptions {
            instance: Some(owner_id.as_str().into()),
            ..PgOptions::new(&db.url, Duration::from_millis(200))
        })
        .await
        .unwrap();
        let recorder = InstanceRecorder::new(owner_id.clone(), db.url.clone()).start();
        let purge = RecordingPurge::default().start();
        let reservations_ctx = Context::<ReservationActor>::new();
        let delay = Duration::from_millis(DELAY_MS);
        let cleanup = CleanupActor::new(clock.clone(), delay, delay, purge.clone().recipient())
            .with_others(reservations_ctx.address().recipient())
            .start();
        let reservations = ReservationActor::new(
            clock.clone(),
            "s3://foo/bar".into(),
            FakeLog {
                replica_version: "123",
                min_watermark: "1ab",
            }
            .start()
            .recipient(),
            cleanup.clone(),
        )
        .restore(&[], delay, log.clone())
        .with_records(recorder.clone());
        let reservations = reservations_ctx.run(reservations);
        Owner {
            id: owner_id,
            recorder,
            clock,
            purge,
            cleanup,
            reservations,
            log,
            db: InstanceRecords::connect(&db.url).await.unwrap(),
        }
    }

    fn at(&self, ms: i64) {
        self.clock.set_ms(START + ms);
    }

    /// One poll that saw watermark `w` backed up an hour before the start.
    async fn poll(&self, w: u64) {
        self.cleanup
            .send(PollResult {
                samples: vec![BackupSample {
                    watermark: Watermark::from_u64(w),
                    replica: "s3".into(),
                    backed_up_at_ms: START - 3_600_000,
                }],
            })
            .await
            .unwrap();
    }

    async fn paused(&self) -> bool {
        self.cleanup.send(GetCleanupState).await.unwrap().paused
    }

    async fn delay_ms(&self) -> i64 {
        self.cleanup
            .send(GetCleanupState)
            .await
            .unwrap()
            .cleanup_delay_ms
    }
}

/// Waits until `cond` holds, asking it every 20 ms, for at most `limit`.
async fn wait_until_async<F, Fut>(what: &str, limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + limit;
    while !cond().await {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {limit:?}: {what}"
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A standby's record holding `held` (task, start offset), written as its refresh writes it.
async fn record_standby(db: &InstanceRecords, standby: &InstanceId, held: &[(&str, i64)]) {
    let held: Vec<HeldReservation> = held
        .iter()
        .map(|(t, at)| HeldReservation {
            task_id: t.to_string(),
            started_ms: START + at,
        })
        .collect();
    let record = InstanceRecord {
        id: standby.clone(),
        role: Role::Standby,
        subscribers: Vec::new(),
        reservations: held.len() as u32,
    };
    db.refresh_with(&record, Some(&held)).await.unwrap();
}

#[actix_rt::test]
async fn a_standbys_recorded_reservation_pauses_the_owners_cleanup_until_dropped() {
    let db = TestDb::create("standby_res_pause").await;
    let owner = Owner::start(&db).await;
    let standby_db = InstanceRecords::connect(&db.url).await.unwrap();
    let standby = id(2);
    record_standby(&standby_db, &standby, &[("t1", 0)]).await;

    owner.at(1_000);
    owner.poll(5).await;
    assert!(owner.paused().await, "the standby's reservation pauses");
    assert_eq!(owner.purge.send(Take).await.unwrap(), Vec::<String>::new());
    // Not the owner's own: its /status lists only its own.
    assert_eq!(owner.reservations.send(ListReservations).await.unwrap(), []);

    // Dropped at the standby (its next refresh no longer has it): ended without growth.
    record_standby(&standby_db, &standby, &[]).await;
    owner.at(60_000);
    owner.poll(6).await;
    assert!(!owner.paused().await);
    assert_eq!(
        owner.purge.send(Take).await.unwrap(),
        [Watermark::from_u64(6).to_string()]
    );
    assert_eq!(
        owner.delay_ms().await,
        DELAY_MS as i64,
        "a drop does not grow"
    );
}

#[actix_rt::test]
async fn a_standbys_reservation_ended_at_the_owner_grows_the_delay_from_its_start() {
    let db = TestDb::create("standby_res_end_owner").await;
    let owner = Owner::start(&db).await;
    let standby_db = InstanceRecords::connect(&db.url).await.unwrap();
    let standby = id(2);
    record_standby(&standby_db, &standby, &[("t1", 0)]).await;
    owner.at(1_000);
    owner.poll(5).await;
    assert!(owner.paused().await);

    // The task subscribes with initial=true at the owner, 60 s after it reserved.
    owner.at(60_000);
    let own = owner
        .reservations
        .send(EndBySubscription {
            task_id: "t1".into(),
        })
        .await
        .unwrap();
    assert_eq!(own, None, "not the owner's own reservation");
    // The standby's refresh finds the end (and would close its socket with 1000).
    wait_until_async(
        "the end recorded for the standby to read",
        LIMIT,
        || async {
            let ends = standby_db.ends_for(&["t1"]).await.unwrap();
            ends.iter().any(|e| e.ended_ms == START + 60_000)
        },
    )
    .await;

    owner.at(61_000);
    owner.poll(6).await;
    assert_eq!(owner.delay_ms().await, 60_000, "grown from the start");
    assert!(
        !owner.paused().await,
        "ended, though the standby still records it"
    );
    assert_eq!(
        owner.purge.send(Take).await.unwrap(),
        [Watermark::from_u64(6).to_string()]
    );
    // The standby closes the socket and drops the row; the owner forgets the end.
    record_standby(&standby_db, &standby, &[]).await;
    owner.poll(7).await;
    owner.poll(8).await;
    wait_until_async("the applied end forgotten", LIMIT, || async {
        owner
            .db
            .reservation_records("x")
            .await
            .unwrap()
            .ends
            .is_empty()
    })
    .await;
    assert_eq!(owner.delay_ms().await, 60_000);
}

#[actix_rt::test]
async fn an_end_the_holder_filled_in_grows_the_delay_once_its_row_is_gone() {
    let db = TestDb::create("standby_res_end_claimed").await;
    let owner = Owner::start(&db).await;
    let standby_db = InstanceRecords::connect(&db.url).await.unwrap();
    let standby = id(2);
    record_standby(&standby_db, &standby, &[("t1", 0)]).await;
    owner.at(1_000);
    owner.poll(5).await;
    assert!(owner.paused().await);
    // Ended at another standby between two polls: its holder filled in the start and closed.
    standby_db
        .record_end(&change_streamer_actors::reservation::records::RecordedEnd {
            task_id: "t1".into(),
            ended_ms: START + 45_000,
            started_ms: Some(START),
        })
        .await
        .unwrap();
    record_standby(&standby_db, &standby, &[]).await;
    owner.at(50_000);
    owner.poll(6).await;
    assert_eq!(owner.delay_ms().await, 45_000);
    assert!(!owner.paused().await);
}

#[actix_rt::test]
async fn a_gone_standbys_reservation_is_orphaned_at_the_owner_from_when_it_was_seen_gone() {
    let db = TestDb::create("standby_res_orphan").await;
    let owner = Owner::start(&db).await;
    let standby = id(2);
    {
        let standby_db = InstanceRecords::connect(&db.url).await.unwrap();
        record_standby(&standby_db, &standby, &[("t1", 0)]).await;
        owner.at(1_000);
        owner.poll(5).await;
        assert!(owner.paused().await);
    } // its connection ends: the standby is gone at once (its session ended)
    wait_until_async("the standby gone", LIMIT, || async {
        let seen = owner.db.instances().await.unwrap();
        !seen.iter().any(|i| i.id == standby.as_str())
    })
    .await;

    owner.at(5_000);
    owner.poll(6).await;
    assert!(owner.paused().await, "the orphan keeps cleanup paused");
    let list = owner.reservations.send(ListReservations).await.unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].task_id, "t1");
    assert!(list[0].orphaned);
    assert_eq!(list[0].held_ms, 5_000, "its original start kept");
    // Written down as the owner's own (a restart keeps it), then forgotten in the records.
    wait_until_async(
        "written down and forgotten in the records",
        LIMIT,
        || async {
            let stored = owner.log.load_state().await.unwrap().reservations;
            let records = owner.db.reservation_records("x").await.unwrap();
            stored
                .iter()
                .any(|r| r.task_id == "t1" && r.started_ms == START)
                && records.held.is_empty()
        },
    )
    .await;

    // §13 (b) from the moment the owner saw it gone (+5 s), not from the start.
    owner.at(5_000 + DELAY_MS as i64 - 1);
    owner.reservations.send(ExpireReservations).await.unwrap();
    assert_eq!(
        owner
            .reservations
            .send(ListReservations)
            .await
            .unwrap()
            .len(),
        1
    );
    owner.at(5_000 + DELAY_MS as i64);
    owner.reservations.send(ExpireReservations).await.unwrap();
    assert_eq!(owner.reservations.send(ListReservations).await.unwrap(), []);
    owner.poll(7).await;
    assert!(!owner.paused().await);
    assert_eq!(owner.delay_ms().await, DELAY_MS as i64);
}

/// A standby's reservations on `owner`'s clock, recorded through `recorder`.
fn standby_reservations(owner: &Owner, max: Option<Duration>) -> Addr<StandbyReservations> {
    StandbyReservations::new(
        owner.clock.clone(),
        owner.id.clone(),
        "s3://foo/bar".into(),
        FakeLog {
            replica_version: "123",
            min_watermark: "1ab",
        }
        .start()
        .recipient(),
        owner.recorder.clone(),
    )
    .with_max_reservation(max)
    .start()
}

/// Reserves `task` at `at` through `holder`: the session and its number.
async fn reserve_at(holder: &Addr<StandbyReservations>, task: &str) -> (Addr<Session>, SessionId) {
    let session = Session::default().start();
    let session_id = SessionId::next();
    holder
        .send(Reserve {
            task_id: task.into(),
            session_id,
            session: session.clone().recipient(),
        })
        .await
        .unwrap();
    (session, session_id)
}

/// Waits until `session` was told something; answers all it was told.
async fn told(session: &Addr<Session>) -> Vec<ReservationEvent> {
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let seen = session.send(Events).await.unwrap();
        if !seen.is_empty() {
            return seen;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the session told nothing within {LIMIT:?}"
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_rt::test]
async fn at_a_takeover_the_standbys_reservations_are_the_owners_own_on_the_same_sockets() {
    let db = TestDb::create("standby_res_handover").await;
    let owner = Owner::start(&db).await;
    let standby = standby_reservations(&owner, None);
    let (s1, _) = reserve_at(&standby, "t1").await;
    assert!(matches!(told(&s1).await[..], [ReservationEvent::Status(_)]));
    owner.at(500);
    // t2's status is not sent yet when the standby takes over (or only just).
    let (s2, s2_id) = reserve_at(&standby, "t2").await;
    // What this instance's record held as a standby, under its own id.
    let rows = InstanceRecords::connect(&db.url).await.unwrap();
    record_standby(&rows, &owner.id, &[("t1", 0), ("t2", 500)]).await;

    let handed = standby
        .send(HandOver {
            to: owner.reservations.clone(),
        })
        .await
        .unwrap();
    assert_eq!(handed, 2);
    owner.at(1_000);
    let list = owner.reservations.send(ListReservations).await.unwrap();
    let seen: Vec<(&str, i64, bool)> = list
        .iter()
        .map(|r| (r.task_id.as_str(), r.held_ms, r.orphaned))
        .collect();
    assert_eq!(
        seen,
        [("t1", 1_000, false), ("t2", 500, false)],
        "original starts"
    );
    // t2 gets its one status (from whichever side sent it); t1 nothing more.
    assert!(matches!(told(&s2).await[..], [ReservationEvent::Status(_)]));
    // Written down as the owner's own with the original start; the standby's rows forgotten.
    wait_until_async("written down, rows forgotten", LIMIT, || async {
        let mut stored = owner.log.load_state().await.unwrap().reservations;
        stored.sort_by(|a, b| a.task_id.cmp(&b.task_id));
        let stored: Vec<(String, i64)> = stored
            .into_iter()
            .map(|r| (r.task_id, r.started_ms))
            .collect();
        let records = owner.db.reservation_records("x").await.unwrap();
        stored == [("t1".to_string(), START), ("t2".to_string(), START + 500)]
            && records.held.is_empty()
    })
    .await;

    // A refresh still in flight at the takeover writes a row again: never an orphan.
    record_standby(&rows, &owner.id, &[("t1", 0)]).await;
    owner.poll(5).await;
    assert!(owner.paused().await);
    let list = owner.reservations.send(ListReservations).await.unwrap();
    assert!(list.iter().all(|r| !r.orphaned), "{list:?}");
    wait_until_async("the row written again forgotten", LIMIT, || async {
        let records = owner.db.reservation_records("x").await.unwrap();
        records.held.is_empty()
    })
    .await;

    // The sessions still talk to the standby's actor, which forwards: t2 dropped, no growth.
    standby
        .send(Release {
            task_id: "t2".into(),
            session_id: s2_id,
        })
        .await
        .unwrap();
    let list = owner.reservations.send(ListReservations).await.unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    // t1 ended by its subscription 60 s after its original start: 1000, and the delay grows.
    owner.at(60_000);
    let held = standby
        .send(EndBySubscription {
            task_id: "t1".into(),
        })
        .await
        .unwrap();
    assert_eq!(held, Some(Duration::from_millis(60_000)));
    assert_eq!(
        told(&s1).await,
        [ReservationEvent::Closed(SessionEnd::EndedBySubscription)]
    );
    owner.poll(6).await;
    assert_eq!(
        owner.delay_ms().await,
        60_000,
        "grown from the original start"
    );
    assert!(!owner.paused().await);
    assert_eq!(owner.reservations.send(ListReservations).await.unwrap(), []);
    assert!(s2.send(Events).await.unwrap().is_empty());
}

#[actix_rt::test]
async fn at_a_standby_a_reservation_held_past_the_cap_closes_1011() {
    let db = TestDb::create("standby_res_cap").await;
    let owner = Owner::start(&db).await;
    let standby = standby_reservations(&owner, Some(Duration::from_millis(200)));
    let (s1, _) = reserve_at(&standby, "t1").await;
    assert!(matches!(told(&s1).await[..], [ReservationEvent::Status(_)]));
    owner.at(200);
    assert_eq!(
        told(&s1).await,
        [ReservationEvent::Closed(SessionEnd::Unavailable(
            "reservation held longer than --max-reservation-ms (200 ms)".into()
        ))]
    );
    assert_eq!(standby.send(ListReservations).await.unwrap(), []);
}

#[actix_rt::test]
async fn a_standbys_reservation_keeps_its_restore_progress_across_a_takeover() {
    let db = TestDb::create("standby_res_progress").await;
    let owner = Owner::start(&db).await;
    let standby = standby_reservations(&owner, None);
    let (s1, s1_id) = reserve_at(&standby, "t1").await;
    // A standby polls no backup: its status carries no replicaSize (PROTOCOL.md §6.3).
    match &told(&s1).await[..] {
        [ReservationEvent::Status(s)] => assert_eq!(s.replica_size, None, "{s:?}"),
        other => panic!("told {other:?}"),
    }
    let progress = |bytes| Progress {
        task_id: "t1".into(),
        session_id: s1_id,
        bytes,
    };
    standby.send(progress(0)).await.unwrap();
    owner.at(2_000);
    standby.send(progress(100_000)).await.unwrap();
    let at_standby = standby.send(ListReservations).await.unwrap();
    assert_eq!(
        at_standby[0].progress,
        Some(ProgressInfo {
            restored_bytes: 100_000,
            replica_size: None,
            restore_bytes_per_second: Some(50_000),
        })
    );

    let rows = InstanceRecords::connect(&db.url).await.unwrap();
    record_standby(&rows, &owner.id, &[("t1", 0)]).await;
    let handed = standby
        .send(HandOver {
            to: owner.reservations.clone(),
        })
        .await
        .unwrap();
    assert_eq!(handed, 1);
    // The owner shows what was reported at the standby, and what the session sends on (through
    // the standby's actor, which forwards) adds to it.
    owner.at(4_000);
    standby.send(progress(300_000)).await.unwrap();
    let at_owner = owner.reservations.send(ListReservations).await.unwrap();
    assert_eq!(
        at_owner[0].progress,
        Some(ProgressInfo {
            restored_bytes: 300_000,
            replica_size: None,
            restore_bytes_per_second: Some(75_000),
        }),
        "{at_owner:?}"
    );
}
