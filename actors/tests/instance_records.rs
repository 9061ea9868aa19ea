//! Instance records in a real PostgreSQL change DB (PROTOCOL.md §14.1): what a refresh writes,
//! when a record means its instance is gone (older than 10 s, or its session ended), and the
//! InstanceRecorder that keeps one fresh and deletes it at its stop.

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::InstanceRecords;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::instance::recorder::{self, InstanceRecorder, ListInstances};
use change_streamer_actors::instance::{InstanceId, InstanceRecord, Refreshed, GONE_AFTER};
use change_streamer_actors::ownership::Role;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::pg::TestDb;

fn id(port: u16) -> InstanceId {
    InstanceId::new(([127, 0, 0, 1], port).into(), &Clock::System)
}

fn standby(id: &InstanceId) -> InstanceRecord {
    InstanceRecord {
        id: id.clone(),
        role: Role::Standby,
        subscribers: Vec::new(),
        reservations: 0,
    }
}

fn ids(db: &[change_streamer_actors::instance::InstanceSeen]) -> Vec<&str> {
    db.iter().map(|i| i.id.as_str()).collect()
}

#[actix_rt::test]
async fn a_refresh_records_the_role_the_subscribers_with_their_acks_and_the_reservations() {
    let db = TestDb::create("records_refresh").await;
    let records = InstanceRecords::connect(&db.url).await.unwrap();
    let me = id(1);
    let record = InstanceRecord {
        role: Role::Owner,
        subscribers: vec![
            ("vs-1".into(), Watermark::from_u64(7)),
            ("vs-2".into(), Watermark::from_u64(9)),
        ],
        reservations: 2,
        ..standby(&me)
    };
    assert_eq!(records.refresh(&record).await.unwrap(), Refreshed::New);
    assert_eq!(
        records.refresh(&record).await.unwrap(),
        Refreshed::Continuous
    );
    let seen = records.instances().await.unwrap();
    assert_eq!(ids(&seen), [me.as_str()]);
    assert_eq!(seen[0].role, "owner");
    assert_eq!(seen[0].subscribers, 2);
    assert_eq!(seen[0].reservations, 2);
    assert!(seen[0].last_seen_ms < GONE_AFTER.as_millis() as u64);
    // The rows the owner's purge will read: each subscriber's acked watermark, replaced whole.
    let one_left = InstanceRecord {
        subscribers: vec![("vs-2".into(), Watermark::from_u64(11))],
        ..record
    };
    records.refresh(&one_left).await.unwrap();
    let rows = db
        .connect()
        .await
        .query(
            "SELECT subscriber, acked FROM change_streamer.instance_subscribers WHERE instance = $1",
            &[&me.as_str()],
        )
        .await
        .unwrap();
    let rows: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        rows,
        [("vs-2".to_string(), Watermark::from_u64(11).to_string())]
    );
}

#[actix_rt::test]
async fn a_record_older_than_10_s_is_gone_though_its_session_lives() {
    let db = TestDb::create("records_old").await;
    let records = InstanceRecords::connect(&db.url).await.unwrap();
    let (old, fresh) = (id(1), id(2));
    records.refresh(&standby(&old)).await.unwrap();
    records.refresh(&standby(&fresh)).await.unwrap();
    // Ages are the change DB's clock: move the record back rather than wait.
    let c = db.connect().await;
    let aged = "UPDATE change_streamer.instances
                SET refreshed_at = now() - $2::int8 * interval '1 millisecond' WHERE id = $1";
    let gone_ms = GONE_AFTER.as_millis() as i64;
    c.execute(aged, &[&old.as_str(), &(gone_ms - 1000)])
        .await
        .unwrap();
    assert_eq!(
        records.instances().await.unwrap().len(),
        2,
        "9 s old: not gone"
    );
    c.execute(aged, &[&old.as_str(), &(gone_ms + 1000)])
        .await
        .unwrap();
    assert_eq!(ids(&records.instances().await.unwrap()), [fresh.as_str()]);
    assert_eq!(records.sweep_gone().await.unwrap(), [old.as_str()]);
    // It comes back as a new record, not a continuous one: the others saw it gone.
    assert_eq!(
        records.refresh(&standby(&old)).await.unwrap(),
        Refreshed::New
    );
}

#[actix_rt::test]
async fn a_record_whose_session_ended_is_gone_at_once() {
    let db = TestDb::create("records_session").await;
    let mine = InstanceRecords::connect(&db.url).await.unwrap();
    let theirs = InstanceRecords::connect(&db.url).await.unwrap();
    let (me, them) = (id(1), id(2));
    mine.refresh(&standby(&me)).await.unwrap();
    theirs.refresh(&standby(&them)).await.unwrap();
    assert_eq!(mine.instances().await.unwrap().len(), 2);
    // Their session ends, as when their process is killed: PostgreSQL shows it gone.
    let ended = db
        .connect()
        .await
        .execute(
            "SELECT pg_terminate_backend(backend_pid) FROM change_streamer.instances
             WHERE id = $1",
            &[&them.as_str()],
        )
        .await
        .unwrap();
    assert_eq!(ended, 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while mine.instances().await.unwrap().len() != 1 {
        assert!(std::time::Instant::now() < deadline, "still listed");
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(ids(&mine.instances().await.unwrap()), [me.as_str()]);
    assert_eq!(mine.sweep_gone().await.unwrap(), [them.as_str()]);
}

#[actix_rt::test]
async fn the_recorder_keeps_its_record_fresh_and_deletes_it_at_its_stop() {
    let db = TestDb::create("records_recorder").await;
    let me = id(1);
    let recorder = InstanceRecorder::new(me.clone(), db.url.clone()).start();
    let refreshed_at = || async {
        let c = db.connect().await;
        c.query_opt(
            "SELECT refreshed_at::text FROM change_streamer.instances WHERE id = $1",
            &[&me.as_str()],
        )
        .await
        .ok()
        .flatten()
        .map(|r| r.get::<_, String>(0))
    };
    // Refreshed, then refreshed again: wait for the events, not for a duration.
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while seen.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "refreshes seen: {seen:?}"
        );
        if let Some(at) = refreshed_at().await {
            if seen.last() != Some(&at) {
                seen.push(at);
            }
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    let listed = recorder.send(ListInstances).await.unwrap().unwrap();
    assert_eq!(ids(&listed), [me.as_str()]);
    assert_eq!(listed[0].role, "standby", "it serves with nothing");
    recorder.send(recorder::Stop).await.unwrap();
    assert_eq!(refreshed_at().await, None, "its record is deleted");
}
