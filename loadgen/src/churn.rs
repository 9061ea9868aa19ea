//! Subscribers that join and leave (`--churn-subs N --churn-rate R`): a pool of N churning
//! joiners spread over the subscriber threads like the steady ones (slot k on thread k mod
//! `--threads`), R joins a second in all once the flood starts. Once a thread's share of the
//! pool is full, each join first tells that thread's oldest joiner to leave, so R leave a
//! second too and each joiner stays about N / R seconds. A joiner subscribes from a commit the
//! service stored, up to 199 transactions back (so that some catch up from the change log
//! before going live), and must get every transaction after it ([`subscriber::join`] checks
//! ids, whole transactions and watermarks from there; a gap is an error of the run).

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::ctx::Ctx;
use crate::shared::Phases;
use crate::subscriber;
use crate::workload::FIRST_SEQ;

/// The churn of a run: pool size, joins per second in all, and the service addresses joiners
/// go to (round-robin by join number).
#[derive(Clone, Debug)]
pub struct Churn {
    pub subs: usize,
    pub rate: f64,
    pub services: Vec<String>,
}

impl Churn {
    /// Pool slots of thread `t` of `threads` (slot k on thread k mod `threads`).
    pub fn share(&self, t: usize, threads: usize) -> usize {
        let threads = threads.max(1);
        self.subs / threads + usize::from(t < self.subs % threads)
    }
}

/// Where joiner number `k` subscribes from, the service having stored every transaction up to
/// `stored`: that commit or one up to 199 before it, never before the replicaVersion.
pub fn watermark(stored: u64, k: u64) -> u64 {
    stored.saturating_sub(k * 37 % 200).max(FIRST_SEQ)
}

/// Runs thread `t`'s share of the churn until the run stops: waits for the flood, then joins
/// at this thread's share of the rate (threads offset from each other by 1 / rate), sending the
/// oldest joiner away first once the share is full.
pub async fn drive(ctx: Rc<Ctx>, churn: Churn, t: usize, threads: usize) {
    let share = churn.share(t, threads);
    if share == 0 || churn.rate <= 0.0 || churn.services.is_empty() {
        return;
    }
    let run = ctx.run.clone();
    run.phases.until(|p| p.go() || p.stopped()).await;
    let every = Duration::from_secs_f64(churn.subs as f64 / (churn.rate * share as f64));
    let start = Instant::now() + Duration::from_secs_f64(t as f64 / churn.rate);
    let pid = std::process::id();
    let mut pool: VecDeque<oneshot::Sender<()>> = VecDeque::with_capacity(share);
    for j in 0u64.. {
        let at = start + every.mul_f64(j as f64);
        tokio::select! {
            _ = tokio::time::sleep_until(at.into()) => {}
            _ = run.phases.until(Phases::stopped) => break,
        }
        if pool.len() >= share {
            if let Some(leave) = pool.pop_front() {
                let _ = leave.send(());
            }
        }
        let k = j * threads as u64 + t as u64;
        let i = k as usize % churn.services.len();
        let from = watermark(run.stored(), k);
        let (tx, rx) = oneshot::channel();
        pool.push_back(tx);
        tokio::task::spawn_local(subscriber::join(
            ctx.clone(),
            churn.services[i].clone(),
            i,
            format!("lg-{pid}-s{i}-churn-{k}"),
            from,
            async move {
                let _ = rx.await;
            },
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_is_shared_over_threads_and_joiners_start_at_a_stored_commit() {
        let churn = Churn {
            subs: 5,
            rate: 50.0,
            services: vec!["ws://a".into()],
        };
        assert_eq!(
            (0..3).map(|t| churn.share(t, 3)).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        assert_eq!(churn.share(0, 1), 5);
        let stored = FIRST_SEQ + 1000;
        for k in 0..500 {
            let w = watermark(stored, k);
            assert!(w <= stored && w + 200 > stored, "{k}: {w}");
        }
        assert_eq!(watermark(stored, 0), stored);
        // Never before the replicaVersion, even early in the run.
        assert_eq!(watermark(FIRST_SEQ + 3, 1), FIRST_SEQ);
    }
}
