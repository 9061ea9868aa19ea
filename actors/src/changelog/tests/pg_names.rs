//! The PostgreSQL engine's connections name themselves (`postgres/connection.rs`, `named`):
//! each part of an instance shows in `pg_stat_activity` as `change-streamer <part> pid <pid>`,
//! so an operator can tell which instance a backend serves and what for; a name the URL sets
//! is kept.
use std::time::Duration;

use super::*;

/// The `application_name` of every other session on `db`, sorted.
async fn names(db: &TestDb) -> Vec<String> {
    let c = db.connect().await;
    let rows = c
        .query(
            "SELECT application_name FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

#[actix_rt::test]
async fn connections_are_named_for_their_part() {
    let db = TestDb::create("connection_names").await;
    let owner = ChangeLog::open_postgres(PgOptions::new(db.url.clone(), Duration::from_millis(50)))
        .await
        .unwrap();
    owner.append(txn(1, 1)).await.unwrap();
    owner.append(txn(2, 1)).await.unwrap();
    // Each reader connects at its first read; the standby's questions at its first question.
    owner.read((w(1), i64::MAX), w(2), 10).await.unwrap();
    let standby = ChangeLog::open_standby(&db.url).unwrap();
    standby.stats().await.unwrap();
    standby.read((w(1), i64::MAX), w(2), 10).await.unwrap();
    let _notices = CommitFeed::listen(&db.url).await.unwrap();
    let _records = InstanceRecords::connect(&db.url).await.unwrap();

    let pid = std::process::id();
    let expected: Vec<String> = [
        "listen",
        "reader",
        "records",
        "standby",
        "standby-reader",
        "writer",
    ]
    .iter()
    .map(|part| format!("change-streamer {part} pid {pid}"))
    .collect();
    assert_eq!(names(&db).await, expected);
}

#[actix_rt::test]
async fn a_name_the_url_sets_is_kept() {
    let db = TestDb::create("connection_named_by_url").await;
    let url = format!("{}?application_name=replication-manager-7", db.url);
    let owner = ChangeLog::open_postgres(PgOptions::new(url.clone(), Duration::from_millis(50)))
        .await
        .unwrap();
    owner.append(txn(1, 1)).await.unwrap();
    owner.read((w(0), i64::MAX), w(1), 10).await.unwrap();
    let _records = InstanceRecords::connect(&url).await.unwrap();
    assert_eq!(names(&db).await, vec!["replication-manager-7"; 3]);
}
