//! The SQLite engine's layouts of a segment table (`segments.layout`).
//!
//! A segment of this build holds a row per transaction, its value packed
//! ([`Layout::RowPerTransactionLz4`]; the value and why a row per transaction:
//! `changelog/txn_value.rs`). The table is a rowid table, appended at its right edge (SQLite's
//! cheap page split for that case), with a unique index on `(watermark, first_pos)` for reads
//! and purges.
//!
//! Segments written by earlier builds keep their layout, a row per change or transaction rows
//! with plain values, until they are purged: the catalogue says which layout each segment has,
//! and the reader and writer read each in its own way. The writer never appends to an older
//! segment: the first append after an upgrade opens a new one.

use super::types::ChangeLogError;

/// How a segment table holds its changes (`segments.layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// `(watermark, pos, kind, change, stored_ms)`, keyed by `(watermark, pos)`: builds before
    /// transaction rows.
    RowPerChange = 0,
    /// `(watermark, changes, body, stored_ms)`, one row per transaction (`txn_value::encode`): builds
    /// from transaction rows to packed values.
    RowPerTransaction = 1,
    /// The same table, each `body` packed (`txn_value::pack`): what this build writes.
    RowPerTransactionLz4 = 2,
}

/// The layout of every segment this build opens.
pub(super) const CURRENT: Layout = Layout::RowPerTransactionLz4;

impl Layout {
    pub(super) fn from_column(n: i64) -> Result<Layout, ChangeLogError> {
        match n {
            0 => Ok(Layout::RowPerChange),
            1 => Ok(Layout::RowPerTransaction),
            2 => Ok(Layout::RowPerTransactionLz4),
            n => Err(ChangeLogError::Corrupt(format!("segment layout {n}"))),
        }
    }
}
