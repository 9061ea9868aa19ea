//! End to end with REAL stock litestream 0.5.17: several backups and a quorum before any purge
//! (PROTOCOL.md §7.1, §8.4). The service runs with `--backups FILE` listing three backups
//! (`a`, `b`, `c`), each asked through its own litestream's control socket (§8.1c), and
//! `--purge-quorum 2`. Each backup has its own backup replicator (`mode=backup&backup=NAME`)
//! following the service into its own SQLite file, which its own `litestream replicate` backs
//! up to its own `file://` replica with an hourly sync interval, so that whatever a backup
//! holds within the test was synced because the service asked that backup's litestream.
//! Backup `c` then wedges (its litestream stopped): the purge still progresses with `a` and
//! `b`, `c` says why in `/status` `backups[]`, and a restore from either healthy backup catches
//! up from the change log with no gap. The `s3_` variant keeps each backup in a bucket of a local
//! S3 server of its own (issue 44), and backup `c` wedges by its server being stopped.

use std::collections::BTreeSet;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_files::{Store, ASKED_AND_PURGED_AT_ONCE};
use change_streamer_test_support::backup_replica::read_replica;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream_world::{Backup, LitestreamWorld, Source, ROWS};
use change_streamer_test_support::service::TestService;
use serde_json::{json, Value};

const NAMES: [&str; 3] = ["a", "b", "c"];

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The service with three backups and a quorum of two, fed by a fake change source.
type Quorum = LitestreamWorld<TestService>;

/// Each backup in its own folder under the test's, replicated to `store`.
async fn start(store: Store) -> Quorum {
    let mut q = LitestreamWorld::builder(env!("CARGO_BIN_EXE_change-streamer"))
        .store(store)
        .source(Source::Control)
        .backups(&NAMES)
        .flags(&["--purge-quorum", "2"])
        .flags(&ASKED_AND_PURGED_AT_ONCE)
        .start()
        .await;
    assert_eq!(q.initial["backup"]["purgeQuorum"], 2, "{}", q.initial);
    q.follow().await;
    q.replicate().await;
    q
}

/// Waits until each backup named in `at` holds its watermark, as `/status` says.
async fn wait_backups(q: &Quorum, at: &[(&str, u64)]) -> Value {
    let want: Vec<(String, String)> = at.iter().map(|(n, x)| (n.to_string(), w(*x))).collect();
    q.svc
        .wait_status("the backups' watermarks", |s| {
            want.iter().all(|(name, wm)| {
                s["backups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|b| b["name"] == name.as_str() && b["watermark"] == wm.as_str())
            })
        })
        .await
}

/// A replica restored from `backup` subscribes from its watermark, transactions `next` and
/// `next + 1` are sent, and it receives every commit after its watermark up to them, and every
/// row once (PROTOCOL.md §8.4: no gap).
async fn restore_and_follow(q: &Quorum, backup: &Backup, next: u64, out: &str) {
    let last = next + 1;
    let db = backup.files.restore(&q.litestream, out);
    let (restored, rows) = read_replica(&db);
    let restored_n = Watermark::parse(&restored)
        .ok()
        .and_then(|w| w.to_u64())
        .expect("the restored stateVersion is a watermark");
    let mut sub = WsClient::connect(&q.svc.ws(&format!(
        "/replication/v6/changes?id={out}&mode=serving&replicaVersion={}&watermark={restored}",
        w(100)
    )))
    .await;
    let (id, first) = sub.msg().await;
    assert_eq!(
        first,
        json!(["status", {"tag": "status"}]),
        "restored at {restored}"
    );
    sub.ack(id).await;
    q.send(next, last).await;
    let mut received = Vec::new();
    let mut commits = Vec::new();
    while commits.last() != Some(&w(last)) {
        let (id, msg) = sub.msg().await;
        match msg[0].as_str() {
            Some("data") => received.push(msg[1]["new"]["id"].as_u64().expect("row id")),
            Some("commit") => commits.push(msg[2]["watermark"].as_str().unwrap_or("").to_string()),
            _ => {}
        }
        sub.ack(id).await;
    }
    let expected: Vec<String> = (restored_n + 1..=last).map(w).collect();
    assert_eq!(commits, expected, "{out}: restored at {restored}");
    let mut all: Vec<u64> = rows.iter().filter_map(|r| r["id"].as_u64()).collect();
    all.extend(received);
    let unique: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "{out}: a row arrived twice");
    let expected: BTreeSet<u64> = (101..=last)
        .flat_map(|n| (0..ROWS).map(move |i| n * 1000 + i))
        .collect();
    assert_eq!(unique, expected, "{out}: restore + stream hold every row");
    sub.close().await;
}

#[actix_rt::test]
async fn quorum_of_two_of_three_purges_past_a_wedged_backup_and_either_healthy_backup_restores_without_a_gap(
) {
    purges_past_a_wedged_backup(Store::File).await;
}

#[actix_rt::test]
async fn s3_quorum_of_two_of_three_purges_past_a_wedged_backup_and_either_healthy_backup_restores_without_a_gap(
) {
    purges_past_a_wedged_backup(Store::S3).await;
}

async fn purges_past_a_wedged_backup(store: Store) {
    let mut q = start(store).await;
    q.send(101, 103).await;
    let st = wait_backups(&q, &[("a", 103), ("b", 103), ("c", 103)]).await;
    assert_eq!(st["backup"]["quorumWatermark"], w(103), "{st}");
    q.svc
        .wait_status("a purge below 103", |s| {
            s["purge"]["lastPurgedBefore"] == w(103)
        })
        .await;
    let subs = q.svc.status().await["subscribers"].clone();
    let required: Vec<&Value> = subs
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["required"] == true)
        .collect();
    assert_eq!(
        required.len(),
        3,
        "each backup's replicator is required: {subs}"
    );

    // Backup c wedges: its litestream stops (file://), or its bucket's server does (S3).
    q.kill_store("c");
    q.send(104, 106).await;
    let st = wait_backups(&q, &[("a", 106), ("b", 106)]).await;
    let c = &st["backups"][2];
    assert_eq!(
        (c["name"].clone(), c["watermark"].clone()),
        (json!("c"), json!(w(103))),
        "{st}"
    );
    let st = q
        .svc
        .wait_status("a purge below 106 without backup c", |s| {
            s["purge"]["lastPurgedBefore"] == w(106)
        })
        .await;
    assert_eq!(st["backup"]["quorumWatermark"], w(106), "{st}");
    // With its bucket's server gone, c's sync is in flight until litestream's 10 s wait ends
    // (with its litestream gone, it fails at once): either way c comes to say why.
    let st = q
        .svc
        .wait_status("c says why", |s| s["backups"][2]["lastError"].is_string())
        .await;
    eprintln!("backup c's lastError: {}", st["backups"][2]["lastError"]);
    let (code, metrics) = q.svc.get("/metrics").await;
    assert_eq!(code, 200);
    for name in NAMES {
        assert!(
            metrics.contains(&format!(
                "change_streamer_backup_watermark{{backup=\"{name}\"}}"
            )) && metrics.contains(&format!(
                "change_streamer_backup_age_seconds{{backup=\"{name}\"}}"
            )),
            "{name}'s series: {metrics}"
        );
    }

    // A restore from either healthy backup catches up from the change log with no gap.
    restore_and_follow(&q, &q.backups[0], 107, "restored-a").await;
    restore_and_follow(&q, &q.backups[1], 109, "restored-b").await;
    q.svc.stop().await;
}

#[actix_rt::test]
async fn backup_vfs_that_cannot_be_loaded_is_a_start_error_naming_the_file_the_backup_and_the_key()
{
    let root = tempfile::tempdir().expect("tempdir");
    let file = root.path().join("backups.toml");
    let missing = root.path().join("no-such-vfs.so");
    std::fs::write(
        &file,
        format!(
            "[[backup]]\nname = \"a\"\nurl = \"file:///nowhere/a\"\n\n[[backup]]\nname = \"west\"\nurl = \"file:///nowhere/w\"\nvfs = \"{}\"\n",
            missing.display()
        ),
    )
    .expect("write the backups file");
    let e = TestService::start_error(&["--backups", &file.display().to_string()]).await;
    assert!(
        e.contains("--backups")
            && e.contains(&file.display().to_string())
            && e.contains("\"west\"")
            && e.contains("`vfs`"),
        "{e}"
    );
}

#[actix_rt::test]
async fn single_backup_flags_are_one_backup_named_backup_with_a_quorum_of_one() {
    use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
    let page = FakeLitestream::start(Answer::default()).await;
    let seconds = format!(
        "{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    );
    page.set_body(render_page(
        "/db",
        &[(Some(w(103).as_str()), "s3", seconds)],
    ));
    let flags = page.service_flags(3_600_000);
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let svc = TestService::start(&args).await;
    // The backup's watermark (the monitor's) and its pending sample (the cleanup's, told by
    // message after it) are two actors' answers: wait for both.
    let st = svc
        .wait_status("the backup's watermark and its pending sample", |s| {
            s["backups"][0]["watermark"] == w(103)
                && s["backup"]["pendingWatermarks"][0]["replica"] == "s3"
        })
        .await;
    assert_eq!(st["backups"].as_array().map(Vec::len), Some(1), "{st}");
    assert_eq!(
        (&st["backups"][0]["name"], &st["backups"][0]["source"]),
        (&json!("backup"), &json!("metrics")),
        "{st}"
    );
    assert_eq!(st["backups"][0]["lastError"], Value::Null, "{st}");
    assert!(st["backups"][0]["ageMs"].as_i64() >= Some(0), "{st}");
    assert_eq!(
        (
            &st["backup"]["purgeQuorum"],
            &st["backup"]["quorumWatermark"]
        ),
        (&json!(1), &json!(w(103))),
        "{st}"
    );
    // As before the quorum: the sample recorded as it is, with its replica's name.
    assert_eq!(
        st["backup"]["pendingWatermarks"][0]["replica"], "s3",
        "{st}"
    );
    svc.stop().await;
}
