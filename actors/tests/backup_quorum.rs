//! Actor-level tests of several backups and the quorum before any purge (PROTOCOL.md §8.4): the
//! [`BackupQuorum`] between its backups' [`MonitorActor`]s and the real [`CleanupActor`], with
//! a manual clock and a recording purge. The floor is the K-th highest held watermark, fuzzed
//! over seeded random polls (nothing is ever scheduled past what K backups held a cleanup
//! delay ago); a wedged backup never stalls the purge with M = 3, K = 2 (real monitors polling
//! real HTTP metrics endpoints, one of them failing); with one backup every sample passes as it
//! is.

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::cleanup::{CleanupActor, GetCleanupState};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::litestream::BackupSample;
use change_streamer_actors::monitor::{
    BackupPolled, BackupQuorum, Check, GetQuorumState, MonitorActor, MonitorConfig, PollOutcome,
};
use change_streamer_actors::reservation::BackupRead;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use common::recording_purge::{RecordingPurge, Take};

const START: i64 = 1_745_452_800_000;
const DELAY_MS: i64 = 30_000;

/// A quorum of `k` among backups `b0…` (metrics sources), its cleanup actor and purge.
struct Quorum {
    clock: Clock,
    purge: Addr<RecordingPurge>,
    cleanup: Addr<CleanupActor>,
    quorum: Addr<BackupQuorum>,
}

impl Quorum {
    fn new(k: usize, m: usize) -> Quorum {
        let clock = Clock::manual(START);
        let purge = RecordingPurge::default().start();
        let cleanup = CleanupActor::new(
            clock.clone(),
            Duration::from_millis(DELAY_MS as u64),
            Duration::from_millis(DELAY_MS as u64),
            purge.clone().recipient(),
        )
        .start();
        let names = (0..m)
            .map(|i| (format!("b{i}"), "metrics".into()))
            .collect();
        let quorum = BackupQuorum::new(clock.clone(), k, names, cleanup.clone()).start();
        Quorum {
            clock,
            purge,
            cleanup,
            quorum,
        }
    }

    /// Backup `backup` polled: `watermark` (a number) backed up at `at_ms` from the start, or
    /// a failed poll.
    async fn poll(&self, backup: usize, held: Option<(u64, i64)>) {
        let (samples, outcome) = match held {
            Some((w, at)) => (
                vec![BackupSample {
                    watermark: Watermark::from_u64(w),
                    replica: "s3".into(),
                    backed_up_at_ms: START + at,
                }],
                PollOutcome::Read {
                    samples: 1,
                    invalid: 0,
                },
            ),
            None => (Vec::new(), PollOutcome::Failed("wedged".into())),
        };
        self.quorum
            .send(BackupPolled {
                backup,
                samples,
                outcome,
                read: None,
            })
            .await
            .expect("quorum");
    }

    async fn scheduled(&self) -> Vec<u64> {
        let s = self.purge.send(Take).await.expect("purge");
        s.iter()
            .map(|w| Watermark::parse(w).unwrap().to_u64().unwrap())
            .collect()
    }

    fn at(&self, ms: i64) {
        self.clock.set_ms(START + ms);
    }
}

#[actix_rt::test]
async fn quorum_floor_is_the_kth_highest_held_watermark() {
    let q = Quorum::new(2, 3);
    q.poll(0, Some((50, 0))).await;
    q.poll(1, Some((30, 0))).await;
    q.poll(2, Some((10, 0))).await;
    let state = q.quorum.send(GetQuorumState).await.unwrap();
    assert_eq!(state.purge_quorum, 2);
    assert_eq!(state.quorum_watermark, Some(Watermark::from_u64(30)));
    let pending: Vec<u64> = q
        .cleanup
        .send(GetCleanupState)
        .await
        .unwrap()
        .pending_watermarks
        .iter()
        .map(|p| p.watermark.to_u64().unwrap())
        .collect();
    assert_eq!(pending, vec![30], "only what 2 backups hold is recorded");
    q.at(DELAY_MS);
    q.poll(2, None).await;
    assert_eq!(q.scheduled().await, vec![30]);
}

#[actix_rt::test]
async fn quorum_dates_a_watermark_when_the_kth_backup_got_there() {
    let q = Quorum::new(2, 3);
    q.poll(0, Some((20, 0))).await;
    q.at(10_000);
    q.poll(1, Some((25, 10_000))).await;
    // Held by b0 since 0 and by b1 since 10 s: due one delay after 10 s, not after 0.
    q.at(DELAY_MS + 9_999);
    q.poll(2, None).await;
    assert_eq!(q.scheduled().await, Vec::<u64>::new());
    q.at(DELAY_MS + 10_000);
    q.poll(2, None).await;
    assert_eq!(q.scheduled().await, vec![20]);
}

/// A xorshift stream: the fuzz's rolls, the same for a seed on every run.
struct Rolls(u64);

impl Rolls {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[actix_rt::test]
async fn quorum_never_purges_past_what_k_backups_verify() {
    let mut checked = 0;
    for seed in 1..=150u64 {
        let mut r = Rolls(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let m = 1 + r.next(4) as usize;
        let k = 1 + r.next(m as u64) as usize;
        let q = Quorum::new(k, m);
        // What each backup reported: (watermark, backed up at, relative ms).
        let mut reports: Vec<Vec<(u64, i64)>> = vec![Vec::new(); m];
        let mut head = vec![0u64; m];
        let mut now = 0i64;
        let mut scheduled: Vec<(u64, i64)> = Vec::new();
        for _ in 0..60 {
            now += r.next(20_000) as i64;
            q.at(now);
            let b = r.next(m as u64) as usize;
            let held = match r.next(5) {
                0 => None,
                1 => Some((head[b], now)),
                _ => {
                    head[b] += r.next(10);
                    // Backed up up to a few seconds before the poll saw it.
                    Some((head[b], now - r.next(5_000) as i64))
                }
            };
            if let Some(h) = held {
                reports[b].push(h);
            }
            q.poll(b, held).await;
            scheduled.extend(q.scheduled().await.into_iter().map(|w| (w, now)));
        }
        for (w, when) in &scheduled {
            let holders = reports
                .iter()
                .filter(|rs| {
                    rs.iter()
                        .any(|(held, at)| held >= w && *at <= when - DELAY_MS)
                })
                .count();
            checked += 1;
            assert!(
                holders >= k,
                "seed {seed} (K={k}, M={m}): {w} scheduled at {when} ms, held a delay before by {holders} backup(s): {reports:?}"
            );
        }
    }
    assert!(checked > 300, "the fuzz purges: {checked} cleanups checked");
}

#[actix_rt::test]
async fn quorum_of_one_backup_hands_every_sample_on_as_it_is() {
    let q = Quorum::new(1, 1);
    // Two replicas of one backup, the smaller watermark seen later: recorded as they are.
    let samples = vec![
        BackupSample {
            watermark: Watermark::from_u64(40),
            replica: "s3".into(),
            backed_up_at_ms: START + 5,
        },
        BackupSample {
            watermark: Watermark::from_u64(30),
            replica: "file".into(),
            backed_up_at_ms: START + 9,
        },
    ];
    q.quorum
        .send(BackupPolled {
            backup: 0,
            samples,
            outcome: PollOutcome::Read {
                samples: 2,
                invalid: 0,
            },
            read: None,
        })
        .await
        .unwrap();
    let pending = q
        .cleanup
        .send(GetCleanupState)
        .await
        .unwrap()
        .pending_watermarks;
    let got: Vec<(u64, String)> = pending
        .iter()
        .map(|p| (p.watermark.to_u64().unwrap(), p.replica.clone()))
        .collect();
    assert_eq!(got, vec![(30, "file".into()), (40, "s3".into())]);
}

/// Tells the test each [`BackupRead`] the quorum hands the reservations.
#[derive(Default)]
struct Reads(Vec<BackupRead>);

impl Actor for Reads {
    type Context = Context<Self>;
}

impl Handler<BackupRead> for Reads {
    type Result = ();
    fn handle(&mut self, r: BackupRead, _: &mut Context<Self>) {
        self.0.push(r);
    }
}

#[derive(Message)]
#[rtype(result = "Vec<BackupRead>")]
struct TakeReads;

impl Handler<TakeReads> for Reads {
    type Result = MessageResult<TakeReads>;
    fn handle(&mut self, _: TakeReads, _: &mut Context<Self>) -> Self::Result {
        MessageResult(std::mem::take(&mut self.0))
    }
}

#[actix_rt::test]
async fn quorum_verifies_reservations_once_k_backups_hold_the_floor() {
    let q = Quorum::new(2, 3);
    let reads = Reads::default().start();
    let names = (0..3).map(|i| (format!("b{i}"), "vfs".into())).collect();
    let quorum = BackupQuorum::new(q.clock.clone(), 2, names, q.cleanup.clone())
        .reporting_backups_to(reads.clone().recipient())
        .start();
    let polled = |backup: usize, w: u64, size: u64| BackupPolled {
        backup,
        samples: vec![BackupSample {
            watermark: Watermark::from_u64(w),
            replica: "vfs".into(),
            backed_up_at_ms: START,
        }],
        outcome: PollOutcome::Read {
            samples: 1,
            invalid: 0,
        },
        read: Some(BackupRead {
            watermark: Watermark::from_u64(w),
            replica_size: Some(size),
        }),
    };
    let take = || async {
        let r = reads.send(TakeReads).await.unwrap();
        r.into_iter()
            .map(|r| (r.watermark.to_u64().unwrap(), r.replica_size))
            .collect::<Vec<_>>()
    };
    quorum.send(polled(0, 90, 4096)).await.unwrap();
    assert_eq!(take().await, vec![], "one backup is not a quorum of 2");
    quorum.send(polled(1, 70, 8192)).await.unwrap();
    assert_eq!(
        take().await,
        vec![(70, Some(8192))],
        "the 2nd highest, with its size"
    );
}

/// A monitor polling `metrics` as backup number `i` of `quorum`, polled by hand.
fn monitor(
    metrics: &FakeLitestream,
    i: usize,
    q: &Quorum,
    quorum: &Addr<BackupQuorum>,
) -> Addr<MonitorActor> {
    let mut cfg = MonitorConfig::new(metrics.url(), Duration::from_secs(60));
    cfg.poll_automatically = false;
    cfg.clock = q.clock.clone();
    MonitorActor::new(cfg, q.cleanup.clone())
        .in_quorum(i, quorum.clone().recipient())
        .start()
}

#[actix_rt::test]
async fn quorum_wedged_backup_never_stalls_the_purge() {
    let q = Quorum::new(2, 3);
    let names = ["east", "west", "wedged"]
        .iter()
        .map(|n| (n.to_string(), "metrics".to_string()))
        .collect();
    let quorum = BackupQuorum::new(q.clock.clone(), 2, names, q.cleanup.clone()).start();
    let mut pages = Vec::new();
    let mut monitors = Vec::new();
    for i in 0..3 {
        let page = FakeLitestream::start(Answer::default()).await;
        monitors.push(monitor(&page, i, &q, &quorum));
        pages.push(page);
    }
    pages[2].set(Answer {
        status: 500,
        body: "replica wedged".into(),
        ..Answer::default()
    });
    let mut purged = Vec::new();
    for step in 1..=5u64 {
        let now = step as i64 * DELAY_MS;
        q.at(now);
        let seconds = format!("{}", (START + now - DELAY_MS) as f64 / 1000.0);
        for page in &pages[..2] {
            let w = Watermark::from_u64(step * 10);
            page.set_body(render_page(
                "/db",
                &[(Some(w.as_str()), "s3", seconds.clone())],
            ));
        }
        for (i, m) in monitors.iter().enumerate() {
            let outcome = m.send(Check).await.unwrap();
            assert_eq!(matches!(outcome, PollOutcome::Failed(_)), i == 2);
        }
        purged.extend(q.scheduled().await);
    }
    assert_eq!(purged, vec![10, 20, 30, 40, 50], "one cleanup per step");
    let state = quorum.send(GetQuorumState).await.unwrap();
    let wedged = &state.backups[2];
    assert_eq!(
        (wedged.name.as_str(), wedged.watermark.clone()),
        ("wedged", None)
    );
    assert!(wedged
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("500")));
    assert_eq!(state.backups[0].age_ms, Some(DELAY_MS));
}
