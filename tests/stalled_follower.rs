//! PROTOCOL.md §11.1 (issue 41, item 5) at a serving standby, end to end against the binaries:
//! an owner reaching a real PostgreSQL change DB directly and a serving standby reaching it
//! through a proxy the test freezes ([`FreezeProxy`]: its connections stay open, no byte
//! crosses). While the owner goes on committing, the standby's follower asks the change DB and
//! hears nothing: past the standby's `--stall-alarm-ms` (1 s, well below the change DB lease of
//! 5 s, so before any of its questions times out), its `/readyz` answers 503
//! `stalled: follower for N ms`, its `/metrics` has `change_streamer_stage_stalled{stage="follower"} 1`
//! and one ERROR line says so. Thawed, it says the stall is over, is ready again, and serves every
//! commit the owner stored meanwhile.

#[allow(dead_code)] // shared with tests/takeover.rs and others
mod takeover_support;

#[allow(dead_code)] // shared with tests/standby_serving.rs and others
mod standby_support;

use std::time::{Duration, Instant};

use change_streamer_test_support::client::http_client;
use change_streamer_test_support::freeze::FreezeProxy;
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::upstream::FakeUpstream;
use change_streamer_test_support::wait::POLL;
use standby_support::*;
use takeover_support::*;

/// The standby's `--stall-alarm-ms`.
const ALARM_MS: u64 = 1000;

/// `/readyz` at `addr` polled until `cond` holds on its (status, line); each request may wait
/// a few seconds (before the stall is seen, a question to the frozen change DB holds it).
async fn readyz_when(addr: &str, what: &str, cond: impl Fn(u16, &str) -> bool) -> String {
    let deadline = Instant::now() + LIMIT;
    loop {
        let resp = http_client()
            .get(format!("http://{addr}/readyz"))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        let (code, line) = match resp {
            Ok(mut r) => {
                let body = r.body().await.unwrap_or_default();
                (
                    r.status().as_u16(),
                    String::from_utf8_lossy(&body).trim().to_string(),
                )
            }
            Err(e) => (0, format!("no answer: {e}")),
        };
        if cond(code, &line) {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {LIMIT:?}: {code} {line}"
        );
        actix_rt::time::sleep(POLL).await;
    }
}

/// Every line of `i`'s log with `text`, once one is there.
async fn lines_with(i: &Instance, seen: &mut Vec<String>, text: &str) -> Vec<String> {
    let deadline = Instant::now() + LIMIT;
    loop {
        seen.extend(std::iter::from_fn(|| i.log.try_recv().ok()));
        let found: Vec<String> = seen.iter().filter(|l| l.contains(text)).cloned().collect();
        if !found.is_empty() {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "no line with {text:?} within {LIMIT:?}"
        );
        actix_rt::time::sleep(POLL).await;
    }
}

#[actix_rt::test]
async fn a_standby_follower_behind_a_frozen_change_db_is_a_stalled_stage() {
    let db = TestDb::create("stalled_follower").await;
    let proxy = FreezeProxy::start_on_own_thread(db.server_addr());
    let up = FakeUpstream::start().await;
    let (_a, _a_addr) = owner_with(&db, &up, &[]);
    up.wait_connections(1).await;
    ingest(&up, 100..=105, 1).await;
    let alarm = ALARM_MS.to_string();
    let b = Instance::start_on(
        &db.url_via(proxy.addr),
        &up.url(),
        INTERVAL_MS,
        &["--stall-alarm-ms", &alarm],
    );
    let b_addr = b
        .standby
        .recv_timeout(START)
        .expect("the instance behind the proxy stands by");
    readyz_until(&b_addr, (200, "ready\n")).await;
    let mut log = Vec::new();

    proxy.freeze();
    // The owner, on its own connection, stores on: the follower has work it cannot reach.
    ingest(&up, 106..=110, 1).await;
    let line = readyz_when(&b_addr, "the follower stalled in /readyz", |code, line| {
        code == 503 && line.starts_with("stalled: ")
    })
    .await;
    let ms: u64 = line
        .strip_prefix("stalled: follower for ")
        .and_then(|rest| rest.strip_suffix(" ms"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not `stalled: follower for N ms`: {line}"));
    assert!(ms >= ALARM_MS, "{line}");
    let (code, metrics) = get(&b_addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("\nchange_streamer_stage_stalled{stage=\"follower\"} 1\n"),
        "{metrics}"
    );
    let errors = lines_with(
        &b,
        &mut log,
        "stage follower stalled: work pending and no progress for",
    )
    .await;
    assert!(
        errors.len() == 1 && errors[0].contains("ERROR"),
        "{errors:?}"
    );
    assert!(
        proxy.is_frozen(),
        "nothing was thawed: the alarm came from the silence"
    );
    // Once its question timed out (3/5 of the lease: 3 s), a failed question is no progress: the
    // same stall goes on, with no new ERROR line (one a minute) and no end.
    lines_with(
        &b,
        &mut log,
        "follower: reading the change DB: no answer from the change DB within",
    )
    .await;
    let line = readyz_when(&b_addr, "still stalled", |code, _| code == 503).await;
    let ms: u64 = line
        .strip_prefix("stalled: follower for ")
        .and_then(|rest| rest.strip_suffix(" ms"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not `stalled: follower for N ms`: {line}"));
    assert!(
        ms >= 3000,
        "one stall since before the question timed out: {line}"
    );
    log.extend(std::iter::from_fn(|| b.log.try_recv().ok()));
    let stall_lines: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("stage follower"))
        .collect();
    assert_eq!(stall_lines.len(), 1, "{stall_lines:?}");
    log.clear();

    proxy.thaw();
    lines_with(&b, &mut log, "stage follower is no longer stalled").await;
    readyz_until(&b_addr, (200, "ready\n")).await;
    let (_, metrics) = get(&b_addr, "/metrics").await;
    assert!(
        metrics.contains("\nchange_streamer_stage_stalled{stage=\"follower\"} 0\n"),
        "{metrics}"
    );
    // It serves what the owner stored while it was cut off, and what it stores next.
    let mut s = subscribe(&b_addr, "rb", 100).await;
    assert_eq!(commits_until(&mut s, 110).await, upto(101, 110));
    ingest(&up, 111..=111, 1).await;
    assert_eq!(commits_until(&mut s, 111).await, vec![111]);
}
