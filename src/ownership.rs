//! The service's side of sharing a PostgreSQL change DB (SPEC §14): standing by until this
//! instance owns it, and what happens when it stops owning it.
//!
//! The change log's PostgreSQL engine holds ownership and fences every write
//! ([`change_streamer_actors::ownership`]). While it waits to own the change DB
//! ([`own_change_db`]), a small standby server answers on the service's own listening socket:
//! `/healthz`, `/status` (`"role": "standby"`) and `/metrics` (`change_streamer_owner 0`), and
//! it closes `/snapshot` and `/changes` websockets with 1011 `standby: not the owner`. Once the
//! instance owns the change DB the standby server stops and the service starts as usual on the
//! same socket.
//!
//! An owner that is deposed refuses every further write (nothing more is stored or acked
//! upstream) and the service exits with [`EXIT_DEPOSED`]: the process's end closes the
//! upstream connection and every session at once, and whoever supervises it starts it again,
//! as a standby.

use actix::prelude::*;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use actix_web_actors::ws;
use change_streamer_actors::changelog::{ChangeLog, ChangeLogError, PgOptions};
use change_streamer_actors::ownership::Role;
use change_streamer_actors::session::SessionEnd;
use log::{error, info, warn};
use serde_json::json;

use crate::config::Config;
use crate::http::{open_websocket, refuse, status::healthz, Opening};
use crate::session::close;

/// The exit status of an owner that lost the change DB (`EX_TEMPFAIL`: start it again).
pub const EXIT_DEPOSED: i32 = 75;

/// The close reason a standby gives websocket clients (with 1011).
pub const STANDBY_REASON: &str = "standby: not the owner";

/// The help of the `change_streamer_owner` gauge.
pub const OWNER_GAUGE_HELP: &str = "1 if this instance owns the change DB, 0 on a standby.";

/// The standby's `/metrics`: the `change_streamer_owner` gauge at 0.
fn standby_gauge() -> String {
    format!(
        "# HELP change_streamer_owner {OWNER_GAUGE_HELP}\n\
         # TYPE change_streamer_owner gauge\n\
         change_streamer_owner 0\n"
    )
}

/// Waits until this instance owns the change DB at `url`, answering as a standby on
/// `listener` meanwhile, and returns the opened change log.
pub async fn own_change_db(
    config: &Config,
    url: &str,
    listener: &std::net::TcpListener,
) -> Result<ChangeLog, ChangeLogError> {
    let standby = match listener.try_clone().and_then(|l| {
        HttpServer::new(|| App::new().configure(standby_routes))
            .workers(1)
            .disable_signals()
            .shutdown_timeout(1)
            .listen(l)
    }) {
        Ok(server) => {
            if let Ok(addr) = listener.local_addr() {
                info!("standby on {addr} until this instance owns the change DB");
            }
            let server = server.run();
            let handle = server.handle();
            actix_rt::spawn(server);
            Some(handle)
        }
        Err(e) => {
            warn!("standby: cannot answer on the listening socket meanwhile: {e}");
            None
        }
    };
    let opened = ChangeLog::open_postgres(PgOptions::new(url, config.takeover_interval())).await;
    if let Some(standby) = standby {
        standby.stop(true).await;
    }
    let log = opened?;
    info!("owner of change DB {}", log.path().display());
    exit_when_deposed(log.clone());
    Ok(log)
}

fn standby_routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/replication/{version}/snapshot",
        web::get().to(refuse_session),
    )
    .route(
        "/replication/{version}/changes",
        web::get().to(refuse_session),
    )
    .route("/healthz", web::get().to(healthz))
    .route("/status", web::get().to(standby_status))
    .route("/metrics", web::get().to(standby_metrics))
    .default_service(web::to(|| async {
        HttpResponse::NotFound()
            .content_type("text/plain")
            .body("not found\n")
    }));
}

async fn standby_status() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "role": Role::Standby }))
}

async fn standby_metrics() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(standby_gauge())
}

/// The same checks as the owner's endpoints (a 1002 for a bad version stays a 1002), then
/// 1011 `standby: not the owner`.
async fn refuse_session(
    req: HttpRequest,
    stream: web::Payload,
    version: web::Path<String>,
) -> Result<HttpResponse, actix_web::Error> {
    match open_websocket(&req, &version) {
        Opening::Answer(response) => Ok(response),
        Opening::Refuse(reason) => refuse(&req, stream, reason),
        Opening::Proceed(_) => ws::start(NotOwner, &req, stream),
    }
}

/// A websocket that closes at once with 1011 [`STANDBY_REASON`].
struct NotOwner;

impl Actor for NotOwner {
    type Context = ws::WebsocketContext<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        close(ctx, SessionEnd::Unavailable(STANDBY_REASON.into()));
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for NotOwner {
    fn handle(&mut self, _: Result<ws::Message, ws::ProtocolError>, _: &mut Self::Context) {}
}

/// Exits the process once `log`'s engine reports this instance no longer owns the change DB.
fn exit_when_deposed(log: ChangeLog) {
    actix_rt::spawn(async move {
        log.deposed().await;
        error!(
            "no longer the owner of change DB {}: exiting ({EXIT_DEPOSED}) to start again as a standby",
            log.path().display()
        );
        std::process::exit(EXIT_DEPOSED);
    });
}
