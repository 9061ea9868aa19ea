//! End to end on the real binary as a process: `--max-queued-bytes` is held at every admission
//! (PROTOCOL.md §10.2). Four subscribers read and ack, three read nothing, and 20 KB changes
//! come in bursts of ten; `change_streamer_queued_bytes` on `/metrics`, sampled every 10 ms, never
//! exceeds the budget by more than one change, and the process's `RssAnon` stays bounded.

use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use change_streamer_test_support::client::http_client;
use change_streamer_test_support::load::{
    large_txn, on_fake_upstream, read_through, rss_anon, subscribers,
};

const BUDGET: u64 = 1536 * 1024;
const CHANGE: usize = 20_000;

/// `change_streamer_queued_bytes` as `/metrics` of `addr` says now.
async fn queued_bytes(addr: &str) -> u64 {
    let mut resp = http_client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("metrics");
    let body = resp.body().limit(1 << 22).await.expect("metrics body");
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix("change_streamer_queued_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("change_streamer_queued_bytes")
}

/// Samples the gauge and `RssAnon` of `pid` every 10 ms until `stop`; answers their most and
/// how many samples were taken.
async fn sample(addr: String, pid: u32, stop: Rc<Cell<bool>>) -> (u64, u64, u64) {
    let (mut queued, mut rss, mut samples) = (0, 0, 0);
    while !stop.get() {
        queued = queued.max(queued_bytes(&addr).await);
        rss = rss.max(rss_anon(pid));
        samples += 1;
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    (queued, rss, samples)
}

#[actix_rt::test]
async fn the_global_budget_is_held_at_every_admission_under_bursts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = Path::new(env!("CARGO_BIN_EXE_change-streamer"));
    let budget = BUDGET.to_string();
    let (svc, up) = on_fake_upstream(bin, dir.path(), &["--max-queued-bytes", &budget]).await;
    // Three connect and never read their socket again (eviction is off: they hold what they
    // were sent for the whole test); four read and ack everything.
    let mut clients = subscribers(&svc, &["s1", "s2", "s3", "h1", "h2", "h3", "h4"]).await;
    let healthy = clients.split_off(3);
    let stalled = clients;
    let pid = svc.pid();
    let rss_before = rss_anon(pid);
    let stop = Rc::new(Cell::new(false));
    let sampler = actix_rt::spawn(sample(svc.addr.clone(), pid, stop.clone()));
    let last = 100 + 10 * 60;
    let readers: Vec<_> = healthy
        .into_iter()
        .map(|mut c| actix_rt::spawn(async move { read_through(&mut c, last, || ()).await }))
        .collect();
    // Sixty bursts of ten transactions of one 20 KB change, each burst one upstream frame batch,
    // a burst every 20 ms.
    for first in (101..=last).step_by(10) {
        up.send(
            (first..first + 10)
                .flat_map(|n| large_txn(n, CHANGE))
                .collect(),
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    for r in readers {
        r.await.expect("a healthy subscriber got every transaction");
    }
    stop.set(true);
    let (queued, rss, samples) = sampler.await.expect("sampler");
    let one_change = CHANGE as u64 + 200;
    println!(
        "change_streamer_queued_bytes most {queued} of {BUDGET} over {samples} samples; RssAnon {} → {} MiB",
        rss_before >> 20,
        rss >> 20
    );
    assert!(samples > 20, "too few samples: {samples}");
    assert!(
        queued > BUDGET * 9 / 10,
        "the budget was never approached: {queued}"
    );
    assert!(
        queued <= BUDGET + one_change,
        "{queued} bytes held: past {BUDGET} by more than one change"
    );
    // What the budget holds, and what serving it costs, stay well within 32 MiB more than at
    // the start (the changes passing are 12 MB).
    assert!(
        rss < rss_before + (32 << 20),
        "RssAnon grew from {} to {} MiB",
        rss_before >> 20,
        rss >> 20
    );
    drop(stalled);
    svc.terminate().await;
}
