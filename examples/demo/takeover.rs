//! The demo on a shared PostgreSQL change DB (PROTOCOL.md §14, §14.1): `--change-db postgres://…`
//! starts three service processes on that database, A, B and C, with two subscribers at each
//! (standbys serve `/changes` too), shows which one owns the change DB, and kills the owner with
//! `kill -9` when Enter is pressed or after `--kill-after N` seconds, so that the takeover is
//! seen live: a standby owns, the change source is asked to resume from the last durable
//! watermark, the surviving instances' subscribers (the new owner's too) are never dropped, and
//! the dead owner's subscribe again at another instance and go on with no gap and no commit
//! twice. The killed instance is started again, and comes back as a standby.
//!
//! The service processes are this demo's own binary run with [`SERVE`]: the real service
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

use change_streamer_test_support::upstream::FakeUpstream;

mod follow;
mod instance;
mod view;

use follow::{subscriber, write_transactions, Addrs, Followed, Shared};
use instance::{role, start_instance, Said};
pub use instance::{serve, SERVE};
pub use view::LEGEND;
use view::{instance_line, since_kill, subscriber_line, Kill, Summary};

/// The service processes: A, B, C.
const INSTANCES: usize = 3;
/// Subscribers started at each instance.
const PER_INSTANCE: usize = 2;

/// Runs the three-instance demo on the change DB at `db`.
pub async fn run(db: String, seconds: Option<u64>, kill_after: Option<u64>) {
    println!("change-streamer demo: three instances sharing the PostgreSQL change DB {db}");
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
    let mut instances: Vec<_> = (0..INSTANCES)
        .map(|i| start_instance(i, &db, &up.url(), &said_tx))
        .collect();
    let names: Vec<char> = instances.iter().map(|i| i.name).collect();
    let addrs: Shared<Addrs> = Rc::new(RefCell::new(Addrs {
        addrs: vec![None; INSTANCES],
        names: names.clone(),
    }));
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
    let mut killed_at: Option<Instant> = None;
    let mut killed: Vec<usize> = Vec::new();
    let mut last_kill: Option<Kill> = None;
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
                    log(format!("{} is a standby on {addr}", names[i]));
                    instances[i].addr = Some(addr.clone());
                    addrs.borrow_mut().addrs[i] = Some(addr);
                }
                Said::Owner(i, at) => {
                    owner = Some(i);
                    let took = match killed_at.take() {
                        Some(k) => {
                            let ms = at.duration_since(k).as_millis();
                            takeovers.push(ms);
                            let mut kept = 0;
                            for s in &subs {
                                let mut s = s.borrow_mut();
                                s.at_takeover = Some(s.commits);
                                kept += usize::from(s.now_on() == Some(i));
                            }
                            format!(
                                ": took over {ms} ms after the kill, keeping its {kept} subscribers on their sockets"
                            )
                        }
                        None => String::new(),
                    };
                    log(format!("{} OWNS the change DB{took}", names[i]));
                }
            }
        }
        // The subscribers, once every instance is up and the change log has its replicaVersion.
        let all_up = addrs.borrow().addrs.iter().all(Option::is_some);
        if subs.is_empty() && all_up {
            if let Some(st) = match owner.and_then(|o| instances[o].addr.clone()) {
                Some(a) => role(&a).await,
                None => None,
            } {
                if let Some(rv) = st.replica_version.as_deref() {
                    for k in 0..INSTANCES * PER_INSTANCE {
                        let seen: Shared<Followed> = Rc::new(RefCell::new(Followed {
                            name: format!("s{}", k + 1),
                            ..Followed::default()
                        }));
                        subs.push(seen.clone());
                        let (home, spread) = (k / PER_INSTANCE, k % PER_INSTANCE);
                        let rv = rv.to_string();
                        actix_rt::spawn(subscriber(home, spread, addrs.clone(), rv, seen));
                    }
                }
            }
        }
        let key = keys.try_recv().is_ok();
        let due = kill_after.is_some_and(|k| start.elapsed() >= Duration::from_secs(k))
            && takeovers.is_empty();
        if (key || due) && killed_at.is_none() && restart_at.is_none() {
            if let Some(o) = owner.take() {
                let pid = instances[o].child.id();
                let _ = instances[o].child.kill();
                let _ = instances[o].child.wait();
                addrs.borrow_mut().addrs[o] = None;
                killed_at = Some(Instant::now());
                killed.push(o);
                restart_at = Some((Instant::now() + Duration::from_secs(2), o));
                let victims: Vec<usize> = (0..subs.len())
                    .filter(|&k| subs[k].borrow().now_on() == Some(o))
                    .collect();
                log(format!(
                    "kill -9 of {} (the owner, pid {pid}, serving {} of the subscribers)",
                    names[o],
                    victims.len()
                ));
                last_kill = Some(Kill {
                    instance: o,
                    victims,
                });
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
            let restarting = restart_at.is_some_and(|(_, k)| k == i);
            match inst.child.try_wait() {
                Ok(Some(status)) if !restarting => Some((inst.name, status)),
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
                log(format!("starting {} again", names[i]));
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
            let mut lines = Vec::new();
            for (i, inst) in instances.iter().enumerate() {
                let up = addrs.borrow().addrs[i].is_some();
                let down_killed = restart_at.is_some_and(|(_, k)| k == i);
                lines.push(instance_line(inst, up, down_killed).await);
            }
            let borrowed: Vec<_> = subs.iter().map(|s| s.borrow()).collect();
            let followed: Vec<&Followed> = borrowed.iter().map(|s| &**s).collect();
            lines.extend(followed.iter().map(|s| subscriber_line(s, &names)));
            if let Some(kill) = &last_kill {
                lines.push(since_kill(kill, &followed, &names));
            }
            drop(borrowed);
            log(lines.join("\n          "));
            printed += 1;
        }
    }
    let mut roles = Vec::new();
    for (i, inst) in instances.iter().enumerate() {
        let up = addrs.borrow().addrs[i].is_some();
        let st = match (&inst.addr, up) {
            (Some(a), true) => role(a).await,
            _ => None,
        };
        roles.push(st.map_or_else(|| "down".to_string(), |st| st.role));
    }
    let borrowed: Vec<_> = subs.iter().map(|s| s.borrow()).collect();
    let summary = Summary {
        seconds: start.elapsed().as_secs(),
        names: &names,
        killed: &killed,
        owner,
        takeover_ms: &takeovers,
        roles,
        subs: borrowed.iter().map(|s| &**s).collect(),
        views: printed,
    };
    println!("\nsummary: {}", summary.json());
    drop(borrowed);
    for inst in &mut instances {
        let _ = Command::new("kill")
            .args(["-TERM", &inst.child.id().to_string()])
            .status();
        let _ = inst.child.wait();
    }
    up.stop().await;
}
