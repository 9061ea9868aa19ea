//! The live page at `/` (PROTOCOL.md §11.2) in a real browser (issue 45): headless Chromium,
//! driven over the DevTools protocol, loads the page from the real binary running a change
//! source, a backup, a reservation reporting its restore and three subscribers, one stalled
//! (tests/operator_support). The page must show each of them with the binary's own values, the
//! stalled one as lagging, update as the binary's state moves, log no console error, and a
//! screenshot of it is written (`target/live-page.png`, or `$CHANGE_STREAMER_SCREENSHOT`; the
//! one in docs/ is such a screenshot). With a secret, the page asks for it and keeps it in the
//! tab only. On a shared PostgreSQL change DB the owner's page lists the instances and a serving
//! standby's page shows what the standby's `/status` holds.
//!
//! Chromium is found or installed (operator_support::chromium); where it cannot be, the test
//! says what is missing and passes, unless `CHANGE_STREAMER_REQUIRE_BROWSER` is set (`.ci/run`
//! sets it), where it fails.

mod operator_support;

#[allow(dead_code)] // shared with the PostgreSQL tests
mod takeover_support;

#[allow(dead_code)] // shared with the standby tests
mod standby_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use change_streamer_test_support::process::ServiceProcess;
use operator_support::chromium::{find_or_install, Browser, Page};
use operator_support::{scene, LIVE, LIVE_2, STALLED, TASK};
use serde_json::Value;

/// Chromium, or `None` after saying why there is none (a failure under
/// `CHANGE_STREAMER_REQUIRE_BROWSER`).
fn chromium() -> Option<PathBuf> {
    match find_or_install() {
        Ok(p) => Some(p),
        Err(why) if std::env::var_os("CHANGE_STREAMER_REQUIRE_BROWSER").is_some() => {
            panic!("the live page's browser test cannot run: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: the live page's browser test: {why}");
            None
        }
    }
}

/// What the page shows, read from its DOM.
const READ_PAGE: &str = r#"(() => {
  // Not yet the page, or the page still being parsed.
  if (document.readyState !== "complete" || !document.getElementById("rate-chart")) return { updates: 0, loading: location.href };
  const field = (root, name) => { const e = root && root.querySelector(`[data-field="${name}"]`); return e ? e.textContent : null; };
  const rows = (sel, key) => Object.fromEntries([...document.querySelectorAll(sel)].map(r => [r.dataset[key], {
    lagging: r.classList.contains("lagging"), state: field(r, "state"), lag: field(r, "lag"), acked: field(r, "acked"),
    watermark: field(r, "watermark"), restore: field(r, "restore"), text: r.textContent }]));
  return {
    updates: Number(document.body.dataset.updates),
    error: document.getElementById("error").textContent,
    role: document.getElementById("role").textContent,
    maxWatermark: field(document.getElementById("changelog"), "maxWatermark"),
    rows: field(document.getElementById("changelog"), "rows"),
    size: field(document.getElementById("changelog"), "size"),
    upstream: field(document.getElementById("upstream"), "state"),
    quorumFloor: field(document.getElementById("backups"), "quorum floor"),
    subscribers: rows("tr[data-subscriber]", "subscriber"),
    backups: rows("tr[data-backup]", "backup"),
    reservations: rows("tr[data-task]", "task"),
    ratePoints: Number(document.getElementById("rate-chart").dataset.points || 0),
    rateMax: Number(document.getElementById("rate-chart").dataset.max || 0),
    lagPoints: Number(document.getElementById("lag-chart").dataset.points || 0),
    loginShown: !document.getElementById("login").hidden,
    instances: Object.keys(rows("tr[data-instance]", "instance")),
    purge: document.getElementById("purge-facts").textContent,
  };
})()"#;

/// Reads the page until `cond` holds (60 s at most, a generous bound for a busy machine).
async fn wait_page(page: &mut Page, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let v = page.eval(READ_PAGE).await;
        if cond(&v) {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the page never showed {what}: {v}\nerrors: {:?}",
            page.errors()
        );
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
}

#[actix_rt::test]
async fn the_live_page_shows_the_running_service_and_marks_the_stalled_subscriber() {
    let Some(bin) = chromium() else { return };
    let s = scene(&[]).await;
    let browser = Browser::launch(&bin);
    let mut page = browser.new_page().await;
    page.navigate(&format!("http://{}/", s.svc.addr)).await;

    let v = wait_page(&mut page, "both subscribers after a few refreshes", |v| {
        v["updates"].as_u64().unwrap_or(0) >= 3
            && v["subscribers"][STALLED].is_object()
            && v["subscribers"][LIVE].is_object()
            && v["subscribers"][LIVE_2].is_object()
    })
    .await;
    let st = s.svc.status().await;
    assert_eq!(v["error"], "", "{v}");
    assert!(v["role"].as_str().unwrap().starts_with("owner "), "{v}");
    assert_eq!(v["upstream"], "connected", "{v}");
    // The stalled subscriber is marked lagging, with the tracked send it lags on; the live one is not.
    let stalled = &v["subscribers"][STALLED];
    assert_eq!(stalled["lagging"], true, "{v}");
    assert!(
        stalled["state"]
            .as_str()
            .unwrap()
            .starts_with("lagging on "),
        "{v}"
    );
    let lag: f64 = stalled["lag"]
        .as_str()
        .unwrap()
        .trim_end_matches(" s")
        .parse()
        .unwrap();
    assert!(lag > 1.0, "{v}");
    assert_eq!(v["subscribers"][LIVE]["lagging"], false, "{v}");
    assert_eq!(v["subscribers"][LIVE]["state"], "keeping up", "{v}");
    // The stalled one acked nothing past where it started: the replicaVersion.
    assert_eq!(
        stalled["acked"],
        Value::String(s.replica_version.clone()),
        "{v}"
    );
    // The backup, as /status shows it, and the quorum's floor.
    let backup = &st["backups"][0];
    assert_eq!(
        v["backups"][backup["name"].as_str().unwrap()]["watermark"],
        backup["watermark"],
        "{v}"
    );
    assert_eq!(v["quorumFloor"], st["backup"]["quorumWatermark"], "{v}");
    // The reservation and its restore (the metrics source knows no replicaSize: bytes and rate).
    let restore = v["reservations"][TASK]["restore"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(restore.starts_with("224.0 KiB restored"), "{v}");
    assert!(v["size"].as_str().unwrap().ends_with("B"), "{v}");

    // Live: the change source keeps sending, so the page's maxWatermark passes the one /status
    // showed just now, and never passes the one /status shows after.
    let before = st["changeLog"]["maxWatermark"]
        .as_str()
        .unwrap()
        .to_string();
    let v = wait_page(
        &mut page,
        "a maxWatermark past /status's of a moment ago",
        |v| {
            v["maxWatermark"]
                .as_str()
                .is_some_and(|w| w > before.as_str())
        },
    )
    .await;
    let after = s.svc.status().await;
    let shown = v["maxWatermark"].as_str().unwrap();
    assert!(
        shown <= after["changeLog"]["maxWatermark"].as_str().unwrap(),
        "{v} {after}"
    );
    // The time series: points drawn, an ingest rate above 0.
    let v = wait_page(&mut page, "two series of a few points", |v| {
        v["ratePoints"].as_u64().unwrap_or(0) >= 3 && v["lagPoints"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    assert!(v["rateMax"].as_f64().unwrap() > 0.0, "{v}");

    let errors = page.errors();
    assert!(errors.is_empty(), "the page logged errors: {errors:#?}");
    let shot = std::env::var_os("CHANGE_STREAMER_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("live-page.png"));
    page.screenshot(1400, &shot).await;
    eprintln!("screenshot: {}", shot.display());
    drop(browser);
    s.stop().await;
}

#[actix_rt::test]
async fn with_a_secret_the_page_asks_for_it_and_keeps_it_in_the_tab_only() {
    let Some(bin) = chromium() else { return };
    const SECRET: &str = "Pag3-5ecret-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let svc = ServiceProcess::spawn(
        std::path::Path::new(env!("CARGO_BIN_EXE_change-streamer")),
        0,
        dir.path(),
        &["--secret", SECRET],
    );
    // The page is served without the secret; /status still wants it.
    let (code, html) = svc.get("/").await;
    assert_eq!(code, 200);
    assert!(html.contains(r#"data-secret="true""#), "{html}");
    assert!(!html.contains(SECRET));
    assert_eq!(svc.get("/status").await.0, 401);

    let browser = Browser::launch(&bin);
    let mut page = browser.new_page().await;
    page.navigate(&format!("http://{}/", svc.addr)).await;
    let v = wait_page(&mut page, "the secret's prompt", |v| {
        v["loginShown"] == true
    })
    .await;
    assert_eq!(v["updates"], 0, "{v}");
    page.eval(&format!(
        r#"document.getElementById("secret").value = "{SECRET}";
           document.getElementById("login-form").requestSubmit(); true"#
    ))
    .await;
    let v = wait_page(&mut page, "the status read with the secret", |v| {
        v["updates"].as_u64().unwrap_or(0) >= 2
    })
    .await;
    assert!(v["role"].as_str().unwrap().starts_with("owner "), "{v}");
    assert_eq!(v["loginShown"], false, "{v}");
    // Kept in this tab's sessionStorage only: no localStorage, no cookie.
    let kept = page
        .eval(r#"JSON.stringify([Object.keys(sessionStorage), localStorage.length, document.cookie])"#)
        .await;
    assert_eq!(kept, r#"[["change-streamer-secret"],0,""]"#);
    let errors = page.errors();
    assert!(errors.is_empty(), "the page logged errors: {errors:#?}");
    drop(browser);
    svc.terminate().await;
}

#[actix_rt::test]
async fn on_a_shared_change_db_the_pages_show_the_instances_and_a_standby() {
    use standby_support::{ingest, owner_with, serving_standby, subscribe};
    use takeover_support::{instance_id, wm};
    let Some(bin) = chromium() else { return };
    let db = change_streamer_test_support::pg::TestDb::create("live_page").await;
    let up = change_streamer_test_support::upstream::FakeUpstream::start().await;
    let (_a, a_addr) = owner_with(&db, &up, &[]);
    up.wait_connections(1).await;
    ingest(&up, 100..=110, 2).await;
    let (_b, b_addr) = serving_standby(&db, &up, &[]).await;
    let (a_id, b_id) = (instance_id(&a_addr).await, instance_id(&b_addr).await);
    let _sub = subscribe(&b_addr, "rb", 100).await;

    let browser = Browser::launch(&bin);
    let mut page = browser.new_page().await;
    page.navigate(&format!("http://{a_addr}/")).await;
    let v = wait_page(
        &mut page,
        "the owner's instances, the standby among them",
        |v| {
            v["updates"].as_u64().unwrap_or(0) >= 2
                && v["instances"]
                    .as_array()
                    .is_some_and(|i| i.iter().any(|x| *x == b_id.as_str()))
        },
    )
    .await;
    assert!(
        v["instances"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| *x == a_id.as_str()),
        "{v}"
    );
    assert_eq!(v["role"], format!("owner {a_id}"), "{v}");

    page.navigate(&format!("http://{b_addr}/")).await;
    let v = wait_page(&mut page, "the standby's status", |v| {
        v["updates"].as_u64().unwrap_or(0) >= 2 && v["subscribers"]["rb"].is_object()
    })
    .await;
    assert_eq!(v["role"], format!("standby {b_id}"), "{v}");
    assert_eq!(v["maxWatermark"], Value::String(wm(110)), "{v}");
    assert_eq!(v["upstream"], "the owner's (this is a standby)", "{v}");
    assert!(v["purge"].as_str().unwrap().contains("the owner's"), "{v}");
    assert_eq!(v["error"], "", "{v}");
    let errors = page.errors();
    assert!(errors.is_empty(), "the pages logged errors: {errors:#?}");
}
