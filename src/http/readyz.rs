//! `GET /readyz` (PROTOCOL.md §11): 200 `ready` while this instance serves `/changes` now,
//! else 503 with a one-line reason, for load balancers and orchestrators. Open to all, like
//! `/healthz`: it says nothing about the data.
//!
//! The owner is ready once its change log is initialised (a replicaVersion stored) and it
//! still owns it. A serving standby (`--standby-serves`, PROTOCOL.md §14.1) is ready once the
//! change DB it follows holds a replicaVersion and its record there is kept; one that does not
//! serve is never ready, and says `standby`. Either says `change DB unreachable` when its last
//! record refresh failed.

use actix_web::{web, HttpResponse};
use change_streamer_actors::changelog::ChangeLogError;
use change_streamer_actors::instance::recorder::IsReachable;

use super::standby_status::StandbyState;
use super::AppState;

/// Why an instance does not serve `/changes` now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReady {
    /// The owner has stored nothing yet: no replicaVersion to check subscribers against.
    NotInitialised,
    Standby,
    ChangeDbUnreachable,
    /// The service is stopping.
    Stopping,
}

impl NotReady {
    /// The one-line reason of the 503.
    pub fn reason(self) -> &'static str {
        match self {
            NotReady::NotInitialised => "not initialised",
            NotReady::Standby => "standby",
            NotReady::ChangeDbUnreachable => "change DB unreachable",
            NotReady::Stopping => "stopping",
        }
    }
}

fn answer(readiness: Result<(), NotReady>) -> HttpResponse {
    match readiness {
        Ok(()) => HttpResponse::Ok()
            .content_type("text/plain")
            .body("ready\n"),
        Err(why) => HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body(format!("{}\n", why.reason())),
    }
}

/// The owner's (and SQLite's) `/readyz`.
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    answer(owner_readiness(&state).await)
}

async fn owner_readiness(state: &AppState) -> Result<(), NotReady> {
    // No guard is handed out once the stop has begun and the sessions are gone.
    if state.guards.guard().is_none() {
        return Err(NotReady::Stopping);
    }
    if !state.log.is_owner() {
        return Err(NotReady::Standby);
    }
    match state.log.stats().await {
        Ok(stats) if stats.replica_version.is_some() => Ok(()),
        Ok(_) => Err(NotReady::NotInitialised),
        Err(ChangeLogError::NotOwner) => Err(NotReady::Standby),
        Err(ChangeLogError::Closed) => Err(NotReady::Stopping),
        Err(_) => Err(NotReady::ChangeDbUnreachable),
    }
}

/// A standby's `/readyz`.
pub async fn standby_readyz(state: Option<web::Data<StandbyState>>) -> HttpResponse {
    let Some(state) = state else {
        return answer(Err(NotReady::Standby));
    };
    answer(standby_readiness(&state).await)
}

async fn standby_readiness(state: &StandbyState) -> Result<(), NotReady> {
    if let Some(s) = &state.serving {
        if s.guards.guard().is_none() {
            return Err(NotReady::Stopping);
        }
    }
    if state.recorder.send(IsReachable).await.ok().flatten() == Some(false) {
        return Err(NotReady::ChangeDbUnreachable);
    }
    let Some(serving) = &state.serving else {
        return Err(NotReady::Standby);
    };
    match serving.log.stats().await {
        Ok(stats) if stats.replica_version.is_some() => Ok(()),
        Ok(_) => Err(NotReady::NotInitialised),
        Err(ChangeLogError::Closed) => Err(NotReady::Stopping),
        Err(_) => Err(NotReady::ChangeDbUnreachable),
    }
}
