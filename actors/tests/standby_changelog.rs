//! A serving standby's side of a real PostgreSQL change DB (PROTOCOL.md §14.1): the owner's
//! purge held back by another instance's subscriber, read in the purging transaction (and not
//! by its own record, nor by an instance that is gone); §9's "no subscriber" rule across
//! instances; the standby's read-only handle; the owner's commit notices.

use std::time::Duration;

use change_streamer_actors::changelog::{
    ChangeKind, ChangeLog, ChangeLogError, CommitFeed, InstanceRecords, PgOptions, PurgeGate,
    PurgeHold, Transaction,
};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::instance::{InstanceId, InstanceRecord};
use change_streamer_actors::ownership::Role;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::pg::TestDb;

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

fn id(port: u16) -> InstanceId {
    InstanceId::new(([127, 0, 0, 1], port).into(), &Clock::System)
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

/// The owner (instance `me`) of `db`, with transactions 1..=10 stored.
async fn owner(db: &TestDb, me: &InstanceId) -> ChangeLog {
    let log = ChangeLog::open_postgres(PgOptions {
        instance: Some(me.as_str().to_string()),
        ..PgOptions::new(db.url.clone(), Duration::from_millis(100))
    })
    .await
    .unwrap();
    for n in 1..=10 {
        log.append(txn(n)).await.unwrap();
    }
    log
}

/// Records instance `who` as a standby with `subscribers`.
async fn record(records: &InstanceRecords, who: &InstanceId, subscribers: &[(&str, u64)]) {
    records
        .refresh(&InstanceRecord {
            id: who.clone(),
            role: Role::Standby,
            subscribers: subscribers
                .iter()
                .map(|(s, n)| (s.to_string(), w(*n)))
                .collect(),
            reservations: 0,
        })
        .await
        .unwrap();
}

fn gate(local: usize) -> PurgeGate {
    PurgeGate {
        local_subscribers: local,
    }
}

const NOW: i64 = i64::MAX;

#[actix_rt::test]
async fn a_standbys_subscriber_holds_back_the_owners_purge_in_its_transaction() {
    let db = TestDb::create("gate_standby_sub").await;
    let (me, other) = (id(1), id(2));
    let log = owner(&db, &me).await;
    let records = InstanceRecords::connect(&db.url).await.unwrap();
    record(&records, &other, &[("vs-far", 3)]).await;
    let out = log.purge_gated(w(7), NOW, gate(1)).await.unwrap();
    assert_eq!(
        out.held,
        Some(PurgeHold::Subscriber {
            instance: other.as_str().to_string(),
            subscriber: "vs-far".into(),
            acked: w(3),
        })
    );
    assert_eq!(out.rows, 0);
    assert_eq!(log.stats().await.unwrap().min_watermark, Some(w(1)));
    // Once it acked the watermark, the purge goes.
    record(&records, &other, &[("vs-far", 7)]).await;
    let out = log.purge_gated(w(7), NOW, gate(1)).await.unwrap();
    assert_eq!((out.held, out.rows), (None, 18));
    assert_eq!(log.stats().await.unwrap().min_watermark, Some(w(7)));
}

#[actix_rt::test]
async fn the_purging_instances_own_record_does_not_hold_its_purge() {
    let db = TestDb::create("gate_own_record").await;
    let me = id(1);
    let log = owner(&db, &me).await;
    let records = InstanceRecords::connect(&db.url).await.unwrap();
    // Its own record may be up to a refresh old; its streamer checked its subscribers.
    record(&records, &me, &[("vs-mine", 1)]).await;
    let out = log.purge_gated(w(5), NOW, gate(1)).await.unwrap();
    assert_eq!((out.held, out.rows), (None, 12));
}

#[actix_rt::test]
async fn no_subscriber_on_any_instance_holds_the_purge_and_one_on_another_counts() {
    let db = TestDb::create("gate_no_subscriber").await;
    let (me, other) = (id(1), id(2));
    let log = owner(&db, &me).await;
    let out = log.purge_gated(w(5), NOW, gate(0)).await.unwrap();
    assert_eq!((out.held, out.rows), (Some(PurgeHold::NoSubscribers), 0));
    let records = InstanceRecords::connect(&db.url).await.unwrap();
    record(&records, &other, &[]).await;
    let out = log.purge_gated(w(5), NOW, gate(0)).await.unwrap();
    assert_eq!(out.held, Some(PurgeHold::NoSubscribers));
    // A subscriber at another instance that acked past the watermark is one connected.
    record(&records, &other, &[("vs-there", 9)]).await;
    let out = log.purge_gated(w(5), NOW, gate(0)).await.unwrap();
    assert_eq!((out.held, out.rows), (None, 12));
}

#[actix_rt::test]
async fn a_gone_instances_subscriber_no_longer_holds_the_purge() {
    let db = TestDb::create("gate_gone").await;
    let (me, other) = (id(1), id(2));
    let log = owner(&db, &me).await;
    {
        // Its session ends with this connection: PostgreSQL shows it gone at once.
        let records = InstanceRecords::connect(&db.url).await.unwrap();
        record(&records, &other, &[("vs-gone", 2)]).await;
        let out = log.purge_gated(w(5), NOW, gate(1)).await.unwrap();
        assert!(matches!(out.held, Some(PurgeHold::Subscriber { .. })));
    }
    let check = db.connect().await;
    // The dropped connection's backend leaves pg_stat_activity shortly after.
    let mut out = log.purge_gated(w(5), NOW, gate(1)).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while out.held.is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "still held 30 s after the standby's session ended"
        );
        let _ = check.query_one("SELECT pg_sleep(0.05)", &[]).await.unwrap();
        out = log.purge_gated(w(5), NOW, gate(1)).await.unwrap();
    }
    assert_eq!(out.rows, 12);
}

#[actix_rt::test]
async fn a_standbys_handle_reads_what_the_owner_stored_and_refuses_writes() {
    let db = TestDb::create("standby_handle").await;
    // Before any owner created the tables: an empty change log.
    let standby = ChangeLog::open_standby(&db.url).unwrap();
    let empty = standby.stats().await.unwrap();
    assert_eq!((empty.replica_version, empty.max_watermark), (None, None));
    let _owner = owner(&db, &id(1)).await;
    let stats = standby.stats().await.unwrap();
    assert_eq!(stats.replica_version, Some(w(1)));
    assert_eq!(
        (stats.min_watermark, stats.max_watermark),
        (Some(w(1)), Some(w(10)))
    );
    assert!(standby.has_commit(w(4)).await.unwrap());
    assert!(!standby.has_commit(w(11)).await.unwrap());
    let rows = standby.read((w(8), i64::MAX), w(10), 100).await.unwrap();
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[0].watermark, w(9));
    standby.barrier().await.unwrap();
    assert!(!standby.is_owner());
    assert!(matches!(
        standby.append(txn(11)).await,
        Err(ChangeLogError::NotOwner)
    ));
    assert!(matches!(
        standby.purge(w(5)).await,
        Err(ChangeLogError::NotOwner)
    ));
    assert_eq!(standby.stats().await.unwrap().max_watermark, Some(w(10)));
}

#[actix_rt::test]
async fn the_owner_announces_each_commit_group_once_it_is_durable() {
    let db = TestDb::create("commit_notices").await;
    let me = id(1);
    let log = owner(&db, &me).await;
    let mut notices = CommitFeed::listen(&db.url).await.unwrap();
    log.append(txn(11)).await.unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(30), notices.next())
        .await
        .expect("a notice within 30 s");
    assert_eq!(heard, Some(w(11)));
    // Appends queued together commit as one group: its notice names the last of them.
    let (a, b) = (log.append(txn(12)), log.append(txn(13)));
    let _ = futures_util::future::join(a, b).await;
    let mut last = None;
    while last != Some(w(13)) {
        last = tokio::time::timeout(Duration::from_secs(30), notices.next())
            .await
            .expect("a notice within 30 s");
        assert!(last.is_some(), "the listening connection ended");
    }
}

#[actix_rt::test]
async fn a_standbys_read_past_a_purge_fails_rather_than_skip_what_was_purged() {
    let db = TestDb::create("standby_purged_past").await;
    let log = owner(&db, &id(1)).await;
    let standby = ChangeLog::open_standby(&db.url).unwrap();
    assert_eq!(
        standby
            .read((w(3), i64::MAX), w(10), 100)
            .await
            .unwrap()
            .len(),
        21
    );
    // The owner purges below 7 (its record gate bypassed: the standby's record lapsed, say).
    log.purge(w(7)).await.unwrap();
    match standby.read((w(3), i64::MAX), w(10), 100).await {
        Err(ChangeLogError::PurgedPast { after, oldest }) => {
            assert_eq!((after, oldest), (w(3), w(7)));
        }
        other => panic!("a read past the purge answered {other:?}"),
    }
    // From where the log still holds everything after, it reads.
    assert_eq!(
        standby
            .read((w(7), i64::MAX), w(10), 100)
            .await
            .unwrap()
            .len(),
        9
    );
    // A read from the very start of the log cannot have missed anything.
    assert_eq!(
        standby
            .read((w(0), -1), w(10), 100)
            .await
            .unwrap()
            .first()
            .map(|r| r.watermark.clone()),
        Some(w(7))
    );
}
