//! Differential replay of the seed's backup-monitor scenarios: every scenario in
//! `test-support/fixtures/scenarios/` (01 to 08 vendored from `shared/peer/scenarios/`; 09, a
//! reservation failed by the change log's error, written here and recorded with the peer's
//! `backup-monitor-replay.mjs`) is replayed by
//! `examples/replay.rs` against the real actors, and its output must equal the scenario's
//! `*.expected.jsonl` (recorded from the original implementation) line for line. Where node and
//! the peer harness are there, the original is also run live on the same scenarios and must
//! agree; elsewhere that test says what is missing and skips (fails with
//! `CHANGE_STREAMER_REQUIRE_PEER=1`).
//!
//! No scenario here needs an exception: the shared ones only exercise behaviour where our protocol and
//! the original agree. (Where they differ, on malformed litestream samples, PROTOCOL.md §8.2 governs
//! and `actors/src/litestream.rs` tests it.)

use std::path::{Path, PathBuf};
use std::process::Command;

use change_streamer_test_support::fixtures::{scenarios as vendored, scenarios_dir};
use change_streamer_test_support::{example_bin, installed_peer};

fn scenarios() -> Vec<PathBuf> {
    let files = vendored();
    assert!(
        files.len() >= 8,
        "expected the eight shared scenarios in {}",
        scenarios_dir().display()
    );
    files
}

fn ours(scenario: &Path) -> String {
    let out = Command::new(example_bin("replay"))
        .arg(scenario)
        .output()
        .expect("run replay");
    assert!(
        out.status.success(),
        "replay {} failed: {}",
        scenario.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn every_shared_scenario_matches_the_recorded_original() {
    let mut failures = Vec::new();
    for s in scenarios() {
        let expected =
            std::fs::read_to_string(s.with_extension("expected.jsonl")).expect("expected output");
        let got = ours(&s);
        if got.trim_end() != expected.trim_end() {
            failures.push(format!(
                "{}:\n--- expected\n{expected}\n--- ours\n{got}",
                s.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_shared_scenario_matches_the_live_original() {
    let Some((_tmp, peer)) = installed_peer() else {
        return;
    };
    for s in scenarios() {
        let out = Command::new("node")
            .arg("backup-monitor-replay.mjs")
            .arg(&s)
            .current_dir(&peer)
            .output()
            .expect("run the peer");
        assert!(
            out.status.success(),
            "peer failed on {}: {}",
            s.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs = String::from_utf8(out.stdout).expect("utf-8");
        assert_eq!(ours(&s).trim_end(), theirs.trim_end(), "{}", s.display());
    }
}
