//! What the purge-across-instances tests share: an owner whose purge reacts within tens of
//! ms, a serving standby beside it, and litestream reporting backups on cue.

use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::pg::TestDb;
use change_streamer_test_support::upstream::FakeUpstream;

use crate::standby_support::*;
use crate::takeover_support::*;

/// litestream reports `n` backed up long ago: with a 0 ms delay floor, the owner schedules a
/// cleanup to `n` at its next poll.
pub fn report_backup_of(lite: &FakeLitestream, n: u64) {
    lite.set_body(render_page(
        "/db",
        &[(Some(wm(n).as_str()), "s3", "1.0".into())],
    ));
}

/// An owner whose backup monitor and purge react within tens of ms (cleanup floor 0, purge
/// delay 20 ms, no retention), transactions 100..=104 of 2 rows stored, and a standby: the
/// owner, its address, the standby, its address and id, the change source and litestream.
pub struct PurgeSetup {
    pub up: FakeUpstream,
    pub lite: FakeLitestream,
    pub _a: Instance,
    pub a_addr: String,
    pub b: Instance,
    pub b_addr: String,
    pub b_id: String,
    /// Last: dropped once the instances are.
    pub _db: TestDb,
}

pub async fn purge_setup(tag: &str) -> PurgeSetup {
    purge_setup_with(tag, "20").await
}

/// [`purge_setup`] with `--purge-delay-ms` `purge_delay_ms`.
pub async fn purge_setup_with(tag: &str, purge_delay_ms: &str) -> PurgeSetup {
    let db = TestDb::create(tag).await;
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let mut flags = lite.service_flags(0);
    let delay = flags.iter().position(|f| f == "--purge-delay-ms").unwrap() + 1;
    flags[delay] = purge_delay_ms.to_string();
    let (a, a_addr) = owner_with(&db, &up, &strs(&flags));
    up.wait_connections(1).await;
    ingest(&up, 100..=104, 2).await;
    let (b, b_addr) = serving_standby(&db, &up, &strs(&flags)).await;
    let b_id = instance_id(&b_addr).await;
    PurgeSetup {
        up,
        lite,
        _a: a,
        a_addr,
        b,
        b_addr,
        b_id,
        _db: db,
    }
}
