//! The takeover keeps the reservations (PROTOCOL.md §14.1): when this standby becomes the
//! owner, [`HandOver`] gives every reservation its sockets hold to the owner's
//! `ReservationActor` (one `Adopt`, `reservation/adopt.rs`), and this actor becomes the
//! sessions' way to it.
//!
//! **Why forward, rather than tell each session its new actor.** A snapshot session holds
//! the recipients it was started with (`Reservations { reserve, release }` in the service)
//! and sends its `Release` whenever it stops. A message retargeting it would race that stop:
//! a session that stops after the hand-over but before it read the new recipients would
//! release to this actor, and the owner would keep a reservation no socket holds (until the
//! cap, if any). So this actor has to pass such messages on anyway; once it does, telling the
//! sessions is redundant. After a hand-over it forwards `Reserve`, `Release`, `Progress` and
//! `EndBySubscription` (a subscription accepted at the standby's door just before it took
//! over) to the owner's actor, in the order it receives them, after the `Adopt` it sent
//! first, so a session's `Release` always reaches the actor holding its reservation. Sessions
//! stay thin and know nothing of phases, and this actor stops by itself once the last session
//! holding its address is gone.
//!
//! A reservation whose end by subscription is being recorded (`ending`) is not handed over:
//! it closes here with 1000 once the end is written, as it would have, and the owner grows
//! the delay from the end's recorded start at its next poll.

use actix::prelude::*;
use log::info;

use super::super::adopt::{Adopt, HandedOver};
use super::super::records::HeldReservation;
use super::super::ReservationActor;
use super::StandbyReservations;

/// This instance owns the change DB now: hands every reservation held here to `to`, and
/// forwards what their sessions send from now on. Answers how many were handed over.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct HandOver {
    pub to: Addr<ReservationActor>,
}

impl Handler<HandOver> for StandbyReservations {
    type Result = usize;

    fn handle(&mut self, msg: HandOver, ctx: &mut Context<Self>) -> usize {
        for timer in [self.retry.take(), self.cap_timer.take()]
            .into_iter()
            .flatten()
        {
            ctx.cancel_future(timer);
        }
        let (ending, handed): (Vec<_>, Vec<_>) =
            self.reservations.drain().partition(|(_, r)| r.ending);
        self.reservations = ending.into_iter().collect();
        self.handed = handed
            .iter()
            .map(|(t, r)| HeldReservation {
                task_id: t.clone(),
                started_ms: r.started_ms,
            })
            .collect();
        let reservations: Vec<HandedOver> = handed
            .into_iter()
            .map(|(task_id, r)| HandedOver {
                task_id,
                started_ms: r.started_ms,
                session_id: r.session_id,
                session: r.session,
                status_sent: r.status_sent,
                restore: r.restore,
            })
            .collect();
        let n = reservations.len();
        info!(
            "taking over: {n} snapshot reservation(s) held at standby {} go to the owner, their sockets open",
            self.instance
        );
        msg.to.do_send(Adopt {
            instance: self.instance.as_str().to_string(),
            reservations,
        });
        self.successor = Some(msg.to);
        n
    }
}
