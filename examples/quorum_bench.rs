//! Measures the purge's progress with several backups and a quorum (PROTOCOL.md §8.4) with
//! real stock litestream 0.5.17, for BENCHMARKS.md:
//!
//! ```sh
//! cargo run --example quorum_bench -- --seconds 20 --sync-ms 1000
//! ```
//!
//! The real service runs with `--backups` listing three backups, each asked through its own
//! litestream's control socket (§8.1c), and `--purge-quorum 2`, with no cleanup delay, a purge
//! delay of 100 ms and no retention, so that a commit is purged as soon as two backups hold a
//! later one. Each backup has its own backup replicator and its own `litestream replicate`
//! (syncing every `--sync-ms` by itself). A fake change source commits a transaction every
//! 50–150 ms. For `--seconds` with the three backups healthy, then as long with one wedged (its
//! litestream killed), it reads `/status` every 10 ms and takes, for each commit W, the time
//! from its sending to the first `purge.lastPurgedBefore` above W (W's rows purged). One JSON
//! line and one line for people; the ratio is of the two phases' medians, in one invocation.

use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_replica::BackupReplica;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::stock_litestream::{self, Replication};
use change_streamer_test_support::upstream::{txn, FakeUpstream};

const NAMES: [&str; 3] = ["a", "b", "c"];

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a whole number"))
        })
        .unwrap_or(default)
}

fn quantile(xs: &mut [f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

/// Commits a transaction every 50–150 ms from `next` for `seconds`, reading `/status` every
/// 10 ms; returns each commit's time to purged, in ms, and the next transaction's number.
async fn phase(
    svc: &TestService,
    up: &FakeUpstream,
    mut next: u64,
    seconds: u64,
) -> (Vec<f64>, u64) {
    let mut sent: Vec<(u64, Instant)> = Vec::new();
    let mut purged: Vec<(Instant, u64)> = Vec::new();
    let mut state = 0x2545_f491_4f6c_dd1d_u64 ^ next;
    let start = Instant::now();
    let mut next_send = Instant::now();
    // Past the sends, as long again for the last commits to be purged.
    while start.elapsed() < Duration::from_secs(seconds * 2) {
        if Instant::now() >= next_send && start.elapsed() < Duration::from_secs(seconds) {
            up.send(txn(next, 1));
            sent.push((next, Instant::now()));
            next += 1;
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            next_send = Instant::now() + Duration::from_millis(50 + state % 101);
        }
        let st = svc.status().await;
        if let Some(w) = st["purge"]["lastPurgedBefore"]
            .as_str()
            .and_then(|w| Watermark::parse(w).ok())
            .and_then(|w| w.to_u64())
        {
            if purged.last().is_none_or(|(_, last)| *last != w) {
                purged.push((Instant::now(), w));
            }
        }
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    let delays = sent
        .iter()
        .filter_map(|(n, at)| {
            purged
                .iter()
                .find(|(t, w)| t >= at && w > n)
                .map(|(t, _)| (*t - *at).as_secs_f64() * 1000.0)
        })
        .collect();
    (delays, next)
}

fn main() {
    let seconds = arg("--seconds", 20);
    let sync_ms = arg("--sync-ms", 1000);
    actix_rt::System::new().block_on(async move {
        let litestream = stock_litestream::install();
        let root = tempfile::tempdir().expect("tempdir");
        let mut file = String::new();
        for name in NAMES {
            let dir = root.path().join(name);
            std::fs::create_dir_all(&dir).expect("a backup's folder");
            file += &format!(
                "[[backup]]\nname = \"{name}\"\nurl = \"file://{}\"\ncontrol_url = \"unix:{}\"\ndb_path = \"{}\"\n",
                dir.join("backup").display(),
                dir.join("ls.sock").display(),
                dir.join("replica.db").display()
            );
        }
        let path = root.path().join("backups.toml");
        std::fs::write(&path, file).expect("the backups file");
        let up = FakeUpstream::start().await;
        let (up_url, path) = (up.url(), path.display().to_string());
        let svc = TestService::start(&[
            "--upstream", &up_url, "--backups", &path, "--purge-quorum", "2",
            "--backup-check-interval-ms", "1000", "--min-cleanup-delay-ms", "0",
            "--purge-delay-ms", "100", "--change-log-retention-ms", "0",
        ])
        .await;
        up.wait_connections(1).await;
        up.send(txn(100, 1));
        svc.wait_status("the initial sync", |s| s["replicaVersion"].is_string()).await;
        let rv = Watermark::from_u64(100).to_string();
        let sync = format!("{sync_ms}ms");
        let mut replicas = Vec::new();
        let mut replications: Vec<Option<Replication>> = Vec::new();
        for name in NAMES {
            let dir = root.path().join(name);
            let db = dir.join("replica.db");
            let replica = BackupReplica::start_for_backup(&svc.base(), name, &rv, &rv, &db).await;
            let url = format!("file://{}", dir.join("backup").display());
            let socket = dir.join("ls.sock");
            let r = litestream.replicate_controlled(&db, &url, &dir.join("litestream.yml"), &socket, &sync);
            r.wait_for_socket(&socket, Duration::from_secs(30)).await;
            replicas.push(replica);
            replications.push(Some(r));
        }
        let (mut healthy, next) = phase(&svc, &up, 101, seconds).await;
        replications[2] = None;
        let (mut wedged, _) = phase(&svc, &up, next, seconds).await;
        let st = svc.status().await;
        let wedged_error = st["backups"][2]["lastError"].as_str().unwrap_or("").to_string();
        let (hn, wn) = (healthy.len(), wedged.len());
        let (h50, h99) = (quantile(&mut healthy, 0.5), quantile(&mut healthy, 0.99));
        let (w50, w99) = (quantile(&mut wedged, 0.5), quantile(&mut wedged, 0.99));
        println!(
            "{}",
            serde_json::json!({"bench": "quorum_purge", "backups": 3, "purgeQuorum": 2, "litestreamSyncMs": sync_ms,
                "healthy": {"commits": hn, "p50Ms": h50, "p99Ms": h99},
                "oneWedged": {"commits": wn, "p50Ms": w50, "p99Ms": w99},
                "p50Ratio": w50 / h50, "wedgedLastError": wedged_error})
        );
        println!(
            "commit -> purged, 3 backups, quorum 2: healthy p50 {h50:.0} ms, p99 {h99:.0} ms ({hn} commits); one wedged p50 {w50:.0} ms, p99 {w99:.0} ms ({wn} commits); ratio of medians {:.2}",
            w50 / h50
        );
        drop(replicas);
        svc.stop().await;
        up.stop().await;
    });
}
