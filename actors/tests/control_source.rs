//! Actor-level tests of the control source (PROTOCOL.md §8.1c) against REAL stock litestream
//! 0.5.17: a SQLite file holding `"_zero.replicationState"` is replicated by `litestream
//! replicate` to a `file://` replica with a long sync interval and its control API on a unix
//! socket; the [`MonitorActor`] is told the backup replicator's acks ([`BackupAcked`]) and asks
//! litestream to sync and wait. What it confirms is restored from the backup to check it is
//! there. Also the streamer's side: it reports the acks of `mode=backup` subscribers only.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use change_streamer_actors::cleanup::{CleanupActor, GetCleanupState};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::litestream_control::ControlUrl;
use change_streamer_actors::monitor::{
    BackupSource, Check, ControlSource, GetMonitorStats, MonitorActor, MonitorConfig, MonitorStats,
    PollOutcome, CONTROL_REPLICA,
};
use change_streamer_actors::session_end::SessionId;
use change_streamer_actors::streamer::{
    BackupAcked, GetStreamerState, Mode, ReportBackupAcks, Subscribe,
};
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::stock_litestream;
use change_streamer_test_support::wait::wait_until;
use common::recording_purge::RecordingPurge;
use common::vfs_harness::{Replicated, START};
use common::{begin, commit, data, send_one, setup, w, FakeSession};

/// litestream's own sync interval here: far longer than any test, so that what the backup
/// holds within a test was put there by the control source's `sync`.
const SLOW_SYNC: &str = "1h";

/// A replicated database, its litestream (control socket `ls.sock`), and a monitor on it.
struct Controlled {
    r: Replicated,
    socket: PathBuf,
    cleanup: Addr<CleanupActor>,
    monitor: Addr<MonitorActor>,
}

impl Controlled {
    /// The database at `watermark`, litestream started (unless `!running`), a monitor asking
    /// it about `db_path` (the database's own path when `None`) with `timeout`.
    async fn start(running: bool, db_path: Option<&str>, timeout: Duration) -> Controlled {
        let mut r = Replicated::new("0a");
        let socket = r.dir.path().join("ls.sock");
        if running {
            Self::run_litestream(&mut r, &socket).await;
        }
        let url = ControlUrl::parse(&format!("unix:{}", socket.display())).unwrap();
        Self::monitoring(r, socket, url, db_path, timeout)
    }

    /// A monitor asking `url` about `r`'s database (or `db_path`).
    fn monitoring(
        r: Replicated,
        socket: PathBuf,
        url: ControlUrl,
        db_path: Option<&str>,
        timeout: Duration,
    ) -> Controlled {
        let clock = Clock::manual(START);
        let cleanup = CleanupActor::new(
            clock.clone(),
            Duration::ZERO,
            Duration::from_secs(30),
            RecordingPurge::default().start().recipient(),
        )
        .start();
        let db = r.dir.path().join("replica.db").display().to_string();
        let source = ControlSource {
            url,
            db_path: db_path.map_or(db, str::to_string),
        };
        let mut cfg =
            MonitorConfig::with_source(BackupSource::Control(source), Duration::from_secs(60));
        cfg.clock = clock;
        cfg.timeout = timeout;
        cfg.poll_automatically = false;
        let monitor = MonitorActor::new(cfg, cleanup.clone()).start();
        Controlled {
            r,
            socket,
            cleanup,
            monitor,
        }
    }

    async fn run_litestream(r: &mut Replicated, socket: &std::path::Path) {
        let replication = stock_litestream::install().replicate_controlled(
            &r.dir.path().join("replica.db"),
            &r.backup_url(),
            &r.dir.path().join("litestream.yml"),
            socket,
            SLOW_SYNC,
        );
        replication
            .wait_for_socket(socket, Duration::from_secs(8))
            .await;
        r.litestream = Some(replication);
    }

    /// The backup replicator wrote `watermark` to its file and acked it.
    fn ack(&self, watermark: &str) {
        self.r.set_watermark(watermark);
        self.monitor.do_send(BackupAcked {
            watermark: Watermark::parse(watermark).unwrap(),
        });
    }

    /// (watermark, replica) of every recorded, unscheduled watermark.
    async fn pending(&self) -> Vec<(String, String)> {
        let state = self.cleanup.send(GetCleanupState).await.unwrap();
        state
            .pending_watermarks
            .into_iter()
            .map(|p| (p.watermark.to_string(), p.replica))
            .collect()
    }

    async fn stats(&self) -> MonitorStats {
        self.monitor.send(GetMonitorStats).await.unwrap()
    }

    /// Waits until the monitor's counters satisfy `cond`.
    async fn wait_stats(&self, what: &str, cond: impl Fn(&MonitorStats) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stats = self.stats().await;
            if cond(&stats) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: not reached: {stats:?}");
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `watermark` is recorded as backed up by the control source.
    async fn wait_confirmed(&self, watermark: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        let want = (watermark.to_string(), CONTROL_REPLICA.to_string());
        while !self.pending().await.contains(&want) {
            assert!(
                Instant::now() < deadline,
                "{watermark} not confirmed within {limit:?}: {:?}",
                self.stats().await
            );
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `stateVersion` of the latest backup, restored with `litestream restore`.
    fn restored_watermark(&self) -> String {
        let out = self
            .r
            .dir
            .path()
            .join(format!("restored-{}.db", rand_suffix()));
        stock_litestream::install()
            .restore(&self.r.backup_url(), &out)
            .unwrap();
        let db = rusqlite::Connection::open(&out).unwrap();
        db.query_row(
            r#"SELECT stateVersion FROM "_zero.replicationState""#,
            [],
            |row| row.get(0),
        )
        .unwrap()
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[actix_rt::test]
async fn control_source_confirms_an_acked_watermark_with_no_read_of_the_backup() {
    let c = Controlled::start(true, None, Duration::from_secs(5)).await;
    c.ack("0b");
    c.wait_confirmed("0b", Duration::from_secs(5)).await;
    let stats = c.stats().await;
    assert_eq!(stats.backup_reads_total, 0, "{stats:?}");
    assert_eq!(stats.poll_errors_total, 0, "{stats:?}");
    assert_eq!(stats.last_error, None);
    assert_eq!(
        stats.backup_watermark.map(|w| w.to_string()),
        Some("0b".into())
    );
    // litestream syncs only hourly by itself: the backup has 0b because the monitor asked.
    assert_eq!(c.restored_watermark(), "0b");
}

#[actix_rt::test]
async fn control_source_merges_acks_that_arrive_during_a_request_into_the_newest() {
    let c = Controlled::start(true, None, Duration::from_secs(5)).await;
    for n in ["0b", "0c", "0d", "0e", "0f"] {
        c.ack(n);
    }
    c.wait_confirmed("0f", Duration::from_secs(5)).await;
    // The first ack's request, then one for all the acks that came while it was in flight.
    assert_eq!(
        c.pending().await,
        vec![
            ("0b".to_string(), CONTROL_REPLICA.to_string()),
            ("0f".to_string(), CONTROL_REPLICA.to_string())
        ]
    );
    assert_eq!(c.stats().await.polls_total, 2);
    assert_eq!(c.restored_watermark(), "0f");
}

#[actix_rt::test]
async fn control_source_unreachable_backs_off_records_nothing_then_recovers() {
    let mut c = Controlled::start(false, None, Duration::from_secs(5)).await;
    let started = Instant::now();
    c.ack("0b");
    c.wait_stats("three failed requests", |s| s.poll_errors_total >= 3)
        .await;
    // 250 ms, then 500 ms between the three.
    assert!(
        started.elapsed() >= Duration::from_millis(750),
        "{:?}",
        started.elapsed()
    );
    let stats = c.stats().await;
    let error = stats.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("cannot connect") && error.contains("is litestream running"),
        "{error}"
    );
    assert_eq!(stats.last_poll_ok, Some(false));
    assert_eq!(stats.backup_watermark, None);
    assert_eq!(c.pending().await, vec![]);

    // litestream comes up: the next request after the backoff confirms 0b.
    let socket = c.socket.clone();
    Controlled::run_litestream(&mut c.r, &socket).await;
    c.wait_confirmed("0b", Duration::from_secs(10)).await;
    assert_eq!(c.stats().await.last_error, None);
}

#[actix_rt::test]
async fn control_source_unknown_db_path_is_a_failed_request_naming_the_flag() {
    let c = Controlled::start(true, Some("/nowhere/replica.db"), Duration::from_secs(5)).await;
    let outcome = c.monitor.send(Check).await.unwrap();
    assert!(
        matches!(&outcome, PollOutcome::Failed(e)
            if e.contains("404") && e.contains("database not found") && e.contains("--litestream-db-path")),
        "{outcome:?}"
    );
}

#[actix_rt::test]
async fn control_source_replica_that_cannot_be_written_is_a_failed_request() {
    let c = Controlled::start(true, None, Duration::from_secs(5)).await;
    // The replica's folder becomes a file: litestream's upload fails.
    let backup = stock_litestream::file_replica_dir(&c.r.backup_url());
    let _ = std::fs::remove_dir_all(&backup);
    std::fs::write(&backup, "not a folder").unwrap();
    c.ack("0b");
    let outcome = c.monitor.send(Check).await.unwrap();
    assert!(
        matches!(&outcome, PollOutcome::Failed(e) if e.contains("HTTP 500") && e.contains("not a directory")),
        "{outcome:?}"
    );
    assert_eq!(c.pending().await, vec![]);
}

#[actix_rt::test]
async fn control_source_no_answer_within_the_timeout_is_a_failed_request() {
    let c = Controlled::start(true, None, Duration::from_millis(300)).await;
    let pid = c.r.litestream.as_ref().unwrap().pid().to_string();
    let signal = |s: &str| {
        let ok = std::process::Command::new("kill")
            .args([s, &pid])
            .status()
            .unwrap();
        assert!(ok.success());
    };
    signal("-STOP");
    c.ack("0b");
    let outcome = c.monitor.send(Check).await.unwrap();
    signal("-CONT");
    assert!(
        matches!(&outcome, PollOutcome::Failed(e) if e.contains("no answer")),
        "{outcome:?}"
    );
    assert_eq!(c.pending().await, vec![]);
}

/// Records what the streamer reports of backup acks.
#[derive(Default)]
struct Acks(Arc<Mutex<Vec<Watermark>>>);
impl Actor for Acks {
    type Context = Context<Self>;
}
impl Handler<BackupAcked> for Acks {
    type Result = ();
    fn handle(&mut self, m: BackupAcked, _: &mut Context<Self>) {
        self.0.lock().unwrap().push(m.watermark);
    }
}

/// What [`Acks`] recorded, after every report sent to it before this.
#[derive(Message)]
#[rtype(result = "Vec<Watermark>")]
struct Seen;
impl Handler<Seen> for Acks {
    type Result = MessageResult<Seen>;
    fn handle(&mut self, _: Seen, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.0.lock().unwrap().clone())
    }
}

#[actix_rt::test]
async fn streamer_reports_the_acks_of_backup_subscribers_only() {
    let s = setup(Some(Duration::from_secs(1)), &[false]).await;
    let acks = Acks::default();
    let seen = acks.0.clone();
    let acks = acks.start();
    s.streamer
        .send(ReportBackupAcks {
            to: acks.clone().recipient(),
        })
        .await
        .unwrap();
    let session_id = SessionId(2000);
    let backup = FakeSession::new(session_id, s.streamer.clone(), false).start();
    s.streamer
        .send(Subscribe {
            session_id,
            id: "backup".into(),
            mode: Mode::Backup,
            backup: None,
            protocol: 6,
            replica_version: w(100).to_string(),
            watermark: w(100),
            session: backup.recipient(),
        })
        .await
        .unwrap()
        .expect("subscribed");
    for n in [101, 102] {
        send_one(&s, begin(n)).await;
        send_one(&s, data(n)).await;
        send_one(&s, commit(n)).await;
    }
    // Once both subscribers' acks of 102 are in, whatever the streamer reported of them was
    // sent before the state's answer.
    let streamer = s.streamer.clone();
    common::until("both subscribers acked 102", || {
        let streamer = streamer.clone();
        async move {
            let st = streamer.send(GetStreamerState).await.unwrap();
            st.subscribers.len() == 2 && st.subscribers.iter().all(|s| s.acked == w(102))
        }
    })
    .await;
    wait_until(
        "the starting point and both commits reported",
        Duration::from_secs(5),
        || seen.lock().unwrap().len() >= 3,
    )
    .await;
    // The serving subscriber acked both commits too; only the backup's acks are reported,
    // after the watermark it subscribed with (what its file holds, PROTOCOL.md §8.1c, §13.1).
    assert_eq!(acks.send(Seen).await.unwrap(), vec![w(100), w(101), w(102)]);
}

/// Forwards each TCP connection to 127.0.0.1:PORT to the unix socket `socket` (as socat would);
/// returns the port.
async fn forward_tcp_to(socket: PathBuf) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    actix_rt::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let socket = socket.clone();
            actix_rt::spawn(async move {
                if let Ok(mut unix) = tokio::net::UnixStream::connect(&socket).await {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                }
            });
        }
    });
    port
}

#[actix_rt::test]
async fn control_source_over_http_posts_base_url_sync_which_litestream_addr_does_not_serve() {
    // litestream with its metrics addr too: 0.5.17 serves no control API there.
    let mut r = Replicated::new("0a");
    let socket = r.dir.path().join("ls.sock");
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yml = format!(
        "addr: {addr}\n{}",
        stock_litestream::control_config(
            &r.dir.path().join("replica.db"),
            &r.backup_url(),
            &socket,
            SLOW_SYNC
        )
    );
    let replication =
        stock_litestream::install().replicate_with(&r.dir.path().join("litestream.yml"), &yml);
    replication
        .wait_for_socket(&socket, Duration::from_secs(8))
        .await;
    r.litestream = Some(replication);

    let url = ControlUrl::parse(&format!("http://{addr}/control")).unwrap();
    let c = Controlled::monitoring(r, socket.clone(), url, None, Duration::from_secs(5));
    let outcome = c.monitor.send(Check).await.unwrap();
    assert!(
        matches!(&outcome, PollOutcome::Failed(e) if e.contains("HTTP 404") && e.contains("unix socket only")),
        "{outcome:?}"
    );
    drop(c.monitor);

    // Through a forward of its socket, http:// reaches the same API.
    let port = forward_tcp_to(socket.clone()).await;
    let url = ControlUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let c = Controlled::monitoring(c.r, socket, url, None, Duration::from_secs(5));
    c.ack("0b");
    c.wait_confirmed("0b", Duration::from_secs(5)).await;
    assert_eq!(c.restored_watermark(), "0b");
}
