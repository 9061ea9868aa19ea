//! `--max-reservation-ms` at a standby (PROTOCOL.md §6.6): a reservation held longer is ended
//! as at the owner, its socket closed with 1011 and the owner's reason. It then leaves the
//! standby's record at the next refresh, so the owner ends it without growth (a drop).
//!
//! One timer, armed for the earliest deadline of any reservation held here; when it fires,
//! everything due by the injected clock ends and the timer is armed again. A standby has no
//! `change_streamer_reservations_expired_total` (its `/metrics` shows only the owner gauge
//! and the access counters): the end is logged.

use std::time::Duration;

use actix::prelude::*;
use log::warn;

use super::super::expiry::{held_too_long, millis};
use super::super::ReservationEvent;
use super::StandbyReservations;

impl StandbyReservations {
    /// Ends reservations held longer than `max` (PROTOCOL.md §6.6); `None`: no cap.
    pub fn with_max_reservation(mut self, max: Option<Duration>) -> Self {
        self.max_reservation = max;
        self
    }

    /// One timer for the earliest end by the cap of the reservations held here.
    pub(super) fn arm_cap(&mut self, ctx: &mut Context<Self>) {
        if let Some(t) = self.cap_timer.take() {
            ctx.cancel_future(t);
        }
        let Some(max) = self.max_reservation.map(millis) else {
            return;
        };
        let next = self
            .reservations
            .values()
            .filter(|r| !r.ending)
            .map(|r| r.started_ms.saturating_add(max))
            .min();
        if let Some(at) = next {
            let wait = (at - self.clock.now_ms()).max(0) as u64;
            self.cap_timer = Some(ctx.run_later(Duration::from_millis(wait), |act, ctx| {
                act.cap_timer = None;
                act.cap(ctx);
            }));
        }
    }

    /// Ends what was held past the cap by now, then arms the timer again.
    fn cap(&mut self, ctx: &mut Context<Self>) {
        let Some(max) = self.max_reservation.map(millis) else {
            return;
        };
        let now = self.clock.now_ms();
        let due: Vec<String> = self
            .reservations
            .iter()
            .filter(|(_, r)| !r.ending && now - r.started_ms >= max)
            .map(|(t, _)| t.clone())
            .collect();
        for task_id in due {
            if let Some(r) = self.reservations.remove(&task_id) {
                warn!(
                    task:% = task_id; "snapshot reservation of task {task_id} at standby {} held {} ms, longer than --max-reservation-ms ({max} ms): ended",
                    self.instance,
                    now - r.started_ms
                );
                r.session
                    .do_send(ReservationEvent::Closed(held_too_long(max)));
            }
        }
        self.arm_cap(ctx);
    }
}
