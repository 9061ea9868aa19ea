//! What the change DB outage tests (tests/change_db_outage.rs, PROTOCOL.md §14.2) run beside the
//! service: a change source writing throughout, replicas that follow an instance through closes
//! and resume from their last ack, and what they check at the end.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use change_streamer_test_support::wait::POLL;

use super::standby_support::sub_url;
use super::takeover_support::{acked, get};

/// How often the change source sends a transaction: steady writing, modest for a shared machine.
const PACE: Duration = Duration::from_millis(10);

/// Safety net: how long a replica waits for an instance to be ready or to send anything, and a
/// test for a state to be reached (the 20 s outage included).
pub const PATIENCE: Duration = Duration::from_secs(90);

/// The change source: from the initial sync (100) on, one transaction of two rows every
/// [`PACE`] to whichever connection is current; on each new connection it resumes after the
/// `lastWatermark` that connection asked for (PROTOCOL.md §4), as a real source does.
pub struct Source {
    stop: Rc<Cell<bool>>,
    /// The last watermark sent.
    task: actix_rt::task::JoinHandle<u64>,
}

impl Source {
    pub fn start(up: &FakeUpstream) -> Source {
        let stop = Rc::new(Cell::new(false));
        let (up, stopped) = (up.clone(), stop.clone());
        let task = actix_rt::spawn(async move {
            let (mut conn, mut next) = (0, 100);
            while !stopped.get() {
                let queries = up.queries();
                if queries.len() > conn {
                    conn = queries.len();
                    next = last_watermark(&queries[conn - 1]).map_or(100, |w| w + 1);
                    log::info!("source: connection {conn} resumes at {next}");
                }
                if conn > 0 && up.send_on(conn, txn(next, 2)) {
                    next += 1;
                }
                actix_rt::time::sleep(PACE).await;
            }
            next - 1
        });
        Source { stop, task }
    }

    /// Stops writing: the last watermark sent.
    pub async fn stop(self) -> u64 {
        self.stop.set(true);
        self.task.await.expect("the change source's task")
    }
}

/// The `lastWatermark` a connection's query asked to resume after, if any.
fn last_watermark(query: &str) -> Option<u64> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("lastWatermark="))
        .and_then(|w| Watermark::parse(w).ok()?.to_u64())
}

/// What a replica saw: the commits it applied (whole transactions, acked), the closes it was
/// sent, and the first thing that broke the rules (an error frame, a torn transaction).
#[derive(Default)]
pub struct Applied {
    pub commits: Vec<u64>,
    pub closes: Vec<(u16, String)>,
    pub broken: Option<String>,
}

/// A replica subscribed at one instance for the whole test: after a close it waits for the
/// instance's `/readyz` and subscribes again from the last commit it applied.
pub struct Replica {
    pub id: &'static str,
    pub seen: Rc<RefCell<Applied>>,
    task: actix_rt::task::JoinHandle<()>,
}

impl Replica {
    pub fn follow(addr: &str, id: &'static str) -> Replica {
        Self::follow_any(&[addr], id)
    }

    /// [`Replica::follow`], going after each close to the first of `addrs` whose `/readyz`
    /// says ready (a replica behind a load balancer that follows `/readyz`).
    pub fn follow_any(addrs: &[&str], id: &'static str) -> Replica {
        let seen = Rc::new(RefCell::new(Applied::default()));
        let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        let s = seen.clone();
        let task = actix_rt::spawn(async move {
            loop {
                let Some(addr) = first_ready(&addrs, PATIENCE).await else {
                    s.borrow_mut().broken =
                        Some(format!("{addrs:?} not ready within {PATIENCE:?}"));
                    return;
                };
                let from = s.borrow().commits.last().copied().unwrap_or(100);
                let mut c = WsClient::connect(&sub_url(&addr, id, from, "")).await;
                if let Err(why) = apply(&mut c, &s).await {
                    s.borrow_mut().broken = Some(why);
                    return;
                }
            }
        });
        Replica { id, seen, task }
    }

    pub fn last(&self) -> u64 {
        self.seen.borrow().commits.last().copied().unwrap_or(100)
    }

    /// Panics if the replica saw anything that breaks the rules.
    pub fn check(&self) {
        if let Some(why) = &self.seen.borrow().broken {
            panic!("replica {}: {why}", self.id);
        }
    }

    /// Stops following; answers the commits applied and the closes seen.
    pub fn end(self) -> (Vec<u64>, Vec<(u16, String)>) {
        self.task.abort();
        self.check();
        let s = self.seen.borrow();
        (s.commits.clone(), s.closes.clone())
    }
}

/// The highest commit the change source was acked.
pub fn max_acked(up: &FakeUpstream) -> u64 {
    acked(up).into_iter().max().unwrap_or(0)
}

/// Polls `cond` until it holds, failing at once if a replica saw something wrong.
pub async fn wait_for(what: &str, mut cond: impl FnMut() -> bool, replicas: &[Replica]) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        replicas.iter().for_each(Replica::check);
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        actix_rt::time::sleep(POLL).await;
    }
}

/// Waits until `last`, the source's last commit, is acked upstream and every replica has it.
pub async fn all_acked_and_applied(up: &FakeUpstream, last: u64, replicas: &[Replica]) {
    wait_for(
        "the last commit sent acked",
        || max_acked(up) == last,
        replicas,
    )
    .await;
    wait_for(
        "both replicas have every acked commit",
        || replicas.iter().all(|r| r.last() >= last),
        replicas,
    )
    .await;
}

/// Ends every replica and checks what each saw: every commit once and in order, and no close
/// but a 1011 whose reason starts with one of `documented` (the closes PROTOCOL.md §14.2 lets
/// an instance that loses or gives up the change DB send).
pub fn end_all_gapless(replicas: impl IntoIterator<Item = Replica>, documented: &[&str]) {
    for r in replicas {
        let id = r.id;
        let (commits, closes) = r.end();
        eprintln!(
            "replica {id}: {} commits ({:?}..={:?}), closes {closes:?}",
            commits.len(),
            commits.first(),
            commits.last()
        );
        if let Err(e) = gapless(&commits) {
            panic!("replica {id}: {e}: {commits:?}");
        }
        for (code, reason) in &closes {
            assert!(
                *code == 1011 && documented.iter().any(|r| reason.starts_with(r)),
                "replica {id} closed with {code} {reason:?}, not 1011 with one of {documented:?}"
            );
        }
    }
}

/// Applies (and acks) one subscription until it closes: `Ok` on a close, recorded.
async fn apply(c: &mut WsClient, s: &RefCell<Applied>) -> Result<(), String> {
    let mut open: Option<String> = None;
    loop {
        let (id, msg) = match c.next(PATIENCE).await {
            Some(Seen::Msg { id, msg }) => (id, msg),
            Some(Seen::Closed { code, reason }) => {
                log::info!("replica closed with {code} {reason:?}");
                s.borrow_mut().closes.push((code, reason));
                return Ok(());
            }
            None => return Err(format!("nothing for {PATIENCE:?}")),
        };
        match msg[0].as_str() {
            Some("status") | Some("data") => {}
            Some("begin") => open = msg[2]["commitWatermark"].as_str().map(str::to_string),
            Some("rollback") => open = None,
            Some("commit") => {
                let w = msg[2]["watermark"].as_str().unwrap_or_default().to_string();
                if open.take().as_deref() != Some(w.as_str()) {
                    return Err(format!("commit {w} without its begin"));
                }
                let n = Watermark::parse(&w)
                    .ok()
                    .and_then(|w| w.to_u64())
                    .ok_or(format!("commit watermark {w}"))?;
                s.borrow_mut().commits.push(n);
            }
            _ => return Err(format!("unexpected message {msg}")),
        }
        c.ack(id).await;
    }
}

/// The first of `addrs` whose `/readyz` answers 200, within `limit`.
pub async fn first_ready(addrs: &[String], limit: Duration) -> Option<String> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        for addr in addrs {
            if get(addr, "/readyz").await.0 == 200 {
                return Some(addr.clone());
            }
        }
        actix_rt::time::sleep(POLL).await;
    }
    None
}

/// Whether `/readyz` at `addr` answers 200 within `limit`.
pub async fn ready_within(addr: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if get(addr, "/readyz").await.0 == 200 {
            return true;
        }
        actix_rt::time::sleep(POLL).await;
    }
    false
}

/// Whether `commits` is every commit after the initial sync up to its last, once each, in order.
pub fn gapless(commits: &[u64]) -> Result<(), String> {
    match commits.iter().zip(101..).find(|(got, want)| **got != *want) {
        None => Ok(()),
        Some((got, want)) => Err(format!(
            "{got} where {want} was due (a gap, a duplicate or a reorder)"
        )),
    }
}
