//! When reservations end without their socket: the cap of `--max-reservation-ms` (PROTOCOL.md §6.6)
//! and the orphans found written down at start (PROTOCOL.md §13).
//!
//! One timer is armed for the earliest deadline of any reservation; when it fires, everything
//! due by the injected clock ends and the timer is armed again.

use std::time::Duration;

use actix::prelude::*;
use log::{info, warn};

use super::{Reservation, ReservationActor, ReservationEvent, Restore};
use crate::changelog::{ChangeLog, StoredReservation};
use crate::session_end::SessionEnd;

/// Ends the reservations that have expired by now (the actor's own timer sends it at each
/// deadline; tests that move a manual clock send it themselves).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct ExpireReservations;

impl ReservationActor {
    /// Takes back the reservations a previous run wrote down, as orphans that end at the
    /// latest `cleanup_delay` from now; and writes every later reservation to `store`.
    pub fn restore(
        mut self,
        stored: &[StoredReservation],
        cleanup_delay: Duration,
        store: ChangeLog,
    ) -> Self {
        let orphans_end_ms = self.clock.now_ms().saturating_add(millis(cleanup_delay));
        for r in stored {
            info!(
                task:% = r.task_id; "snapshot reservation of task {} was open when the service stopped: orphaned, cleanup stays paused",
                r.task_id
            );
            self.reservations.insert(
                r.task_id.clone(),
                Reservation {
                    holder: None,
                    started_ms: r.started_ms,
                    status_sent: true,
                    orphan_end_ms: orphans_end_ms,
                    restore: Restore::default(),
                },
            );
        }
        self.store = Some(store);
        self
    }

    /// Ends what has expired: reservations held past `--max-reservation-ms`, and orphans past
    /// their end. Then arms one timer for the next deadline.
    pub(super) fn expire(&mut self, ctx: &mut Context<Self>) {
        let now = self.clock.now_ms();
        let max = self.max_reservation.map(millis).unwrap_or(0);
        let expired: Vec<String> = self
            .reservations
            .iter()
            .filter(|(_, r)| {
                (max > 0 && now - r.started_ms >= max)
                    || (r.holder.is_none() && now >= r.orphan_end_ms)
            })
            .map(|(t, _)| t.clone())
            .collect();
        for task_id in expired {
            let Some(res) = self.reservations.remove(&task_id) else {
                continue;
            };
            let held = now - res.started_ms;
            match res.holder {
                Some(h) if max > 0 && held >= max => {
                    warn!(task:% = task_id; "snapshot reservation of task {task_id} held {held} ms, longer than --max-reservation-ms ({max} ms): ended");
                    self.expired_total += 1;
                    h.session
                        .do_send(ReservationEvent::Closed(held_too_long(max)));
                }
                Some(_) => continue,
                None if max > 0 && held >= max => {
                    warn!(task:% = task_id; "orphaned snapshot reservation of task {task_id} held {held} ms, longer than --max-reservation-ms ({max} ms): ended");
                    self.expired_total += 1;
                }
                None => {
                    info!(task:% = task_id; "orphaned snapshot reservation of task {task_id} ended: the cleanup delay passed since it was orphaned without the task coming back");
                }
            }
            self.erase(&task_id, ctx);
            self.closed(&task_id, None);
        }
        self.arm_timer(ctx);
    }

    /// One timer for the earliest deadline of any reservation.
    pub(super) fn arm_timer(&mut self, ctx: &mut Context<Self>) {
        if let Some(t) = self.timer.take() {
            ctx.cancel_future(t);
        }
        let max = self.max_reservation.map(millis).unwrap_or(0);
        let next = self
            .reservations
            .values()
            .flat_map(|r| {
                let cap = (max > 0).then(|| r.started_ms.saturating_add(max));
                let orphan = r.holder.is_none().then_some(r.orphan_end_ms);
                cap.into_iter().chain(orphan)
            })
            .min();
        if let Some(at) = next {
            let wait = (at - self.clock.now_ms()).max(0) as u64;
            self.timer = Some(ctx.run_later(Duration::from_millis(wait), |act, ctx| {
                act.timer = None;
                act.expire(ctx);
            }));
        }
    }
}

/// The close of a reservation held longer than `--max-reservation-ms` (`max` ms), 1011.
pub(super) fn held_too_long(max: i64) -> SessionEnd {
    SessionEnd::Unavailable(format!(
        "reservation held longer than --max-reservation-ms ({max} ms)"
    ))
}

/// `d` in the injected clock's unit (ms), saturating.
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Handler<ExpireReservations> for ReservationActor {
    type Result = ();
    fn handle(&mut self, _: ExpireReservations, ctx: &mut Context<Self>) {
        self.expire(ctx);
    }
}
