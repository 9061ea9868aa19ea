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

/// The demo's state: the instances, who owns, the last kill and the restart due, the
/// subscribers, and what the summary counts.
struct Demo {
    db: String,
    up: FakeUpstream,
    said_tx: mpsc::Sender<Said>,
    instances: Vec<instance::Instance>,
    names: Vec<char>,
    addrs: Shared<Addrs>,
    start: Instant,
    owner: Option<usize>,
    killed_at: Option<Instant>,
    killed: Vec<usize>,
    last_kill: Option<Kill>,
    restart_at: Option<(Instant, usize)>,
    takeovers: Vec<u128>,
    subs: Vec<Shared<Followed>>,
    printed: usize,
    hinted: bool,
    last_view: Instant,
}

/// Runs the three-instance demo on the change DB at `db`.
pub async fn run(db: String, seconds: Option<u64>, kill_after: Option<u64>) {
    banner(&db, kill_after);
    let up = FakeUpstream::start().await;
    let (said_tx, said) = mpsc::channel();
    let instances: Vec<_> = (0..INSTANCES)
        .map(|i| start_instance(i, &db, &up.url(), &said_tx))
        .collect();
    let names: Vec<char> = instances.iter().map(|i| i.name).collect();
    let addrs: Shared<Addrs> = Rc::new(RefCell::new(Addrs {
        addrs: vec![None; INSTANCES],
        names: names.clone(),
    }));
    actix_rt::spawn(write_transactions(up.clone(), 200));
    let keys = keys();
    let mut demo = Demo {
        db,
        up,
        said_tx,
        instances,
        names,
        addrs,
        start: Instant::now(),
        owner: None,
        killed_at: None,
        killed: Vec::new(),
        last_kill: None,
        restart_at: None,
        takeovers: Vec::new(),
        subs: Vec::new(),
        printed: 0,
        hinted: false,
        last_view: Instant::now() - Duration::from_secs(1),
    };
    let mut tick = actix_rt::time::interval(Duration::from_millis(100));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = tick.tick() => {}
        }
        if seconds.is_some_and(|s| demo.start.elapsed() >= Duration::from_secs(s)) {
            break;
        }
        while let Ok(s) = said.try_recv() {
            demo.heard(s);
        }
        demo.start_subscribers().await;
        let key = keys.try_recv().is_ok();
        let due = kill_after.is_some_and(|k| demo.start.elapsed() >= Duration::from_secs(k))
            && demo.takeovers.is_empty();
        if (key || due) && demo.killed_at.is_none() && demo.restart_at.is_none() {
            demo.kill_owner();
        }
        demo.hint();
        if demo.ended_by_itself() {
            break;
        }
        demo.restart_due();
        for s in &demo.subs {
            for line in s.borrow_mut().events.drain(..) {
                demo.log(line);
            }
        }
        if demo.last_view.elapsed() >= Duration::from_secs(1) {
            demo.show().await;
        }
    }
    demo.summary().await;
    demo.stop().await;
}

/// What the demo is and how to kill the owner; the view's legend.
fn banner(db: &str, kill_after: Option<u64>) {
    println!("change-streamer demo: three instances sharing the PostgreSQL change DB {db}");
    println!(
        "  press Enter to kill -9 the owner{}; Ctrl-C to stop\n",
        match kill_after {
            Some(s) => format!(" (it is also killed after {s} s)"),
            None => String::new(),
        }
    );
    println!("{LEGEND}");
}

/// A message for each line read from the terminal (Enter kills the owner).
fn keys() -> mpsc::Receiver<()> {
    let (keys_tx, keys) = mpsc::channel();
    std::thread::spawn(move || {
        for _ in std::io::stdin().lock().lines().map_while(Result::ok) {
            if keys_tx.send(()).is_err() {
                return;
            }
        }
    });
    keys
}

impl Demo {
    /// Every instance stopped (SIGTERM, then waited for), and the change source.
    async fn stop(&mut self) {
        for inst in &mut self.instances {
            let _ = Command::new("kill")
                .args(["-TERM", &inst.child.id().to_string()])
                .status();
            let _ = inst.child.wait();
        }
        self.up.stop().await;
    }

    /// One line, stamped with the time since the demo started.
    fn log(&self, line: String) {
        println!("t={:>5.1}s  {line}", self.start.elapsed().as_secs_f64());
    }

    /// What an instance said: it is a standby on an address, or it owns the change DB (a
    /// takeover when the owner was killed).
    fn heard(&mut self, s: Said) {
        match s {
            Said::Standby(i, addr) => {
                self.log(format!("{} is a standby on {addr}", self.names[i]));
                self.instances[i].addr = Some(addr.clone());
                self.addrs.borrow_mut().addrs[i] = Some(addr);
            }
            Said::Owner(i, at) => {
                self.owner = Some(i);
                let took = match self.killed_at.take() {
                    Some(k) => {
                        let ms = at.duration_since(k).as_millis();
                        self.takeovers.push(ms);
                        let mut kept = 0;
                        for s in &self.subs {
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
                self.log(format!("{} OWNS the change DB{took}", self.names[i]));
            }
        }
    }

    /// The subscribers, once every instance is up and the change log has its replicaVersion.
    async fn start_subscribers(&mut self) {
        let all_up = self.addrs.borrow().addrs.iter().all(Option::is_some);
        if !self.subs.is_empty() || !all_up {
            return;
        }
        let st = match self.owner.and_then(|o| self.instances[o].addr.clone()) {
            Some(a) => role(&a).await,
            None => None,
        };
        let Some(rv) = st.as_ref().and_then(|st| st.replica_version.as_deref()) else {
            return;
        };
        for k in 0..INSTANCES * PER_INSTANCE {
            let seen: Shared<Followed> = Rc::new(RefCell::new(Followed {
                name: format!("s{}", k + 1),
                ..Followed::default()
            }));
            self.subs.push(seen.clone());
            let (home, spread) = (k / PER_INSTANCE, k % PER_INSTANCE);
            let rv = rv.to_string();
            actix_rt::spawn(subscriber(home, spread, self.addrs.clone(), rv, seen));
        }
    }

    /// `kill -9` of the owner, if one owns; it is started again 2 s later.
    fn kill_owner(&mut self) {
        let Some(o) = self.owner.take() else {
            return;
        };
        let pid = self.instances[o].child.id();
        let _ = self.instances[o].child.kill();
        let _ = self.instances[o].child.wait();
        self.addrs.borrow_mut().addrs[o] = None;
        self.killed_at = Some(Instant::now());
        self.killed.push(o);
        self.restart_at = Some((Instant::now() + Duration::from_secs(2), o));
        let victims: Vec<usize> = (0..self.subs.len())
            .filter(|&k| self.subs[k].borrow().now_on() == Some(o))
            .collect();
        self.log(format!(
            "kill -9 of {} (the owner, pid {pid}, serving {} of the subscribers)",
            self.names[o],
            victims.len()
        ));
        self.last_kill = Some(Kill {
            instance: o,
            victims,
        });
    }

    /// Once, after 5 s with no owner: a hint that the database may be out of reach.
    fn hint(&mut self) {
        if self.owner.is_none()
            && self.killed_at.is_none()
            && !self.hinted
            && self.start.elapsed() > Duration::from_secs(5)
        {
            self.hinted = true;
            self.log(
                "no instance owns the change DB yet: can they reach it? (the database must exist)"
                    .into(),
            );
        }
    }

    /// Whether an instance ended by itself (a bad --change-db, say), which ends the demo.
    fn ended_by_itself(&mut self) -> bool {
        let restart_at = self.restart_at;
        let ended = self.instances.iter_mut().enumerate().find_map(|(i, inst)| {
            let restarting = restart_at.is_some_and(|(_, k)| k == i);
            match inst.child.try_wait() {
                Ok(Some(status)) if !restarting => Some((inst.name, status)),
                _ => None,
            }
        });
        let Some((name, status)) = ended else {
            return false;
        };
        self.log(format!(
            "{name} ended by itself ({status}); stopping the demo"
        ));
        true
    }

    /// The killed instance started again once its restart is due.
    fn restart_due(&mut self) {
        if let Some((at, i)) = self.restart_at {
            if Instant::now() >= at {
                self.restart_at = None;
                self.log(format!("starting {} again", self.names[i]));
                self.instances[i] = start_instance(i, &self.db, &self.up.url(), &self.said_tx);
            }
        }
    }

    /// The view: each instance's line, each subscriber's, and since the last kill.
    async fn show(&mut self) {
        self.last_view = Instant::now();
        let mut lines = Vec::new();
        for (i, inst) in self.instances.iter().enumerate() {
            let up = self.addrs.borrow().addrs[i].is_some();
            let down_killed = self.restart_at.is_some_and(|(_, k)| k == i);
            lines.push(instance_line(inst, up, down_killed).await);
        }
        let borrowed: Vec<_> = self.subs.iter().map(|s| s.borrow()).collect();
        let followed: Vec<&Followed> = borrowed.iter().map(|s| &**s).collect();
        lines.extend(followed.iter().map(|s| subscriber_line(s, &self.names)));
        if let Some(kill) = &self.last_kill {
            lines.push(since_kill(kill, &followed, &self.names));
        }
        drop(borrowed);
        self.log(lines.join("\n          "));
        self.printed += 1;
    }

    /// The summary line: each instance's role at the end, the kills and takeovers, the
    /// subscribers' figures.
    async fn summary(&self) {
        let mut roles = Vec::new();
        for (i, inst) in self.instances.iter().enumerate() {
            let up = self.addrs.borrow().addrs[i].is_some();
            let st = match (&inst.addr, up) {
                (Some(a), true) => role(a).await,
                _ => None,
            };
            roles.push(st.map_or_else(|| "down".to_string(), |st| st.role));
        }
        let borrowed: Vec<_> = self.subs.iter().map(|s| s.borrow()).collect();
        let summary = Summary {
            seconds: self.start.elapsed().as_secs(),
            names: &self.names,
            killed: &self.killed,
            owner: self.owner,
            takeover_ms: &self.takeovers,
            roles,
            subs: borrowed.iter().map(|s| &**s).collect(),
            views: self.printed,
        };
        println!("\nsummary: {}", summary.json());
    }
}
