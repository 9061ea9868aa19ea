//! A silent change DB (PROTOCOL.md §14.2): a connection that stays open while nothing crosses
//! it (a [`FreezeProxy`] in front of a real server, frozen) fails each call with
//! `no answer from the change DB within …` rather than hanging, and counts as the change DB out
//! of reach; a silent owner is deposed, and the server ends its writer's session after the
//! lease, so that another instance takes the ownership lock and finds every acked commit.
//!
//! The lease is this test process's own, short one (2 s: a call is given up after 1.2 s, a
//! connect after 1 s); every wait below is a safety net far above it.

use std::time::{Duration, Instant};

use change_streamer_actors::changelog::{
    set_change_db_lease, ChangeKind, ChangeLog, ChangeLogError, InstanceRecords, PgOptions,
    Transaction,
};
use change_streamer_actors::ownership::OWNER_LOCK_KEY;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::freeze::FreezeProxy;
use change_streamer_test_support::pg::TestDb;

const LEASE: Duration = Duration::from_secs(2);
/// 3L/5: the bound of one call.
const CALL: Duration = Duration::from_millis(1_200);
/// How long a test waits for what must come well within the bounds above.
const PATIENCE: Duration = Duration::from_secs(30);
const INTERVAL: Duration = Duration::from_millis(100);

fn txn(n: u64) -> Transaction {
    Transaction {
        watermark: Watermark::from_u64(n),
        changes: vec![
            (ChangeKind::Begin, r#"{"tag":"begin"}"#.into()),
            (ChangeKind::Data, format!(r#"{{"tag":"insert","n":{n}}}"#)),
            (ChangeKind::Commit, r#"{"tag":"commit"}"#.into()),
        ],
    }
}

/// `f`'s answer, failing the test if none came within [`PATIENCE`] (the bug: it hangs).
async fn answered<T>(what: &str, f: impl std::future::Future<Output = T>) -> (T, Duration) {
    let start = Instant::now();
    match tokio::time::timeout(PATIENCE, f).await {
        Ok(t) => (t, start.elapsed()),
        Err(_) => panic!("{what}: no answer within {PATIENCE:?}: a silent change DB hangs it"),
    }
}

fn assert_silent<T: std::fmt::Debug>(what: &str, r: Result<T, ChangeLogError>) {
    match r {
        Err(e @ ChangeLogError::Silent(_)) => {
            assert!(e.is_unreachable(), "{what}: {e} is an outage");
            assert!(
                e.to_string()
                    .starts_with("no answer from the change DB within"),
                "{what}: {e}"
            );
        }
        other => panic!("{what}: {other:?}, not a silent change DB"),
    }
}

#[actix_rt::test]
async fn a_frozen_connection_fails_each_read_and_connect_with_no_answer_rather_than_hanging() {
    set_change_db_lease(LEASE);
    let db = TestDb::create("silent_reads").await;
    // An owner, directly, so that the change log's tables exist; the standby behind the proxy.
    let owner = ChangeLog::open_postgres(PgOptions::new(&db.url, INTERVAL))
        .await
        .unwrap();
    owner.append(txn(1)).await.unwrap();
    let proxy = FreezeProxy::start(db.server_addr()).await;
    let standby = ChangeLog::open_standby(&db.url_via(proxy.addr)).unwrap();
    // Both of its connections made and answering first: the freeze then catches them open.
    let one = Some(Watermark::from_u64(1));
    assert_eq!(standby.stats().await.unwrap().max_watermark, one);
    standby.disk_bytes().await.unwrap();

    proxy.freeze();
    let (stats, took) = answered("a standby's question", standby.stats()).await;
    assert_silent("a standby's question", stats);
    assert!(took >= CALL, "given up after {took:?}, before its bound");
    let (size, _) = answered("a read", standby.disk_bytes()).await;
    assert_silent("a read", size);
    let (records, _) = answered(
        "connecting the records",
        InstanceRecords::connect(&db.url_via(proxy.addr)),
    )
    .await;
    assert_silent("connecting the records", records.map(|_| ()));

    // Thawed, the same handle answers again on connections made anew.
    proxy.thaw();
    let (stats, _) = answered("a question after the thaw", standby.stats()).await;
    assert_eq!(stats.unwrap().max_watermark, one);
    drop(owner);
}

#[actix_rt::test]
async fn a_silent_owner_is_deposed_and_the_server_frees_its_lock_for_the_next() {
    set_change_db_lease(LEASE);
    let db = TestDb::create("silent_owner").await;
    let proxy = FreezeProxy::start(db.server_addr()).await;
    let owner = ChangeLog::open_postgres(PgOptions::new(db.url_via(proxy.addr), INTERVAL))
        .await
        .unwrap();
    for n in 1..=3 {
        owner.append(txn(n)).await.unwrap();
    }
    assert!(owner.is_owner());

    proxy.freeze();
    let frozen = Instant::now();
    // Idle, it notices at its next idle check, given up after the call's bound.
    answered("the silent owner deposed", owner.deposed()).await;
    let noticed = frozen.elapsed();
    assert!(
        noticed <= LEASE + Duration::from_secs(5),
        "deposed {noticed:?} after the freeze"
    );
    let (refused, _) = answered("a write after", owner.append(txn(4))).await;
    assert!(
        matches!(refused, Err(ChangeLogError::NotOwner)),
        "{refused:?}"
    );

    // The server hears nothing from the writer's session for the lease and ends it: the lock
    // is free although its connection is still open, and the next owner finds every commit the
    // silent one stored.
    let (next, _) = answered(
        "another instance owning",
        ChangeLog::open_postgres(PgOptions::new(&db.url, INTERVAL)),
    )
    .await;
    let next = next.unwrap();
    assert!(next.is_owner());
    let stats = next.stats().await.unwrap();
    assert_eq!(stats.max_watermark, Some(Watermark::from_u64(3)));
    next.append(txn(4)).await.unwrap();
    let holders: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND objid::int8 = ($1::int8 & 4294967295) AND objsubid = 1",
            &[&OWNER_LOCK_KEY],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(holders, 1, "one owner");
    assert!(
        proxy.is_frozen(),
        "the silent owner's connection was never closed"
    );
}

/// The server ends a writer's session it does not hear from for the lease: an owner answering
/// only what it holds in memory (stats, more often than its takeover interval, so it is never
/// idle) still checks its lock every interval, and stays the owner well past the lease.
#[actix_rt::test]
async fn an_owner_busy_with_stats_only_is_still_heard_by_the_server_past_the_lease() {
    set_change_db_lease(LEASE);
    let db = TestDb::create("silent_busy").await;
    let owner = ChangeLog::open_postgres(PgOptions::new(&db.url, INTERVAL))
        .await
        .unwrap();
    owner.append(txn(1)).await.unwrap();
    let until = Instant::now() + LEASE * 2;
    while Instant::now() < until {
        owner.stats().await.unwrap();
        tokio::time::sleep(INTERVAL / 5).await;
    }
    assert!(owner.is_owner(), "deposed while busy");
    owner.append(txn(2)).await.unwrap();
}

/// A slow change DB is not a silent one: a commit group that waits, at the server, far past
/// the writer's bounds (here for a lock another session holds for twice the lease) is heard
/// out, because the server says the writer's session is working on it; the owner stays the
/// owner and the commit is stored.
#[actix_rt::test]
async fn a_writer_call_the_server_works_on_for_longer_than_the_lease_is_heard_out() {
    set_change_db_lease(LEASE);
    let db = TestDb::create("slow_owner").await;
    let owner = ChangeLog::open_postgres(PgOptions::new(&db.url, INTERVAL))
        .await
        .unwrap();
    owner.append(txn(1)).await.unwrap();
    let blocker = db.connect().await;
    blocker
        .batch_execute("BEGIN; LOCK TABLE change_streamer.segments IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let held = LEASE * 2;
    let release = tokio::spawn(async move {
        let sql = format!("SELECT pg_sleep({}); COMMIT", held.as_secs_f64());
        blocker.batch_execute(&sql).await.unwrap();
    });
    let (stored, took) = answered("a commit group behind a lock", owner.append(txn(2))).await;
    stored.unwrap();
    assert!(
        took >= held / 2,
        "stored after {took:?}: the lock was not in its way"
    );
    assert!(owner.is_owner(), "deposed while the server worked");
    release.await.unwrap();
    let stats = owner.stats().await.unwrap();
    assert_eq!(stats.max_watermark, Some(Watermark::from_u64(2)));
}
