//! The SQLite writer's commit window: held only under load, ended by any other command.
use super::*;

/// A client that waits for each ack before sending more never shows load: its appends are
/// committed at once, not held for the commit window (it would be slowed to one per window).
#[actix_rt::test]
async fn an_append_awaited_before_the_next_is_not_held_for_the_commit_window() {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    let n = 20u32;
    let t0 = std::time::Instant::now();
    for i in 1..=u64::from(n) {
        log.append(txn(i, 3)).await.unwrap();
    }
    let took = t0.elapsed();
    let held = log.stats().await.unwrap().commits_held_total;
    assert_eq!(
        held, 0,
        "{n} awaited appends took {took:?}, {held} held for the window"
    );
}

/// Under load appends are held for the commit window, but a barrier (or any command other
/// than an append) ends it at once: the held appends commit and the barrier is answered
/// after them, without waiting out the window.
#[actix_rt::test]
async fn a_barrier_ends_the_commit_window_after_committing_what_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let log = ChangeLog::open(dir.path()).unwrap();
    log.append(txn(1, 1)).await.unwrap();
    // Two appends queued together: load, so the window is held for more.
    let a = log.append(txn(2, 1));
    let b = log.append(txn(3, 1));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let t0 = std::time::Instant::now();
    log.barrier().await.unwrap();
    let took = t0.elapsed();
    use futures_util::FutureExt;
    assert!(
        matches!(a.now_or_never(), Some(Ok(()))),
        "held append not durable"
    );
    assert!(
        matches!(b.now_or_never(), Some(Ok(()))),
        "held append not durable"
    );
    assert!(
        took < sqlite::COMMIT_WINDOW * 7 / 10,
        "the barrier waited {took:?}, as if for the window"
    );
    let stats = log.stats().await.unwrap();
    assert_eq!(stats.max_watermark, Some(Watermark::from_u64(3)));
    assert_eq!(
        stats.commits_held_total, 1,
        "the two queued appends were not held"
    );
}
