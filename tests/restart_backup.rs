//! End to end, PROTOCOL.md §13.1 (no backward walk after a restart) with REAL stock litestream
//! 0.5.17 and the real binary as a child process: the service confirms the backup through
//! litestream's control socket (§8.1c), litestream is frozen (SIGSTOP) with uploads pending, the
//! service is killed with `kill -9` and started again. Until the backup is seen covering the
//! watermark recorded before the kill, `/readyz` says why with both watermarks and a snapshot
//! reservation gets no status; once litestream runs again, the backup replicator's reconnection
//! is confirmed (without any new commit), and both follow. The `s3_` variant keeps the backup in
//! a bucket of a local S3 server (issue 44).

use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_files::Store;
use change_streamer_test_support::backup_replica::{read_replica, BackupReplica};
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream_world::{LitestreamWorld, Source};
use change_streamer_test_support::upstream::txn;
use serde_json::json;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

#[actix_rt::test]
async fn no_backward_walk_after_kill_9_with_uploads_pending_readyz_and_statuses_wait_for_the_backup(
) {
    uploads_pending_hold_readiness(Store::File).await;
}

#[actix_rt::test]
async fn s3_no_backward_walk_after_kill_9_with_uploads_pending_readyz_and_statuses_wait_for_the_backup(
) {
    uploads_pending_hold_readiness(Store::S3).await;
}

async fn uploads_pending_hold_readiness(store: Store) {
    // The periodic poll is an hour apart: every confirmation comes from an ack or a join.
    let mut world = LitestreamWorld::builder(env!("CARGO_BIN_EXE_change-streamer"))
        .store(store)
        .source(Source::Control)
        .flags(&[
            "--backup-check-interval-ms",
            "3600000",
            "--min-cleanup-delay-ms",
            "3600000",
        ])
        .spawn()
        .await;
    assert_eq!(
        world.svc.readyz().await,
        (200, "ready".into()),
        "a first start"
    );
    let rv = w(100);
    world.follow().await;
    // litestream syncs hourly by itself: what the backup holds, it holds because it was asked.
    world.replicate().await;
    for n in 101..=103 {
        world.up.send(txn(n, 2));
    }
    world
        .svc
        .wait_status("103 confirmed", |s| {
            s["backup"]["monitor"]["backupWatermark"] == json!(w(103))
        })
        .await;

    // litestream frozen: what the replica applies from now on is an upload pending.
    world.freeze("backup");
    for n in 104..=105 {
        world.up.send(txn(n, 2));
    }
    let applied = w(105);
    world.replica().wait_applied(&applied).await;
    // The change log's writer keeps call order: 105 stored means 103's record is durable too.
    world
        .svc
        .wait_status("105 stored", |s| {
            s["changeLog"]["maxWatermark"] == json!(w(105))
        })
        .await;
    let (mut world, first) = world.into_parts();
    first.kill9();
    drop(world.take_replicas());
    let restored = world.restore("backup", "pending.db");
    assert_eq!(
        read_replica(&restored).0,
        w(103),
        "104 and 105 are uploads pending"
    );

    world.up.drop_connection();
    let second = world.spawn_service();
    let behind = format!(
        "backup behind its recorded watermark (recorded {}, backup shows none)",
        w(103)
    );
    assert_eq!(second.readyz().await, (503, behind.clone()));
    // The backup replicator comes back from what its file holds; litestream cannot answer.
    let replica =
        BackupReplica::start(&second.addr, "backup", &rv, &applied, &world.files().db()).await;
    let mut res = WsClient::connect(&second.ws("/replication/v6/snapshot?taskID=t1")).await;
    let st = second
        .wait_status("the reservation is open, unverified", |s| {
            s["reservations"][0]["taskID"] == json!("t1")
        })
        .await;
    assert_eq!(st["reservations"][0]["verified"], json!(false), "{st}");
    assert_eq!(
        st["backup"]["restartCatchUp"],
        json!({"recorded": w(103), "backup": null}),
        "{st}"
    );
    // No observation can be made: the wait goes on through failed requests.
    second
        .wait_status("a failed request to the frozen litestream", |s| {
            s["backup"]["monitor"]["pollErrorsTotal"].as_u64() >= Some(1)
        })
        .await;
    assert_eq!(second.readyz().await, (503, behind));
    assert!(
        res.next(Duration::from_millis(1)).await.is_none(),
        "no status while the backup is behind"
    );

    let thawed = Instant::now();
    world.thaw("backup");
    let (id, status) = res.msg().await;
    assert_eq!(status[0], json!("status"), "{status}");
    assert_eq!(status[1]["minWatermark"], json!(w(100)), "{status}");
    res.ack(id).await;
    assert_eq!(second.readyz().await, (200, "ready".into()));
    let st = second.status().await;
    assert_eq!(st["backup"]["restartCatchUp"], json!(null), "{st}");
    assert_eq!(
        st["backup"]["monitor"]["backupWatermark"],
        json!(w(105)),
        "the replicator's starting point, confirmed without a new commit: {st}"
    );
    assert_eq!(st["reservations"][0]["verified"], json!(true), "{st}");
    let restored = world.restore("backup", "caught-up.db");
    assert_eq!(read_replica(&restored).0, w(105));
    eprintln!(
        "covered {} ms after litestream was thawed",
        thawed.elapsed().as_millis()
    );
    drop(replica);
    second.terminate().await;
}
