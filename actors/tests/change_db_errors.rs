//! Which failures of the PostgreSQL change DB are "the change DB out of reach" (PROTOCOL.md
//! §14.2, "An outage is one event in the log"): said once per outage, against real failures
//! of a real server. Anything else is a fault said each time (`unreachable.rs` tests how each
//! is said).

use std::sync::Arc;

use change_streamer_actors::changelog::ChangeLogError;
use change_streamer_test_support::pg::TestDb;
use tokio_postgres::NoTls;

fn said(e: tokio_postgres::Error) -> ChangeLogError {
    ChangeLogError::Postgres(e)
}

#[tokio::test]
async fn a_query_the_server_refuses_is_not_the_change_db_out_of_reach() {
    let db = TestDb::create("errq").await;
    let client = db.connect().await;
    let division = client.query("SELECT 1/0", &[]).await.unwrap_err();
    assert_eq!(division.code().map(|c| c.code()), Some("22012"));
    assert!(!said(division).is_unreachable());
    let missing = client
        .query("SELECT * FROM no_such_table", &[])
        .await
        .unwrap_err();
    assert!(!said(missing).is_unreachable());
    // A value that does not convert: the client's own fault, no I/O.
    let row = client.query_one("SELECT 'text'::text", &[]).await.unwrap();
    let wrong = row.try_get::<_, i64>(0).unwrap_err();
    assert!(!said(wrong).is_unreachable());
    // The connection is still fine after all of them.
    client.query_one("SELECT 1", &[]).await.unwrap();
}

#[tokio::test]
async fn an_ended_session_is_the_change_db_out_of_reach() {
    let db = TestDb::create("errt").await;
    let client = db.connect().await;
    let admin = db.connect().await;
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    // The first query after the end sees the server's 57P01 or the closed socket, whichever
    // the client reads first; both are the change DB out of reach, and so is every later one.
    for _ in 0..2 {
        let e = client.query_one("SELECT 1", &[]).await.unwrap_err();
        let text = e.to_string();
        let code = e.code().map(|c| c.code().to_string());
        let e = said(e);
        assert!(e.is_unreachable(), "{text} ({code:?}): {e}");
        let write = ChangeLogError::Write(Arc::new(e));
        assert!(write.is_unreachable(), "a write failure is as its cause");
    }
}

#[tokio::test]
async fn a_refused_connection_is_the_change_db_out_of_reach() {
    // A port nothing listens on: taken, then freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let e = tokio_postgres::connect(&url, NoTls).await.err().unwrap();
    assert!(said(e).is_unreachable());
    // Not everything at connect time is: a database that does not exist (3D000) is the
    // configuration's fault, said each time.
    let db = TestDb::create("errc").await;
    let missing = format!("{}_missing", db.url);
    let e = tokio_postgres::connect(&missing, NoTls)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code().map(|c| c.code()), Some("3D000"));
    assert!(!said(e).is_unreachable());
}
