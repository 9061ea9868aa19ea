//! `GET /replication/v{N}/snapshot?taskID=T` (SPEC §6): checks the request and starts a
//! [`SnapshotSession`].

use actix_web::{web, HttpRequest, HttpResponse};
use actix_web_actors::ws;

use super::{
    parse_version, query_map, refuse, require_upgrade, unsupported_version, AppState, MAX_PROTOCOL,
    MIN_PROTOCOL,
};
use crate::session::snapshot::SnapshotSession;

pub async fn snapshot(
    req: HttpRequest,
    stream: web::Payload,
    version: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, actix_web::Error> {
    let Some(v) = parse_version(&version) else {
        return Ok(HttpResponse::NotFound().body("not found\n"));
    };
    if let Some(bad) = require_upgrade(&req) {
        return Ok(bad);
    }
    if !(MIN_PROTOCOL..=MAX_PROTOCOL).contains(&v) {
        return refuse(&req, stream, unsupported_version(v));
    }
    let task_id = query_map(&req).remove("taskID").unwrap_or_default();
    if task_id.is_empty() {
        return refuse(&req, stream, "Missing taskID in snapshot request".into());
    }
    let Some(backup) = &state.backup else {
        return refuse(
            &req,
            stream,
            "replication-manager is not configured with a ZERO_LITESTREAM_BACKUP_URL".into(),
        );
    };
    let session = SnapshotSession::new(
        task_id,
        backup.reservations.clone(),
        state.config.ping_interval(),
    );
    ws::start(session, &req, stream)
}
