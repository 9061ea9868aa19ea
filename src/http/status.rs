//! Operator endpoints (PROTOCOL.md §11): `/healthz`, and the owner's `/status`: what its actors
//! answer ([`observe`]) put in the one typed document both roles serve ([`Status`]; a standby's
//! `/status` is in [`super::standby`]).

mod document;
mod observe;

use actix_web::HttpResponse;
use change_streamer_actors::instance::recorder::ListInstances;
use change_streamer_actors::instance::InstanceSeen;
use change_streamer_actors::ownership::Role;

pub use document::{
    cleanup_delay, learned_delay, Backup, BackupSource, ChangeLogStatus, FlowControl, Purge,
    Status, Upstream,
};
pub use observe::{observe, unavailable, Observation, Unavailable};

use super::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok")
}

pub async fn status(state: &AppState) -> HttpResponse {
    let (observed, instances) = futures_util::future::join(observe(state), instances(state)).await;
    match observed {
        Ok(o) => {
            let role = if state.log.is_owner() {
                Role::Owner
            } else {
                Role::Standby
            };
            respond(&Status::owner(
                &state.config,
                role,
                &state.instance,
                &o,
                instances,
            ))
        }
        Err(e) => unavailable(e),
    }
}

/// The 200 of `/status`, at the owner and at a standby.
pub fn respond(status: &Status) -> HttpResponse {
    match status.to_json() {
        Ok(json) => HttpResponse::Ok().json(json),
        Err(e) => HttpResponse::InternalServerError()
            .content_type("text/plain")
            .body(format!("writing /status failed: {e}\n")),
    }
}

/// The instances not gone (PROTOCOL.md §14.1), on a shared change DB only; `Some(None)` (`null`)
/// while the change DB cannot be read.
async fn instances(state: &AppState) -> Option<Option<Vec<InstanceSeen>>> {
    let recorder = state.recorder.as_ref()?;
    Some(match recorder.send(ListInstances).await {
        Ok(Ok(list)) => Some(list),
        Ok(Err(e)) => {
            log::warn!("/status: reading the instance records failed: {e}");
            None
        }
        Err(_) => None,
    })
}
