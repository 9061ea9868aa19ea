//! `Alarm`: a timer that runs beside an actor, not inside its context, and is cancelled by
//! dropping it.
//!
//! ### Why not `run_later`
//! actix polls every future spawned in an actor's context (`run_later`, `run_interval`,
//! `spawn`) on every turn of the actor, whatever woke it. The streamer turns for every upstream
//! batch and every subscriber's report, tens of thousands of times a second under load, and a
//! `run_later` whose owner forgot it stays in that list until its deadline: a release timer of
//! each finished tracked send did, for a second each, so at ~500 tracked sends a second the
//! streamer polled hundreds of dead timers per turn (`Sleep::poll` and its waker's
//! registration were ~4 % of the service's CPU in `perf`). An alarm is a task of its own,
//! polled only when its deadline passes; it then sends its message. Dropping it aborts the
//! task, so a timer cannot outlive the state it belongs to.
//!
//! Alarms hold a [`WeakAddr`](actix::WeakAddr): an armed alarm never keeps its actor alive,
//! and one that fires after the actor stopped sends nothing.

use std::time::Duration;

use actix::dev::ToEnvelope;
use actix::prelude::*;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A pending message to an actor, sent at its deadline unless the alarm is dropped first.
#[derive(Debug)]
pub struct Alarm {
    task: JoinHandle<()>,
    at: Instant,
}

impl Alarm {
    /// Sends `msg` to `addr` once `after` has passed (on the runtime's clock, which tests may
    /// pause and advance).
    pub fn after<A, M>(after: Duration, addr: &Addr<A>, msg: M) -> Alarm
    where
        A: Actor + Handler<M>,
        A::Context: ToEnvelope<A, M>,
        M: Message + Send + 'static,
        M::Result: Send,
    {
        let at = Instant::now() + after;
        let addr = addr.downgrade();
        let task = actix_rt::spawn(async move {
            tokio::time::sleep_until(at).await;
            if let Some(addr) = addr.upgrade() {
                addr.do_send(msg);
            }
        });
        Alarm { task, at }
    }

    /// Sends a fresh `msg()` to `addr` every `period`, the first one `period` from now, until
    /// dropped or the actor stops.
    pub fn every<A, M>(period: Duration, addr: &Addr<A>, msg: impl Fn() -> M + 'static) -> Alarm
    where
        A: Actor + Handler<M>,
        A::Context: ToEnvelope<A, M>,
        M: Message + Send + 'static,
        M::Result: Send,
    {
        let at = Instant::now() + period;
        let addr = addr.downgrade();
        let task = actix_rt::spawn(async move {
            let mut ticks = tokio::time::interval_at(at, period);
            loop {
                ticks.tick().await;
                match addr.upgrade() {
                    Some(addr) => addr.do_send(msg()),
                    None => return,
                }
            }
        });
        Alarm { task, at }
    }

    /// When it fires (first, for [`Alarm::every`]).
    pub fn at(&self) -> Instant {
        self.at
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    //! Time is paused: a test that awaits a message lets the runtime jump its clock to the next
    //! timer, so each ring arrives at exactly its deadline and is seen as an event, never
    //! waited for with a guessed duration. That an alarm did *not* ring is seen the same way:
    //! a later sentinel alarm's message arrives first.
    use super::*;
    use tokio::sync::mpsc;

    /// Passes each ring on, with the (paused) time it arrived.
    struct Bell(mpsc::UnboundedSender<(u32, Instant)>);
    impl Actor for Bell {
        type Context = Context<Self>;
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Ring(u32);
    impl Handler<Ring> for Bell {
        type Result = ();
        fn handle(&mut self, ring: Ring, _: &mut Context<Self>) {
            let _ = self.0.send((ring.0, Instant::now()));
        }
    }

    /// The ring `got` (number, arrival) is ring `n`, `after` the start or within the timer's
    /// resolution of a millisecond after that (tokio rounds a deadline up to its next tick).
    fn assert_rang(got: (u32, Instant), start: Instant, n: u32, after: Duration) {
        let late = (got.1 - start).checked_sub(after);
        assert!(
            got.0 == n && late.is_some_and(|l| l <= Duration::from_millis(1)),
            "expected ring {n} at {after:?}, got ring {} at {:?}",
            got.0,
            got.1 - start
        );
    }

    fn bell() -> (Addr<Bell>, mpsc::UnboundedReceiver<(u32, Instant)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Bell(tx).start(), rx)
    }

    #[actix_rt::test]
    async fn an_alarm_sends_its_message_at_its_deadline_and_not_before() {
        tokio::time::pause();
        let (addr, mut rings) = bell();
        let start = Instant::now();
        let _alarm = Alarm::after(Duration::from_millis(100), &addr, Ring(1));
        assert_rang(
            rings.recv().await.unwrap(),
            start,
            1,
            Duration::from_millis(100),
        );
    }

    #[actix_rt::test]
    async fn a_dropped_alarm_never_fires() {
        tokio::time::pause();
        let (addr, mut rings) = bell();
        let start = Instant::now();
        let dropped = Alarm::after(Duration::from_millis(100), &addr, Ring(1));
        let _sentinel = Alarm::after(Duration::from_millis(300), &addr, Ring(2));
        drop(dropped);
        assert_rang(
            rings.recv().await.unwrap(),
            start,
            2,
            Duration::from_millis(300),
        );
    }

    #[actix_rt::test]
    async fn a_repeating_alarm_rings_every_period_until_dropped() {
        tokio::time::pause();
        let (addr, mut rings) = bell();
        let start = Instant::now();
        let alarm = Alarm::every(Duration::from_secs(1), &addr, || Ring(1));
        for k in 1..=3 {
            assert_rang(
                rings.recv().await.unwrap(),
                start,
                1,
                Duration::from_secs(k),
            );
        }
        drop(alarm);
        let dropped_at = Instant::now() - start;
        let _sentinel = Alarm::after(Duration::from_millis(5500), &addr, Ring(2));
        let sentinel_at = dropped_at + Duration::from_millis(5500);
        assert_rang(rings.recv().await.unwrap(), start, 2, sentinel_at);
    }

    #[actix_rt::test]
    async fn an_alarm_does_not_keep_its_actor_alive() {
        tokio::time::pause();
        let (addr, _rings) = bell();
        let alarm = Alarm::every(Duration::from_secs(1), &addr, || Ring(1));
        drop(addr);
        // Its actor gone, the ticker ends at its next tick instead of ringing forever.
        for _ in 0..100 {
            if alarm.task.is_finished() {
                return;
            }
            tokio::time::advance(Duration::from_secs(1)).await;
            tokio::task::yield_now().await;
        }
        panic!("the ticker outlived its actor by 100 ticks");
    }
}
