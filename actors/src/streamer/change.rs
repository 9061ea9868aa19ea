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

thread_local! {
    /// Where [`shared_concat`] puts a message together before its one shared copy.
    static SCRATCH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// The most [`SCRATCH`] keeps between messages.
const SCRATCH_KEPT: usize = 64 * 1024;

/// `parts` joined, as one `Arc<str>`.
///
/// Why: every change's message is built once per change live, and once per change and
/// subscriber in a catch-up, so its cost is per delivery there. `format!` and then
/// `Arc::from` allocate twice and copy twice (once through the formatting machinery); joining
/// into a buffer this thread keeps allocates only the shared copy.
fn shared_concat(parts: &[&str]) -> Arc<str> {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            parts.iter().for_each(|p| buf.push_str(p));
            let message = Arc::from(buf.as_str());
            if buf.capacity() > SCRATCH_KEPT {
                // One large change must not keep its size in memory for good.
                *buf = String::new();
            }
            message
        }
        // Not reached (nothing here calls itself); joined without the buffer all the same.
        Err(_) => Arc::from(parts.concat()),
    })
}

impl Change {
    pub fn new(kind: Kind, watermark: Watermark, pos: i64, payload: &str) -> Change {
        let w = watermark.as_str();
        let parts = match kind {
            Kind::Begin => [
                r#"["begin","#,
                payload,
                r#",{"commitWatermark":""#,
                w,
                r#""}]"#,
            ],
            Kind::Data => [r#"["data","#, payload, "]", "", ""],
            Kind::Commit => [r#"["commit","#, payload, r#",{"watermark":""#, w, r#""}]"#],
            Kind::Rollback => [r#"["rollback","#, payload, "]", "", ""],
        };
        Change {
            needs_v5: kind == Kind::Data && is_v5_only(payload),
            message: shared_concat(&parts),
            watermark,
            pos,
            kind,
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
    fn builds_a_rollback_and_reuses_its_buffer_for_shorter_and_larger_messages() {
        let w = Watermark::parse("0b").unwrap();
        let long = format!(r#"{{"tag":"insert","s":"{}"}}"#, "y".repeat(100));
        let d = Change::new(Kind::Data, w.clone(), 1, &long);
        assert_eq!(&*d.message, format!(r#"["data",{long}]"#));
        // Shorter than the one before it: nothing of the longer one is left over.
        let r = Change::new(Kind::Rollback, w.clone(), 0, r#"{"tag":"rollback"}"#);
        assert_eq!(&*r.message, r#"["rollback",{"tag":"rollback"}]"#);
        // Larger than the buffer keeps: built whole, and the next one still right.
        let huge = format!(r#"{{"s":"{}"}}"#, "z".repeat(2 * SCRATCH_KEPT));
        let h = Change::new(Kind::Commit, w.clone(), 2, &huge);
        assert_eq!(
            &*h.message,
            format!(r#"["commit",{huge},{{"watermark":"0b"}}]"#)
        );
        let b = Change::new(Kind::Begin, w, 0, "{}");
        assert_eq!(&*b.message, r#"["begin",{},{"commitWatermark":"0b"}]"#);
        SCRATCH.with(|s| assert!(s.borrow().capacity() <= SCRATCH_KEPT));
    }

    #[test]
    fn a_stored_change_knows_the_length_of_its_message() {
        use crate::changelog::ChangeKind;
        for (kind, w) in [
            (ChangeKind::Begin, 10),
            (ChangeKind::Data, 11),
            (ChangeKind::Commit, 123_456_789_012),
        ] {
            let s = StoredChange {
                watermark: Watermark::from_u64(w),
                pos: 3,
                kind,
                json: r#"{"tag":"x","s":"é"}"#.into(),
            };
            assert_eq!(
                Change::from_stored(&s).message.len(),
                s.message_len(),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn spots_update_table_metadata() {
        assert!(is_v5_only(r#"{"tag":"update-table-metadata","table":{}}"#));
        assert!(!is_v5_only(
            r#"{"tag":"insert","new":{"s":"update-table-metadata"}}"#
        ));
    }
}
