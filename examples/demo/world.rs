//! The default demo's stand-ins for the outside world: an upstream change source writing
//! transactions, the replicas that follow the stream (the backup one, the restoring ones, the
//! one that stalls), where a restore's backup comes from, and the stand-in litestream's reports.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use change_streamer_test_support::access::Credentials;
use change_streamer_test_support::backup_replica::read_replica;
use change_streamer_test_support::client::{Seen, WsClient};
use change_streamer_test_support::litestream::{render_page, FakeLitestream};
use change_streamer_test_support::stock_litestream::Litestream;
use change_streamer_test_support::upstream::{self, FakeUpstream};

/// The last watermark the backup replica applied (what litestream "backs up").
pub type Applied = Rc<RefCell<Option<String>>>;

/// Pushes transactions forever at about `per_second`.
pub async fn write_transactions(up: FakeUpstream, per_second: u64) {
    let mut n = 1_000_000u64;
    let mut tick = actix_rt::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let frames: Vec<String> = (0..per_second / 20)
            .flat_map(|_| {
                n += 1;
                upstream::txn(n, 1 + n % 5)
            })
            .collect();
        up.send(frames);
    }
}

/// Follows the stream, acking each message, and records the last commit applied.
pub async fn follow(mut c: WsClient, applied: Option<Applied>, stall_after: Option<Duration>) {
    let start = Instant::now();
    loop {
        if stall_after.is_some_and(|d| start.elapsed() > d) {
            // Stops reading (and so answering pings) but keeps the socket open.
            std::future::pending::<()>().await;
        }
        match c.next(Duration::from_secs(60)).await {
            Some(Seen::Msg { id, msg }) => {
                if msg[0] == "commit" {
                    if let Some(a) = &applied {
                        *a.borrow_mut() = msg[2]["watermark"].as_str().map(str::to_string);
                    }
                }
                c.ack(id).await;
            }
            Some(Seen::Closed { .. }) | None => return,
        }
    }
}

/// Where a restoring replica's backup comes from.
#[derive(Clone)]
pub enum Restore {
    /// The stand-in: the watermark last reported as backed up.
    Reported(Applied),
    /// Real litestream: `litestream restore` of the `file://` replica, then its stateVersion.
    Real {
        litestream: Litestream,
        url: String,
        dir: std::path::PathBuf,
    },
}

impl Restore {
    /// The watermark a restore starts from, `None` when there is no backup.
    pub async fn watermark(&self, name: &str) -> Option<String> {
        match self {
            Restore::Reported(backed_up) => backed_up.borrow().clone(),
            Restore::Real {
                litestream,
                url,
                dir,
            } => {
                let (litestream, url) = (litestream.clone(), url.clone());
                let out = dir.join(format!("{name}.db"));
                // A blocking command: off the runtime, which also runs the service's actors.
                tokio::task::spawn_blocking(move || {
                    litestream.restore(&url, &out).ok()?;
                    Some(read_replica(&out).0)
                })
                .await
                .ok()
                .flatten()
            }
        }
    }
}

/// A restoring replica: reserve, restore for `restore`, subscribe with initial=true, follow.
pub async fn replica(
    base: String,
    credentials: Credentials,
    name: String,
    restore: Duration,
    backed_up: Restore,
    stall_after: Option<Duration>,
) {
    let mut res = WsClient::connect_with(
        &format!("ws://{base}/replication/v6/snapshot?taskID={name}"),
        &credentials,
    )
    .await;
    let (id, status) = res.msg().await;
    res.ack(id).await;
    let replica_version = status[1]["replicaVersion"]
        .as_str()
        .unwrap_or("00")
        .to_string();
    // "Restore": keep the reservation open (answering pings) for a while.
    let _ = res.next(restore).await;
    let from = backed_up
        .watermark(&name)
        .await
        .unwrap_or(replica_version.clone());
    let url = format!(
        "ws://{base}/replication/v6/changes?id={name}&taskID={name}&mode=serving&replicaVersion={replica_version}&watermark={from}&initial=true"
    );
    let sub = WsClient::connect_with(&url, &credentials).await;
    let _ = res.next(Duration::from_secs(2)).await; // the reservation's close
    follow(sub, None, stall_after).await;
}

/// Reports the backup replica's applied watermark as backed up, every second.
pub async fn litestream_reports(lite: FakeLitestream, applied: Applied, backed_up: Applied) {
    let mut tick = actix_rt::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(w) = applied.borrow().clone() else {
            continue;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        lite.set_body(render_page(
            "/data/replica.db",
            &[(Some(&w), "s3", format!("{:.3}", now.as_secs_f64()))],
        ));
        *backed_up.borrow_mut() = Some(w);
    }
}
