//! Benchmarks, measured rather than asserted: `cargo bench --bench bench [-- SECTION...]`.
//!
//! Sections (all by default): `fanout`, `stall`, `e2e`, `reservations`, `changelog`, `poll`,
//! `slow`.
//! Each prints one JSON line (`{"bench": ...}`) and one line for people. Where the original
//! JavaScript implementation has the same workload (`../shared/peer/broadcast-bench.mjs`), it
//! is run in the same invocation with the same parameters and the ratio is printed; pass
//! `--no-peer` to skip it. Figures and the machine they were taken on are in `BENCHMARKS.md`.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use change_streamer_actors::changelog::{ChangeLog, Transaction};
use change_streamer_actors::monitor::{Check, MonitorActor, MonitorConfig};
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{
    GetStreamerState, PurgeAnswer, PurgeIfSafe, Streamer, StreamerConfig, Subscribe, UpstreamBatch,
};
use change_streamer_actors::streamer::{Mode, SessionProgress, ToSession, Token};
use change_streamer_actors::upstream::protocol::UpstreamMessage;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support as support;
use serde_json::{json, Value};
use support::client::{Seen, WsClient};
use support::feed::feed;
use support::{litestream, upstream};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[(v.len() - 1) / 2]
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn report(v: Value, human: String) {
    println!("{v}");
    println!("  {human}");
}

/// Runs `node broadcast-bench.mjs ARGS` in an installed copy of the peer; its JSON line.
fn peer_bench(peer: &Option<std::path::PathBuf>, args: &[&str]) -> Option<Value> {
    let dir = peer.as_ref()?;
    let out = Command::new("node")
        .arg("broadcast-bench.mjs")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
}

// ---------------------------------------------------------------------------------------
// Fake subscriber sessions for the in-process benchmarks.

/// When each tracked frame (by token) was acked, per subscriber.
type AckTimes = Arc<Mutex<HashMap<Token, Vec<Instant>>>>;

/// A fake subscriber session that acks every batch as it arrives, reporting as the real
/// session does (`src/websocket/subscriber_socket.rs`): tracked frames at once, an acked commit alone at
/// most [`COMMIT_REPORT_DELAY`] later (the newest of them).
struct Session {
    session_id: SessionId,
    streamer: Addr<Streamer>,
    stalled: bool,
    received: u64,
    total: Arc<AtomicU64>,
    ack_times: Option<AckTimes>,
    delivered_at: Option<Arc<Mutex<Vec<Instant>>>>,
    /// An acked commit not reported yet: (messages acked, its watermark).
    unreported: Option<(u64, Watermark)>,
    report_armed: bool,
}

/// The real session's delay for reporting an acked commit alone.
const COMMIT_REPORT_DELAY: Duration = Duration::from_millis(5);

impl Actor for Session {
    type Context = Context<Self>;
}

impl Session {
    fn report(&mut self, acked: u64, tokens: Vec<Token>) {
        self.streamer.do_send(SessionProgress {
            session_id: self.session_id,
            acked_messages: acked,
            acked_commit: self.unreported.take().map(|(_, c)| c),
            tokens,
        });
    }
}

impl Handler<ToSession> for Session {
    type Result = ();
    fn handle(&mut self, msg: ToSession, ctx: &mut Context<Self>) {
        let ToSession::Send(frames) = msg else { return };
        self.received += frames.len() as u64;
        self.total.fetch_add(frames.len() as u64, Ordering::Relaxed);
        if let Some(d) = &self.delivered_at {
            d.lock().unwrap().push(Instant::now());
        }
        if self.stalled {
            return;
        }
        let mut tokens = Vec::new();
        for f in frames.iter() {
            if let Some(c) = &f.commit {
                self.unreported = Some((self.received, c.clone()));
            }
            tokens.extend(f.token);
        }
        if !tokens.is_empty() {
            if let Some(times) = &self.ack_times {
                let now = Instant::now();
                let mut t = times.lock().unwrap();
                for tok in &tokens {
                    t.entry(*tok).or_default().push(now);
                }
            }
            self.report(self.received, tokens);
        } else if self.unreported.is_some() && !self.report_armed {
            self.report_armed = true;
            ctx.run_later(COMMIT_REPORT_DELAY, |act, _| {
                act.report_armed = false;
                if let Some((acked, _)) = act.unreported {
                    act.report(acked, Vec::new());
                }
            });
        }
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    log: ChangeLog,
    streamer: Addr<Streamer>,
    total: Arc<AtomicU64>,
    ack_times: AckTimes,
    delivered_at: Arc<Mutex<Vec<Instant>>>,
    _arbiter: Arbiter,
}

fn w(n: u64) -> Watermark {
    Watermark::from_u64(n)
}

/// The peer's workload: begin, `changes` inserts of `row_bytes`, commit.
fn workload(first: u64, txns: u64, changes: u64, row_bytes: usize) -> Vec<UpstreamMessage> {
    let pad = "x".repeat(row_bytes);
    let mut v = Vec::with_capacity((txns * (changes + 2)) as usize);
    for t in first..first + txns {
        v.push(UpstreamMessage::Begin {
            payload: r#"{"tag":"begin"}"#.into(),
            commit_watermark: w(t),
            skip_ack: false,
        });
        for c in 0..changes {
            v.push(UpstreamMessage::Data {
                payload: format!(
                    r#"{{"tag":"insert","relation":{{"schema":"public","name":"issues","rowKey":{{"columns":["id"],"type":"default"}}}},"new":{{"id":"{t}-{c}","title":"{pad}"}}}}"#
                ),
            });
        }
        v.push(UpstreamMessage::Commit {
            payload: r#"{"tag":"commit"}"#.into(),
            watermark: w(t),
        });
    }
    v
}

/// A streamer (initialized at watermark 1) with `stalled.len()` fake sessions on a second thread.
async fn rig(padding: Duration, stalled: &[bool]) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    let stats = log.stats().await.unwrap();
    let streamer = Streamer::new(
        StreamerConfig {
            padding: Some(padding),
            ..StreamerConfig::default()
        },
        log.clone(),
        &stats,
    )
    .start();
    feed(&streamer, workload(1, 1, 1, 10), 512).await;
    let arbiter = Arbiter::new();
    let total = Arc::new(AtomicU64::new(0));
    let ack_times = Arc::new(Mutex::new(HashMap::new()));
    let delivered_at = Arc::new(Mutex::new(Vec::new()));
    for (i, &st) in stalled.iter().enumerate() {
        let session_id = SessionId(10_000 + i as u64);
        let (s2, t2, a2, d2) = (
            streamer.clone(),
            total.clone(),
            ack_times.clone(),
            delivered_at.clone(),
        );
        let session = Session::start_in_arbiter(&arbiter.handle(), move |_| Session {
            session_id,
            streamer: s2,
            stalled: st,
            received: 0,
            total: t2,
            ack_times: Some(a2),
            delivered_at: (i == 0).then_some(d2),
            unreported: None,
            report_armed: false,
        });
        streamer
            .send(Subscribe {
                session_id,
                id: format!("s{i}"),
                mode: Mode::Serving,
                protocol: 6,
                replica_version: w(1).to_string(),
                watermark: w(1),
                session: session.recipient(),
            })
            .await
            .unwrap()
            .unwrap();
    }
    loop {
        let st = streamer.send(GetStreamerState).await.unwrap();
        if st
            .subscribers
            .iter()
            .all(|s| format!("{:?}", s.phase) == "Live")
        {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
    Rig {
        _dir: dir,
        log,
        streamer,
        total,
        ack_times,
        delivered_at,
        _arbiter: arbiter,
    }
}

// ---------------------------------------------------------------------------------------

async fn fanout(peer: &Option<std::path::PathBuf>) {
    for subs in [8usize, 64] {
        let (txns, changes) = (10_000u64, 10u64);
        let mut runs = Vec::new();
        let mut waits = 0;
        for run in 0..4 {
            let r = rig(Duration::from_secs(1), &vec![false; subs]).await;
            let msgs = workload(2, if run == 0 { 1000 } else { txns }, changes, 100);
            let sent = msgs.len() as u64;
            let base = r.total.load(Ordering::Relaxed);
            let t0 = Instant::now();
            waits = feed(&r.streamer, msgs, 512).await;
            while r.total.load(Ordering::Relaxed) < base + sent * subs as u64 {
                tokio::task::yield_now().await;
                actix_rt::time::sleep(Duration::from_micros(200)).await;
            }
            if run > 0 {
                runs.push(sent as f64 / t0.elapsed().as_secs_f64());
            }
        }
        let ours = median(&mut runs.clone());
        let theirs = peer_bench(
            peer,
            &[
                "--phases",
                "throughput",
                "--subs",
                &subs.to_string(),
                "--txns",
                "10000",
                "--changes",
                "10",
                "--repeat",
                "3",
            ],
        )
        .and_then(|v| v["throughput"]["changes_per_s"].as_f64());
        report(
            json!({"bench": "fanout", "subscribers": subs, "txns": txns, "changesPerTxn": changes, "changes_per_s": ours.round(),
                   "deliveries_per_s": (ours * subs as f64).round(), "runs_changes_per_s": runs.iter().map(|r| r.round()).collect::<Vec<_>>(),
                   "trackedSendsWaitedOn": waits, "peer_changes_per_s": theirs, "ratio": theirs.map(|t| (ours / t * 10.0).round() / 10.0)}),
            format!(
                "fan-out to {subs} subscribers: {:.0} changes/s ({:.2} M deliveries/s), median of {} runs{}",
                ours,
                ours * subs as f64 / 1e6,
                runs.len(),
                theirs.map(|t| format!("; original {t:.0} changes/s, ratio {:.1}x", ours / t)).unwrap_or_default()
            ),
        );
    }
}

async fn stall(peer: &Option<std::path::PathBuf>) {
    let padding = 100.0;
    for stalled_n in [2usize, 1] {
        let mut stalled = vec![false; 5];
        for s in stalled.iter_mut().skip(5 - stalled_n) {
            *s = true;
        }
        let r = rig(Duration::from_secs_f64(padding / 1000.0), &stalled).await;
        let mut after_third = Vec::new();
        let mut release = Vec::new();
        // Each transaction carries a 64 KiB change, so each is (at least) one tracked send.
        for next in 2..22u64 {
            let mut msgs = workload(next, 1, 1, 70_000);
            while !msgs.is_empty() {
                let reply = r
                    .streamer
                    .send(UpstreamBatch(std::mem::take(&mut msgs)))
                    .await
                    .unwrap()
                    .unwrap();
                msgs = reply.rest;
                if let Some(rx) = reply.release {
                    let t0 = Instant::now();
                    let _ = rx.await;
                    let released = Instant::now();
                    release.push((released - t0).as_secs_f64() * 1000.0);
                    let times = r.ack_times.lock().unwrap();
                    let third = times
                        .values()
                        .filter(|v| v.len() >= 3)
                        .filter_map(|v| v.iter().max().copied())
                        .max();
                    drop(times);
                    if let Some(third) = third {
                        after_third.push((released - third).as_secs_f64() * 1000.0);
                    }
                    r.ack_times.lock().unwrap().clear();
                }
            }
        }
        let p50 = percentile(&mut after_third.clone(), 0.5);
        let p99 = percentile(&mut after_third.clone(), 0.99);
        let theirs = if stalled_n == 1 {
            peer_bench(
                peer,
                &[
                    "--phases",
                    "stall",
                    "--stall-subs",
                    "5",
                    "--padding",
                    "0.1",
                    "--stall-sends",
                    "5",
                ],
            )
            .map(|v| v["stall"].clone())
        } else {
            None
        };
        report(
            json!({"bench": "stall", "subscribers": 5, "stalled": stalled_n, "paddingMs": padding, "sends": after_third.len(),
                   "after_third_ack_ms_p50": (p50 * 10.0).round() / 10.0, "after_third_ack_ms_p99": (p99 * 10.0).round() / 10.0,
                   "release_ms_max": (release.iter().cloned().fold(0.0, f64::max) * 10.0).round() / 10.0,
                   "peer": theirs}),
            format!(
                "stalled minority ({stalled_n} of 5 never ack, padding {padding} ms): release {p50:.1} ms (p50) / {p99:.1} ms (p99) after the third ack{}",
                theirs
                    .as_ref()
                    .and_then(|t| t["release_ms_mean"].as_f64())
                    .map(|m| format!("; original (1 stalled): {m:.1} ms mean after the send"))
                    .unwrap_or_default()
            ),
        );
    }
}

/// CPU seconds (user + system) a process has used.
fn cpu_seconds(pid: &str) -> f64 {
    let ticks = 100.0; // USER_HZ on Linux
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rsplit(')').next()?.split_whitespace().collect::<Vec<_>>();
            let u: f64 = after.get(11)?.parse().ok()?;
            let st: f64 = after.get(12)?.parse().ok()?;
            Some((u + st) / ticks)
        })
        .unwrap_or(0.0)
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

struct Child_ {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Child_ {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn spawn_service(args: &[&str]) -> Child_ {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_change-streamer"))
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--data-dir",
        ])
        .arg(dir.path())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the service binary");
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    Child_ {
        child,
        port,
        _dir: dir,
    }
}

/// The frames of transaction `n`: 1–20 inserts of ~80 bytes, each stamped with when it was
/// built (µs since `epoch`) so that subscribers can measure latency.
fn stamped_txn(n: u64, epoch: Instant) -> Vec<String> {
    let wm = w(n);
    let now = epoch.elapsed().as_secs_f64() * 1e6;
    let pad = "x".repeat(80);
    let mut frames = vec![format!(
        r#"["begin",{{"tag":"begin"}},{{"commitWatermark":"{wm}"}}]"#
    )];
    for r in 0..1 + (n * 7919) % 20 {
        frames.push(format!(
            r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"items","keyColumns":["id"]}},"new":{{"id":{},"sent":{now:.0},"v":"{pad}"}}}}]"#,
            n * 100 + r
        ));
    }
    frames.push(format!(
        r#"["commit",{{"tag":"commit"}},{{"watermark":"{wm}"}}]"#
    ));
    frames
}

async fn e2e() {
    let up = upstream::FakeUpstream::start().await;
    let url = up.url();
    // E2E_STALL=1: subscriber 0 stops reading after 2,000 messages (liveness drops it).
    let stall = std::env::var("E2E_STALL").is_ok_and(|v| v == "1");
    let svc = spawn_service(&[
        "--upstream",
        &url,
        "--ping-interval-ms",
        if stall { "2000" } else { "30000" },
    ])
    .await;
    up.wait_connections(1).await;
    let epoch = Instant::now();
    up.send(upstream::txn(1, 1));
    actix_rt::time::sleep(Duration::from_millis(200)).await;
    let subs: usize = std::env::var("E2E_SUBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let received = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let mut handles = Vec::new();
    for i in 0..subs {
        let url = format!(
            "ws://127.0.0.1:{}/replication/v6/changes?id=b{i}&replicaVersion={}&watermark={}",
            svc.port,
            w(1),
            w(1)
        );
        let (received, latencies) = (received.clone(), latencies.clone());
        handles.push(actix_rt::spawn(async move {
            let mut c = WsClient::connect(&url).await;
            let mut seen = 0u64;
            while let Some(Seen::Msg { id, msg }) = c.next(Duration::from_secs(5)).await {
                seen += 1;
                if stall && i == 0 && seen == 2000 {
                    std::future::pending::<()>().await;
                }
                if msg[0] == "data" {
                    if let Some(sent) = msg[1]["new"]["sent"].as_f64() {
                        let now = epoch.elapsed().as_secs_f64() * 1e6;
                        latencies.lock().unwrap().push((now - sent) / 1000.0);
                    }
                }
                received.fetch_add(1, Ordering::Relaxed);
                c.ack(id).await;
            }
        }));
    }
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    // Transactions of 1–20 rows, paced by the service's acks (at most `window` in flight).
    let txns: u64 = std::env::var("E2E_TXNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let window = 500u64;
    let mut sent_changes = 0u64;
    let svc_pid = svc.child.id().to_string();
    let (svc_cpu0, own_cpu0) = (cpu_seconds(&svc_pid), cpu_seconds("self"));
    let t0 = Instant::now();
    let mut peak = 0;
    let mut n = 2u64;
    while n < 2 + txns {
        let acked = up.acks().len() as u64;
        if n - 1 > acked + window {
            actix_rt::time::sleep(Duration::from_micros(500)).await;
            continue;
        }
        let mut frames = Vec::new();
        for _ in 0..50 {
            if n >= 2 + txns {
                break;
            }
            let txn = stamped_txn(n, epoch);
            sent_changes += txn.len() as u64;
            frames.extend(txn);
            n += 1;
        }
        up.send(frames);
        peak = peak.max(rss_kib(svc.child.id(), "VmRSS:"));
    }
    let target = sent_changes * (subs as u64 - u64::from(stall));
    let deadline = Instant::now() + Duration::from_secs(120);
    // Each subscriber also got the initial status frame.
    while received.load(Ordering::Relaxed) < target + subs as u64 && Instant::now() < deadline {
        actix_rt::time::sleep(Duration::from_millis(5)).await;
        peak = peak.max(rss_kib(svc.child.id(), "VmRSS:"));
    }
    let secs = t0.elapsed().as_secs_f64();
    let (svc_cpu, own_cpu) = (
        cpu_seconds(&svc_pid) - svc_cpu0,
        cpu_seconds("self") - own_cpu0,
    );
    let flow = match awc::Client::new()
        .get(format!("http://127.0.0.1:{}/status", svc.port))
        .send()
        .await
    {
        Ok(mut r) => r
            .json::<Value>()
            .limit(1 << 24)
            .await
            .map(|v| v["flowControl"].clone())
            .unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    let hwm = rss_kib(svc.child.id(), "VmHWM:");
    // Latency at a steady 200 transactions/s (well below saturation), one every 5 ms.
    latencies.lock().unwrap().clear();
    let (lat_txns, before) = (1000u64, received.load(Ordering::Relaxed));
    let mut lat_changes = 0;
    let mut tick = actix_rt::time::interval(Duration::from_millis(5));
    for _ in 0..lat_txns {
        tick.tick().await;
        let frames = stamped_txn(n, epoch);
        lat_changes += frames.len() as u64;
        n += 1;
        up.send(frames);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) < before + lat_changes * subs as u64
        && Instant::now() < deadline
    {
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    let mut lat = latencies.lock().unwrap().clone();
    let (p50, p99) = (percentile(&mut lat, 0.5), percentile(&mut lat, 0.99));
    let per_sub = received.load(Ordering::Relaxed) as f64 / subs as f64 / secs;
    report(
        json!({"bench": "e2e", "subscribers": subs, "stalledSubscriber": stall, "txns": txns, "changes": sent_changes, "seconds": (secs * 100.0).round() / 100.0,
               "changes_per_s_per_subscriber": per_sub.round(), "deliveries_per_s": (per_sub * subs as f64).round(),
               "latency_at_txns_per_s": 200, "latency_ms_p50": (p50 * 100.0).round() / 100.0, "latency_ms_p99": (p99 * 100.0).round() / 100.0,
               "service_peak_rss_mib": (hwm.max(peak) as f64 / 1024.0).round(),
               "flowControl": flow, "service_cpu_s": (svc_cpu * 10.0).round() / 10.0, "clients_cpu_s": (own_cpu * 10.0).round() / 10.0}),
        format!(
            "end to end over loopback, {subs} websocket subscribers: {per_sub:.0} changes/s each ({:.0} deliveries/s) saturated; at 200 txns/s latency p50 {p50:.2} ms / p99 {p99:.2} ms; service peak RSS {:.0} MiB",
            per_sub * subs as f64,
            hwm.max(peak) as f64 / 1024.0
        ),
    );
    drop(svc);
    for h in handles {
        h.abort();
    }
}

async fn reservations() {
    let up = upstream::FakeUpstream::start().await;
    let url = up.url();
    let svc = spawn_service(&[
        "--upstream",
        &url,
        "--litestream-backup-url",
        "s3://b/r",
        "--ping-interval-ms",
        "60000",
    ])
    .await;
    up.wait_connections(1).await;
    up.send(upstream::txn(1, 1));
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    let total = 10_000usize;
    let before = rss_kib(svc.child.id(), "VmRSS:");
    let mut held = Vec::with_capacity(total);
    let mut lat = Vec::with_capacity(total);
    let t0 = Instant::now();
    // RES_WAVE: how many are opened at once (default 50; 500 shows the load generator queueing).
    let wave_size: usize = std::env::var("RES_WAVE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
        .max(1);
    for wave in 0..total.div_ceil(wave_size) {
        let mut conns = Vec::new();
        for i in 0..wave_size.min(total - wave * wave_size) {
            let url = format!(
                "ws://127.0.0.1:{}/replication/v6/snapshot?taskID=t{}",
                svc.port,
                wave * wave_size + i
            );
            conns.push(actix_rt::spawn(async move {
                let start = Instant::now();
                let mut c = WsClient::connect(&url).await;
                let (id, _) = c.msg().await;
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                c.ack(id).await;
                (c, ms)
            }));
        }
        for c in conns {
            let (c, ms) = c.await.unwrap();
            held.push(c);
            lat.push(ms);
        }
    }
    let all_ms = t0.elapsed().as_secs_f64() * 1000.0;
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    let rss = rss_kib(svc.child.id(), "VmRSS:");
    let hwm = rss_kib(svc.child.id(), "VmHWM:");
    let (p50, p99) = (
        percentile(&mut lat.clone(), 0.5),
        percentile(&mut lat, 0.99),
    );
    report(
        json!({"bench": "reservations", "held": held.len(), "opened_at_once": wave_size, "status_ms_p50": (p50 * 100.0).round() / 100.0, "status_ms_p99": (p99 * 100.0).round() / 100.0,
               "open_all_ms": all_ms.round(), "rss_mib_before": (before as f64 / 1024.0).round(), "rss_mib_held": (rss as f64 / 1024.0).round(),
               "peak_rss_mib": (hwm as f64 / 1024.0).round()}),
        format!(
            "{} concurrent snapshot reservations (opened {wave_size} at a time): status after {p50:.2} ms (p50) / {p99:.2} ms (p99); service RSS {:.0} MiB held (peak {:.0} MiB)",
            held.len(),
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0
        ),
    );
    drop(held);
    drop(svc);
}

async fn changelog() {
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

async fn poll() {
    let series = 10_000usize;
    let mut samples: Vec<(Option<String>, String, String)> = Vec::new();
    for i in 0..series {
        samples.push((
            Some(w(1_000_000 + i as u64).to_string()),
            format!("r{}", i % 7),
            "1745456444.765".into(),
        ));
    }
    let refs: Vec<(Option<&str>, &str, String)> = samples
        .iter()
        .map(|(a, b, c)| (a.as_deref(), b.as_str(), c.clone()))
        .collect();
    let body = litestream::render_page("/data/replica.db", &refs);
    let mut parse = Vec::new();
    for _ in 0..20 {
        let t0 = Instant::now();
        let page = change_streamer_actors::litestream::parse_progress_page(&body).unwrap();
        assert_eq!(page.samples.len(), series);
        parse.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    let lite = litestream::FakeLitestream::start(litestream::Answer {
        body: body.clone(),
        ..Default::default()
    })
    .await;
    struct Sink;
    impl Actor for Sink {
        type Context = Context<Self>;
    }
    impl Handler<change_streamer_actors::cleanup::ScheduleCleanup> for Sink {
        type Result = ();
        fn handle(
            &mut self,
            _: change_streamer_actors::cleanup::ScheduleCleanup,
            _: &mut Context<Self>,
        ) {
        }
    }
    let cleanup = change_streamer_actors::cleanup::CleanupActor::new(
        change_streamer_actors::clock::Clock::System,
        Duration::from_secs(30),
        Duration::from_secs(30),
        Sink.start().recipient(),
    )
    .start();
    let mut cfg = MonitorConfig::new(lite.url(), Duration::from_secs(60));
    cfg.poll_automatically = false;
    let monitor = MonitorActor::new(cfg, cleanup).start();
    let mut full = Vec::new();
    for _ in 0..20 {
        let t0 = Instant::now();
        monitor.send(Check).await.unwrap();
        full.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    let (p, f) = (median(&mut parse), median(&mut full));
    report(
        json!({"bench": "poll", "series": series, "body_bytes": body.len(), "parse_ms_median": (p * 100.0).round() / 100.0,
               "poll_ms_median": (f * 100.0).round() / 100.0}),
        format!("metrics poll of {series} series ({} KiB): parse {p:.2} ms, whole poll (HTTP + parse + record) {f:.2} ms, medians of 20", body.len() / 1024),
    );
}

// ---------------------------------------------------------------------------------------
// `slow`: slow subscribers against the real binary (PROTOCOL.md §10.1, §10.2).

/// Healthy websocket subscribers that read and ack everything, counting the changes (not the
/// status frame) they receive.
fn healthy_subscribers(
    port: u16,
    ids: &[&str],
    received: &Arc<AtomicU64>,
) -> Vec<actix_rt::task::JoinHandle<()>> {
    ids.iter()
        .map(|id| {
            let url = format!(
                "ws://127.0.0.1:{port}/replication/v6/changes?id={id}&replicaVersion={}&watermark={}",
                w(1),
                w(1)
            );
            let received = received.clone();
            actix_rt::spawn(async move {
                let mut c = WsClient::connect(&url).await;
                while let Some(Seen::Msg { id, msg }) = c.next(Duration::from_secs(30)).await {
                    if msg[0] != "status" {
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                    c.ack(id).await;
                }
            })
        })
        .collect()
}

/// Sends transactions of 100 inserts from watermark `first` on, keeping at most 200
/// unacknowledged by the service, until `stop` says so; returns the changes sent and the
/// next watermark.
async fn feed_upstream(
    up: &upstream::FakeUpstream,
    first: u64,
    mut stop: impl FnMut(u64) -> bool,
) -> (u64, u64) {
    let (mut n, mut sent) = (first, 0u64);
    let acked_before = up.acks().len() as u64;
    while !stop(sent) {
        let acked = up.acks().len() as u64 - acked_before;
        if n - first > acked + 200 {
            actix_rt::time::sleep(Duration::from_micros(500)).await;
            continue;
        }
        let frames: Vec<String> = (n..n + 10).flat_map(|t| upstream::txn(t, 100)).collect();
        sent += frames.len() as u64;
        n += 10;
        up.send(frames);
    }
    (sent, n)
}

/// A service with an upstream, initialized at watermark 1, and one subscriber (`never`) that
/// connects and then never reads its socket.
async fn slow_rig(args: &[&str]) -> (upstream::FakeUpstream, Child_) {
    let up = upstream::FakeUpstream::start().await;
    let url = up.url();
    let mut all = vec!["--upstream", url.as_str()];
    all.extend_from_slice(args);
    let svc = spawn_service(&all).await;
    up.wait_connections(1).await;
    up.send(upstream::txn(1, 1));
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    (up, svc)
}

async fn slow() {
    let runs: usize = std::env::var("SLOW_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // (a) One subscriber that never reads and two healthy ones, 1,000,000 changes, padding 0 and
    // no eviction (the hardest case for memory): the service's peak RSS.
    let total: u64 = std::env::var("SLOW_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let mut peaks = Vec::new();
    let mut complete = true;
    for _ in 0..runs {
        let (up, svc) = slow_rig(&[
            "--flow-control-consensus-padding-seconds",
            "0",
            "--slow-subscriber-grace-ms",
            "0",
        ])
        .await;
        let url = format!(
            "ws://127.0.0.1:{}/replication/v6/changes?id=never&replicaVersion={}&watermark={}",
            svc.port,
            w(1),
            w(1)
        );
        let never = WsClient::connect(&url).await;
        let received = Arc::new(AtomicU64::new(0));
        let healthy = healthy_subscribers(svc.port, &["h1", "h2"], &received);
        actix_rt::time::sleep(Duration::from_millis(300)).await;
        let (sent, _) = feed_upstream(&up, 2, |sent| sent >= total).await;
        let deadline = Instant::now() + Duration::from_secs(120);
        while received.load(Ordering::Relaxed) < 2 * sent && Instant::now() < deadline {
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        let got = received.load(Ordering::Relaxed);
        complete &= got == 2 * sent;
        let peak = rss_kib(svc.child.id(), "VmHWM:") as f64 / 1024.0;
        println!(
            "  run: {sent} changes, healthy received {got} of {}, service peak RSS {peak:.0} MiB",
            2 * sent
        );
        peaks.push(peak);
        drop(never);
        drop(svc);
        for h in healthy {
            h.abort();
        }
        up.stop().await;
    }
    let peak = median(&mut peaks.clone());
    report(
        json!({"bench": "slow_memory", "changes": total, "subscribers": 3, "neverReading": 1, "paddingSeconds": 0, "graceMs": 0,
               "service_peak_rss_mib_median": peak.round(), "runs_peak_rss_mib": peaks.iter().map(|p| p.round()).collect::<Vec<_>>(),
               "healthy_received_everything": complete}),
        format!("one never-reading subscriber and two healthy ones, {total} changes: service peak RSS {peak:.0} MiB (median of {runs}); healthy ones received everything: {complete}"),
    );

    // (b) Healthy subscribers' throughput over 20 s with one stalled subscriber of three, at the
    // default padding (1 s) and grace (30 s), against the same run without it.
    let window = Duration::from_secs(20);
    let mut ratios = Vec::new();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        for stalled in [false, true] {
            let (up, svc) = slow_rig(&[]).await;
            let never = if stalled {
                Some(
                    WsClient::connect(&format!(
                        "ws://127.0.0.1:{}/replication/v6/changes?id=stalled&replicaVersion={}&watermark={}",
                        svc.port,
                        w(1),
                        w(1)
                    ))
                    .await,
                )
            } else {
                None
            };
            let received = Arc::new(AtomicU64::new(0));
            let healthy = healthy_subscribers(svc.port, &["h1", "h2"], &received);
            actix_rt::time::sleep(Duration::from_millis(300)).await;
            let t0 = Instant::now();
            feed_upstream(&up, 2, |_| t0.elapsed() >= window).await;
            let per_s = received.load(Ordering::Relaxed) as f64 / 2.0 / t0.elapsed().as_secs_f64();
            if stalled {
                with.push(per_s)
            } else {
                without.push(per_s)
            }
            drop(never);
            drop(svc);
            for h in healthy {
                h.abort();
            }
            up.stop().await;
        }
        if let (Some(a), Some(b)) = (with.last(), without.last()) {
            ratios.push(a / b);
            println!(
                "  run: {a:.0} vs {b:.0} changes/s per healthy subscriber ({:.0} %)",
                a / b * 100.0
            );
        }
    }
    let (a, b, r) = (median(&mut with), median(&mut without), median(&mut ratios));
    report(
        json!({"bench": "slow_throughput", "seconds": window.as_secs(), "subscribers": 3, "stalled": 1, "paddingSeconds": 1, "graceMs": 30000,
               "with_stalled_changes_per_s": a.round(), "without_changes_per_s": b.round(), "ratio_median": (r * 1000.0).round() / 1000.0,
               "runs_ratio": ratios.iter().map(|r| (r * 1000.0).round() / 1000.0).collect::<Vec<_>>()}),
        format!("one stalled subscriber of three, default padding and grace, over {} s: healthy ones at {a:.0} changes/s each vs {b:.0} without it: {:.0} % (median of {runs})", window.as_secs(), r * 100.0),
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--bench"))
        .collect();
    let no_peer = args.iter().any(|a| a == "--no-peer");
    let all = [
        "fanout",
        "stall",
        "e2e",
        "reservations",
        "changelog",
        "poll",
        "slow",
    ];
    let chosen: Vec<&str> = {
        let named: Vec<&str> = args
            .iter()
            .map(String::as_str)
            .filter(|a| all.contains(a))
            .collect();
        if named.is_empty() {
            all.to_vec()
        } else {
            named
        }
    };
    let needs_peer = !no_peer && chosen.iter().any(|c| *c == "fanout" || *c == "stall");
    let peer_install = if needs_peer {
        support::installed_peer()
    } else {
        None
    };
    let peer = peer_install.as_ref().map(|(_, p)| p.clone());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!(
        "{}",
        json!({"machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "cpu": cpu}, "peer": peer.is_some()})
    );
    actix_rt::System::new().block_on(async move {
        for c in chosen {
            match c {
                "fanout" => fanout(&peer).await,
                "stall" => stall(&peer).await,
                "e2e" => e2e().await,
                "reservations" => reservations().await,
                "changelog" => changelog().await,
                "poll" => poll().await,
                "slow" => slow().await,
                _ => {}
            }
        }
    });
}
