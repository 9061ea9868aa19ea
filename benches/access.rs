//! What the access rule (PROTOCOL.md §15) costs, measured rather than asserted:
//! `cargo bench --bench access`.
//!
//! The rule runs once per HTTP request, before the upgrade; a subscription's changes then travel
//! on the upgraded socket, which no request check sees, so its cost is per subscription and
//! nothing per change. Two figures: the check itself (a bearer header compared in constant time
//! with a 64-byte secret, right and wrong of the same length), and opening a subscription
//! end to end on the real service (connect, upgrade, first `status` frame) with a secret beside
//! the same without one, in the same invocation. Each is a median of 3 runs; one JSON line and
//! one line for people.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use actix_web::http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use change_streamer::http::access::{Access, Mode};
use change_streamer_actors::secret::{Secret, Secrets};
use change_streamer_test_support::access::Credentials;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use serde_json::json;

const SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const CHECKS: u32 = 200_000;
const OPENS: usize = 300;

/// (min, median, max) of the runs: the machine is shared, so the spread is reported too.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

/// ns per check of `presented` against the secret, on `/replication/v6/changes`.
fn check_ns(presented: &str) -> f64 {
    let access = Access::new(Mode::fixed(Secrets::one(Secret::new(SECRET).unwrap())));
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {presented}")).unwrap(),
    );
    let peer = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let start = Instant::now();
    let mut admitted = 0u32;
    for _ in 0..CHECKS {
        let path = std::hint::black_box("/replication/v6/changes");
        admitted += u32::from(access.check(path, &headers, peer).is_ok());
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(CHECKS);
    assert_eq!(admitted == CHECKS, presented == SECRET);
    ns
}

/// µs per subscription opened (connect, upgrade, the first `status` frame), one at a time.
async fn open_us(svc: &TestService, rv: &str) -> f64 {
    let url = svc.ws(&format!(
        "/replication/v6/changes?id=bench&mode=serving&replicaVersion={rv}&watermark={rv}"
    ));
    let start = Instant::now();
    for _ in 0..OPENS {
        let mut sub = WsClient::connect_with(&url, &svc.credentials).await;
        sub.next(Duration::from_secs(10)).await.expect("status");
        sub.close().await;
    }
    start.elapsed().as_micros() as f64 / OPENS as f64
}

async fn service(args: &[&str]) -> (TestService, FakeUpstream, String) {
    let up = FakeUpstream::start().await;
    let mut all = vec!["--upstream".to_string(), up.url()];
    all.extend(args.iter().map(|a| a.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let svc = TestService::start(&all).await;
    up.wait_connections(1).await;
    up.send(txn(1, 1));
    let st = svc
        .wait_status("initial sync", |s| !s["replicaVersion"].is_null())
        .await;
    let rv = st["replicaVersion"].as_str().unwrap().to_string();
    (svc, up, rv)
}

fn main() {
    let right: Vec<f64> = (0..3).map(|_| check_ns(SECRET)).collect();
    let wrong_last = format!("{}x", &SECRET[..SECRET.len() - 1]);
    let wrong: Vec<f64> = (0..3).map(|_| check_ns(&wrong_last)).collect();
    let ((r0, right, r1), (w0, wrong, w1)) = (spread(right), spread(wrong));
    println!(
        "{}",
        json!({"bench": "access-check", "secretBytes": SECRET.len(), "rightNs": right, "wrongLastByteNs": wrong,
               "rightNsMinMax": [r0, r1], "wrongLastByteNsMinMax": [w0, w1]})
    );
    println!(
        "access check with a {}-byte secret: {right:.0} ns right ({r0:.0}–{r1:.0}), {wrong:.0} ns wrong in the last byte ({w0:.0}–{w1:.0}) (medians of 3 × {CHECKS})",
        SECRET.len()
    );

    actix_rt::System::new().block_on(async {
        let (with, _up1, rv1) = service(&["--secret", SECRET]).await;
        let (without, _up2, rv2) = service(&[]).await;
        assert!(with.credentials.secret.is_some());
        assert!(Credentials::default().secret.is_none());
        let mut a = Vec::new();
        let mut b = Vec::new();
        for _ in 0..3 {
            a.push(open_us(&with, &rv1).await);
            b.push(open_us(&without, &rv2).await);
        }
        let ((a0, a, a1), (b0, b, b1)) = (spread(a), spread(b));
        println!(
            "{}",
            json!({"bench": "access-open", "opens": OPENS, "withSecretUs": a, "withoutUs": b,
                   "withSecretUsMinMax": [a0, a1], "withoutUsMinMax": [b0, b1]})
        );
        println!(
            "subscription opened (connect, upgrade, status), one at a time: {a:.0} µs with a secret ({a0:.0}–{a1:.0}), {b:.0} µs without ({b0:.0}–{b1:.0}) (medians of 3 × {OPENS}; ratio {:.2})",
            a / b
        );
        with.stop().await;
        without.stop().await;
    });
}
