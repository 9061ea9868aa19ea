//! HTTP routes: the two websocket endpoints and the operator endpoints.
//!
//! `/replication/v{N}/snapshot` and `/replication/v{N}/changes` upgrade to websocket session
//! actors. A request that is bad (unsupported version, missing or invalid parameter) is still
//! upgraded, then closed with 1002 and a reason, because websocket clients only see close
//! frames; a request to these paths without an upgrade gets a plain 400. Everything else but
//! `/healthz`, `/metrics` and `/status` is 404.

pub mod changes;
pub mod snapshot;
pub mod status;

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use actix_web::{web, HttpRequest, HttpResponse};
use actix_web_actors::ws;
use change_streamer_actors::changelog::ChangeLog;
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::monitor::MonitorActor;
use change_streamer_actors::reservation::ReservationActor;
use change_streamer_actors::streamer::Purger;
use change_streamer_actors::streamer::Streamer;

use crate::config::Config;
use crate::session::close;
use change_streamer_actors::session::SessionEnd;

/// Protocol versions served.
pub const MIN_PROTOCOL: u32 = 1;
pub const MAX_PROTOCOL: u32 = 6;

/// What the handlers reach: the actors' addresses, never their state.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub streamer: Addr<Streamer>,
    pub purger: Addr<Purger>,
    pub log: ChangeLog,
    /// Present when the backup monitor is enabled (`--litestream-backup-url`).
    pub backup: Option<BackupActors>,
}

#[derive(Clone)]
pub struct BackupActors {
    pub reservations: Addr<ReservationActor>,
    pub cleanup: Addr<CleanupActor>,
    pub monitor: Addr<MonitorActor>,
}

/// Registers every route.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/replication/{version}/snapshot",
        web::get().to(snapshot::snapshot),
    )
    .route(
        "/replication/{version}/changes",
        web::get().to(changes::changes),
    )
    .route("/healthz", web::get().to(status::healthz))
    .route("/metrics", web::get().to(status::metrics))
    .route("/status", web::get().to(status::status))
    .default_service(web::to(not_found));
}

async fn not_found() -> HttpResponse {
    HttpResponse::NotFound()
        .content_type("text/plain")
        .body("not found\n")
}

/// `v6` → 6; anything else is not one of our paths.
pub fn parse_version(segment: &str) -> Option<u32> {
    let digits = segment.strip_prefix('v')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The refusal for an unsupported protocol version.
pub fn unsupported_version(v: u32) -> String {
    format!("Cannot service client at protocol v{v}. Supported protocols: [v{MIN_PROTOCOL} ... v{MAX_PROTOCOL}]")
}

/// The query string as a map (first value of each name wins).
pub fn query_map(req: &HttpRequest) -> HashMap<String, String> {
    let mut map = HashMap::new();
    for (k, v) in url::form_urlencoded::parse(req.query_string().as_bytes()) {
        map.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    map
}

/// A 400 for a websocket path requested without an upgrade, or `None` when it is an upgrade.
pub fn require_upgrade(req: &HttpRequest) -> Option<HttpResponse> {
    ws::handshake(req).err().map(|e| {
        HttpResponse::BadRequest()
            .content_type("text/plain")
            .body(format!("this endpoint only speaks websocket: {e}\n"))
    })
}

/// What the checks shared by both websocket endpoints decided.
pub enum Opening {
    /// Go on, at this protocol version.
    Proceed(u32),
    /// Answer over plain HTTP (404, or 400 without an upgrade).
    Answer(HttpResponse),
    /// Upgrade, then close with 1002 and this reason.
    Refuse(String),
}

/// The checks both websocket endpoints start with: one of our paths, an upgrade, a supported
/// protocol version.
pub fn open_websocket(req: &HttpRequest, version: &str) -> Opening {
    let Some(v) = parse_version(version) else {
        return Opening::Answer(
            HttpResponse::NotFound()
                .content_type("text/plain")
                .body("not found\n"),
        );
    };
    if let Some(bad) = require_upgrade(req) {
        return Opening::Answer(bad);
    }
    if !(MIN_PROTOCOL..=MAX_PROTOCOL).contains(&v) {
        return Opening::Refuse(unsupported_version(v));
    }
    Opening::Proceed(v)
}

/// A websocket that closes at once with 1002 and `reason`.
struct Refusal {
    reason: String,
}

impl Actor for Refusal {
    type Context = ws::WebsocketContext<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        let reason = std::mem::take(&mut self.reason);
        close(ctx, SessionEnd::Protocol(reason));
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for Refusal {
    fn handle(&mut self, _: Result<ws::Message, ws::ProtocolError>, _: &mut Self::Context) {}
}

/// Upgrades, then closes with 1002 and `reason`.
pub fn refuse(
    req: &HttpRequest,
    stream: web::Payload,
    reason: String,
) -> Result<HttpResponse, actix_web::Error> {
    log::info!("refusing {} {}: {reason}", req.path(), req.query_string());
    ws::start(Refusal { reason }, req, stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("v6"), Some(6));
        assert_eq!(parse_version("v10"), Some(10));
        assert_eq!(parse_version("6"), None);
        assert_eq!(parse_version("vx"), None);
        assert_eq!(parse_version("v"), None);
        assert_eq!(
            unsupported_version(7),
            "Cannot service client at protocol v7. Supported protocols: [v1 ... v6]"
        );
    }
}
