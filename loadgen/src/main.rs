//! End-to-end load generator for a change-streamer, in its own process: it is the
//! custom change source the service connects to (`--listen`, PROTOCOL.md §4) and `--subs` websocket
//! subscribers of its `/replication/v6/changes` (PROTOCOL.md §5, §7). It measures deliveries/s, the
//! service's CPU per delivery (utime + stime of `--service-pid` and its descendants from
//! `/proc`), its own CPU, and commit-to-receipt latency, and prints one JSON line and one human
//! line. The same workload drives our service and zero's replication-manager.
//!
//! Several instances sharing one change DB (PROTOCOL.md §14.1) are measured together:
//! `--service` takes a comma-separated list of base URLs, the subscribers assigned to them
//! round-robin (subscriber k to address k mod n), and `--service-pid-file` a comma-separated
//! list of PID files, each process tree's CPU measured apart (`processes` in the JSON, in the
//! list's order; the `service*` CPU figures are their sum) and the deliveries and latencies
//! split by address (`services`). `--join-late` starts the flood without subscribers and
//! subscribes them at the start of the measured window, from the replicaVersion: they catch
//! up from the change log while it is measured.
//!
//! `--churn-subs N --churn-rate R` adds N subscribers that join and leave, R a second, each from
//! a stored commit, while the flood runs ([`churn`]): the steady subscribers' figures are
//! theirs alone, the joiners' (joins, leaves, what they received, any gap as an error) apart.
//! `--idle-s S` measures the service's memory per idle subscriber: its `RssAnon` once the
//! initial sync is stored and before anyone subscribes, then S seconds after every subscriber
//! has its `status` (connected, caught up, no traffic yet).
//!
//! `--check-subs K` checks a sample: K of the subscribers ([`sample`], spread over the
//! addresses and threads) read as above; the others are light ([`light`]: they check the frame
//! ids, ack and count every delivery, but parse no message), so that at hundreds of subscribers
//! the generator does not take the CPU the service needs. Deliveries, messages and frames count
//! every subscriber; latencies and gaps are the K checked ones' (`checkedSubs` in the JSON).
//!
//! Everything runs on the main thread by default; `--threads N` spreads the subscribers over N
//! threads (the main one and N-1 more, [`crew`]) for the loads one thread cannot read.

mod churn;
mod cpu;
mod crew;
mod ctx;
mod frames;
mod light;
mod limits;
mod memory;
mod report;
mod sample;
mod sched;
mod sent;
mod shared;
mod subscriber;
mod tally;
mod upstream;
mod workload;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::net::TcpListener;

use crate::ctx::Framing;
use crate::ctx::Setup;
use crate::report::{Report, Snapshot};
use crate::shared::{Run, ServiceAccess};
use crate::tally::Counters;
use crate::upstream::{Pace, SourceConfig, SourceStats};

#[derive(Parser, Debug)]
#[command(about = "End-to-end load generator for a change-streamer (ours or zero's).")]
struct Args {
    /// Address the change source listens on; the service's `--upstream` points here.
    #[arg(long, default_value = "127.0.0.1:7001")]
    listen: String,
    /// Base URL of the service's websocket endpoints (`ws://` or `wss://`); a comma-separated
    /// list spreads the subscribers over several, round-robin.
    #[arg(long, default_value = "ws://127.0.0.1:4849")]
    service: String,
    /// Secret the subscribers present (`Authorization: Bearer …`), as the service's --secret.
    #[arg(long)]
    secret: Option<String>,
    /// PEM certificate(s) the subscribers trust for a `wss://` --service.
    #[arg(long)]
    ca_file: Option<String>,
    /// File holding the service's PID (read once it exists); its process tree's CPU is measured.
    /// A comma-separated list measures each file's processes apart (the memory peak is the
    /// first's); a file may list several PIDs, and is read again at each snapshot.
    #[arg(long)]
    service_pid_file: String,
    /// Label of the service in the report.
    #[arg(long, default_value = "ours")]
    label: String,
    #[arg(long, default_value_t = 8)]
    subs: usize,
    /// Subscribers (of --subs) that check every message and measure latency: K of them,
    /// spread evenly over the --service addresses, the --threads and the connecting order.
    /// The others are light: they check that frame ids run 1, 2, 3…, ack as the checked ones
    /// do and count every delivery (deliveries/s stay exact), but parse no message (no
    /// transaction, watermark or gap check). Commit→receipt percentiles and the longest gap
    /// are then over the K checked subscribers only (`checkedSubs` in the JSON); the light
    /// ones' newest commit per frame is a separate figure (`lightNewestCommitLatencyMs`).
    /// Default: all checked.
    #[arg(long, value_name = "K")]
    check_subs: Option<usize>,
    /// OS threads the subscribers are spread over, round-robin (subscriber k on thread k mod
    /// N), each with its own single-threaded runtime; thread 0 is the main thread, which also
    /// runs the change source. One thread reads ~1.3 M messages/s at most: 64 batched
    /// subscribers at 2,000 txns/s need more, or the generator's own delay is measured as the
    /// service's latency.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
    /// Bytes each subscriber reads from its socket at most per read (tungstenite's
    /// `read_buffer_size`, 128 KiB there). tungstenite zero-fills that much before every read,
    /// one that finds nothing included: at 128 KiB that memset was 16-21 % of the generator's
    /// CPU with 256 subscribers; at 4 KiB the extra reads cost more than it saved.
    #[arg(long, default_value_t = 16 * 1024)]
    ws_read_buffer: usize,
    /// Inserts per transaction.
    #[arg(long, default_value_t = 10)]
    changes: usize,
    /// Bytes of each insert's payload (about); 0 keeps the ~160-byte rows.
    #[arg(long, default_value_t = 0)]
    row_bytes: usize,
    /// Fill each insert's text column with letters and digits drawn anew for every row
    /// (nothing to compress but the payload's structure) instead of the same `x`s.
    #[arg(long)]
    row_noise: bool,
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
    /// Start the flood at once and subscribe at the start of the measured window (after
    /// `--warm-s` of ingest with no subscriber), from the replicaVersion: the measured window
    /// is the subscribers' catch-up (their commit-to-receipt latencies are the catch-up's age).
    #[arg(long)]
    join_late: bool,
    /// Churning subscribers: a pool of this many joins and leaves while the flood runs (from a
    /// commit the service stored; each must get every transaction after it), not counted in
    /// the deliveries or latencies.
    #[arg(long, default_value_t = 0)]
    churn_subs: usize,
    /// Joins per second of the churning pool (as many leave once it is full).
    #[arg(long, default_value_t = 50.0)]
    churn_rate: f64,
    /// Measure the service's RssAnon with every subscriber connected and idle: before they
    /// subscribe (once the initial sync is stored) and this many seconds after the last has
    /// its `status`, before the flood; 0 = not measured.
    #[arg(long, default_value_t = 0.0)]
    idle_s: f64,
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

/// The non-empty items of a comma-separated `--flag`'s value.
fn list(flag: &str, value: &str) -> Vec<String> {
    let items: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if items.is_empty() {
        fail(&format!("--{flag} names nothing"));
    }
    items
}

fn fail(msg: &str) -> ! {
    eprintln!("loadgen: {msg}");
    std::process::exit(1);
}

async fn run(args: Args) -> i32 {
    let services = list("service", &args.service);
    let pid_files = list("service-pid-file", &args.service_pid_file);
    let threads = usize::from(args.threads);
    let sockets = args.subs + args.never_reading + args.churn_subs + 1;
    match limits::raise_nofile(limits::needed(sockets)) {
        Ok(Some((from, to))) => {
            eprintln!(
                "loadgen: raised the open-file limit from {from} to {to} for {sockets} sockets"
            )
        }
        Ok(None) => {}
        Err(e) => fail(&e),
    }
    let run = Arc::new(Run::new());
    let source = Rc::new(SourceStats::new());
    let counters: Vec<Arc<Counters>> = (0..threads)
        .map(|_| Arc::new(Counters::new(services.len())))
        .collect();
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
        filler: workload::filler(args.row_bytes, args.row_noise),
        window: args.window,
        pace,
    };
    let go_at = Rc::new(Cell::new(None));
    tokio::task::spawn_local(upstream::serve(
        listener,
        run.clone(),
        source.clone(),
        cfg,
        go_at.clone(),
    ));

    let deadline = Instant::now() + Duration::from_secs_f64(args.setup_timeout_s);
    let mut pid = None;
    for file in &pid_files {
        while cpu::read_pids(file).is_empty() {
            if Instant::now() > deadline {
                fail(&format!("no PID in {file}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        pid = pid.or(cpu::read_pids(file).first().copied());
    }
    let Some(pid) = pid else {
        fail("--service-pid-file names no PID");
    };
    let rss_peak = Rc::new(Cell::new(0));
    tokio::task::spawn_local(memory::sample_peak(run.clone(), rss_peak.clone(), pid));
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
    let setup = Setup {
        access: ServiceAccess {
            secret: args.secret.clone(),
            tls,
            read_buffer: args.ws_read_buffer,
        },
        changes: args.changes,
        framing,
        deadline,
        churn: (args.churn_subs > 0).then(|| churn::Churn {
            subs: args.churn_subs,
            rate: args.churn_rate,
            services: services.clone(),
        }),
    };
    // Subscriber k reads from service address k mod n on thread k mod --threads; this thread's
    // share runs beside the change source.
    let main_ctx = Rc::new(setup.ctx(run.clone(), counters[0].clone()));
    let checked_subs = args.check_subs.unwrap_or(args.subs).min(args.subs);
    let mut plan = Some(crew::plan(
        args.subs,
        checked_subs,
        args.never_reading,
        &services,
        threads,
    ));
    let mut subscribe_all = || {
        crew::launch(
            plan.take().unwrap_or_default(),
            &main_ctx,
            &setup,
            &counters,
        )
    };
    let mut reports = Vec::new();
    let mut idle = None;
    if args.idle_s > 0.0 {
        while run.stored() < workload::FIRST_SEQ {
            if Instant::now() > deadline {
                fail("the service did not store the initial sync");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        idle = Some((memory::rss_anon_kib(pid).unwrap_or(0), 0));
    }
    if !args.join_late {
        reports = subscribe_all();
        while run.subs_ready() < args.subs + args.never_reading {
            if run.error_count() > 0 || Instant::now() > deadline {
                fail("subscribers did not all get their status");
            }
            tokio::select! {
                _ = run.subs_ready_changed.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        if let Some((before, _)) = idle {
            tokio::time::sleep(Duration::from_secs_f64(args.idle_s)).await;
            idle = Some((before, memory::rss_anon_kib(pid).unwrap_or(0)));
        }
    }
    go_at.set(Some(Instant::now()));
    run.phases.start();

    tokio::time::sleep(Duration::from_secs_f64(args.warm_s)).await;
    if args.join_late {
        reports = subscribe_all();
    }
    let a = Snapshot::take(&run, &source, &counters, &pid_files);
    run.phases.record(true);
    tokio::time::sleep(Duration::from_secs_f64(args.meas_s)).await;
    run.phases.record(false);
    let b = Snapshot::take(&run, &source, &counters, &pid_files);
    run.phases.stop();
    let received = crew::collect(&run, main_ctx.tally.take(), reports).await;

    let report = Report {
        label: &args.label,
        subs: args.subs,
        checked_subs,
        never_reading: args.never_reading,
        batched: args.batched,
        changes_per_txn: args.changes,
        rate: args.rate,
        window: args.window,
        join_late: args.join_late,
        services: &services,
        pid_files: &pid_files,
        a,
        b,
        run: &run,
        source: &source,
        received: &received,
        service_rss_anon_peak_kib: rss_peak.get(),
        service_rss_anon_idle_kib: idle,
        churn: setup.churn.as_ref(),
    };
    report.print();
    if run.error_count() > 0 {
        2
    } else {
        0
    }
}
