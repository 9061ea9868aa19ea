//! The demo on a shared PostgreSQL change DB (PROTOCOL.md §14): `--change-db postgres://…` starts two
//! service processes on that database, shows which one owns it, and kills the owner with
//! `kill -9` when Enter is pressed or after `--kill-after N` seconds, so that the takeover is
//! seen live: the standby owns, the change source is asked to resume from the last durable
//! watermark, and the subscribers reconnect and go on with no gap and no commit twice. The
//! killed instance is started again, and comes back as the standby.
//!
//! The two service processes are this demo's own binary run with [`SERVE`]: the real service
//! (`change_streamer::ownership::run`), in a process of its own so that it can be killed.
//! The stand-in change source numbers its transactions one after another and, like a real
//! one, resumes after the `lastWatermark` each new connection asks for; so a subscriber that
//! sees a commit other than the one after its last is seeing a gap.

use std::cell::RefCell;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use actix_codec::Framed;
use awc::ws::{Codec, Frame, Message};
use awc::BoxedSocket;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::upstream::{self, FakeUpstream};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};

/// The hidden first argument that makes this binary a service process.
pub const SERVE: &str = "__serve";

/// The instances' `--takeover-interval-ms`.
const TAKEOVER_INTERVAL_MS: u64 = 200;

/// Runs the real service with the flags after [`SERVE`], until SIGINT or SIGTERM.
pub fn serve() -> std::process::ExitCode {
    use clap::Parser;
    let args = std::iter::once("change-streamer".to_string()).chain(std::env::args().skip(2));
    let config = match change_streamer::Config::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let run = change_streamer::ownership::run(
        config,
        change_streamer_actors::clock::Clock::System,
        change_streamer::shutdown::wait_for_signal(),
    );
    match actix_rt::System::new().block_on(run) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("change-streamer: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What a service process said on its log.
enum Said {
    Standby(usize, String),
    Owner(usize, Instant),
}

/// One service process.
struct Instance {
    name: char,
    child: Child,
    addr: Option<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Instance {
    /// A demo that ends early (a panic, say) leaves no service process running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_instance(i: usize, db: &str, up: &str, said: &mpsc::Sender<Said>) -> Instance {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("the demo's own path");
    let mut child = Command::new(exe)
        .arg(SERVE)
        .args(["--host", "127.0.0.1", "--port", "0", "--upstream", up])
        .args(["--change-db", db, "--takeover-interval-ms"])
        .arg(TAKEOVER_INTERVAL_MS.to_string())
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "info")
        // In the environment, not on the command line, where `ps` would show it.
        .env("ZERO_CHANGE_STREAMER_SECRET", secret())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a service process");
    let stderr = child.stderr.take().expect("stderr");
    let said = said.clone();
    std::thread::spawn(move || {
        let addr = |rest: &str| rest.split_whitespace().next().unwrap_or("").to_string();
        let mut said_unreachable = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("standby on ").nth(1) {
                let _ = said.send(Said::Standby(i, addr(rest)));
            } else if line.contains("listening on ") {
                let _ = said.send(Said::Owner(i, Instant::now()));
            } else if line.contains("unreachable") && !said_unreachable {
                said_unreachable = true;
                eprintln!("instance {}: {line}", (b'A' + i as u8) as char);
            } else if line.contains("change-streamer: ") {
                eprintln!("instance {}: {line}", (b'A' + i as u8) as char);
            }
        }
    });
    Instance {
        name: (b'A' + i as u8) as char,
        child,
        addr: None,
        _dir: dir,
    }
}

/// Writes about `per_second` transactions a second, numbered one after another; on each new
/// connection it goes on after the `lastWatermark` asked for, as a real change source does.
async fn write_transactions(up: FakeUpstream, per_second: u64) {
    let mut n = 1_000_000u64;
    let mut connections = 0;
    let mut tick = actix_rt::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let queries = up.queries();
        if queries.len() != connections {
            connections = queries.len();
            if let Some(last) = queries.last().and_then(|q| last_watermark(q)) {
                n = last;
            }
        }
        if connections == 0 {
            continue;
        }
        let frames: Vec<String> = (0..per_second / 20)
            .flat_map(|_| {
                n += 1;
                upstream::txn(n, 1 + n % 5)
            })
            .collect();
        up.send(frames);
    }
}

fn last_watermark(query: &str) -> Option<u64> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("lastWatermark="))
        .and_then(|w| Watermark::parse(w).ok()?.to_u64())
}

fn wm_u64(v: &Value) -> Option<u64> {
    Watermark::parse(v.as_str()?).ok()?.to_u64()
}

/// What one subscriber saw.
#[derive(Default)]
struct Followed {
    last: Option<u64>,
    commits: u64,
    gaps: u64,
    twice: u64,
    reconnects: u64,
    /// Lines for the event log.
    events: Vec<String>,
}

type Shared<T> = Rc<RefCell<T>>;

/// A subscriber that follows whichever instance owns the change DB: on a close or a lost
/// connection it connects again (to either instance; a standby closes it at once with 1011)
/// from the last commit it acked.
async fn subscriber(
    name: String,
    addrs: Shared<Vec<Option<String>>>,
    rv: String,
    seen: Shared<Followed>,
) {
    let mut turn = 0usize;
    loop {
        let candidates: Vec<String> = addrs.borrow().iter().flatten().cloned().collect();
        if candidates.is_empty() {
            actix_rt::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let addr = candidates[turn % candidates.len()].clone();
        turn += 1;
        let from = seen
            .borrow()
            .last
            .map(|w| Watermark::from_u64(w).to_string())
            .unwrap_or(rv.clone());
        let url = format!(
            "ws://{addr}/replication/v6/changes?id={name}&replicaVersion={rv}&watermark={from}"
        );
        // A killed instance's port refuses, a standby handing over may drop the connection:
        // try again, on the other one.
        let Ok((_, mut c)) = awc::Client::new()
            .ws(&url)
            .header("authorization", format!("Bearer {}", secret()))
            .connect()
            .await
        else {
            actix_rt::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut served = false;
        loop {
            match next(&mut c).await {
                Got::Msg(id, msg) => {
                    if !served {
                        served = true;
                        let mut s = seen.borrow_mut();
                        if s.last.is_some() {
                            s.reconnects += 1;
                            let line = format!("{name} subscribed again on {addr} from {from}");
                            s.events.push(line);
                        }
                    }
                    if msg[0] == "commit" {
                        if let Some(w) = wm_u64(&msg[2]["watermark"]) {
                            let mut s = seen.borrow_mut();
                            match s.last {
                                Some(l) if w <= l => s.twice += 1,
                                Some(l) if w != l + 1 => s.gaps += 1,
                                _ => {}
                            }
                            s.last = Some(s.last.map_or(w, |l| l.max(w)));
                            s.commits += 1;
                        }
                    }
                    let ack = Message::Text(format!(r#"{{"ack":{id}}}"#).into());
                    if c.send(ack).await.is_err() {
                        break;
                    }
                }
                Got::Closed(code, reason) => {
                    if served {
                        let line = format!("{name} closed by {addr}: {code} {reason}");
                        seen.borrow_mut().events.push(line);
                    }
                    break;
                }
            }
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a subscription read next.
enum Got {
    Msg(u64, Value),
    /// The close code and reason; 1006 for a connection that ended without one.
    Closed(u16, String),
}

/// The next message or close of a subscription (PROTOCOL.md §5 framing), answering pings.
async fn next(c: &mut Framed<BoxedSocket, Codec>) -> Got {
    let lost = || Got::Closed(1006, String::new());
    loop {
        let frame = match tokio::time::timeout(Duration::from_secs(30), c.next()).await {
            Ok(Some(Ok(f))) => f,
            _ => return lost(),
        };
        match frame {
            Frame::Text(t) => {
                let Ok(v) = serde_json::from_slice::<Value>(&t) else {
                    return lost();
                };
                let Some(id) = v["id"].as_u64() else {
                    return lost();
                };
                return Got::Msg(id, v["msg"].clone());
            }
            Frame::Ping(p) => {
                let _ = c.send(Message::Pong(p)).await;
            }
            Frame::Close(r) => {
                let _ = c.send(Message::Close(None)).await;
                return r.map_or(Got::Closed(1005, String::new()), |r| {
                    Got::Closed(u16::from(r.code), r.description.unwrap_or_default())
                });
            }
            _ => {}
        }
    }
}

async fn role(addr: &str) -> Option<Value> {
    let mut resp = awc::Client::new()
        .get(format!("http://{addr}/status"))
        .insert_header(("authorization", format!("Bearer {}", secret())))
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .ok()?;
    resp.json::<Value>().limit(1 << 20).await.ok()
}

/// The secret both instances ask for, generated for this run (as in the single-instance demo).
fn secret() -> &'static str {
    static SECRET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SECRET.get_or_init(crate::demo_secret)
}

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
