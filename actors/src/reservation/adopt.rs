//! A takeover keeps the reservations (PROTOCOL.md §14.1): the reservations a serving standby's
//! sockets held become the owner's own when that standby becomes the owner.
//!
//! At the takeover the standby's [`StandbyReservations`] hands every reservation its sockets
//! hold ([`HandedOver`]: task, original start, session and whether its status went out) to
//! the new owner's `ReservationActor` in one [`Adopt`], and from then on forwards whatever
//! those sessions send (`standby/handover.rs`). The owner adopts them as live reservations of
//! its own, not as orphans:
//!
//! - **Cleanup paused** at once (`ReservationOpened`), and the reservation listed in its
//!   `/status` with `"orphaned": false` and its original start.
//! - **Written down** in the change log's safety state with the original start, as its own
//!   are (PROTOCOL.md §13): a later `kill -9` of this owner leaves them orphaned at the next
//!   one. Its row in `instance_reservations`, recorded under this same instance id while it
//!   stood by, is deleted once it is written down (the row kept it safe until then); a row
//!   that a refresh still in flight wrote again is never taken for an orphan (`others.rs`
//!   skips the rows handed over) and is deleted at the next poll.
//! - **Ended as its own**: by [`EndBySubscription`](super::EndBySubscription) (the held time,
//!   and so the delay's growth, measured from the original start), [`Release`](super::Release),
//!   a replacement, `--max-reservation-ms` counted from the original start, or a stop.
//! - **The socket stays open** and is told nothing new, unless its status had not been sent:
//!   then it gets it from the owner's path once the reservation is written down (with the VFS
//!   source, once a poll verified the backup, PROTOCOL.md §6.7).
//!
//! A task the owner already holds (an orphan it restored from the dead owner's safety state)
//! is replaced by the standby's reservation, which is the newer one.
//!
//! [`StandbyReservations`]: super::standby::StandbyReservations

use actix::prelude::*;
use log::{info, warn};

use super::records::RecordedReservation;
use super::status::ReservationEvent;
use super::{Holder, Reservation, ReservationActor, Restore};
use crate::changelog::{StateChange, StoredReservation};
use crate::cleanup::ReservationOpened;
use crate::session_end::SessionId;

/// One reservation a standby's socket holds, handed to the owner it became.
pub struct HandedOver {
    pub task_id: String,
    /// When it opened at the standby (unix ms).
    pub started_ms: i64,
    pub session_id: SessionId,
    pub session: Recipient<ReservationEvent>,
    /// Its status went out already.
    pub status_sent: bool,
    /// What its replica reported there (PROTOCOL.md §6.8): a takeover keeps it.
    pub restore: Restore,
}

/// Adopts the reservations of this instance's standby phase, recorded under `instance`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Adopt {
    pub instance: String,
    pub reservations: Vec<HandedOver>,
}

impl Handler<Adopt> for ReservationActor {
    type Result = ();

    fn handle(&mut self, msg: Adopt, ctx: &mut Context<Self>) {
        let Adopt {
            instance,
            reservations,
        } = msg;
        for handed in reservations {
            self.adopt_handed_over(&instance, handed, ctx);
        }
        self.arm_timer(ctx);
    }
}

impl ReservationActor {
    fn adopt_handed_over(&mut self, instance: &str, handed: HandedOver, ctx: &mut Context<Self>) {
        let HandedOver {
            task_id,
            started_ms,
            session_id,
            session,
            status_sent,
            restore,
        } = handed;
        self.replace(
            &task_id,
            session_id,
            "the one this instance held as a standby",
        );
        info!(
            task:% = task_id; "snapshot reservation of task {task_id} (session {session_id}), held by this instance as a standby, is the owner's now: its socket stays open, cleanup stays paused"
        );
        self.others
            .handed_over
            .insert((instance.to_string(), task_id.clone(), started_ms));
        self.reservations.insert(
            task_id.clone(),
            Reservation {
                holder: Some(Holder {
                    session_id,
                    session,
                }),
                started_ms,
                status_sent,
                orphan_end_ms: 0,
                restore,
            },
        );
        self.cleanup.do_send(ReservationOpened {
            task_id: task_id.clone(),
        });
        let row = RecordedReservation {
            instance: instance.to_string(),
            task_id: task_id.clone(),
            started_ms,
            live: false,
        };
        let written = self.write_down(StateChange::ReservationOpened(StoredReservation {
            task_id: task_id.clone(),
            started_ms,
        }));
        let Some(written) = written else {
            if !status_sent {
                self.send_status(task_id, session_id, ctx);
            }
            return;
        };
        written
            .into_actor(self)
            .map(move |r, act, ctx| match r {
                Ok(()) => {
                    // Safe in the safety state: the standby's row is no longer needed.
                    act.forget(vec![row], Vec::new(), ctx);
                    if !status_sent {
                        act.send_status(task_id, session_id, ctx);
                    }
                }
                Err(e) => {
                    warn!(task:% = task_id; "failing snapshot reservation of task {task_id}: adopted from this instance's standby phase, it could not be written down: {e}");
                    act.fail_unstored(&task_id, session_id, e);
                }
            })
            .spawn(ctx);
    }
}
