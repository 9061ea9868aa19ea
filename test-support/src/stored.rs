//! Change-log transactions made up for measurements and tests that fill a change log directly:
//! a begin, copies of one data change, a commit.

use change_streamer_actors::changelog::{ChangeKind, Transaction};
use change_streamer_actors::watermark::Watermark;

/// An insert into `public.items` whose value is `value_bytes` bytes (with 80: ~130 bytes of JSON,
/// the rows of the benchmarks' workloads).
pub fn insert_row(value_bytes: usize) -> String {
    format!(
        r#"{{"tag":"insert","relation":{{"schema":"public","name":"items","keyColumns":["id"]}},"new":{{"id":1,"v":"{}"}}}}"#,
        "x".repeat(value_bytes)
    )
}

/// The transaction committed at watermark `n`: begin, `rows` copies of `row`, commit.
pub fn stored_txn(n: u64, row: &str, rows: usize) -> Transaction {
    Transaction {
        watermark: Watermark::from_u64(n),
        pending: 0,
        changes: std::iter::once((ChangeKind::Begin, r#"{"tag":"begin"}"#.to_string()))
            .chain(std::iter::repeat_n(
                (ChangeKind::Data, row.to_string()),
                rows,
            ))
            .chain(std::iter::once((
                ChangeKind::Commit,
                r#"{"tag":"commit"}"#.to_string(),
            )))
            .collect(),
    }
}
