//! The SQLite change-log writer's CPU per transaction at a steady rate, and how long each
//! transaction takes to become durable (what delays the upstream ack).
//!
//! `cargo run --release -p change-streamer-actors --example writer_cost -- [RATE...]`
//! (environment: `DURATION_S` per run, default 10; `RUNS`, default 3; `CHANGES` per transaction,
//! default 10, begin and commit included; `TMPDIR` for the database). For each rate (default
//! 200 and 2000 transactions/s) it appends single transactions through a [`ChangeLog`] handle,
//! one every 1/RATE s, each queued alone as the streamer queues a commit, and reads the writer
//! thread's CPU time (`/proc/self/task/TID/schedstat`, nanoseconds) over the measured window.
//! One JSON line per run, then one per rate with the medians.
//!
//! Why a thread of its own paces the appends: a tokio timer ticks in whole milliseconds, so at
//! 2,000/s it would queue two transactions at once and let the writer group them for free.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use change_streamer_actors::changelog::{ChangeLog, Transaction};
use change_streamer_test_support::stored::{insert_row, stored_txn};
use futures_util::stream::{FuturesOrdered, StreamExt};
use serde_json::json;

/// The writer thread's name as the kernel keeps it (15 bytes).
const WRITER_COMM: &str = "change-log-writ";

/// Nanoseconds the writer thread of this process has run, from its schedstat.
fn writer_cpu_ns() -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() == WRITER_COMM {
            let stat = std::fs::read_to_string(dir.join("schedstat")).ok()?;
            return stat.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

/// A transaction of `changes` changes in all (begin and commit included).
fn txn(n: u64, changes: usize, row: &str) -> Transaction {
    stored_txn(n, row, changes.saturating_sub(2))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(0.0)
}

struct Run {
    cpu_us_per_txn: f64,
    achieved_rate: f64,
    durable_p50_ms: f64,
    durable_p99_ms: f64,
}

/// One run at `rate`: a warm-up second, then `seconds` measured.
fn run(rate: f64, seconds: f64, changes: usize) -> Run {
    let dir = tempfile::tempdir().expect("temporary directory");
    let log = ChangeLog::open(dir.path()).expect("open change log");
    let row = insert_row(80);
    // Durability is awaited on a runtime of its own; the pacing thread only queues.
    let (done_tx, done_rx) = mpsc::channel::<(bool, Duration)>();
    let (fut_tx, mut fut_rx) = tokio::sync::mpsc::unbounded_channel();
    let waiter = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // One task awaits them all in order, as the upstream client does with its acks.
        rt.block_on(async move {
            let mut pending = FuturesOrdered::new();
            let mut open = true;
            while open || !pending.is_empty() {
                tokio::select! {
                    next = fut_rx.recv(), if open => match next {
                        Some((measured, at, fut)) => pending.push_back(async move {
                            let res: Result<(), _> = fut.await;
                            res.expect("append");
                            (measured, at)
                        }),
                        None => open = false,
                    },
                    Some((measured, at)) = pending.next(), if !pending.is_empty() => {
                        let _ = done_tx.send((measured, Instant::now().duration_since(at)));
                    }
                }
            }
        });
    });
    let interval = Duration::from_secs_f64(1.0 / rate);
    let warmup = Duration::from_secs(1);
    let start = Instant::now();
    let (mut n, mut measured, mut cpu0, mut t0) = (1u64, 0u64, None, None);
    let mut next = start;
    loop {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        let now = Instant::now();
        let in_window = now.duration_since(start) >= warmup;
        if in_window && cpu0.is_none() {
            cpu0 = writer_cpu_ns();
            t0 = Some(now);
        }
        if let Some(t0) = t0 {
            if now.duration_since(t0).as_secs_f64() >= seconds {
                break;
            }
        }
        let fut = log.append(txn(n, changes, &row));
        let _ = fut_tx.send((in_window, now, fut));
        n += 1;
        measured += u64::from(in_window);
        next += interval;
    }
    let cpu1 = writer_cpu_ns();
    let elapsed = t0.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
    drop(fut_tx);
    let _ = waiter.join();
    let mut latencies: Vec<f64> = done_rx
        .try_iter()
        .filter(|(m, _)| *m)
        .map(|(_, d)| d.as_secs_f64() * 1000.0)
        .collect();
    let cpu_ns = cpu1.zip(cpu0).map(|(b, a)| b - a).unwrap_or(0) as f64;
    Run {
        cpu_us_per_txn: cpu_ns / 1000.0 / measured.max(1) as f64,
        achieved_rate: measured as f64 / elapsed.max(1e-9),
        durable_p50_ms: percentile(&mut latencies, 0.5),
        durable_p99_ms: percentile(&mut latencies, 0.99),
    }
}

fn main() {
    let env = |k: &str, d: f64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (seconds, runs, changes) = (
        env("DURATION_S", 10.0),
        env("RUNS", 3.0),
        env("CHANGES", 10.0),
    );
    let mut rates: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if rates.is_empty() {
        rates = vec![200.0, 2000.0];
    }
    for rate in rates {
        let all: Vec<Run> = (0..runs as usize)
            .map(|_| {
                let r = run(rate, seconds, changes as usize);
                println!(
                    "{}",
                    json!({"rate": rate, "cpu_us_per_txn": (r.cpu_us_per_txn * 10.0).round() / 10.0,
                           "achieved_rate": r.achieved_rate.round(),
                           "durable_p50_ms": (r.durable_p50_ms * 100.0).round() / 100.0,
                           "durable_p99_ms": (r.durable_p99_ms * 100.0).round() / 100.0})
                );
                r
            })
            .collect();
        let m = |f: fn(&Run) -> f64| median(all.iter().map(f).collect());
        println!(
            "{}",
            json!({"bench": "writer_cost", "rate": rate, "changes_per_txn": changes, "seconds": seconds,
                   "runs": all.len(),
                   "median_cpu_us_per_txn": (m(|r| r.cpu_us_per_txn) * 10.0).round() / 10.0,
                   "median_durable_p50_ms": (m(|r| r.durable_p50_ms) * 100.0).round() / 100.0,
                   "median_durable_p99_ms": (m(|r| r.durable_p99_ms) * 100.0).round() / 100.0,
                   "runs_cpu_us_per_txn": all.iter().map(|r| (r.cpu_us_per_txn * 10.0).round() / 10.0).collect::<Vec<_>>()})
        );
    }
}
