//! A reservation's session for actor tests: records what the ReservationActor tells it, and
//! hands the record over on [`Events`]; [`reserve`] opens a reservation held by a new one.

use actix::prelude::*;
use change_streamer_actors::reservation::{ReservationActor, ReservationEvent, Reserve};
use change_streamer_actors::session_end::SessionId;

/// A reservation's session: records what it is told.
#[derive(Default)]
pub struct Session(Vec<ReservationEvent>);
impl Actor for Session {
    type Context = Context<Self>;
}
impl Handler<ReservationEvent> for Session {
    type Result = ();
    fn handle(&mut self, e: ReservationEvent, _: &mut Context<Self>) {
        self.0.push(e);
    }
}

/// Takes what the session was told since the last `Events`.
#[derive(Message)]
#[rtype(result = "Vec<ReservationEvent>")]
pub struct Events;
impl Handler<Events> for Session {
    type Result = Vec<ReservationEvent>;
    fn handle(&mut self, _: Events, _: &mut Context<Self>) -> Vec<ReservationEvent> {
        std::mem::take(&mut self.0)
    }
}

/// Reserves `task` for a new session numbered `session_id`, which it returns.
pub async fn reserve(
    reservations: &Addr<ReservationActor>,
    task: &str,
    session_id: u64,
) -> Addr<Session> {
    let s = Session::default().start();
    reservations
        .send(Reserve {
            task_id: task.into(),
            session_id: SessionId(session_id),
            session: s.clone().recipient(),
        })
        .await
        .expect("the reservation actor");
    s
}
