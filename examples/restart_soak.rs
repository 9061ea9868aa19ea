//! Measures PROTOCOL.md §13 under load: restart the service (`kill -9` and SIGTERM) while a replica
//! restores, and count how often the replica's `initial=true` subscription from its backup's
//! watermark is refused.
//!
//! ```sh
//! cargo build --release --bin change-streamer --example restart_soak
//! target/release/examples/restart_soak            # 20 runs of each stop
//! target/release/examples/restart_soak --runs 5
//! ```
//!
//! Each run starts the real binary (the `change-streamer` beside the example's directory, or
//! `$CHANGE_STREAMER_BIN`) on a fresh data directory with short delays (cleanup delay floor
//! 1 s, purge delay 50 ms, no retention floor, polls every 50 ms), and around it:
//! - a change source writing a transaction every 10 ms;
//! - a litestream `/metrics` page that, every 500 ms ("sync interval"), reports the newest
//!   stored watermark as backed up at that moment;
//! - a follower that acks everything (so the purge is never held back by no subscriber), and
//!   reconnects from its last acked watermark after the restart.
//!
//! The replica reserves a snapshot, takes the reported backup's watermark `B` as the one it
//! restores, and restores for a while; in the middle the service is stopped (by SIGKILL or
//! SIGTERM) and started again on the same port and data directory. The replica then
//! subscribes with `initial=true` from `B`, within the cleanup delay of the restart. "served"
//! is a `status`; "refused" is anything else (error type 2: its watermark was purged).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use awc::ws::{Frame, Message};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::process::{free_port, sibling_binary, ServiceProcess};
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use futures_util::{SinkExt, StreamExt};

const FLOOR_MS: u64 = 1000;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

#[derive(Clone, Copy, Debug)]
enum Stop {
    Kill9,
    Sigterm,
}

/// A small deterministic generator (xorshift) for the restore times.
struct Rng(u64);
impl Rng {
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + self.0 % (hi - lo)
    }
}

fn start(
    port: u16,
    dir: &std::path::Path,
    up: &FakeUpstream,
    lite: &FakeLitestream,
) -> ServiceProcess {
    let floor = FLOOR_MS.to_string();
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
            "50",
            "--min-cleanup-delay-ms",
            &floor,
            "--purge-delay-ms",
            "50",
            "--change-log-retention-ms",
            "0",
        ],
    )
}

/// Follows the stream as `follower`, acking everything; reconnects from its last acked commit
/// whenever the socket ends, until `stop` is set.
async fn follow(port: u16, acked: Rc<Cell<u64>>, stop: Rc<Cell<bool>>) {
    while !stop.get() {
        let url = format!(
            "ws://127.0.0.1:{port}/replication/v6/changes?id=follower&replicaVersion={}&watermark={}",
            w(100),
            w(acked.get())
        );
        let Ok((_, mut ws)) = awc::Client::new().ws(url).connect().await else {
            actix_rt::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        while let Ok(Some(Ok(frame))) =
            tokio::time::timeout(Duration::from_millis(200), ws.next()).await
        {
            match frame {
                Frame::Text(t) => {
                    let v: serde_json::Value = serde_json::from_slice(&t).unwrap_or_default();
                    if v["msg"][0] == "commit" {
                        if let Some(n) = v["msg"][2]["watermark"]
                            .as_str()
                            .and_then(|s| Watermark::parse(s).ok())
                            .and_then(|m| m.to_u64())
                        {
                            acked.set(n);
                        }
                    }
                    let ack = format!(r#"{{"ack":{}}}"#, v["id"]);
                    if ws.send(Message::Text(ack.into())).await.is_err() {
                        break;
                    }
                }
                Frame::Ping(p) => {
                    let _ = ws.send(Message::Pong(p)).await;
                }
                Frame::Close(_) => break,
                _ => {}
            }
            if stop.get() {
                break;
            }
        }
    }
}

/// One run; `true` when the replica was served.
async fn run(stop_by: Stop, rng: &mut Rng) -> bool {
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let service = start(port, dir.path(), &up, &lite);
    up.wait_connections(1).await;
    up.send(txn(100, 1));

    let done = Rc::new(Cell::new(false));
    let written = Rc::new(Cell::new(100u64));
    let backed_up = Rc::new(RefCell::new(None::<u64>));
    let writer = {
        let (up, done, written) = (up.clone(), done.clone(), written.clone());
        actix_rt::spawn(async move {
            while !done.get() {
                let n = written.get() + 1;
                up.send(txn(n, 3));
                written.set(n);
                actix_rt::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let litestream = {
        let (lite, done, written, backed_up) = (
            lite.clone(),
            done.clone(),
            written.clone(),
            backed_up.clone(),
        );
        actix_rt::spawn(async move {
            while !done.get() {
                // Some transactions behind the newest sent: stored by now.
                let n = written.get().saturating_sub(5).max(100);
                let at = Clock::System.now_ms() as f64 / 1000.0;
                lite.set_body(render_page(
                    "/db",
                    &[(Some(w(n).as_str()), "s3", format!("{at}"))],
                ));
                *backed_up.borrow_mut() = Some(n);
                actix_rt::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let follower = actix_rt::spawn(follow(port, Rc::new(Cell::new(100)), done.clone()));
    // Cleanups and purges come and go before the replica arrives.
    actix_rt::time::sleep(Duration::from_millis(1500)).await;

    let mut res = WsClient::connect(&service.ws("/replication/v6/snapshot?taskID=soak")).await;
    let (id, _) = res.msg().await;
    res.ack(id).await;
    let backup = backed_up.borrow().expect("a backup was reported");
    actix_rt::time::sleep(Duration::from_millis(rng.between(800, 1500))).await;
    match stop_by {
        Stop::Kill9 => service.kill9(),
        Stop::Sigterm => service.terminate().await,
    }
    let service = start(port, dir.path(), &up, &lite);
    // The restore ends within the cleanup delay of the restart.
    actix_rt::time::sleep(Duration::from_millis(rng.between(300, FLOOR_MS - 200))).await;
    let mut sub = WsClient::connect(&service.ws(&format!(
        "/replication/v6/changes?id=replica&taskID=soak&initial=true&mode=serving&replicaVersion={}&watermark={}",
        w(100),
        w(backup)
    )))
    .await;
    let answer = sub.next(Duration::from_secs(10)).await;
    let served = matches!(&answer, Some(Seen::Msg { msg, .. }) if msg[0] == "status");
    if !served {
        eprintln!("refused ({stop_by:?}, backup {}): {answer:?}", w(backup));
    }
    done.set(true);
    let _ = futures_util::future::join3(writer, litestream, follower).await;
    service.terminate().await;
    up.stop().await;
    served
}

fn parse_runs() -> u32 {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--runs") {
        Some(i) => args
            .get(i + 1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                eprintln!("restart_soak: --runs takes a whole number");
                std::process::exit(2);
            }),
        None => 20,
    }
}

#[actix_rt::main]
async fn main() {
    let runs = parse_runs();
    if !sibling_binary().exists() {
        eprintln!(
            "restart_soak: {} is not built; run `cargo build --release --bin change-streamer --example restart_soak`",
            sibling_binary().display()
        );
        std::process::exit(2);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for stop_by in [Stop::Kill9, Stop::Sigterm] {
        let mut refused = 0;
        for _ in 0..runs {
            if !run(stop_by, &mut rng).await {
                refused += 1;
            }
        }
        println!(
            "restart by {stop_by:?} while a replica restores: {refused} of {runs} runs refused"
        );
    }
}
