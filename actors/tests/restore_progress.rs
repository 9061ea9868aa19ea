//! Actor-level tests of restore progress (PROTOCOL.md §6.3 `replicaSize`, §6.8): the owner's
//! [`ReservationActor`] with a change log of fixed answers, sessions that record what they are
//! told, [`BackupRead`]s sent as the VFS monitor sends them, and [`Progress`] messages as the
//! snapshot session passes them on. Time is a manual clock moved by hand.

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::reservation::{
    BackupRead, ListReservations, Progress, ProgressInfo, ReservationActor, ReservationEvent,
    ReservationInfo, SnapshotStatus,
};
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::watermark::Watermark;
use common::fake_log::FakeLog;
use common::recording_purge::RecordingPurge;
use common::reservation_session::{reserve, Events, Session};
use serde_json::{json, Value};

const START: i64 = 1_745_452_800_000; // 2025-04-24T00:00:00Z
const LIMIT: Duration = Duration::from_secs(10);

/// The owner's reservations on a manual clock; `verify`: with the VFS source (§6.7).
fn start(clock: &Clock, verify: bool) -> Addr<ReservationActor> {
    let delay = Duration::from_secs(30);
    let cleanup = CleanupActor::new(
        clock.clone(),
        delay,
        delay,
        RecordingPurge::default().start().recipient(),
    )
    .start();
    let log = FakeLog {
        replica_version: "0a",
        min_watermark: "0b",
    }
    .start()
    .recipient();
    let actor = ReservationActor::new(clock.clone(), "file:///backup".into(), log, cleanup);
    if verify {
        actor.verifying_backups()
    } else {
        actor
    }
    .start()
}

/// The status `session` is told, waiting for it.
async fn status_of(session: &Addr<Session>) -> SnapshotStatus {
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        match session.send(Events).await.unwrap().as_slice() {
            [] => {}
            [ReservationEvent::Status(s)] => return s.clone(),
            other => panic!("told {other:?}"),
        }
        assert!(std::time::Instant::now() < deadline, "no status");
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
}

fn read(w: u64, size: Option<u64>) -> BackupRead {
    BackupRead {
        watermark: Watermark::from_u64(w),
        replica_size: size,
    }
}

fn progress(task: &str, session: u64, bytes: u64) -> Progress {
    Progress {
        task_id: task.into(),
        session_id: SessionId(session),
        bytes,
    }
}

async fn listed(r: &Addr<ReservationActor>) -> Vec<ReservationInfo> {
    r.send(ListReservations).await.unwrap()
}

#[actix_rt::test]
async fn the_status_carries_the_replica_size_the_latest_backup_read_gave() {
    let clock = Clock::manual(START);
    let r = start(&clock, true);
    r.send(read(11, Some(409_600))).await.unwrap();
    r.send(read(11, Some(450_560))).await.unwrap();
    let s = reserve(&r, "t1", 1).await;
    let status = status_of(&s).await;
    assert_eq!(status.replica_size, Some(450_560));
    let wire: Value = serde_json::from_str(&status.to_message()).unwrap();
    assert_eq!(
        wire,
        json!(["status", {"tag": "status", "backupURL": "file:///backup", "replicaVersion": "0a",
                          "minWatermark": "0b", "replicaSize": 450_560}])
    );
    // A status that waited for its backup gets the size of the read that verified it.
    let r = start(&clock, true);
    let s = reserve(&r, "t2", 2).await;
    r.send(read(11, Some(8_192))).await.unwrap();
    assert_eq!(status_of(&s).await.replica_size, Some(8_192));
}

#[actix_rt::test]
async fn an_unknown_replica_size_is_absent_from_the_status_not_zero() {
    let clock = Clock::manual(START);
    // The metrics and control sources read nothing of the backup.
    let r = start(&clock, false);
    let s = reserve(&r, "t1", 1).await;
    let status = status_of(&s).await;
    assert_eq!(status.replica_size, None);
    assert_eq!(
        status.to_message(),
        r#"["status",{"tag":"status","backupURL":"file:///backup","replicaVersion":"0a","minWatermark":"0b"}]"#
    );
    // A read whose pragmas failed: the size is unknown again until one reads it.
    let r = start(&clock, true);
    r.send(read(11, Some(450_560))).await.unwrap();
    r.send(read(12, None)).await.unwrap();
    let s = reserve(&r, "t2", 2).await;
    assert_eq!(status_of(&s).await.replica_size, None);
}

#[actix_rt::test]
async fn without_progress_messages_a_reservation_shows_nothing_more() {
    let clock = Clock::manual(START);
    let r = start(&clock, true);
    r.send(read(11, Some(450_560))).await.unwrap();
    let s = reserve(&r, "t1", 1).await;
    status_of(&s).await;
    clock.advance_ms(5_000);
    let list = listed(&r).await;
    assert_eq!(list[0].progress, None);
    assert_eq!(
        serde_json::to_value(&list[0]).unwrap(),
        json!({"taskID": "t1", "heldMs": 5_000, "orphaned": false, "verified": true})
    );
}

#[actix_rt::test]
async fn progress_shows_restored_bytes_the_status_size_and_the_rate_over_the_last_ten_seconds() {
    let clock = Clock::manual(START);
    let r = start(&clock, true);
    r.send(read(11, Some(450_560))).await.unwrap();
    let s = reserve(&r, "t1", 1).await;
    status_of(&s).await;
    // A later backup read does not change the size this reservation was given.
    r.send(read(12, Some(999_999))).await.unwrap();
    r.send(progress("t1", 1, 0)).await.unwrap();
    let info = |l: Vec<ReservationInfo>| l[0].progress;
    assert_eq!(
        info(listed(&r).await),
        Some(ProgressInfo {
            restored_bytes: 0,
            replica_size: Some(450_560),
            restore_bytes_per_second: None, // a window under 1 s
        })
    );
    for second in 1..=15 {
        clock.advance_ms(1_000);
        r.send(progress("t1", 1, second * 20_000)).await.unwrap();
    }
    let now = info(listed(&r).await).unwrap();
    assert_eq!(now.restored_bytes, 300_000);
    assert_eq!(now.restore_bytes_per_second, Some(20_000));
    assert_eq!(now.ratio(), Some(300_000.0 / 450_560.0));
    let json = serde_json::to_value(&listed(&r).await[0]).unwrap();
    assert_eq!(json["restoredBytes"], 300_000, "{json}");
    assert_eq!(json["replicaSize"], 450_560, "{json}");
    assert_eq!(json["restoreBytesPerSecond"], 20_000, "{json}");
    // The replica stops reporting: 5 s later half the window gained nothing, 10 s later none.
    clock.advance_ms(5_000);
    assert_eq!(
        info(listed(&r).await).unwrap().restore_bytes_per_second,
        Some(10_000)
    );
    clock.advance_ms(5_000);
    assert_eq!(
        info(listed(&r).await).unwrap().restore_bytes_per_second,
        Some(0)
    );
}

#[actix_rt::test]
async fn progress_without_a_known_size_shows_a_null_replica_size() {
    let clock = Clock::manual(START);
    let r = start(&clock, false);
    let s = reserve(&r, "t1", 1).await;
    status_of(&s).await;
    r.send(progress("t1", 1, 4_096)).await.unwrap();
    let json = serde_json::to_value(&listed(&r).await[0]).unwrap();
    assert_eq!(json["restoredBytes"], 4_096, "{json}");
    assert_eq!(json["replicaSize"], Value::Null, "{json}");
    assert_eq!(json["restoreBytesPerSecond"], Value::Null, "{json}");
    assert_eq!(listed(&r).await[0].progress.and_then(|p| p.ratio()), None);
}

#[actix_rt::test]
async fn a_lower_total_is_a_restore_that_started_over() {
    let clock = Clock::manual(START);
    let r = start(&clock, false);
    let s = reserve(&r, "t1", 1).await;
    status_of(&s).await;
    r.send(progress("t1", 1, 0)).await.unwrap();
    clock.advance_ms(4_000);
    r.send(progress("t1", 1, 400_000)).await.unwrap();
    clock.advance_ms(1_000);
    r.send(progress("t1", 1, 1_000)).await.unwrap();
    let p = listed(&r).await[0].progress.unwrap();
    assert_eq!(p.restored_bytes, 1_000);
    assert_eq!(
        p.restore_bytes_per_second, None,
        "measured from the restart"
    );
    clock.advance_ms(2_000);
    r.send(progress("t1", 1, 5_000)).await.unwrap();
    let p = listed(&r).await[0].progress.unwrap();
    assert_eq!(p.restore_bytes_per_second, Some(2_000));
}

#[actix_rt::test]
async fn a_replaced_sessions_late_progress_is_ignored() {
    let clock = Clock::manual(START);
    let r = start(&clock, false);
    let old = reserve(&r, "t1", 1).await;
    status_of(&old).await;
    r.send(progress("t1", 1, 100)).await.unwrap();
    let new = reserve(&r, "t1", 2).await;
    // The replacement starts afresh: nothing reported on it yet.
    assert_eq!(listed(&r).await[0].progress, None);
    r.send(progress("t1", 1, 9_999)).await.unwrap();
    r.send(progress("other-task", 2, 9_999)).await.unwrap();
    assert_eq!(listed(&r).await[0].progress, None);
    status_of(&new).await;
    r.send(progress("t1", 2, 50)).await.unwrap();
    let list = listed(&r).await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].progress.map(|p| p.restored_bytes), Some(50));
}
