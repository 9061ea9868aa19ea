//! A change as it travels to subscribers: its transaction's commit watermark, its position in
//! the transaction, its kind, and the downstream message text, built once and shared by every
//! subscriber (`Arc`).
//!
//! Downstream messages (PROTOCOL.md §7) have the upstream's shape: `["begin", B, {"commitWatermark":W}]`,
//! `["data", D]`, `["commit", C, {"watermark":W}]`, `["rollback", R]`. `B`, `D`, `C`, `R` are the
//! payload texts exactly as the change source sent them (and as the change log stores them).

use std::sync::Arc;

use crate::changelog::{ChangeKind, StoredChange};
use crate::watermark::Watermark;

/// The kind of a downstream change message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Begin,
    Data,
    Commit,
    Rollback,
}

/// One change on its way to subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The commit watermark of the change's transaction.
    pub(super) watermark: Watermark,
    /// Its index in the transaction (`begin` is 0), as stored in the change log: where a
    /// catch-up resumes when a subscriber stopped receiving in the middle of the transaction.
    pub(super) pos: i64,
    pub(super) kind: Kind,
    /// `["data", {...}]` etc.
    pub(super) message: Arc<str>,
    /// Bytes of payload, for flow control's "about every 64 KiB".
    pub(super) payload_len: usize,
    /// `update-table-metadata`, which protocol < 5 does not know.
    pub(super) needs_v5: bool,
}

/// The tag that protocol < 5 subscribers must not receive.
pub const V5_ONLY_TAG: &str = "update-table-metadata";

/// Whether a payload's `tag` is [`V5_ONLY_TAG`]; cheap for every other payload.
pub fn is_v5_only(payload: &str) -> bool {
    if !payload.contains(V5_ONLY_TAG) {
        return false;
    }
    #[derive(serde::Deserialize)]
    struct Tagged {
        tag: Option<String>,
    }
    serde_json::from_str::<Tagged>(payload)
        .ok()
        .and_then(|t| t.tag)
        .is_some_and(|t| t == V5_ONLY_TAG)
}

impl Change {
    pub fn new(kind: Kind, watermark: Watermark, pos: i64, payload: &str) -> Change {
        let w = watermark.as_str();
        let message = match kind {
            Kind::Begin => format!(r#"["begin",{payload},{{"commitWatermark":"{w}"}}]"#),
            Kind::Data => format!(r#"["data",{payload}]"#),
            Kind::Commit => format!(r#"["commit",{payload},{{"watermark":"{w}"}}]"#),
            Kind::Rollback => format!(r#"["rollback",{payload}]"#),
        };
        Change {
            needs_v5: kind == Kind::Data && is_v5_only(payload),
            watermark,
            pos,
            kind,
            message: Arc::from(message),
            payload_len: payload.len(),
        }
    }

    pub fn from_stored(s: &StoredChange) -> Change {
        let kind = match s.kind {
            ChangeKind::Begin => Kind::Begin,
            ChangeKind::Data => Kind::Data,
            ChangeKind::Commit => Kind::Commit,
        };
        Change::new(kind, s.watermark.clone(), s.pos, &s.json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_downstream_messages() {
        let w = Watermark::parse("0a").unwrap();
        assert_eq!(
            &*Change::new(Kind::Begin, w.clone(), 0, r#"{"tag":"begin"}"#).message,
            r#"["begin",{"tag":"begin"},{"commitWatermark":"0a"}]"#
        );
        assert_eq!(
            &*Change::new(Kind::Commit, w.clone(), 1, r#"{"tag":"commit"}"#).message,
            r#"["commit",{"tag":"commit"},{"watermark":"0a"}]"#
        );
        let d = Change::new(
            Kind::Data,
            w,
            1,
            r#"{"tag":"insert","n":12345678901234567890}"#,
        );
        assert_eq!(
            &*d.message,
            r#"["data",{"tag":"insert","n":12345678901234567890}]"#
        );
        assert!(!d.needs_v5);
    }

    #[test]
    fn spots_update_table_metadata() {
        assert!(is_v5_only(r#"{"tag":"update-table-metadata","table":{}}"#));
        assert!(!is_v5_only(
            r#"{"tag":"insert","new":{"s":"update-table-metadata"}}"#
        ));
    }
}
