//! The demo on a shared PostgreSQL change DB (PROTOCOL.md §14): `--change-db postgres://…` starts two
//! service processes on that database, shows which one owns it, and kills the owner with
//! `kill -9` when Enter is pressed or after `--kill-after N` seconds, so that the takeover is
//! seen live: the standby owns, the change source is asked to resume from the last durable
//! watermark, and the subscribers reconnect and go on with no gap and no commit twice. The
//! killed instance is started again, and comes back as the standby.
//!
//! The two service processes are this demo's own binary run with [`SERVE`]: the real service
//! (`change_streamer::instance::run`), in a process of its own so that it can be killed.
//! The stand-in change source numbers its transactions one after another and, like a real
//! one, resumes after the `lastWatermark` each new connection asks for; so a subscriber that
//! sees a commit other than the one after its last is seeing a gap.

use std::cell::RefCell;
use std::io::BufRead;
use std::process::Command;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::upstream::FakeUpstream;
use serde_json::json;

mod follow;
mod instance;

use follow::{subscriber, write_transactions, Followed, Shared};
use instance::{role, start_instance, Said};
pub use instance::{serve, SERVE};

/// The demo's legend in this mode.
pub const LEGEND: &str = "\
legend (two instances on one PostgreSQL change DB):
  access: both instances ask every client for a secret generated for this run (never shown)
  A and B are two change-streamer processes sharing the change DB; exactly one is the OWNER
    (it holds a PostgreSQL advisory lock on its writer connection, reads upstream, stores and
    serves); the other is a STANDBY (answers /status and /metrics, closes sessions with 1011
    `standby: not the owner`, tries to take the lock every --takeover-interval-ms, 200 ms here)
  kill -9 (Enter, or --kill-after N): the owner dies; PostgreSQL ends its session and with it
    the lock; the standby owns within the takeover interval + 1 s, asks the change source to
    resume after the last durable watermark, and the killed one is started again as standby
  s1, s2: subscribers that reconnect on any close from the last commit they acked; `gaps` counts
    commits that were not the one after the last, `twice` commits seen again: both stay 0
";

/// Runs the two-instance demo on the change DB at `db`.
pub async fn run(db: String, seconds: Option<u64>, kill_after: Option<u64>) {
    println!("change-streamer demo: two instances sharing the PostgreSQL change DB {db}");
    println!(
        "  press Enter to kill -9 the owner{}; Ctrl-C to stop\n",
        match kill_after {
            Some(s) => format!(" (it is also killed after {s} s)"),
            None => String::new(),
        }
    );
    println!("{LEGEND}");
    let up = FakeUpstream::start().await;
    let (said_tx, said) = mpsc::channel();
    let mut instances = vec![
        start_instance(0, &db, &up.url(), &said_tx),
        start_instance(1, &db, &up.url(), &said_tx),
    ];
    let addrs: Shared<Vec<Option<String>>> = Rc::new(RefCell::new(vec![None, None]));
    actix_rt::spawn(write_transactions(up.clone(), 200));
    let (keys_tx, keys) = mpsc::channel();
    std::thread::spawn(move || {
        for _ in std::io::stdin().lock().lines().map_while(Result::ok) {
            if keys_tx.send(()).is_err() {
                return;
            }
        }
    });

    let start = Instant::now();
    let mut owner: Option<usize> = None;
    let mut killed_at: Option<(Instant, usize)> = None;
    let mut restart_at: Option<(Instant, usize)> = None;
    let mut takeovers: Vec<u128> = Vec::new();
    let mut subs: Vec<Shared<Followed>> = Vec::new();
    let mut printed = 0usize;
    let mut hinted = false;
    let mut tick = actix_rt::time::interval(Duration::from_millis(100));
    let mut last_view = Instant::now() - Duration::from_secs(1);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let log = |line: String| println!("t={:>5.1}s  {line}", start.elapsed().as_secs_f64());
    loop {
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = tick.tick() => {}
        }
        if seconds.is_some_and(|s| start.elapsed() >= Duration::from_secs(s)) {
            break;
        }
        while let Ok(s) = said.try_recv() {
            match s {
                Said::Standby(i, addr) => {
                    log(format!("{} is a standby on {addr}", instances[i].name));
                    instances[i].addr = Some(addr.clone());
                    addrs.borrow_mut()[i] = Some(addr);
                }
                Said::Owner(i, at) => {
                    owner = Some(i);
                    let took = killed_at
                        .take()
                        .map(|(k, _)| {
                            let ms = at.duration_since(k).as_millis();
                            takeovers.push(ms);
                            format!(": took over {ms} ms after the kill")
                        })
                        .unwrap_or_default();
                    log(format!("{} OWNS the change DB{took}", instances[i].name));
                }
            }
        }
        // The first subscribers once the change log has its replicaVersion.
        if subs.is_empty() {
            if let Some(st) = match owner.and_then(|o| instances[o].addr.clone()) {
                Some(a) => role(&a).await,
                None => None,
            } {
                if let Some(rv) = st["replicaVersion"].as_str() {
                    for name in ["s1", "s2"] {
                        let seen: Shared<Followed> = Rc::default();
                        subs.push(seen.clone());
                        actix_rt::spawn(subscriber(
                            name.into(),
                            addrs.clone(),
                            rv.to_string(),
                            seen,
                        ));
                    }
                }
            }
        }
        let key = keys.try_recv().is_ok();
        let due = kill_after.is_some_and(|k| start.elapsed() >= Duration::from_secs(k))
            && takeovers.is_empty()
            && killed_at.is_none();
        if (key || due) && killed_at.is_none() {
            if let Some(o) = owner.take() {
                let pid = instances[o].child.id();
                let _ = instances[o].child.kill();
                let _ = instances[o].child.wait();
                addrs.borrow_mut()[o] = None;
                killed_at = Some((Instant::now(), o));
                restart_at = Some((Instant::now() + Duration::from_secs(2), o));
                log(format!(
                    "kill -9 of {} (the owner, pid {pid})",
                    instances[o].name
                ));
            }
        }
        if owner.is_none()
            && killed_at.is_none()
            && !hinted
            && start.elapsed() > Duration::from_secs(5)
        {
            hinted = true;
            log(
                "no instance owns the change DB yet: can they reach it? (the database must exist)"
                    .into(),
            );
        }
        // An instance that ended by itself (a bad --change-db, say) ends the demo.
        let ended = instances.iter_mut().enumerate().find_map(|(i, inst)| {
            let killed = restart_at.is_some_and(|(_, k)| k == i);
            match inst.child.try_wait() {
                Ok(Some(status)) if !killed => Some((inst.name, status)),
                _ => None,
            }
        });
        if let Some((name, status)) = ended {
            log(format!(
                "{name} ended by itself ({status}); stopping the demo"
            ));
            break;
        }
        if let Some((at, i)) = restart_at {
            if Instant::now() >= at {
                restart_at = None;
                log(format!("starting {} again", instances[i].name));
                instances[i] = start_instance(i, &db, &up.url(), &said_tx);
            }
        }
        for s in &subs {
            for line in s.borrow_mut().events.drain(..) {
                log(line);
            }
        }
        if last_view.elapsed() >= Duration::from_secs(1) {
            last_view = Instant::now();
            let mut line = String::new();
            for (i, inst) in instances.iter().enumerate() {
                let state = match &inst.addr {
                    Some(a) if addrs.borrow()[i].is_some() => match role(a).await {
                        Some(st) if st["role"] == "owner" => format!(
                            "OWNER   {a} stored up to {} upstream {}",
                            st["changeLog"]["maxWatermark"].as_str().unwrap_or("-"),
                            if st["upstream"]["connected"] == true {
                                "connected"
                            } else {
                                "DOWN"
                            }
                        ),
                        Some(st) => format!("{:<7} {a}", st["role"].as_str().unwrap_or("?")),
                        None => format!("down    {a}"),
                    },
                    _ => "down".to_string(),
                };
                line.push_str(&format!("{}: {state}   ", inst.name));
            }
            for (k, s) in subs.iter().enumerate() {
                let s = s.borrow();
                line.push_str(&format!(
                    "\n          s{}: {} commits, at {}, gaps {}, twice {}, reconnects {}",
                    k + 1,
                    s.commits,
                    s.last
                        .map(|w| Watermark::from_u64(w).to_string())
                        .unwrap_or("-".into()),
                    s.gaps,
                    s.twice,
                    s.reconnects
                ));
            }
            log(line);
            printed += 1;
        }
    }
    let total = |f: fn(&Followed) -> u64| subs.iter().map(|s| f(&s.borrow())).sum::<u64>();
    let summary = json!({
        "seconds": start.elapsed().as_secs(),
        "takeoverMs": takeovers,
        "subscriberCommits": subs.iter().map(|s| s.borrow().commits).collect::<Vec<_>>(),
        "gaps": total(|s| s.gaps),
        "twice": total(|s| s.twice),
        "reconnects": total(|s| s.reconnects),
        "views": printed,
    });
    println!("\nsummary: {summary}");
    for inst in &mut instances {
        let _ = Command::new("kill")
            .args(["-TERM", &inst.child.id().to_string()])
            .status();
        let _ = inst.child.wait();
    }
    up.stop().await;
}
