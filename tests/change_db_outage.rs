//! End to end: the PostgreSQL change DB goes away and comes back (PROTOCOL.md §14.2), each case
//! against a real PostgreSQL cluster the test starts itself (so that it can stop and restart it
//! without touching anyone else's server), with an owner and a serving standby on it, a
//! replica subscribed at each, and the change source writing throughout:
//! - every backend the service holds ended with `pg_terminate_backend`;
//! - the server restarted (`pg_ctl restart -m fast`);
//! - the server stopped for 20 s, then started again.
//!
//! Each checks §14.2's rules: nothing exits; `/readyz` says `change DB unreachable` while the
//! change DB is gone (the 20 s outage, long enough to look); afterwards exactly one instance
//! owns the change DB, both are ready and ingest resumes; each replica is kept or closed with
//! 1011 (`standby: …`, or `catch-up failed: …` or `change log unavailable: …` when the change
//! DB went away under a read) and resumes from its last ack, its commits gapless and without duplicates;
//! and every commit acked upstream is stored (read back by a fresh subscription).

#[allow(dead_code)] // shared with tests/takeover.rs and others
mod takeover_support;

#[allow(dead_code)] // shared with tests/standby_serving.rs and others
mod standby_support;

mod outage_support;

use std::time::{Duration, Instant};

use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::pg_cluster::{self, Cluster};
use change_streamer_test_support::upstream::FakeUpstream;
use change_streamer_test_support::wait::POLL;
use outage_support::*;
use standby_support::*;
use takeover_support::*;

/// How long the third case keeps the server stopped (issue 30's number).
const OUTAGE: Duration = Duration::from_secs(20);

/// How the reason of a 1011 close may begin while the change DB is away (PROTOCOL.md §14.2).
const DOCUMENTED: [&str; 3] = ["standby:", "catch-up failed:", "change log unavailable:"];

/// What happens to the change DB.
#[derive(Clone, Copy, Debug)]
enum Outage {
    TerminateBackends,
    Restart,
    Stopped,
}

#[actix_rt::test]
async fn terminating_every_backend_of_the_service_loses_nothing_and_nothing_exits() {
    survive(Outage::TerminateBackends).await;
}

#[actix_rt::test]
async fn a_restart_of_the_change_db_loses_nothing_and_nothing_exits() {
    survive(Outage::Restart).await;
}

#[actix_rt::test]
async fn a_change_db_gone_for_20_s_makes_readyz_say_so_then_all_resumes() {
    survive(Outage::Stopped).await;
}

async fn survive(outage: Outage) {
    let _ = env_logger::builder().is_test(true).try_init();
    let cluster = pg_cluster::start().expect("a PostgreSQL cluster of the test's own");
    let db = TestDb::create_on(&cluster.url, "outage").await;
    let up = FakeUpstream::start().await;
    let (mut a, a_addr) = owner_with(&db, &up, &[]);
    up.wait_connections(1).await;
    let source = Source::start(&up);
    wait_for("the initial sync acked", || !acked(&up).is_empty(), &[]).await;
    let (mut b, b_addr) = serving_standby(&db, &up, &[]).await;
    let replicas = [
        Replica::follow(&a_addr, "ra"),
        Replica::follow(&b_addr, "rb"),
    ];
    wait_for(
        "both replicas live",
        || replicas.iter().all(|r| r.last() > 120),
        &replicas,
    )
    .await;

    let before = max_acked(&up);
    eprintln!("{outage:?} at commit {before}");
    disrupt(outage, &cluster, &db, [(&a, &a_addr), (&b, &b_addr)]).await;
    for (name, i) in [("owner", &mut a), ("standby", &mut b)] {
        assert!(i.child.try_wait().unwrap().is_none(), "the {name} exited");
    }

    // Back: both ready, exactly one owner, ingest going on.
    for addr in [&a_addr, &b_addr] {
        assert!(ready_within(addr, PATIENCE).await, "{addr} not ready again");
    }
    let owner = one_owner([&a_addr, &b_addr]).await;
    wait_for("ingest resumed", || max_acked(&up) > before + 50, &replicas).await;
    let last = source.stop().await;
    all_acked_and_applied(&up, last, &replicas).await;
    for (name, i) in [("first", &mut a), ("second", &mut b)] {
        assert!(
            i.child.try_wait().unwrap().is_none(),
            "the {name} instance exited"
        );
    }

    // Each replica: gapless, no duplicate, closed (if at all) with a documented close.
    end_all_gapless(replicas, &DOCUMENTED);
    // Every commit acked upstream (up to `last`, the last one sent) is stored: a fresh
    // subscription reads them all back.
    let mut fresh = subscribe(&owner, "fresh", 100).await;
    let stored = commits_until(&mut fresh, last).await;
    if let Err(e) = gapless(&stored) {
        panic!("stored: {e}");
    }
}

/// Does `outage` to the change DB; returns once it is back.
async fn disrupt(outage: Outage, cluster: &Cluster, db: &TestDb, at: [(&Instance, &String); 2]) {
    let addrs = at.map(|(_, addr)| addr);
    match outage {
        Outage::TerminateBackends => {
            let c = db.connect().await;
            let ended = c
                .query(
                    "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE application_name LIKE 'change-streamer %'",
                    &[],
                )
                .await
                .unwrap();
            let names: Vec<String> = ended.iter().map(|r| r.get(0)).collect();
            eprintln!("terminated {names:?}");
            for part in ["writer", "records", "standby-reader", "listen"] {
                assert!(
                    names
                        .iter()
                        .any(|n| n.starts_with(&format!("change-streamer {part} "))),
                    "no {part} backend among {names:?}"
                );
            }
        }
        Outage::Restart => cluster.restart().expect("pg_ctl restart"),
        Outage::Stopped => {
            at.iter()
                .for_each(|(i, _)| while i.log.try_recv().is_ok() {});
            cluster.stop().expect("pg_ctl stop");
            let stopped = Instant::now();
            // Not ready, saying why, for as long as the change DB is gone; alive all along.
            let mut said = [false; 2];
            while stopped.elapsed() < OUTAGE {
                for (i, addr) in addrs.iter().enumerate() {
                    assert_eq!(get(addr, "/healthz").await.0, 200, "{addr}'s /healthz");
                    let (code, body) = get(addr, "/readyz").await;
                    if said[i] {
                        assert_eq!(
                            (code, body.as_str()),
                            (503, "change DB unreachable\n"),
                            "{addr} while the change DB is gone"
                        );
                    }
                    said[i] |= (code, body.as_str()) == (503, "change DB unreachable\n");
                }
                actix_rt::time::sleep(POLL).await;
            }
            assert_eq!(said, [true, true], "/readyz said `change DB unreachable`");
            // The outage is one event: said once by each part that retries, not at each try.
            for (i, addr) in at {
                let repeats = most_repeated_warning(&i.log);
                assert!(
                    repeats.0 <= 3,
                    "{addr} logged this {} times in {OUTAGE:?}: {}",
                    repeats.0,
                    repeats.1
                );
            }
            cluster.start_again().expect("pg_ctl start");
        }
    }
}

/// Waits until exactly one of the instances at `addrs` says it is the owner: its address.
async fn one_owner(addrs: [&String; 2]) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let roles = [role(addrs[0]).await, role(addrs[1]).await];
        let owners: Vec<&String> = addrs
            .iter()
            .zip(&roles)
            .filter(|(_, r)| *r == "owner")
            .map(|(a, _)| *a)
            .collect();
        match owners[..] {
            [owner] => return owner.clone(),
            [_, _] => panic!("two owners of one change DB"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "no owner within {PATIENCE:?}");
        actix_rt::time::sleep(POLL).await;
    }
}

/// The WARN or ERROR line logged most often among those `log` holds (its numbers aside), and
/// how often.
fn most_repeated_warning(log: &std::sync::mpsc::Receiver<String>) -> (usize, String) {
    let mut counts = std::collections::HashMap::<String, usize>::new();
    for line in log.try_iter() {
        let Some(at) = line.find(" WARN ").or_else(|| line.find(" ERROR ")) else {
            continue;
        };
        let text: String = line[at..]
            .chars()
            .map(|c| if c.is_ascii_digit() { '0' } else { c })
            .collect();
        *counts.entry(text).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(text, n)| (n, text))
        .max()
        .unwrap_or_default()
}
