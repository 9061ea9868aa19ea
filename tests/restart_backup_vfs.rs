//! End to end, PROTOCOL.md §13.1 with the VFS source (§8.1b) and REAL stock litestream 0.5.17:
//! the service reads the backup itself; it is killed with `kill -9` after recording 103, and the
//! backup it finds at the next start shows less (the `file://` replica rolled back to a copy
//! taken at 102). `/readyz` names both watermarks and a reservation gets no status until the
//! backup is read at 103 again. The `s3_` variant does it with a bucket of a local S3 server
//! (issue 44), rolled back to its objects at 102.

use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_files::Store;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream_world::{LitestreamWorld, Source};
use change_streamer_test_support::upstream::txn;
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
    let mut world = LitestreamWorld::builder(env!("CARGO_BIN_EXE_change-streamer"))
        .store(store)
        .source(Source::Vfs)
        .flags(&[
            "--backup-check-interval-ms",
            "200",
            "--min-cleanup-delay-ms",
            "3600000",
        ])
        .spawn()
        .await;
    world.follow().await;
    world.replicate().await;
    let send_and_read = |n: u64| {
        world.up.send(txn(n, 2));
        let want = w(n);
        let (first, replica) = (&world.svc, world.replica());
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
    let early = world.save("backup", "early");
    send_and_read(103).await;
    // 104 stored means 103's record, queued before it on the same writer, is durable.
    world.up.send(txn(104, 2));
    world
        .svc
        .wait_status("104 stored", |s| {
            s["changeLog"]["maxWatermark"] == json!(w(104))
        })
        .await;
    let (mut world, first) = world.into_parts();
    first.kill9();
    world.kill("backup");
    drop(world.take_replicas());
    let late = world.save("backup", "late");
    world.roll_back("backup", &early);

    world.up.drop_connection();
    let second = world.spawn_service();
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
    world.roll_back("backup", &late);
    let (id, status) = res.msg().await;
    assert_eq!(status[0], json!("status"), "{status}");
    res.ack(id).await;
    assert_eq!(second.readyz().await, (200, "ready".into()));
    let st = second.status().await;
    assert_eq!(st["backup"]["restartCatchUp"], json!(null), "{st}");
    second.terminate().await;
}
