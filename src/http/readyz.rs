//! `GET /readyz` (PROTOCOL.md §11): 200 `ready` while this instance serves `/changes` now,
//! else 503 with a one-line reason, for load balancers and orchestrators. Open to all, like
//! `/healthz`: it says nothing about the data.
//!
//! The owner is ready once its change log is initialised (a replicaVersion stored) and it
//! still owns it. A standby's readiness is in [`super::standby`].

use actix_web::HttpResponse;
use change_streamer_actors::changelog::ChangeLogError;

use super::AppState;

/// Why an instance does not serve `/changes` now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// The owner has stored nothing yet: no replicaVersion to check subscribers against.
    NotInitialised,
    Standby,
    ChangeDbUnreachable,
    /// The service is stopping.
    Stopping,
    /// The change log's latest write failed (a full disk, say), with what failed and where;
    /// nothing more is acked upstream until a write succeeds (PROTOCOL.md §3.1).
    CannotWrite(String),
}

impl NotReady {
    /// The one-line reason of the 503.
    pub fn reason(&self) -> String {
        match self {
            NotReady::NotInitialised => "not initialised".into(),
            NotReady::Standby => "standby".into(),
            NotReady::ChangeDbUnreachable => "change DB unreachable".into(),
            NotReady::Stopping => "stopping".into(),
            NotReady::CannotWrite(why) => format!("change log cannot write: {why}"),
        }
    }
}

pub(super) fn answer(readiness: Result<(), NotReady>) -> HttpResponse {
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
pub async fn readyz(state: &AppState) -> HttpResponse {
    answer(owner_readiness(state).await)
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
        Ok(stats) if stats.write_error.is_some() => {
            Err(NotReady::CannotWrite(stats.write_error.unwrap_or_default()))
        }
        Ok(stats) if stats.replica_version.is_some() => Ok(()),
        Ok(_) => Err(NotReady::NotInitialised),
        Err(ChangeLogError::NotOwner) => Err(NotReady::Standby),
        Err(ChangeLogError::Closed) => Err(NotReady::Stopping),
        Err(_) => Err(NotReady::ChangeDbUnreachable),
    }
}
