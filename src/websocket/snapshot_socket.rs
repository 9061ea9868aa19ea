//! `SnapshotSession`: the websocket of one snapshot reservation (PROTOCOL.md §6).
//!
//! On start it asks the actor holding reservations (the owner's [`ReservationActor`], or a
//! standby's [`StandbyReservations`]) for a reservation and relays what it is told:
//! the status message once, then a close (1000 when replaced or ended by the task's
//! subscription, 1001 when the service stops, 1011 when the change log has no status to give).
//! From the client it takes acks (§5) and, once the status is sent, progress messages
//! (`progress.rs`, PROTOCOL.md §6.8), which it passes on as [`Progress`]; anything else closes
//! with 1002 and says why.
//! Whatever stops it (client close, liveness, a bad ack, replacement), its `stopped` sends
//! [`Release`] naming its own session number, which ends the reservation *without* growing
//! the cleanup delay, and only if this session still holds it.
//!
//! A session keeps the recipients it started with for its whole life, even across a takeover
//! (PROTOCOL.md §14.1): when the standby it reserved at becomes the owner, the standby's
//! [`StandbyReservations`] hands the reservation to the owner's [`ReservationActor`] and from
//! then on forwards this session's messages to it, in order. A message telling the session
//! its new recipients would race its stop (a `Release` sent before it read them would reach
//! the old actor, and the owner would keep a reservation no socket holds), so the old actor
//! would have to forward anyway; forwarding alone keeps the session ignorant of phases.
//!
//! [`ReservationActor`]: change_streamer_actors::reservation::ReservationActor
//! [`StandbyReservations`]: change_streamer_actors::reservation::standby::StandbyReservations

use std::time::Duration;

use actix::prelude::*;
use actix_web_actors::ws;
use change_streamer_actors::reservation::{Progress, Release, ReservationEvent, Reserve};
use change_streamer_actors::session_end::{SessionEnd, SessionId};
use log::warn;

use super::framing::{Framing, FramingError};
use super::progress::{self, ProgressError};
use super::{client_frame, close, start_liveness, Live, Liveness};

pub struct SnapshotSession {
    task_id: String,
    session_id: SessionId,
    reservations: Reservations,
    ping_interval: Duration,
    framing: Framing,
    liveness: Liveness,
}

/// Where a snapshot session's reservation is held: the owner's or a standby's actor.
#[derive(Clone)]
pub struct Reservations {
    pub reserve: Recipient<Reserve>,
    pub release: Recipient<Release>,
    pub progress: Recipient<Progress>,
}

impl Reservations {
    pub fn of<A>(addr: Addr<A>) -> Reservations
    where
        A: Actor<Context = Context<A>> + Handler<Reserve> + Handler<Release> + Handler<Progress>,
    {
        Reservations {
            reserve: addr.clone().recipient(),
            release: addr.clone().recipient(),
            progress: addr.recipient(),
        }
    }
}

impl SnapshotSession {
    pub fn new(task_id: String, reservations: Reservations, ping_interval: Duration) -> Self {
        SnapshotSession {
            task_id,
            session_id: SessionId::next(),
            reservations,
            ping_interval,
            framing: Framing::default(),
            liveness: Liveness::default(),
        }
    }
}

impl Live for SnapshotSession {
    fn liveness(&mut self) -> &mut Liveness {
        &mut self.liveness
    }
    fn describe(&self) -> String {
        format!(
            "snapshot session {} of task {}",
            self.session_id, self.task_id
        )
    }
}

impl Actor for SnapshotSession {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.liveness.heard();
        start_liveness(ctx, self.ping_interval);
        self.reservations.reserve.do_send(Reserve {
            task_id: self.task_id.clone(),
            session_id: self.session_id,
            session: ctx.address().recipient(),
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.reservations.release.do_send(Release {
            task_id: self.task_id.clone(),
            session_id: self.session_id,
        });
    }
}

impl Handler<ReservationEvent> for SnapshotSession {
    type Result = ();
    fn handle(&mut self, ev: ReservationEvent, ctx: &mut Self::Context) {
        match ev {
            ReservationEvent::Status(status) => {
                let (_, frame) = self.framing.frame(&status.to_message());
                ctx.text(frame);
            }
            ReservationEvent::Failed(e) => close(ctx, SessionEnd::Unavailable(e.to_string())),
            ReservationEvent::Closed(end) => close(ctx, end),
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for SnapshotSession {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        let Some(text) = client_frame(self, msg, ctx) else {
            return;
        };
        let refused = match progress::parse(&text) {
            None => match self.framing.ack(&text) {
                Ok(_) => None,
                Err(FramingError::NotAnAck) => Some(progress::NEITHER.to_string()),
                Err(e) => Some(e.to_string()),
            },
            Some(Ok(_)) if self.framing.last_sent() == 0 => {
                Some(ProgressError::BeforeStatus.to_string())
            }
            Some(Ok(bytes)) => {
                self.reservations.progress.do_send(Progress {
                    task_id: self.task_id.clone(),
                    session_id: self.session_id,
                    bytes,
                });
                None
            }
            Some(Err(e)) => Some(e.to_string()),
        };
        if let Some(why) = refused {
            warn!("{}: {why}", self.describe());
            close(ctx, SessionEnd::Protocol(why));
        }
    }
}
