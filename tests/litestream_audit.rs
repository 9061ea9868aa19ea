//! End to end, PROTOCOL.md §8.1d (an audit that can catch a lie) with REAL stock litestream
//! 0.5.17: the control API confirms (§8.1c) and the VFS audits, `--litestream-control-url`
//! and `--litestream-vfs` together. A lying backup is made by rolling the `file://` replica
//! directory back to a copy taken early: the audit reads less than was confirmed, every purge
//! stops (`purge.blockedBy: "audit"`, the failures counted per backup), stays stopped while
//! nothing else holds it back, and resumes only once a read reaches the confirmed watermark
//! again (the directory put back as it was). The `s3_` variant lies with a bucket of a local S3
//! server rolled back to its early objects (issue 44).

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_files::{Store, ASKED_AND_PURGED_AT_ONCE};
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream_world::{LitestreamWorld, Source};
use change_streamer_test_support::upstream::txn;
use serde_json::{json, Value};

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// Reads and acks until the commit of `last`.
async fn ack_through(c: &mut WsClient, last: u64) {
    loop {
        let (id, msg) = c.msg().await;
        c.ack(id).await;
        if msg[0] == "commit" && msg[2]["watermark"] == json!(w(last)) {
            return;
        }
    }
}

fn audit(st: &Value) -> &Value {
    &st["backup"]["monitor"]["audit"]
}

#[actix_rt::test]
async fn audit_a_rolled_back_backup_blocks_every_purge_until_a_read_reaches_the_confirmed_watermark(
) {
    audit_blocks_a_rolled_back_backup(Store::File).await;
}

#[actix_rt::test]
async fn s3_audit_a_rolled_back_backup_blocks_every_purge_until_a_read_reaches_the_confirmed_watermark(
) {
    audit_blocks_a_rolled_back_backup(Store::S3).await;
}

async fn audit_blocks_a_rolled_back_backup(store: Store) {
    // The control API confirms, the VFS audits.
    let mut world = LitestreamWorld::builder(env!("CARGO_BIN_EXE_change-streamer"))
        .store(store)
        .source(Source::ControlAndVfs)
        .flags(&["--backup-audit-interval-ms", "300"])
        .flags(&ASKED_AND_PURGED_AT_ONCE)
        .start()
        .await;
    let st = &world.initial;
    assert_eq!(st["backup"]["source"], "control", "{st}");
    assert_eq!(
        audit(st)["backup"],
        "backup",
        "the VFS audits, the control API confirms: {st}"
    );
    assert_eq!(audit(st)["intervalMs"], 300, "{st}");
    let rv = w(100);
    world.follow().await;
    world.replicate().await;
    let (svc, up, replica) = (&world.svc, &world.up, world.replica());
    // A serving subscriber that acks only what the test says: it holds the purge back first.
    let mut sub = WsClient::connect(&svc.ws(&format!(
        "/replication/v6/changes?id=r&replicaVersion={rv}&watermark={rv}"
    )))
    .await;
    let sent = |from: u64, to: u64| {
        for n in from..=to {
            up.send(txn(n, 2));
        }
    };
    let applied = |n: u64| {
        let want = w(n);
        async move { replica.wait_applied(&want).await }
    };

    sent(101, 102);
    applied(102).await;
    ack_through(&mut sub, 102).await;
    svc.wait_status("102 confirmed, read back by an audit, purged below", |s| {
        s["backup"]["monitor"]["backupWatermark"] == json!(w(102))
            && audit(s)["lastRead"] == json!(w(102))
            && s["purge"]["lastPurgedBefore"] == json!(w(102))
    })
    .await;
    // The early state of the backup, kept to lie with later.
    let early = world.save("backup", "early");

    sent(103, 105);
    applied(105).await;
    let st = svc
        .wait_status("105 confirmed and read back; its purge waits for r", |s| {
            s["backup"]["monitor"]["backupWatermark"] == json!(w(105))
                && audit(s)["lastRead"] == json!(w(105))
                && s["purge"]["blockedBy"] == json!("subscriber")
        })
        .await;
    assert_eq!(audit(&st)["failuresTotal"], 0, "an honest backup: {st}");
    let reads_before = st["backup"]["monitor"]["backupReadsTotal"]
        .as_u64()
        .unwrap();
    assert!(reads_before >= 2, "the audit's reads are counted: {st}");
    let late = world.save("backup", "late");

    // The lie: the backup rolled back to 102 while 105 was confirmed. litestream is frozen
    // first, so that nothing it does (a sync, a compaction) can mend the lie before an audit
    // reads it.
    world.freeze("backup");
    world.roll_back("backup", &early);
    let st = svc
        .wait_status("the audit catches the rolled-back backup", |s| {
            s["purge"]["blockedBy"] == json!("audit")
        })
        .await;
    assert_eq!(audit(&st)["lastRead"], json!(w(102)), "{st}");
    assert_eq!(audit(&st)["blockedBelow"], json!(w(105)), "{st}");
    assert!(audit(&st)["failuresTotal"].as_u64() >= Some(1), "{st}");
    let (_, metrics) = svc.get("/metrics").await;
    assert!(
        metrics.contains("change_streamer_purge_blocked{reason=\"audit\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("change_streamer_backup_audit_failures_total{backup=\"backup\"}"),
        "{metrics}"
    );

    // Nothing else holds the purge back now, and it still never happens by itself.
    ack_through(&mut sub, 105).await;
    let failures = audit(&st)["failuresTotal"].as_u64().unwrap();
    let st = svc
        .wait_status("two more audits that still read the lie", |s| {
            audit(s)["failuresTotal"].as_u64() >= Some(failures + 2)
        })
        .await;
    assert_eq!(st["purge"]["blockedBy"], json!("audit"), "{st}");
    assert_eq!(st["purge"]["lastPurgedBefore"], json!(w(102)), "{st}");
    assert_eq!(st["changeLog"]["minWatermark"], json!(w(102)), "{st}");

    // The backup as it was: a read reaches 105 again, and the purge resumes.
    world.roll_back("backup", &late);
    world.thaw("backup");
    let st = svc
        .wait_status("the block lifted and 105 purged", |s| {
            s["purge"]["lastPurgedBefore"] == json!(w(105))
        })
        .await;
    assert_eq!(audit(&st)["blockedBelow"], Value::Null, "{st}");
    assert_eq!(audit(&st)["lastRead"], json!(w(105)), "{st}");
    assert_ne!(st["purge"]["blockedBy"], json!("audit"), "{st}");
    world.svc.stop().await;
}
