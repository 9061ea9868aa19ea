//! The README's first command, `cargo run --release --example demo`, shows the whole pipeline:
//! run it (debug build) for a bounded time and check that its summary, taken from the
//! service's own `/status` and `/metrics`, shows every part working: transactions stored,
//! replicas that restored and subscribed, cleanups scheduled from litestream's reports, rows
//! purged, the stalled replica released by consensus and then dropped.

use std::process::Command;

use change_streamer_test_support::example_bin;

#[test]
fn demo_shows_the_whole_pipeline_and_ends_cleanly() {
    let out = Command::new(example_bin("demo"))
        .args(["--seconds", "15"])
        .output()
        .expect("run demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("warming up ["), "{stdout}");
    let summary = stdout
        .lines()
        .find_map(|l| l.strip_prefix("summary: "))
        .unwrap_or_else(|| panic!("no summary line:\n{stdout}"));
    let s: serde_json::Value = serde_json::from_str(summary).expect("summary is JSON");
    let num = |k: &str| s[k].as_f64().unwrap_or(0.0);
    assert!(num("transactionsStored") > 500.0, "{s}");
    assert!(num("cleanupsScheduled") >= 1.0, "{s}");
    assert!(num("rowsPurged") > 0.0, "{s}");
    assert!(
        num("releasesConsensus") >= 1.0,
        "the stalled replica should have been left behind by consensus: {s}"
    );
    assert_eq!(
        num("subscribersAtEnd"),
        4.0,
        "three replicas and the backup remain, the stalled one was dropped: {s}"
    );
    assert!(num("cleanupDelayMs") >= 3000.0, "{s}");
}
