//! Unit tests of the change log, through its handle: storage, segments, purges, store times,
//! the safety state and the size on disk. Most run against both engines: SQLite in a
//! temporary directory, and PostgreSQL in a database of its own (see `test-support/src/pg.rs`).

use std::time::Duration;

use change_streamer_test_support::pg::TestDb;

use super::*;

mod commit_window;
mod disk_bytes;
mod layouts; // SQLite only
mod pg_layouts; // PostgreSQL only
mod pg_names; // PostgreSQL only
mod retention;
mod safety_state;
mod storage;

/// Where a test's change log lives.
enum Store {
    Sqlite(tempfile::TempDir),
    Postgres(TestDb),
}

impl Store {
    async fn open_with(&self, segment_rows: u64, clock: Clock) -> ChangeLog {
        match self {
            Store::Sqlite(dir) => ChangeLog::open_with(dir.path(), segment_rows, clock).unwrap(),
            Store::Postgres(db) => ChangeLog::open_postgres(PgOptions {
                url: db.url.clone(),
                takeover_interval: Duration::from_millis(50),
                segment_rows,
                clock,
                instance: None,
            })
            .await
            .unwrap(),
        }
    }

    async fn open(&self) -> ChangeLog {
        self.open_with(SEGMENT_ROWS, Clock::System).await
    }
}

/// Runs each named test (of the module it is used in) once on SQLite and once on PostgreSQL.
macro_rules! on_both_engines {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[actix_rt::test]
            async fn sqlite() {
                super::$name(super::Store::Sqlite(tempfile::tempdir().unwrap())).await
            }
            #[actix_rt::test]
            async fn postgres() {
                let db = super::TestDb::create(stringify!($name)).await;
                super::$name(super::Store::Postgres(db)).await
            }
        }
    )*};
}
use on_both_engines;

/// A transaction at watermark `n`: begin, `rows` inserts, commit.
fn txn(n: u64, rows: usize) -> Transaction {
    let mut changes = vec![(ChangeKind::Begin, r#"{"tag":"begin"}"#.to_string())];
    for i in 0..rows {
        changes.push((
            ChangeKind::Data,
            format!(r#"{{"tag":"insert","n":{n},"i":{i}}}"#),
        ));
    }
    changes.push((ChangeKind::Commit, r#"{"tag":"commit"}"#.to_string()));
    Transaction {
        watermark: Watermark::from_u64(n),
        changes,
    }
}

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}
