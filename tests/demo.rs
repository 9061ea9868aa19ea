//! The README's first command, `cargo run --release --example demo`, shows the whole pipeline:
//! run it (debug build) for a bounded time and check that its summary, taken from the
//! service's own `/status` and `/metrics`, shows every part working: transactions stored,
//! replicas that restored and subscribed, cleanups scheduled from litestream's reports, rows
//! purged, the stalled replica released by consensus and then dropped. With `--change-db` it
//! runs three instances on one PostgreSQL change DB with two subscribers at each and kills the
//! owner: the summary shows one takeover within the bound, the killed instance back as a
//! standby, no subscriber of the surviving instances dropped, the dead owner's subscribed again
//! elsewhere, and everyone going on with no gap and no commit twice.

use std::process::Command;

use change_streamer_test_support::example_bin;

#[test]
fn demo_shows_the_whole_pipeline_and_ends_cleanly() {
    let (stdout, s) = run_demo(&["--seconds", "15"]);
    assert!(stdout.contains("warming up ["), "{stdout}");
    // Every client of the demo presents the secret generated for the run, and the legend says so.
    assert!(
        stdout.contains("asks every client for a secret generated for this run"),
        "{stdout}"
    );
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
    // With stock litestream installed (`.ci/run` installs it), the backup is confirmed through
    // litestream's control API, reading nothing of the backup (PROTOCOL.md §8.1c); the
    // cleanups scheduled above came from those confirmations.
    let expected = match change_streamer_test_support::stock_litestream::installed() {
        Some(_) => "control",
        None => "metrics",
    };
    assert_eq!(s["backupSource"], expected, "{s}");
    if expected == "control" {
        assert_eq!(num("backupReads"), 0.0, "{s}");
        assert!(stdout.contains("backup via control: confirmed"), "{stdout}");
    }
    // With moto installed too, the backup is in a bucket of a local S3 server (issue 44).
    if expected == "control" && change_streamer_test_support::s3::installed().is_some() {
        assert!(
            stdout.contains("the backup goes to s3://demo/replica?endpoint=http://127.0.0.1:"),
            "{stdout}"
        );
    }
}

#[actix_rt::test]
async fn the_postgres_demo_shows_a_takeover_with_no_gap() {
    let db = change_streamer_test_support::pg::TestDb::create("demo").await;
    let (stdout, s) = run_demo(&[
        "--change-db",
        &db.url,
        "--kill-after",
        "4",
        "--seconds",
        "12",
    ]);
    assert!(stdout.contains("kill -9 of "), "{stdout}");
    assert!(
        stdout.contains("ask every client for a secret generated for this run"),
        "{stdout}"
    );
    let takeovers = s["takeoverMs"].as_array().expect("takeoverMs");
    assert_eq!(takeovers.len(), 1, "{stdout}");
    // --takeover-interval-ms (200) + 1 s after PostgreSQL noticed; it notices a killed
    // process's connection at once.
    assert!(takeovers[0].as_u64() < Some(1200), "{stdout}");
    let killed = s["killed"].as_array().expect("killed");
    assert_eq!(killed.len(), 1, "{stdout}");
    let killed = &killed[0];
    assert!(s["owner"].is_string() && s["owner"] != *killed, "{stdout}");
    // The killed instance came back, as a standby; the others are still up.
    let roles = s["rolesAtEnd"].as_object().expect("rolesAtEnd");
    assert_eq!(roles.len(), 3, "{stdout}");
    assert_eq!(roles[killed.as_str().unwrap()], "standby", "{stdout}");
    assert_eq!(roles[s["owner"].as_str().unwrap()], "owner", "{stdout}");
    let subs = s["subscribers"].as_array().expect("subscribers");
    assert_eq!(subs.len(), 6, "two at each instance: {stdout}");
    let mut moved = 0;
    for sub in subs {
        assert_eq!(sub["gaps"], 0, "{sub}: {stdout}");
        assert_eq!(sub["repeats"], 0, "{sub}: {stdout}");
        let on = sub["on"].as_array().expect("on");
        if on[0] == *killed {
            // The dead owner's subscriber was dropped once and went on at a live instance.
            moved += 1;
            assert_eq!(sub["drops"], 1, "{sub}: {stdout}");
            assert_eq!(on.len(), 2, "{sub}: {stdout}");
            assert_ne!(on[1], *killed, "{sub}: {stdout}");
        } else {
            // A standby's subscriber (the new owner's too) is never dropped.
            assert_eq!(sub["drops"], 0, "{sub}: {stdout}");
            assert_eq!(on.len(), 1, "{sub}: {stdout}");
        }
        assert!(sub["commits"].as_u64() > Some(500), "{sub}: {stdout}");
        // Commits went on flowing after the takeover, to every subscriber.
        assert!(sub["afterTakeover"].as_u64() > Some(300), "{sub}: {stdout}");
    }
    assert_eq!(moved, 2, "the killed owner had two subscribers: {stdout}");
}

/// Runs the demo with `args` to its end; its output and the JSON of its `summary:` line.
fn run_demo(args: &[&str]) -> (String, serde_json::Value) {
    let out = Command::new(example_bin("demo"))
        .args(args)
        .output()
        .expect("run demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = stdout
        .lines()
        .find_map(|l| l.strip_prefix("summary: "))
        .unwrap_or_else(|| panic!("no summary line:\n{stdout}"));
    let s = serde_json::from_str(summary).expect("summary is JSON");
    (stdout, s)
}

/// The demo's `backup via SOURCE:` lines (issue 45): the watermark each backup holds, read from
/// `/status`'s typed `backups[]`, with the metrics source as with the control source (which reads
/// `backup.monitor.backupWatermark` only on some sources, and showed `confirmed -` for a whole
/// run with metrics). The shown watermarks are real ones, they move on, and the last is at most
/// the one the summary reads at the end.
#[test]
fn the_demo_shows_the_confirmed_watermark_with_either_backup_source() {
    // The control source needs stock litestream (installed as the other litestream tests do).
    change_streamer_test_support::stock_litestream::install();
    for source in ["metrics", "control"] {
        let (stdout, s) = run_demo(&["--seconds", "10", "--backup-source", source]);
        assert_eq!(s["backupSource"], source, "{s}");
        let prefix = format!("backup via {source}: confirmed ");
        let shown: Vec<String> = stdout
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix(&prefix))
            .filter_map(|rest| {
                let (w, tail) = rest.split_once(' ')?;
                tail.starts_with("(backup, ").then(|| w.to_string())
            })
            .collect();
        assert!(shown.len() >= 2, "{source}: {stdout}");
        for w in &shown {
            change_streamer_actors::watermark::Watermark::parse(w)
                .unwrap_or_else(|e| panic!("{source}: {w} is not a watermark ({e}): {stdout}"));
        }
        assert!(
            shown.first() < shown.last(),
            "{source}: the confirmed watermark never moved: {stdout}"
        );
        let last = s["backupConfirmed"][0].as_str().expect("backupConfirmed");
        assert!(
            shown.last().map(String::as_str) <= Some(last),
            "{source}: {s}"
        );
    }
}
