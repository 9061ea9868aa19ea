//! `changelog`: the SQLite change log alone: durable ingest of 2,000 × 100-change transactions
//! queued together (group commit), one awaited transaction at a time, and a purge of 1 M rows
//! while a subscriber is fed (its duration and the longest forwarding gap meanwhile), beside the
//! same purge on the one-table layout.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use change_streamer_actors::changelog::{ChangeLog, Transaction};
use change_streamer_actors::streamer::{PurgeAnswer, PurgeIfSafe};
use change_streamer_test_support as support;
use serde_json::json;
use support::feed::feed;

use crate::report::{median, report};
use crate::rig::{rig, w, workload};

pub async fn changelog() {
    // Durable ingest: 2,000 transactions of 100 changes, queued together (group commit).
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    let row = support::stored::insert_row(80);
    let make = |n: u64, rows: usize| support::stored::stored_txn(n, &row, rows);
    let mut rates = Vec::new();
    let mut next = 1u64;
    for _ in 0..3 {
        let txns: Vec<Transaction> = (next..next + 2000).map(|n| make(n, 98)).collect();
        next += 2000;
        let t0 = Instant::now();
        let pending: Vec<_> = txns.into_iter().map(|t| log.append(t)).collect();
        for p in pending {
            p.await.unwrap();
        }
        rates.push(200_000.0 / t0.elapsed().as_secs_f64());
    }
    let ingest = median(&mut rates.clone());
    // One transaction at a time, each awaited (no grouping): the latency-bound case.
    let t0 = Instant::now();
    for n in next..next + 200 {
        log.append(make(n, 8)).await.unwrap();
    }
    let single_txn_ms = t0.elapsed().as_secs_f64() * 1000.0 / 200.0;

    // Purge of 1 M rows while a subscriber is fed: the purge's duration and the longest gap
    // between deliveries meanwhile.
    let r = rig(Duration::from_secs(1), &[false]).await;
    let mut msgs = Vec::new();
    let big = 10_000u64;
    for t in 2..2 + big {
        msgs.extend(workload(t, 1, 98, 60));
    }
    feed(&r.streamer, msgs, 512).await;
    // Wait until all of it is durable, so that the purge does not queue behind the appends.
    r.log.barrier().await.unwrap();
    let purge_below = w(2 + big - 1);
    let rows_before = r.total.load(Ordering::Relaxed);
    assert!(rows_before > 0);
    r.delivered_at.lock().unwrap().clear();
    let streamer = r.streamer.clone();
    let feeder = actix_rt::spawn(async move {
        let mut t = 10_000_000u64;
        let stop = Instant::now() + Duration::from_secs(4);
        while Instant::now() < stop {
            feed(&streamer, workload(t, 1, 3, 60), 512).await;
            t += 1;
            actix_rt::time::sleep(Duration::from_millis(1)).await;
        }
    });
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    let answer = r
        .streamer
        .send(PurgeIfSafe {
            watermark: purge_below,
            stored_by_ms: i64::MAX,
        })
        .await
        .unwrap();
    let purge_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let _ = feeder.await;
    let deliveries = r.delivered_at.lock().unwrap().clone();
    let max_gap = deliveries
        .windows(2)
        .map(|p| (p[1] - p[0]).as_secs_f64() * 1000.0)
        .fold(0.0, f64::max);
    let purged = match answer {
        PurgeAnswer::Purged(n) => n,
        other => panic!("purge refused: {other:?}"),
    };
    // For comparison: the same purge on a change log kept in one table (no segments).
    let one_dir = tempfile::tempdir().unwrap();
    let one = ChangeLog::open_with_segment_rows(one_dir.path(), u64::MAX).unwrap();
    let pending: Vec<_> = (1..=10_000u64).map(|n| one.append(make(n, 98))).collect();
    for p in pending {
        p.await.unwrap();
    }
    let t0 = Instant::now();
    let one_purged = one.purge(w(10_000)).await.unwrap();
    let one_table_ms = t0.elapsed().as_secs_f64() * 1000.0;
    report(
        json!({"bench": "changelog", "ingest_changes_per_s": ingest.round(), "purge_ms_single_table": one_table_ms.round(), "purged_rows_single_table": one_purged, "runs": rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
               "single_txn_commit_ms": (single_txn_ms * 100.0).round() / 100.0, "purged_rows": purged, "purge_ms": purge_ms.round(),
               "max_forwarding_gap_ms_during_purge": (max_gap * 10.0).round() / 10.0}),
        format!(
            "change log: durable ingest {ingest:.0} changes/s (2,000 x 100-change txns, group commit); one awaited txn {single_txn_ms:.2} ms; purge of {purged} rows {purge_ms:.0} ms (one-table layout: {one_table_ms:.0} ms), longest forwarding gap meanwhile {max_gap:.1} ms"
        ),
    );
}
