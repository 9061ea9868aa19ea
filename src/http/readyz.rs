//! `GET /readyz` (PROTOCOL.md §11): 200 `ready` while this instance serves `/changes` now,
//! else 503 with a one-line reason, for load balancers and orchestrators. Open to all, like
//! `/healthz`: it says nothing about the data.
//!
//! The owner is ready once its change log is initialised (a replicaVersion stored), it still
//! owns it, its change source is not silent (its last connection did not end by a silence nor
//! its last connect time out, with none since) and has not said `reset-required` since its last
//! new transaction (PROTOCOL.md §4), and after a restart the backup covers the watermark recorded before it
//! (PROTOCOL.md §13.1, as the cleanup actor judges). A standby's readiness is in
//! [`super::standby`].

use actix_web::HttpResponse;
use change_streamer_actors::changelog::ChangeLogError;
use change_streamer_actors::cleanup::GetRestartCatchUp;
use change_streamer_actors::streamer::{IsResetRequired, IsUpstreamSilent};

use super::AppState;

/// Why an instance does not serve `/changes` now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// After a restart, the backup does not cover the watermark recorded before it
    /// (PROTOCOL.md §13.1): the whole line, with both watermarks.
    BackupBehind(String),
    /// The owner has stored nothing yet: no replicaVersion to check subscribers against.
    NotInitialised,
    Standby,
    ChangeDbUnreachable,
    /// The service is stopping.
    Stopping,
    /// The change log's latest write failed (a full disk, say), with what failed and where;
    /// nothing more is acked upstream until a write succeeds (PROTOCOL.md §3.1).
    CannotWrite(String),
    /// The change source said `reset-required` and has sent no new transaction since.
    ResetRequired,
    /// The last connection to the change source ended by a silence, or the last connect timed
    /// out, and none has succeeded since (PROTOCOL.md §4).
    UpstreamSilent,
}

impl NotReady {
    /// The one-line reason of the 503.
    pub fn reason(&self) -> String {
        match self {
            NotReady::BackupBehind(line) => line.clone(),
            NotReady::NotInitialised => "not initialised".into(),
            NotReady::Standby => "standby".into(),
            NotReady::ChangeDbUnreachable => "change DB unreachable".into(),
            NotReady::Stopping => "stopping".into(),
            NotReady::CannotWrite(why) => format!("change log cannot write: {why}"),
            NotReady::ResetRequired => "reset required".into(),
            NotReady::UpstreamSilent => "upstream silent".into(),
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
            return Err(NotReady::CannotWrite(stats.write_error.unwrap_or_default()))
        }
        Ok(stats) if stats.replica_version.is_some() => {}
        Ok(_) => return Err(NotReady::NotInitialised),
        Err(ChangeLogError::NotOwner) => return Err(NotReady::Standby),
        Err(ChangeLogError::Closed) => return Err(NotReady::Stopping),
        Err(_) => return Err(NotReady::ChangeDbUnreachable),
    }
    match state.streamer.send(IsUpstreamSilent).await {
        Ok(true) => return Err(NotReady::UpstreamSilent),
        Ok(false) => {}
        Err(_) => return Err(NotReady::Stopping),
    }
    match state.streamer.send(IsResetRequired).await {
        Ok(true) => Err(NotReady::ResetRequired),
        Ok(false) => backup_caught_up(state).await,
        Err(_) => Err(NotReady::Stopping),
    }
}

/// PROTOCOL.md §13.1: not ready while the backup is behind the watermark recorded before the
/// restart. A cleanup actor that does not answer is stopping.
async fn backup_caught_up(state: &AppState) -> Result<(), NotReady> {
    let Some(b) = &state.backup else {
        return Ok(());
    };
    match b.cleanup.send(GetRestartCatchUp).await {
        Ok(Some(view)) => Err(NotReady::BackupBehind(view.reason())),
        Ok(None) => Ok(()),
        Err(_) => Err(NotReady::Stopping),
    }
}
