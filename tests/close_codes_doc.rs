//! PROTOCOL.md §5's close-code table checked against the codes the service can send, both ways
//! (issue 29): every close of a client's websocket is a `SessionEnd` (`session_end.rs` writes
//! each code and reason in one place), so each of its kinds must have its code in the table, and
//! each fixed reason must stand there as written; each code of the table must be one a kind
//! sends. A new kind of close fails to compile here until it is listed, and fails the test until
//! the document has it.

use std::collections::BTreeSet;

use change_streamer_actors::session_end::SessionEnd;

/// One of every kind of close, the ones with a free-form reason given a sample.
fn every_end() -> Vec<SessionEnd> {
    let all = vec![
        SessionEnd::Replaced,
        SessionEnd::BackupReplaced,
        SessionEnd::EndedBySubscription,
        SessionEnd::ErrorAcked,
        SessionEnd::ErrorNotAcked,
        SessionEnd::ServiceStop,
        SessionEnd::NoPong(30_000),
        SessionEnd::Protocol("sample".into()),
        SessionEnd::Unavailable("sample".into()),
        SessionEnd::Evicted("sample".into()),
    ];
    // Exhaustive, without a wildcard: a kind added to `SessionEnd` stops this file compiling
    // until it is in the list above.
    for end in &all {
        match end {
            SessionEnd::Replaced
            | SessionEnd::BackupReplaced
            | SessionEnd::EndedBySubscription
            | SessionEnd::ErrorAcked
            | SessionEnd::ErrorNotAcked
            | SessionEnd::ServiceStop
            | SessionEnd::NoPong(_)
            | SessionEnd::Protocol(_)
            | SessionEnd::Unavailable(_)
            | SessionEnd::Evicted(_) => {}
        }
    }
    all
}

/// Whether the reason of `end` is one the service writes as it is (not the sample given).
fn fixed_reason(end: &SessionEnd) -> bool {
    !matches!(
        end,
        SessionEnd::Protocol(_) | SessionEnd::Unavailable(_) | SessionEnd::Evicted(_)
    )
}

/// The rows of §5's close-code table: the code and the row's text.
fn table() -> Vec<(u16, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PROTOCOL.md");
    let doc = std::fs::read_to_string(path).expect("read docs/PROTOCOL.md");
    let section = doc
        .split("**Close codes.**")
        .nth(1)
        .expect("PROTOCOL.md §5 has its close-code table");
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let code = l.trim_start_matches('|').split('|').next()?.trim();
            Some((code.parse().ok()?, l.to_string()))
        })
        .collect()
}

#[test]
fn close_code_table_matches_the_closes_the_service_sends() {
    let table = table();
    assert!(table.len() >= 5, "{table:?}");
    let documented: BTreeSet<u16> = table.iter().map(|(c, _)| *c).collect();
    let mut sent = BTreeSet::new();
    for end in every_end() {
        let (code, reason) = end.close_frame();
        sent.insert(code);
        let Some((_, row)) = table.iter().find(|(c, _)| *c == code) else {
            panic!("{end:?} closes with {code}, which PROTOCOL.md §5's table lacks");
        };
        if fixed_reason(&end) {
            assert!(
                row.contains(&format!("`{reason}`")),
                "{end:?}: the reason `{reason}` is not in §5's row for {code}: {row}"
            );
        }
    }
    assert_eq!(
        documented, sent,
        "codes in PROTOCOL.md §5's table against codes the service sends"
    );
}
