//! End-to-end load generator for a change-streamer, in its own process and thread: it is the
//! custom change source the service connects to (`--listen`, PROTOCOL.md §4) and `--subs` websocket
//! subscribers of its `/replication/v6/changes` (PROTOCOL.md §5, §7). It measures deliveries/s, the
//! service's CPU per delivery (utime + stime of `--service-pid` and its descendants from
//! `/proc`), its own CPU, and commit-to-receipt latency, and prints one JSON line and one human
//! line. The same workload drives our service and zero's replication-manager.

mod cpu;
mod memory;
mod report;
mod shared;
mod subscriber;
mod upstream;
mod workload;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::net::TcpListener;

use crate::report::{Report, Snapshot};
use crate::shared::{ServiceAccess, Shared};
use crate::subscriber::Framing;
use crate::upstream::{Pace, SourceConfig};

#[derive(Parser, Debug)]
#[command(about = "End-to-end load generator for a change-streamer (ours or zero's).")]
struct Args {
    /// Address the change source listens on; the service's `--upstream` points here.
    #[arg(long, default_value = "127.0.0.1:7001")]
    listen: String,
    /// Base URL of the service's websocket endpoints (`ws://` or `wss://`).
    #[arg(long, default_value = "ws://127.0.0.1:4849")]
    service: String,
    /// Secret the subscribers present (`Authorization: Bearer …`), as the service's --secret.
    #[arg(long)]
    secret: Option<String>,
    /// PEM certificate(s) the subscribers trust for a `wss://` --service.
    #[arg(long)]
    ca_file: Option<String>,
    /// File holding the service's PID (read once it exists); its process tree's CPU is measured.
    #[arg(long)]
    service_pid_file: String,
    /// Label of the service in the report.
    #[arg(long, default_value = "ours")]
    label: String,
    #[arg(long, default_value_t = 8)]
    subs: usize,
    /// Inserts per transaction.
    #[arg(long, default_value_t = 10)]
    changes: usize,
    /// Bytes of each insert's payload (about); 0 keeps the ~160-byte rows.
    #[arg(long, default_value_t = 0)]
    row_bytes: usize,
    /// Subscribe with `wsBatched=true`: read both frame shapes, ack cumulatively (PROTOCOL.md §5).
    #[arg(long)]
    batched: bool,
    /// More subscribers that ack their `status` and then never read their socket (PROTOCOL.md
    /// §10.2); not counted in the deliveries.
    #[arg(long, default_value_t = 0)]
    never_reading: usize,
    /// Transactions per second; 0 = saturate (as many as the window allows).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Transactions sent ahead of the service's upstream acks at most.
    #[arg(long, default_value_t = 256)]
    window: u64,
    #[arg(long, default_value_t = 3.0)]
    warm_s: f64,
    #[arg(long, default_value_t = 10.0)]
    meas_s: f64,
    /// Seconds to wait for the service and every subscriber's `status`.
    #[arg(long, default_value_t = 120.0)]
    setup_timeout_s: f64,
    #[arg(long, default_value = "zero")]
    app: String,
    #[arg(long, default_value = "0")]
    shard: String,
}

fn main() {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(&format!("cannot start the runtime: {e}")),
    };
    let local = tokio::task::LocalSet::new();
    let code = local.block_on(&rt, run(args));
    std::process::exit(code);
}

fn fail(msg: &str) -> ! {
    eprintln!("loadgen: {msg}");
    std::process::exit(1);
}

async fn run(args: Args) -> i32 {
    let shared = Rc::new(Shared::new());
    let listener = match TcpListener::bind(&args.listen).await {
        Ok(l) => l,
        Err(e) => fail(&format!("cannot listen on {}: {e}", args.listen)),
    };
    let pace = if args.rate > 0.0 {
        Pace::Rate(args.rate)
    } else {
        Pace::Saturate
    };
    let cfg = SourceConfig {
        app: args.app.clone(),
        shard: args.shard.clone(),
        changes: args.changes,
        filler: workload::filler(args.row_bytes),
        window: args.window,
        pace,
    };
    let go_at = Rc::new(Cell::new(None));
    tokio::task::spawn_local(upstream::serve(
        listener,
        shared.clone(),
        cfg,
        go_at.clone(),
    ));

    let deadline = Instant::now() + Duration::from_secs_f64(args.setup_timeout_s);
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&args.service_pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            break pid;
        }
        if Instant::now() > deadline {
            fail(&format!("no PID in {}", args.service_pid_file));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::task::spawn_local(memory::sample_peak(shared.clone(), pid));
    let framing = if args.batched {
        Framing::Batched
    } else {
        Framing::PerFrame
    };
    let tls = match args.ca_file.as_deref().map(ServiceAccess::trusting) {
        Some(Err(e)) => fail(&e),
        Some(Ok(tls)) => Some(tls),
        None => None,
    };
    let access = Rc::new(ServiceAccess {
        secret: args.secret.clone(),
        tls,
    });
    for k in 0..args.subs {
        let name = format!("lg-{}-{k}", std::process::id());
        tokio::task::spawn_local(subscriber::run(
            shared.clone(),
            access.clone(),
            args.service.clone(),
            name,
            args.changes,
            framing,
            deadline,
        ));
    }
    for k in 0..args.never_reading {
        let name = format!("lg-{}-never-{k}", std::process::id());
        tokio::task::spawn_local(subscriber::hold(
            shared.clone(),
            access.clone(),
            args.service.clone(),
            name,
            deadline,
        ));
    }
    while shared.subs_ready.get() < args.subs + args.never_reading {
        if shared.error_count.get() > 0 || Instant::now() > deadline {
            fail("subscribers did not all get their status");
        }
        tokio::select! {
            _ = shared.subs_ready_changed.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    go_at.set(Some(Instant::now()));
    shared.go.set(true);
    shared.go_changed.notify_waiters();

    tokio::time::sleep(Duration::from_secs_f64(args.warm_s)).await;
    let a = Snapshot::take(&shared, pid);
    shared.recording.set(true);
    tokio::time::sleep(Duration::from_secs_f64(args.meas_s)).await;
    shared.recording.set(false);
    let b = Snapshot::take(&shared, pid);
    shared.stop.set(true);
    shared.stop_changed.notify_waiters();

    let report = Report {
        label: &args.label,
        subs: args.subs,
        never_reading: args.never_reading,
        batched: args.batched,
        changes_per_txn: args.changes,
        rate: args.rate,
        window: args.window,
        a,
        b,
        shared: &shared,
    };
    report.print();
    if shared.error_count.get() > 0 {
        2
    } else {
        0
    }
}
