//! End to end, PROTOCOL.md §13.1 with the VFS source (§8.1b) and REAL stock litestream 0.5.17:
//! the service reads the backup itself; it is killed with `kill -9` after recording 103, and the
//! backup it finds at the next start shows less (the `file://` replica rolled back to a copy
//! taken at 102). `/readyz` names both watermarks and a reservation gets no status until the
//! backup is read at 103 again. The `s3_` variant does it with a bucket of a local S3 server
//! (issue 44), rolled back to its objects at 102.

use std::path::Path;
use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_files::{flag_refs, BackupFiles, Store};
use change_streamer_test_support::backup_replica::BackupReplica;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::process::ServiceProcess;
use change_streamer_test_support::stock_litestream;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use serde_json::json;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

#[actix_rt::test]
async fn no_backward_walk_with_the_vfs_source_a_rolled_back_backup_holds_readyz_and_statuses() {
    rolled_back_backup_holds_readiness(Store::File).await;
}

#[actix_rt::test]
async fn s3_no_backward_walk_with_the_vfs_source_a_rolled_back_backup_holds_readyz_and_statuses() {
    rolled_back_backup_holds_readiness(Store::S3).await;
}

async fn rolled_back_backup_holds_readiness(store: Store) {
    let litestream = stock_litestream::install();
    let dir = tempfile::tempdir().expect("tempdir");
    let files = BackupFiles::new(dir.path(), store);
    let data = dir.path().join("data");
    let up = FakeUpstream::start().await;
    let (up_url, vfs) = (up.url(), files.vfs_flags(&litestream));
    let flags = flag_refs(
        &vfs,
        &[
            "--upstream",
            &up_url,
            "--backup-check-interval-ms",
            "200",
            "--min-cleanup-delay-ms",
            "3600000",
        ],
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_change-streamer"));
    let first = ServiceProcess::spawn(bin, 0, &data, &flags);
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    first
        .wait_status("the initial sync", |s| s["replicaVersion"].is_string())
        .await;
    let rv = w(100);
    let replica = BackupReplica::start(&first.addr, "backup", &rv, &rv, &files.db()).await;
    let replication = files.replicate(&litestream);
    let send_and_read = |n: u64| {
        up.send(txn(n, 2));
        let want = w(n);
        let (first, replica) = (&first, &replica);
        async move {
            replica.wait_applied(&want).await;
            first
                .wait_status("read back from the backup", |s| {
                    s["backup"]["monitor"]["backupWatermark"] == json!(want)
                })
                .await;
        }
    };
    send_and_read(101).await;
    send_and_read(102).await;
    let early = files.save("early");
    send_and_read(103).await;
    // 104 stored means 103's record, queued before it on the same writer, is durable.
    up.send(txn(104, 2));
    first
        .wait_status("104 stored", |s| {
            s["changeLog"]["maxWatermark"] == json!(w(104))
        })
        .await;
    first.kill9();
    drop(replication);
    drop(replica);
    let late = files.save("late");
    files.put_back(&early);

    up.drop_connection();
    let second = ServiceProcess::spawn(bin, 0, &data, &flags);
    let mut res = WsClient::connect(&second.ws("/replication/v6/snapshot?taskID=t1")).await;
    let st = second
        .wait_status("the rolled-back backup read", |s| {
            s["backup"]["restartCatchUp"]["backup"] == json!(w(102))
        })
        .await;
    assert_eq!(
        st["backup"]["restartCatchUp"]["recorded"],
        json!(w(103)),
        "{st}"
    );
    assert_eq!(st["reservations"][0]["verified"], json!(false), "{st}");
    assert_eq!(
        second.readyz().await,
        (
            503,
            format!(
                "backup behind its recorded watermark (recorded {}, backup shows {})",
                w(103),
                w(102)
            )
        )
    );
    assert!(res.next(Duration::from_millis(1)).await.is_none());

    // The backup as it was: read at 103 again, statuses and readiness follow.
    files.put_back(&late);
    let (id, status) = res.msg().await;
    assert_eq!(status[0], json!("status"), "{status}");
    res.ack(id).await;
    assert_eq!(second.readyz().await, (200, "ready".into()));
    let st = second.status().await;
    assert_eq!(st["backup"]["restartCatchUp"], json!(null), "{st}");
    second.terminate().await;
}
