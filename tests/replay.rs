//! Differential replay of the seed's backup-monitor scenarios: every scenario in
//! `../shared/peer/scenarios/` is replayed by `examples/replay.rs` against the real actors, and
//! its output must equal the scenario's `*.expected.jsonl` (recorded from the original
//! implementation) line for line. Where node is installed, the original is also run live on the
//! same scenarios and must agree.
//!
//! No scenario here needs an exception: the shared ones only exercise behaviour where SPEC and
//! the original agree. (Where they differ, on malformed litestream samples, SPEC §8.2 governs
//! and `actors/src/litestream.rs` tests it.)

mod support;

use std::path::PathBuf;
use std::process::Command;

fn scenarios() -> Vec<PathBuf> {
    let dir = support::shared_dir().join("peer").join("scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 8,
        "expected the eight shared scenarios in {}",
        dir.display()
    );
    files
}

fn ours(scenario: &PathBuf) -> String {
    let out = Command::new(support::example_bin("replay"))
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
    let Some((_tmp, peer)) = support::installed_peer() else {
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
