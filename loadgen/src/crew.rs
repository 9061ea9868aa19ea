//! The subscriber threads (`--threads N`): subscriber k runs on thread k mod N, each thread a
//! single-threaded tokio runtime of its own; thread 0 is the main thread, which also runs the
//! change source. One thread reads ~1.3 M messages/s at most, less on a shared core: 64
//! subscribers at 2,000 txns/s are that many, and a generator that falls behind measures its
//! own delay as the service's latency. Inside a thread everything stays `Rc`/`Cell`
//! ([`Ctx`], [`Tally`](crate::tally::Tally)); what crosses is the [`Run`], each thread's [`Counters`], and the
//! [`Received`] figures it hands back once the run stops. Churning joiners (`--churn-subs`)
//! are spread the same way, each thread driving its share ([`churn::drive`]).

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::churn::{self, Churn};
use crate::ctx::{Ctx, Setup};
use crate::sample;
use crate::shared::{Phases, Run};
use crate::subscriber;
use crate::tally::{Counters, Received};

/// One subscriber to start: one that reads and checks, or one that never reads.
#[derive(Debug, PartialEq, Eq)]
pub enum Job {
    Read {
        base: String,
        service: usize,
        name: String,
        /// Every check and the latencies, or light (`--check-subs`, [`crate::sample`]).
        checked: bool,
    },
    Hold {
        base: String,
        name: String,
    },
}

/// The subscribers of each of `threads` threads: subscriber k reads from service address
/// k mod n (its name says which, `s<i>`) on thread k mod `threads`, checked if it is one of
/// the `check` of [`sample::checked`]; never-reading ones alike.
pub fn plan(
    subs: usize,
    check: usize,
    never_reading: usize,
    services: &[String],
    threads: usize,
) -> Vec<Vec<Job>> {
    let threads = threads.max(1);
    let n = services.len().max(1);
    let base = |i: usize| services.get(i).cloned().unwrap_or_default();
    let pid = std::process::id();
    let mut plan: Vec<Vec<Job>> = (0..threads).map(|_| Vec::new()).collect();
    for k in 0..subs {
        let i = k % n;
        plan[k % threads].push(Job::Read {
            base: base(i),
            service: i,
            name: format!("lg-{pid}-s{i}-{k}"),
            checked: sample::checked(k, subs, check, n, threads),
        });
    }
    for k in 0..never_reading {
        let i = k % n;
        plan[k % threads].push(Job::Hold {
            base: base(i),
            name: format!("lg-{pid}-s{i}-never-{k}"),
        });
    }
    plan
}

/// Starts `jobs` on the current thread's `LocalSet`, thread `t` of `threads`, and that
/// thread's share of the churn (`--churn-subs`), if any.
pub fn start(ctx: &Rc<Ctx>, jobs: Vec<Job>, t: usize, threads: usize, churn: Option<&Churn>) {
    if let Some(c) = churn {
        tokio::task::spawn_local(churn::drive(ctx.clone(), c.clone(), t, threads));
    }
    for job in jobs {
        match job {
            Job::Read {
                base,
                service,
                name,
                checked,
            } => {
                let sub = subscriber::run(ctx.clone(), base, service, name, checked);
                tokio::task::spawn_local(sub);
            }
            Job::Hold { base, name } => {
                tokio::task::spawn_local(subscriber::hold(ctx.clone(), base, name));
            }
        }
    }
}

/// Starts every thread's subscribers and churning joiners (`churn`): thread 0's on `main`
/// (the caller's thread), the others' each on a new OS thread (`counters[t]` its counters); one
/// receiver per new thread, of what it received once the run stopped. Threads given no
/// subscriber are not started.
pub fn launch(
    plan: Vec<Vec<Job>>,
    main: &Rc<Ctx>,
    setup: &Setup,
    counters: &[Arc<Counters>],
    churn: Option<&Churn>,
) -> Vec<oneshot::Receiver<Received>> {
    let mut reports = Vec::new();
    let threads = plan.len();
    let churns = |t: usize| churn.is_some_and(|c| c.share(t, threads) > 0);
    for (t, jobs) in plan.into_iter().enumerate() {
        if t == 0 {
            start(main, jobs, t, threads, churn);
            continue;
        }
        if jobs.is_empty() && !churns(t) {
            continue;
        }
        let Some(counters) = counters.get(t).cloned() else {
            main.run
                .error(format!("no counters for subscriber thread {t}"));
            continue;
        };
        let (tx, rx) = oneshot::channel();
        let (run, setup, churn) = (main.run.clone(), setup.clone(), churn.cloned());
        let spawned = std::thread::Builder::new()
            .name(format!("lg-subs-{t}"))
            .spawn(move || {
                let ctx = setup.ctx(run, counters);
                thread(t, threads, ctx, jobs, churn, tx)
            });
        match spawned {
            Ok(_) => reports.push(rx),
            Err(e) => main
                .run
                .error(format!("cannot start subscriber thread {t}: {e}")),
        }
    }
    reports
}

/// Body of subscriber thread `t`: its runtime runs its subscribers and joiners until the run
/// stops, then hands back what they received (the tasks are dropped with the runtime).
fn thread(
    t: usize,
    threads: usize,
    ctx: Ctx,
    jobs: Vec<Job>,
    churn: Option<Churn>,
    done: oneshot::Sender<Received>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            ctx.run.error(format!(
                "subscriber thread {t}: cannot start its runtime: {e}"
            ));
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    let received = local.block_on(&rt, async move {
        let ctx = Rc::new(ctx);
        start(&ctx, jobs, t, threads, churn.as_ref());
        ctx.run.phases.until(Phases::stopped).await;
        ctx.tally.take()
    });
    // Nobody waits any more if the main thread gave up on this one.
    let _ = done.send(received);
    drop(local);
    rt.shutdown_background();
}

/// What every thread received, merged with `main`'s (thread 0's); a thread that does not
/// report within a few seconds of the stop is an error (its figures are missing).
pub async fn collect(
    run: &Run,
    main: Received,
    reports: Vec<oneshot::Receiver<Received>>,
) -> Received {
    let mut parts = vec![main];
    for (t, rx) in reports.into_iter().enumerate() {
        match tokio::time::timeout(Duration::from_secs(10), rx).await {
            Ok(Ok(r)) => parts.push(r),
            _ => run.error(format!("subscriber thread {} did not report", t + 1)),
        }
    }
    Received::merge(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribers_go_round_robin_over_threads_and_services() {
        let services = ["ws://a".to_string(), "ws://b".to_string()];
        let pid = std::process::id();
        let read = |i: usize, k: usize| Job::Read {
            base: services[i].clone(),
            service: i,
            name: format!("lg-{pid}-s{i}-{k}"),
            checked: true,
        };
        let hold = Job::Hold {
            base: services[0].clone(),
            name: format!("lg-{pid}-s0-never-0"),
        };
        assert_eq!(
            plan(5, usize::MAX, 1, &services, 3),
            vec![
                vec![read(0, 0), read(1, 3), hold],
                vec![read(1, 1), read(0, 4)],
                vec![read(0, 2)],
            ]
        );
        // One thread: everything on the main thread, as without --threads.
        assert_eq!(plan(5, usize::MAX, 1, &services, 1)[0].len(), 6);
    }

    #[test]
    fn check_subs_marks_that_many_subscribers_checked() {
        let services = ["ws://a".to_string()];
        let checked: Vec<usize> = plan(256, 32, 0, &services, 2)
            .iter()
            .map(|jobs| {
                let is_checked = |j: &Job| matches!(j, Job::Read { checked: true, .. });
                jobs.iter().filter(|j| is_checked(j)).count()
            })
            .collect();
        assert_eq!(checked, vec![16, 16]);
    }
}
