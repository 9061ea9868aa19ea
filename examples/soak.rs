//! A soak of the real binary on loopback (issue 30, item 5): `--duration-s` (default 1800) of
//! ingest while subscribers join, leave, stall and are killed, restoring tasks open and end
//! reservations, and the service is killed with `kill -9` every few minutes and started again on
//! the same data directory and port. It checks every subscriber's stream for gaps and duplicates,
//! every commit acked upstream before a kill against what the restarted service resumes from and
//! serves (acked-but-lost), and the service's `RssAnon` and open fds over time (flat: no rise
//! within a life nor across lives), and prints a one-line verdict; it also writes the samples
//! (CSV), a PNG of them, and each life's log into `--out`.
//!
//! ```sh
//! benches/soak.sh                      # builds (release) and runs 30 minutes
//! DURATION_S=120 benches/soak.sh       # a short one
//! ```
//!
//! Around the service (the `change-streamer` beside the example's directory, or
//! `$CHANGE_STREAMER_BIN`): the fake change source of `change-streamer-test-support`, sending
//! `--rate` transactions a second and resending after each new connection's `lastWatermark`; the
//! stand-in litestream `/metrics` page (as `restart_soak` uses), reporting the backup replicator's
//! last applied commit as backed up every second; a backup replicator (`mode=backup`) and
//! `--subscribers` serving subscribers; two restoring tasks. Exit status 0 on PASS, 1 on FAIL.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix_rt::task::JoinHandle;
use change_streamer_actors::clock::Clock;
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::process::{free_port, sibling_binary, ServiceProcess};
use change_streamer_test_support::upstream::FakeUpstream;

#[path = "soak/check.rs"]
mod check;
#[path = "soak/plot.rs"]
mod plot;
#[path = "soak/report.rs"]
mod report;
#[path = "soak/restore.rs"]
mod restore;
#[path = "soak/rng.rs"]
mod rng;
#[path = "soak/sample.rs"]
mod sample;
#[path = "soak/source.rs"]
mod source;
#[path = "soak/subscriber.rs"]
mod subscriber;

use check::{StreamCheck, Tally};
use rng::Rng;
use sample::Sample;
use source::{acked_watermark, last_watermark, w, SourceState, FIRST};
use subscriber::{connect, read_stream, End, Slot, Stats};

struct Args {
    duration_s: u64,
    rate: u64,
    subscribers: usize,
    kill_min_s: u64,
    kill_max_s: u64,
    out: PathBuf,
    seed: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        duration_s: 1800,
        rate: 300,
        subscribers: 6,
        kill_min_s: 240,
        kill_max_s: 360,
        out: PathBuf::from("target/soak"),
        seed: 0x9e37_79b9_7f4a_7c15,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} takes a value")));
        let n = || {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| usage(&format!("{flag} takes a whole number")))
        };
        match flag.as_str() {
            "--duration-s" => a.duration_s = n(),
            "--rate" => a.rate = n().max(1),
            "--subscribers" => a.subscribers = n() as usize,
            "--kill-min-s" => a.kill_min_s = n(),
            "--kill-max-s" => a.kill_max_s = n(),
            "--seed" => a.seed = n(),
            "--out" => a.out = PathBuf::from(value),
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    if a.kill_max_s <= a.kill_min_s {
        usage("--kill-max-s must be above --kill-min-s");
    }
    a
}

fn usage(problem: &str) -> ! {
    eprintln!("soak: {problem}\nusage: soak [--duration-s 1800] [--rate 300] [--subscribers 6] [--kill-min-s 240] [--kill-max-s 360] [--seed N] [--out DIR]");
    std::process::exit(2);
}

/// The service on `port` and `dir`: backups from the stand-in page polled every second, purges
/// checked every second but nothing younger than 30 s purged (every subscriber of the soak
/// comes back well within it), liveness and slow-subscriber eviction after 5 s (so stalls end
/// both ways).
fn start(port: u16, dir: &Path, up: &FakeUpstream, lite: &FakeLitestream) -> ServiceProcess {
    ServiceProcess::spawn(
        &sibling_binary(),
        port,
        dir,
        &[
            "--upstream",
            &up.url(),
            "--litestream-backup-url",
            "s3://bucket/replica",
            "--litestream-metrics-url",
            &lite.url(),
            "--backup-check-interval-ms",
            "1000",
            "--min-cleanup-delay-ms",
            "5000",
            "--purge-delay-ms",
            "1000",
            "--change-log-retention-ms",
            "30000",
            "--ping-interval-ms",
            "5000",
            "--slow-subscriber-grace-ms",
            "5000",
        ],
    )
}

/// Where the sampler reads: the service's pid, its life, and when that life began.
type Current = Rc<Cell<Option<(u32, usize, f64)>>>;

/// What the kills found.
#[derive(Default)]
struct Kills {
    count: u64,
    /// Commits acked upstream before a kill and not resumed from after it, summed.
    acked_but_lost: u64,
    /// Restarts after which a subscriber could not read up to the last commit acked before.
    unserved: u64,
    restarts_at: Vec<f64>,
    evidence: Vec<String>,
}

/// After a restart: reads from a little before `acked` up to it, each commit once.
async fn serves_up_to(port: u16, acked: u64, tally: &Tally) -> bool {
    let from = acked.saturating_sub(200).max(FIRST);
    let url = format!(
        "ws://127.0.0.1:{port}/replication/v6/changes?id=verifier&replicaVersion={}&watermark={}&wsBatched=true",
        w(FIRST),
        w(from)
    );
    let Some(ws) = connect(&url).await else {
        return false;
    };
    let mut check = StreamCheck::new("verifier".into(), from);
    let applied = Cell::new(from);
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut ws = Some(ws);
    // read_stream reads until a deadline; read in short slices until `acked` came.
    while applied.get() < acked && tokio::time::Instant::now() < until {
        let slice = tokio::time::Instant::now() + Duration::from_millis(200);
        match read_stream(
            ws.take().expect("socket"),
            &mut check,
            slice,
            None,
            &applied,
            tally,
        )
        .await
        {
            End::Time(s) => ws = Some(s),
            _ => break,
        }
    }
    if let Some(s) = ws {
        subscriber::leave(s).await;
    }
    applied.get() >= acked
}

fn save_log(out: &Path, life: usize, service: &ServiceProcess) {
    let path = out.join(format!("service-life-{life}.log"));
    if let Ok(mut f) = std::fs::File::create(&path) {
        for line in service.logged("") {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// What the soak's tasks share: the stream checks' totals, the subscribers' and restorers'
/// figures, the backup replicator's last applied commit and the backed-up one, and the stop.
struct Shared {
    tally: Rc<Tally>,
    stats: Rc<Stats>,
    rstats: Rc<restore::RestoreStats>,
    backup_applied: Rc<Cell<u64>>,
    backed_up: Rc<Cell<u64>>,
    stop: Rc<Cell<bool>>,
}

#[actix_rt::main]
async fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = parse_args();
    require_the_service();
    std::fs::create_dir_all(&args.out).expect("--out directory");
    let began = Instant::now();
    let deadline = began + Duration::from_secs(args.duration_s);

    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let dir = tempfile::Builder::new()
        .prefix("soak-")
        .tempdir()
        .expect("data dir");
    let port = free_port();
    let service = start(port, dir.path(), &up, &lite);
    let current: Current = Rc::new(Cell::new(Some((service.pid(), 0, 0.0))));

    let stop = Rc::new(Cell::new(false));
    let src = Rc::new(SourceState::default());
    let window = args.rate * 10;
    let mut tasks = vec![actix_rt::spawn(source::run(
        up.clone(),
        src.clone(),
        args.rate,
        window,
        stop.clone(),
    ))];
    up.wait_connections(1).await;

    let shared = Shared {
        tally: Rc::new(Tally::default()),
        stats: Rc::new(Stats::default()),
        rstats: Rc::new(restore::RestoreStats::default()),
        backup_applied: Rc::new(Cell::new(0u64)),
        backed_up: Rc::new(Cell::new(FIRST)),
        stop,
    };
    tasks.push(stand_in_litestream(&lite, &shared));
    let mut seeds = Rng::new(args.seed);
    tasks.extend(spawn_readers(&args, port, &mut seeds, &shared));
    let samples = Rc::new(RefCell::new(Vec::<Sample>::new()));
    tasks.push(sampler(began, &current, &samples, &shared));

    let mut lives = Lives {
        port,
        dir: dir.path(),
        up: &up,
        lite: &lite,
        service: Some(service),
        current,
        life: 0,
        kills: Kills::default(),
    };
    let rng = Rng::new(seeds.between(1, u64::MAX));
    lives
        .kill_until(deadline, rng, &args, began, &shared.tally)
        .await;
    let (kills, elapsed, final_status) = lives.end(&args.out, &shared, tasks, began).await;
    up.stop().await;

    let samples = samples.borrow().clone();
    // The report exits the process: the data directory goes first.
    drop(dir);
    report::report(
        &args,
        elapsed,
        &src,
        &shared.tally,
        &shared.stats,
        &shared.rstats,
        &kills,
        &samples,
        &final_status,
    );
}

/// Stops (exit status 2) unless the service beside the example is built.
fn require_the_service() {
    if !sibling_binary().exists() {
        eprintln!(
            "soak: {} is not built; run benches/soak.sh",
            sibling_binary().display()
        );
        std::process::exit(2);
    }
}

/// The stand-in litestream: the backup replicator's last applied commit, backed up now (every
/// second, until the stop).
fn stand_in_litestream(lite: &FakeLitestream, shared: &Shared) -> JoinHandle<()> {
    let (lite, stop, applied, backed_up) = (
        lite.clone(),
        shared.stop.clone(),
        shared.backup_applied.clone(),
        shared.backed_up.clone(),
    );
    actix_rt::spawn(async move {
        while !stop.get() {
            let n = applied.get().max(FIRST);
            let at = Clock::System.now_ms() as f64 / 1000.0;
            lite.set_body(render_page(
                "/db",
                &[(Some(w(n).as_str()), "s3", format!("{at}"))],
            ));
            backed_up.set(n);
            actix_rt::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// The backup replicator and `--subscribers` serving subscribers, then two restoring tasks,
/// each with its own generator drawn from `seeds` in that order.
fn spawn_readers(args: &Args, port: u16, seeds: &mut Rng, shared: &Shared) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for k in 0..=args.subscribers {
        let slot = Slot {
            name: if k == 0 {
                "backup".into()
            } else {
                format!("sub-{k}")
            },
            backup: k == 0,
            batched: k % 2 == 0,
            applied: if k == 0 {
                shared.backup_applied.clone()
            } else {
                Rc::new(Cell::new(0))
            },
        };
        let rng = Rng::new(seeds.between(1, u64::MAX));
        tasks.push(actix_rt::spawn(subscriber::run_slot(
            port,
            slot,
            rng,
            shared.tally.clone(),
            shared.stats.clone(),
            shared.stop.clone(),
        )));
    }
    for k in 0..2 {
        let rng = Rng::new(seeds.between(1, u64::MAX));
        tasks.push(actix_rt::spawn(restore::run(
            port,
            k,
            shared.backed_up.clone(),
            rng,
            shared.tally.clone(),
            shared.stats.clone(),
            shared.rstats.clone(),
            shared.stop.clone(),
        )));
    }
    tasks
}

/// Every 2 s, the running service's RssAnon and open fds (and the soak's open sockets).
fn sampler(
    began: Instant,
    current: &Current,
    samples: &Rc<RefCell<Vec<Sample>>>,
    shared: &Shared,
) -> JoinHandle<()> {
    let (current, samples, stats, stop) = (
        current.clone(),
        samples.clone(),
        shared.stats.clone(),
        shared.stop.clone(),
    );
    actix_rt::spawn(async move {
        while !stop.get() {
            if let Some((pid, life, since)) = current.get() {
                if let Some((rss_anon_kb, fds)) = sample::read(pid) {
                    let t = began.elapsed().as_secs_f64();
                    samples.borrow_mut().push(Sample {
                        t,
                        life,
                        age: t - since,
                        rss_anon_kb,
                        fds,
                        sockets: stats.open.get(),
                    });
                }
            }
            actix_rt::time::sleep(Duration::from_secs(2)).await;
        }
    })
}

/// The service's lives: the one running, its number, and what the kills found.
struct Lives<'a> {
    port: u16,
    dir: &'a Path,
    up: &'a FakeUpstream,
    lite: &'a FakeLitestream,
    /// The service running (none only inside a kill and restart).
    service: Option<ServiceProcess>,
    current: Current,
    life: usize,
    kills: Kills,
}

impl Lives<'_> {
    /// Kills and restarts the service every `--kill-min-s` to `--kill-max-s` (drawn from
    /// `rng`) until `deadline`.
    async fn kill_until(
        &mut self,
        deadline: Instant,
        mut rng: Rng,
        args: &Args,
        began: Instant,
        tally: &Tally,
    ) {
        loop {
            let wait = Duration::from_secs(rng.between(args.kill_min_s, args.kill_max_s));
            let at = (Instant::now() + wait).min(deadline);
            actix_rt::time::sleep(at.saturating_duration_since(Instant::now())).await;
            if Instant::now() >= deadline {
                break;
            }
            self.kill_and_restart(&args.out, began, tally).await;
        }
    }

    /// The last life's log saved, every task stopped (10 s each at most), the service's final
    /// `/status`, then the service stopped: what the kills found, the seconds the soak ran (its
    /// tasks stopped) and that status.
    async fn end(
        self,
        out: &Path,
        shared: &Shared,
        tasks: Vec<JoinHandle<()>>,
        began: Instant,
    ) -> (Kills, f64, serde_json::Value) {
        let service = self.service.expect("a service runs between the kills");
        save_log(out, self.life, &service);
        shared.stop.set(true);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        let elapsed = began.elapsed().as_secs_f64();
        let final_status = service.status().await;
        service.terminate().await;
        (self.kills, elapsed, final_status)
    }

    /// `kill -9`, a restart on the same port and data dir, then what it resumed from upstream
    /// against the last commit acked before, and whether it serves up to that commit.
    async fn kill_and_restart(&mut self, out: &Path, began: Instant, tally: &Tally) {
        let (up, port) = (self.up, self.port);
        let secs = || began.elapsed().as_secs_f64();
        let Some(service) = self.service.take() else {
            return;
        };
        save_log(out, self.life, &service);
        self.current.set(None);
        service.kill9();
        let t_kill = secs();
        let kills = &mut self.kills;
        kills.count += 1;
        kills.restarts_at.push(t_kill);
        // Acks the service sent before it died are all in by the time the connection is gone.
        actix_rt::time::sleep(Duration::from_millis(300)).await;
        let acked = up
            .last_ack()
            .1
            .as_deref()
            .and_then(acked_watermark)
            .unwrap_or(0);
        let connections = up.queries().len();
        self.life += 1;
        let service = start(port, self.dir, up, self.lite);
        self.current.set(Some((service.pid(), self.life, secs())));
        self.service = Some(service);
        let reconnected = Instant::now() + Duration::from_secs(30);
        while up.queries().len() <= connections && Instant::now() < reconnected {
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        let query = up.queries().get(connections).cloned().unwrap_or_default();
        let resumed = last_watermark(&query).unwrap_or(0);
        let lost = acked.saturating_sub(resumed);
        let served = serves_up_to(port, acked, tally).await;
        let kills = &mut self.kills;
        let line = format!(
            "kill {} at {t_kill:.0} s: last ack upstream {} ({acked}), resumed from lastWatermark {} ({resumed}), acked-but-lost {lost}, served up to it after the restart: {served}",
            kills.count,
            w(acked),
            w(resumed)
        );
        eprintln!("soak: {line}");
        if lost > 0 || !served {
            log::error!("{line}; query {query:?}");
            kills.evidence.push(line);
        }
        kills.acked_but_lost += lost;
        kills.unserved += u64::from(!served);
    }
}
