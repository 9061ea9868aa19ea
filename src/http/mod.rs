//! HTTP routes: the two websocket endpoints and the operator endpoints, of the instance's one
//! HTTP server for its whole life.
//!
//! What a route does depends on the instance's phase ([`Phase`], read through the [`Door`] at
//! each request): the owner's handlers (this folder's files) or a standby's ([`standby`]).
//! Because the server never changes, a standby that becomes the owner keeps its websocket
//! connections, and with them its subscribers (PROTOCOL.md §14.1).
//!
//! `/replication/v{N}/snapshot` and `/replication/v{N}/changes` upgrade to websocket session
//! actors. A request that is bad (unsupported version, missing or invalid parameter) is still
//! upgraded, then closed with 1002 and a reason, because websocket clients only see close
//! frames; a request to these paths without an upgrade gets a plain 400. Everything else but
//! `/` (the live page, [`page`]), `/healthz`, `/readyz`, `/metrics` and `/status` is 404. Before any of it, [`access`] decides
//! whether the request is served at all.

pub mod access;
pub mod changes;
pub mod metrics;
pub mod page;
pub mod query;
pub mod readyz;
pub mod snapshot;
pub mod standby;
pub mod status;

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use actix_web_actors::ws;
use change_streamer_actors::changelog::ChangeLog;
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::instance::recorder::InstanceRecorder;
use change_streamer_actors::instance::InstanceId;
use change_streamer_actors::monitor::{BackupQuorum, MonitorActor};
use change_streamer_actors::purger::Purger;
use change_streamer_actors::reservation::ReservationActor;
use change_streamer_actors::stall::StallWatch;
use change_streamer_actors::streamer::Streamer;
use tokio::sync::watch;

use crate::config::Config;
use crate::shutdown::{hold_until_closed, Guards};
use crate::websocket::close;
use change_streamer_actors::session_end::{truncate_reason, SessionEnd};

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
    /// Present when the backup monitor is enabled (`--litestream-backup-url` or `--backups`).
    pub backup: Option<BackupActors>,
    /// A guard for every websocket session; the stop waits until all are dropped.
    pub guards: Guards,
    /// The access rule every request passed first, with its refusal counts (for `/metrics`).
    pub access: Arc<access::Access>,
    /// This instance's id (PROTOCOL.md §14.1).
    pub instance: InstanceId,
    /// Its record in the shared change DB; `None` on SQLite.
    pub recorder: Option<Addr<InstanceRecorder>>,
    /// The stages' stall watch (PROTOCOL.md §11.1).
    pub stall: Addr<StallWatch>,
}

#[derive(Clone)]
pub struct BackupActors {
    pub reservations: Addr<ReservationActor>,
    pub cleanup: Addr<CleanupActor>,
    /// One per backup, in the order they are listed (PROTOCOL.md §8.4).
    pub monitors: Vec<Addr<MonitorActor>>,
    pub quorum: Addr<BackupQuorum>,
}

/// What the instance serves with now.
#[derive(Clone)]
pub enum Phase {
    /// It owns the change log: the owner's actors.
    Owner(AppState),
    /// It stands by (a shared change DB another instance owns).
    Standby(standby::StandbyState),
}

/// The instance's phase as its HTTP server reads it at each request; the instance's life
/// ([`crate::instance`]) moves it on.
#[derive(Clone)]
pub struct Door {
    phase: watch::Receiver<Phase>,
}

impl Door {
    pub fn new(phase: watch::Receiver<Phase>) -> Door {
        Door { phase }
    }

    /// The phase now.
    pub fn phase(&self) -> Phase {
        self.phase.borrow().clone()
    }
}

/// Registers every route; each asks the [`Door`] which phase serves it.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(page))
        .route("/replication/{version}/snapshot", web::get().to(snapshot))
        .route("/replication/{version}/changes", web::get().to(changes))
        .route("/healthz", web::get().to(status::healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics))
        .route("/status", web::get().to(status))
        .default_service(web::to(not_found));
}

/// The live page (PROTOCOL.md §11.2), the same at the owner and at a standby.
async fn page(door: web::Data<Door>) -> HttpResponse {
    match door.phase() {
        Phase::Owner(s) => page::page(s.access.mode()),
        Phase::Standby(s) => page::page(s.access.mode()),
    }
}

async fn snapshot(
    req: HttpRequest,
    stream: web::Payload,
    version: web::Path<String>,
    door: web::Data<Door>,
) -> Result<HttpResponse, actix_web::Error> {
    match door.phase() {
        Phase::Owner(s) => snapshot::snapshot(&req, stream, &version, &s),
        Phase::Standby(s) => standby::snapshot(&req, stream, &version, &s),
    }
}

async fn changes(
    req: HttpRequest,
    stream: web::Payload,
    version: web::Path<String>,
    door: web::Data<Door>,
) -> Result<HttpResponse, actix_web::Error> {
    match door.phase() {
        Phase::Owner(s) => changes::changes(&req, stream, &version, &s),
        Phase::Standby(s) => standby::changes(&req, stream, &version, &s),
    }
}

async fn readyz(door: web::Data<Door>) -> HttpResponse {
    match door.phase() {
        Phase::Owner(s) => readyz::readyz(&s).await,
        Phase::Standby(s) => standby::readyz(&s).await,
    }
}

async fn metrics(door: web::Data<Door>) -> HttpResponse {
    match door.phase() {
        Phase::Owner(s) => metrics::metrics(&s).await,
        Phase::Standby(s) => standby::metrics(&s).await,
    }
}

async fn status(door: web::Data<Door>) -> HttpResponse {
    match door.phase() {
        Phase::Owner(s) => status::status(&s).await,
        Phase::Standby(s) => standby::status(&s).await,
    }
}

async fn not_found() -> HttpResponse {
    HttpResponse::NotFound()
        .content_type("text/plain")
        .body("not found\n")
}

/// `v6` → `"6"`: the digits of a version segment, however many; anything else is not one of
/// our paths.
pub fn version_digits(segment: &str) -> Option<&str> {
    let digits = segment.strip_prefix('v')?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(digits)
}

/// The refusal for an unsupported protocol version (`digits` as the client sent them).
pub fn unsupported_version(digits: &str) -> String {
    format!("Cannot service client at protocol v{digits}. Supported protocols: [v{MIN_PROTOCOL} ... v{MAX_PROTOCOL}]")
}

/// The query string of `req` (see [`query`]); the error is the close reason.
pub fn query_map(req: &HttpRequest) -> Result<HashMap<String, String>, String> {
    query::parse_query(req.query_string())
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
    let Some(digits) = version_digits(version) else {
        return Opening::Answer(
            HttpResponse::NotFound()
                .content_type("text/plain")
                .body("not found\n"),
        );
    };
    if let Some(bad) = require_upgrade(req) {
        return Opening::Answer(bad);
    }
    match digits.parse::<u32>() {
        Ok(v) if (MIN_PROTOCOL..=MAX_PROTOCOL).contains(&v) => Opening::Proceed(v),
        _ => Opening::Refuse(unsupported_version(digits)),
    }
}

/// The most request header bytes (names, values and their separators) served.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Answers 431 to a request whose headers total more than [`MAX_HEADER_BYTES`] (PROTOCOL.md §12);
/// actix-http's own limit is the 128 KiB read buffer, not a header budget.
pub fn limit_header_size<S>(
    req: ServiceRequest,
    srv: &S,
) -> futures_util::future::Either<
    futures_util::future::Ready<Result<ServiceResponse, actix_web::Error>>,
    S::Future,
>
where
    S: Service<ServiceRequest, Response = ServiceResponse, Error = actix_web::Error>,
{
    use futures_util::future::{ready, Either};
    // Each header line is `name: value\r\n`.
    let total: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if total <= MAX_HEADER_BYTES {
        return Either::Right(srv.call(req));
    }
    log::info!(
        "refusing {}: {total} bytes of request headers (limit {MAX_HEADER_BYTES})",
        req.path()
    );
    let response = HttpResponse::build(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        .content_type("text/plain")
        .body(format!(
            "request headers total {total} bytes; the limit is {MAX_HEADER_BYTES}\n"
        ));
    Either::Left(ready(Ok(req.into_response(response))))
}

/// Starts a websocket session that holds a shutdown guard for as long as it lives.
pub fn start_session<A>(
    session: A,
    req: &HttpRequest,
    stream: web::Payload,
    guards: &Guards,
) -> Result<HttpResponse, actix_web::Error>
where
    A: Actor<Context = ws::WebsocketContext<A>>
        + StreamHandler<Result<ws::Message, ws::ProtocolError>>,
{
    Ok(hold_until_closed(
        ws::start(session, req, stream)?,
        guards.guard(),
    ))
}

/// A websocket that closes at once with its end: a refused request's 1002, a standby's 1011.
struct ClosingSocket {
    end: Option<SessionEnd>,
}

impl Actor for ClosingSocket {
    type Context = ws::WebsocketContext<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(end) = self.end.take() {
            close(ctx, end);
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for ClosingSocket {
    fn handle(&mut self, _: Result<ws::Message, ws::ProtocolError>, _: &mut Self::Context) {}
}

/// Upgrades, then closes at once with `end`.
pub fn close_at_once(
    req: &HttpRequest,
    stream: web::Payload,
    end: SessionEnd,
) -> Result<HttpResponse, actix_web::Error> {
    ws::start(ClosingSocket { end: Some(end) }, req, stream)
}

/// Upgrades, then closes with 1002 and `reason`.
pub fn refuse(
    req: &HttpRequest,
    stream: web::Payload,
    reason: String,
) -> Result<HttpResponse, actix_web::Error> {
    // The query is client input of any length: the log line shows its start only.
    log::info!(
        "refusing {} {}: {reason}",
        req.path(),
        truncate_reason(req.query_string())
    );
    close_at_once(req, stream, SessionEnd::Protocol(reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(version_digits("v6"), Some("6"));
        assert_eq!(
            version_digits("v99999999999999999999"),
            Some("99999999999999999999")
        );
        assert_eq!(version_digits("6"), None);
        assert_eq!(version_digits("vx"), None);
        assert_eq!(version_digits("v"), None);
        assert_eq!(
            unsupported_version("7"),
            "Cannot service client at protocol v7. Supported protocols: [v1 ... v6]"
        );
    }
}
