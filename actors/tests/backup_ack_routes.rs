//! Actor-level tests of one backup replicator per backup among several (PROTOCOL.md §7.1,
//! §8.4): the real [`Streamer`] and change log, with each backup's monitor routed by
//! [`RouteBackupAcks`]. Each backup's replicator (`backup=NAME`) is required, replaces only an
//! older one of the same backup, and its acks go to its own backup's monitor only.
//!
//! [`Streamer`]: change_streamer_actors::streamer::Streamer

mod common;

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::session_end::{SessionEnd, SessionId};
use change_streamer_actors::streamer::{
    BackupAcked, GetStreamerState, Mode, RouteBackupAcks, Subscribe,
};
use change_streamer_actors::watermark::Watermark;
use common::*;

/// Records the acks reported to one backup's monitor.
#[derive(Default)]
struct Monitor(Vec<Watermark>);
impl Actor for Monitor {
    type Context = Context<Self>;
}
impl Handler<BackupAcked> for Monitor {
    type Result = ();
    fn handle(&mut self, m: BackupAcked, _: &mut Context<Self>) {
        self.0.push(m.watermark);
    }
}

#[derive(Message)]
#[rtype(result = "Vec<Watermark>")]
struct Reported;
impl Handler<Reported> for Monitor {
    type Result = MessageResult<Reported>;
    fn handle(&mut self, _: Reported, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.0.clone())
    }
}

/// Subscribes session `n` as the backup replicator of `backup`, acking at once.
async fn replicator(s: &Setup, n: u64, backup: Option<&str>) -> Addr<FakeSession> {
    let session_id = SessionId(n);
    let session = FakeSession::new(session_id, s.streamer.clone(), false).start();
    s.streamer
        .send(Subscribe {
            session_id,
            id: format!("replicator-{n}"),
            mode: Mode::Backup,
            backup: backup.map(str::to_string),
            protocol: 6,
            replica_version: w(100).to_string(),
            watermark: w(100),
            session: session.clone().recipient(),
        })
        .await
        .unwrap()
        .expect("subscribed");
    session
}

#[actix_rt::test]
async fn several_backups_route_each_replicators_acks_to_its_own_monitor_and_replace_by_name() {
    let s = setup(Some(Duration::from_secs(1)), &[]).await;
    let (a, b) = (Monitor::default().start(), Monitor::default().start());
    for (name, m) in [("a", &a), ("b", &b)] {
        s.streamer
            .send(RouteBackupAcks {
                backup: name.into(),
                to: m.clone().recipient(),
            })
            .await
            .unwrap();
    }
    let first_a = replicator(&s, 2000, Some("a")).await;
    let _b = replicator(&s, 2001, Some("b")).await;
    let _unnamed = replicator(&s, 2002, None).await;
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(
        st.subscribers.len(),
        3,
        "different backups replace no one: {st:?}"
    );
    assert!(st.subscribers.iter().all(|s| s.required), "{st:?}");
    // A restarted replicator of a replaces a's only.
    let _second_a = replicator(&s, 2003, Some("a")).await;
    assert_eq!(
        first_a.send(Received).await.unwrap().1,
        Some(SessionEnd::BackupReplaced)
    );
    let st = s.streamer.send(GetStreamerState).await.unwrap();
    assert_eq!(st.subscribers.len(), 3, "{st:?}");

    for n in [101, 102] {
        for m in [begin(n), data(n), commit(n)] {
            send_one(&s, m).await;
        }
    }
    let streamer = s.streamer.clone();
    until("every replicator acked 102", || {
        let streamer = streamer.clone();
        async move {
            let st = streamer.send(GetStreamerState).await.unwrap();
            st.subscribers.iter().all(|s| s.acked == w(102))
        }
    })
    .await;
    let (a2, b2) = (a.clone(), b.clone());
    until("both monitors told of 102", || {
        let (a, b) = (a2.clone(), b2.clone());
        async move {
            a.send(Reported).await.unwrap().last() == Some(&w(102))
                && b.send(Reported).await.unwrap().last() == Some(&w(102))
        }
    })
    .await;
    // Each monitor hears, at each of its replicators' acceptance, the watermark it subscribed
    // with (100, PROTOCOL.md §8.1c), then its own replicator's commits only, each once (moving
    // forward): the other backup's acks, and the unnamed one's, would repeat a commit.
    for m in [&a, &b] {
        let heard = m.send(Reported).await.unwrap();
        let acked: Vec<&Watermark> = heard.iter().filter(|x| **x > w(100)).collect();
        assert!(
            heard.iter().all(|x| *x >= w(100)) && acked.windows(2).all(|p| p[0] < p[1]),
            "{heard:?}"
        );
    }
}
