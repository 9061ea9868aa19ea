//! `GET /replication/v{N}/snapshot?taskID=T` (PROTOCOL.md §6): checks the request and starts a
//! [`SnapshotSession`].

use actix_web::{web, HttpRequest, HttpResponse};

use super::{open_websocket, query_map, refuse, start_session, AppState, Opening};
use crate::shutdown::Guards;
use crate::websocket::snapshot_socket::{Reservations, SnapshotSession};

pub fn snapshot(
    req: &HttpRequest,
    stream: web::Payload,
    version: &str,
    state: &AppState,
) -> Result<HttpResponse, actix_web::Error> {
    let with = Reserving {
        reservations: state
            .backup
            .as_ref()
            .map(|b| Reservations::of(b.reservations.clone())),
        ping_interval: state.config.ping_interval(),
        guards: &state.guards,
    };
    reserve(req, stream, version, with)
}

/// What a reservation is held with: the owner's reservation actor, or a serving standby's
/// (PROTOCOL.md §14.1); `None` without `--litestream-backup-url`.
pub struct Reserving<'a> {
    pub reservations: Option<Reservations>,
    pub ping_interval: std::time::Duration,
    pub guards: &'a Guards,
}

/// Checks a snapshot request and starts its [`SnapshotSession`].
pub fn reserve(
    req: &HttpRequest,
    stream: web::Payload,
    version: &str,
    with: Reserving<'_>,
) -> Result<HttpResponse, actix_web::Error> {
    let req = req.clone();
    // Every supported version speaks the same snapshot protocol.
    match open_websocket(&req, version) {
        Opening::Proceed(_) => {}
        Opening::Answer(response) => return Ok(response),
        Opening::Refuse(reason) => return refuse(&req, stream, reason),
    }
    let task_id = match query_map(&req) {
        Ok(mut q) => q.remove("taskID").unwrap_or_default(),
        Err(reason) => return refuse(&req, stream, reason),
    };
    if task_id.is_empty() {
        return refuse(&req, stream, "Missing taskID in snapshot request".into());
    }
    let Some(reservations) = with.reservations else {
        return refuse(
            &req,
            stream,
            "replication-manager is not configured with a ZERO_LITESTREAM_BACKUP_URL".into(),
        );
    };
    let session = SnapshotSession::new(task_id, reservations, with.ping_interval);
    start_session(session, &req, stream, with.guards)
}
