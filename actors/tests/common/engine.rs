//! The change log on either engine for the tests of PROTOCOL.md §3.0 (`open_txn_pending.rs`,
//! `open_txn_streamer.rs`): opened and reopened as a restart would, its pending rows counted from
//! the database itself, and transactions of numbered rows checked whole.

use std::time::Duration;

use change_streamer_actors::changelog::{
    ChangeKind, ChangeLog, PgOptions, StoredChange, Transaction,
};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::pg::TestDb;

use super::w;

/// A change log on one engine, reopened as a restart would.
pub enum Engine {
    Sqlite(tempfile::TempDir),
    Pg(TestDb),
}

impl Engine {
    pub fn sqlite() -> Engine {
        Engine::Sqlite(tempfile::tempdir().unwrap())
    }

    pub async fn pg(tag: &str) -> Engine {
        Engine::Pg(TestDb::create(tag).await)
    }

    pub async fn open(&self) -> ChangeLog {
        match self {
            Engine::Sqlite(dir) => ChangeLog::open_with(dir.path(), 50, Clock::System).unwrap(),
            Engine::Pg(db) => ChangeLog::open_postgres(PgOptions {
                url: db.url.clone(),
                takeover_interval: Duration::from_millis(100),
                segment_rows: 50,
                clock: Clock::System,
                instance: None,
            })
            .await
            .unwrap(),
        }
    }

    /// The pending rows stored, read from the database itself.
    pub async fn pending_rows(&self) -> i64 {
        match self {
            Engine::Sqlite(dir) => {
                let c = rusqlite::Connection::open(dir.path().join("change-log.db")).unwrap();
                c.query_row("SELECT COUNT(*) FROM pending_txn", [], |r| r.get(0))
                    .unwrap()
            }
            Engine::Pg(db) => db
                .connect()
                .await
                .query_one("SELECT count(*) FROM change_streamer.pending_txn", &[])
                .await
                .unwrap()
                .get(0),
        }
    }
}

pub fn row(i: i64) -> String {
    format!(r#"{{"tag":"insert","i":{i},"pad":"{}"}}"#, "x".repeat(100))
}

pub fn whole(n: u64, rows: i64) -> Transaction {
    let mut changes = vec![(ChangeKind::Begin, r#"{"tag":"begin"}"#.to_string())];
    changes.extend((0..rows).map(|i| (ChangeKind::Data, row(i))));
    changes.push((ChangeKind::Commit, r#"{"tag":"commit"}"#.to_string()));
    Transaction {
        watermark: w(n),
        pending: 0,
        changes,
    }
}

/// Asserts no read sees anything of transaction 101, still open. Each read starts at a
/// position of its own: the PostgreSQL reader keeps its reads and answers one with the same
/// start from memory, as catch-ups are only asked up to durable commits (`read_cache.rs`).
pub async fn assert_none_visible(log: &ChangeLog) {
    use std::sync::atomic::{AtomicI64, Ordering};
    static AFTER: AtomicI64 = AtomicI64::new(1_000_000);
    let after = (w(100), AFTER.fetch_add(1, Ordering::SeqCst));
    let rows = log.read(after, w(u64::MAX >> 1), 100_000).await.unwrap();
    assert!(rows.is_empty(), "no pending row read: {rows:?}");
}

pub async fn read_all(log: &ChangeLog, up_to: u64) -> Vec<StoredChange> {
    log.read((Watermark::from_u64(0), -1), w(up_to), 100_000)
        .await
        .unwrap()
}

/// Asserts `rows` hold transaction `n` whole, once, in order: `pos` 0.., its data `0..count`.
pub fn assert_whole(rows: &[StoredChange], n: u64, count: i64) {
    let of: Vec<&StoredChange> = rows.iter().filter(|r| r.watermark == w(n)).collect();
    assert_eq!(
        of.len() as i64,
        count + 2,
        "transaction {n} stored whole, once"
    );
    for (p, r) in of.iter().enumerate() {
        assert_eq!(r.pos, p as i64, "positions in order");
    }
    assert_eq!(of[0].kind, ChangeKind::Begin);
    assert_eq!(of[of.len() - 1].kind, ChangeKind::Commit);
    for i in 0..count {
        assert_eq!(
            &*of[1 + i as usize].json,
            row(i).as_str(),
            "data {i} as sent"
        );
    }
}
