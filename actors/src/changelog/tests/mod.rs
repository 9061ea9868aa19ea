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
        pending: 0,
        changes,
    }
}

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

/// A read's byte limit ([`ChangeLog::read_within`]) on a log holding transactions 1, 3, 4, 5
/// and 7 of three changes each, 1 and 3 in an older layout than the rest (`all`, every change
/// read without a limit): the change that reaches the limit is the last, across the layouts
/// too, and a limit of one byte still reads one change.
async fn reads_stop_at_their_byte_limit(log: &ChangeLog, all: &[StoredChange]) {
    let w = Watermark::from_u64;
    let at = |rows: &[StoredChange]| -> Vec<(Watermark, i64)> {
        rows.iter().map(|r| (r.watermark.clone(), r.pos)).collect()
    };
    let size: Vec<usize> = all.iter().map(StoredChange::message_len).collect();
    let five: usize = size[..5].iter().sum();
    for (limit, want) in [(five, 5), (five + 1, 6), (five - 1, 5)] {
        let cut = log
            .read_within((w(0), i64::MAX), w(7), 100, limit)
            .await
            .unwrap();
        assert_eq!(at(&cut), at(&all[..want]), "{limit} bytes");
    }
    // From inside 3 (older layout) into 4 (transaction rows).
    let limit = size[4] + size[5] + size[6] + 1;
    let across = log.read_within((w(3), 0), w(7), 100, limit).await.unwrap();
    assert_eq!(at(&across), at(&all[4..8]));
    let one = log.read_within((w(4), 1), w(7), 100, 1).await.unwrap();
    assert_eq!(at(&one), at(&all[8..9]));
    // The limit in changes still holds.
    let two = log
        .read_within((w(0), i64::MAX), w(7), 2, usize::MAX)
        .await
        .unwrap();
    assert_eq!(at(&two), at(&all[..2]));
}
