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
//!
//! The flags are in [`args`]; [`run`] goes through a run's steps in order, each a function of
//! its own: start the change source, find the service's PID, subscribe (and measure the idle
//! memory), flood and measure the window, report.

mod args;
mod churn;
mod cpu;
mod crew;
mod ctx;
mod frames;
mod light;
mod limits;
mod memory;
mod reader;
mod report;
mod sample;
mod scan;
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
use tokio::sync::oneshot;

use crate::args::Args;
use crate::churn::Churn;
use crate::ctx::{Framing, Setup};
use crate::report::{Report, Snapshot};
use crate::shared::{Run, ServiceAccess};
use crate::tally::{Counters, Received};
use crate::upstream::{Pace, SourceConfig, SourceStats};

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

/// One run, its steps in order; the exit code (2 when the run saw an error).
async fn run(args: Args) -> i32 {
    let services = list("service", &args.service);
    let pid_files = list("service-pid-file", &args.service_pid_file);
    let threads = usize::from(args.threads);
    raise_open_files(args.subs + args.never_reading + args.churn_subs + 1);
    let run = Arc::new(Run::new());
    let source = Rc::new(SourceStats::new());
    let counters: Vec<Arc<Counters>> = (0..threads)
        .map(|_| Arc::new(Counters::new(services.len())))
        .collect();
    let go_at = start_source(&args, &run, &source).await;
    let deadline = Instant::now() + Duration::from_secs_f64(args.setup_timeout_s);
    let pid = service_pid(&pid_files, deadline).await;
    let rss_peak = Rc::new(Cell::new(0));
    tokio::task::spawn_local(memory::sample_peak(run.clone(), rss_peak.clone(), pid));
    let setup = subscribers_setup(&args, deadline);
    let churn = (args.churn_subs > 0).then(|| Churn {
        subs: args.churn_subs,
        rate: args.churn_rate,
        services: services.clone(),
    });
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
        let plan = plan.take().unwrap_or_default();
        crew::launch(plan, &main_ctx, &setup, &counters, churn.as_ref())
    };
    let (mut reports, idle) =
        subscribe_before(&args, &run, deadline, pid, &mut subscribe_all).await;
    go_at.set(Some(Instant::now()));
    run.phases.start();
    let (a, b) = measure(&args, &run, &source, &counters, &pid_files, || {
        if args.join_late {
            reports = subscribe_all();
        }
    })
    .await;
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
        churn: churn.as_ref(),
    };
    report.print();
    if run.error_count() > 0 {
        2
    } else {
        0
    }
}

/// Raises the open-file limit to what `sockets` sockets need, saying so, or stops.
fn raise_open_files(sockets: usize) {
    match limits::raise_nofile(limits::needed(sockets)) {
        Ok(Some((from, to))) => {
            eprintln!(
                "loadgen: raised the open-file limit from {from} to {to} for {sockets} sockets"
            )
        }
        Ok(None) => {}
        Err(e) => fail(&e),
    }
}

/// Listens on `--listen` and serves the change source there (`upstream.rs`); the cell that
/// starts its flood once set.
async fn start_source(
    args: &Args,
    run: &Arc<Run>,
    source: &Rc<SourceStats>,
) -> Rc<Cell<Option<Instant>>> {
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
    go_at
}

/// The first PID the `--service-pid-file`s list, once each lists one (until `deadline`).
async fn service_pid(pid_files: &[String], deadline: Instant) -> u32 {
    let mut pid = None;
    for file in pid_files {
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
    pid
}

/// How every subscriber subscribes: secret, TLS roots, read buffer, framing, deadline.
fn subscribers_setup(args: &Args, deadline: Instant) -> Setup {
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
    Setup {
        access: ServiceAccess {
            secret: args.secret.clone(),
            tls,
            read_buffer: args.ws_read_buffer,
        },
        changes: args.changes,
        framing,
        deadline,
    }
}

/// Before the flood: with `--idle-s`, the service's RssAnon once the initial sync is stored;
/// unless `--join-late`, every subscriber subscribed (`subscribe_all`) and given its `status`,
/// then with `--idle-s` the RssAnon that long after. The threads' receivers (none when joining
/// late) and the idle RssAnon before and after (KiB).
async fn subscribe_before(
    args: &Args,
    run: &Run,
    deadline: Instant,
    pid: u32,
    subscribe_all: &mut impl FnMut() -> Vec<oneshot::Receiver<Received>>,
) -> (Vec<oneshot::Receiver<Received>>, Option<(u64, u64)>) {
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
    if args.join_late {
        return (Vec::new(), idle);
    }
    let reports = subscribe_all();
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
    (reports, idle)
}

/// The flood running: `--warm-s`, then `warmed` (the late joiners subscribe), then the measured
/// window of `--meas-s` between two snapshots.
async fn measure(
    args: &Args,
    run: &Run,
    source: &SourceStats,
    counters: &[Arc<Counters>],
    pid_files: &[String],
    warmed: impl FnOnce(),
) -> (Snapshot, Snapshot) {
    tokio::time::sleep(Duration::from_secs_f64(args.warm_s)).await;
    warmed();
    let a = Snapshot::take(run, source, counters, pid_files);
    run.phases.record(true);
    tokio::time::sleep(Duration::from_secs_f64(args.meas_s)).await;
    run.phases.record(false);
    let b = Snapshot::take(run, source, counters, pid_files);
    (a, b)
}
