//! The size on disk each engine reports for `change_streamer_change_log_bytes` (PROTOCOL.md
//! §11): the SQLite file and its WAL, PostgreSQL's tables in the change DB's schema.

use super::*;

on_both_engines!(disk_bytes_grow_when_rows_are_stored);

async fn disk_bytes_grow_when_rows_are_stored(store: Store) {
    let log = store.open().await;
    let empty = log.disk_bytes().await.unwrap();
    for n in 1..=200 {
        log.append(txn(n, 20)).await.unwrap();
    }
    let stored = log.disk_bytes().await.unwrap();
    assert!(
        stored > empty,
        "{stored} bytes after 4,400 rows, {empty} before"
    );
    // 4,400 rows of about 40 bytes of JSON each take at least that much room.
    assert!(stored > 4_400 * 40, "only {stored} bytes for 4,400 rows");
}
