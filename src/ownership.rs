//! The service's side of sharing a PostgreSQL change DB (PROTOCOL.md §14): standing by until this
//! instance owns it, serving as the owner, and standing by again once deposed.
//!
//! The change log's PostgreSQL engine holds ownership and fences every write
//! ([`change_streamer_actors::ownership`]). [`run`] is the instance's life:
//!
//! 1. **Standby.** While it waits to own the change DB, a small standby server answers on the
//!    service's own listening socket: `/healthz`, `/readyz` (503 `standby`), `/status`
//!    (`"role": "standby"`, the change DB's state) and `/metrics` (`change_streamer_owner 0`); it closes `/snapshot` and `/changes` websockets
//!    with 1011 `standby: not the owner`. The engine tries to take ownership every
//!    `--takeover-interval-ms`.
//! 2. **Owner.** Once it owns the change DB the standby server stops and the service starts
//!    on the same socket ([`Service::serve`]).
//! 3. **Deposed.** Once the engine finds it no longer owns the change DB (the fence refused a
//!    write, its session ended, or the idle check failed), it refuses every further write, so
//!    nothing more is stored or acked upstream, and reports it
//!    ([`ChangeLog::deposed`]). The service then steps down ([`Service::stop`] with
//!    [`StopMode::HandOver`]): it stops
//!    reading upstream, halts the actors that write, closes every session with 1011
//!    `standby: not the owner` and stops its HTTP server; after one takeover interval (the other
//!    standbys' turn first) it is a standby again, at 1.
//!
//! Throughout, the instance keeps its record in the change DB under one id
//! ([`InstanceRecorder`], PROTOCOL.md §14.1); a graceful stop deletes it.
//!
//! SIGINT or SIGTERM ends any phase gracefully ([`StopMode::Graceful`]): the owner stops as
//! [`Service::stop`] says, a standby stops answering and exits.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use actix_web_actors::ws;
use change_streamer_actors::changelog::{ChangeLog, ChangeLogError, PgOptions};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::instance::recorder::{self, InstanceRecorder};
use change_streamer_actors::instance::InstanceId;
use change_streamer_actors::session_end::SessionEnd;
use log::{error, info, warn};

use crate::config::Config;
use crate::edge::{no_delay, Edge};
use crate::http::access::{guard, Access};
use crate::http::metrics::auth_failures_text;
use crate::http::readyz::standby_readyz;
use crate::http::standby_status::{standby_status, StandbyState};
use crate::http::{open_websocket, refuse, status::healthz, Opening};
use crate::server::{listen, Listening, Service, StartError};
use crate::shutdown::StopMode;
use crate::websocket::close;

/// The close reason a standby, and an owner that steps down, gives websocket clients (1011).
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

/// Runs the service until `stop` resolves (SIGINT or SIGTERM), then stops it gracefully. With
/// SQLite it is the owner throughout; with a shared change DB it goes through the phases of
/// the module documentation for as long as it runs.
pub async fn run(
    config: Config,
    clock: Clock,
    stop: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let Some(url) = config.change_db.clone() else {
        let service = Service::start(config, clock).await?;
        stop.await;
        service.stop(StopMode::Graceful).await;
        return Ok(());
    };
    let config = Arc::new(config);
    let edge = Edge::load(&config)?;
    // Kept for the whole run; each server (standby or owner) listens on a duplicate of it.
    let listener = listen(&config.host, config.port)?;
    edge.access
        .log_mode(&listener.addr.to_string(), config.allow_unauthenticated);
    // One id and one record for the whole run, whatever the phase (PROTOCOL.md §14.1).
    let instance = InstanceId::new(listener.addr, &clock);
    let recorder = InstanceRecorder::new(instance.clone(), url.clone()).start();
    let standing = StandbyState {
        config: config.clone(),
        instance: instance.clone(),
        recorder: recorder.clone(),
    };
    tokio::pin!(stop);
    let mut standby = Standby::start(&listener, &edge, &standing);
    let mut first_try_after = Duration::ZERO;
    loop {
        let opened = tokio::select! {
            opened = async {
                actix_rt::time::sleep(first_try_after).await;
                open(&config, &url).await
            } => opened,
            () = &mut stop => {
                info!("stopping the standby");
                standby.stop(StopMode::Graceful).await;
                let _ = recorder.send(recorder::Stop).await;
                info!("stopped");
                return Ok(());
            }
        };
        standby.stop(StopMode::HandOver).await;
        let log = opened.map_err(StartError::ChangeDb)?;
        let serving = Service::serve(
            config.clone(),
            log.clone(),
            listener.duplicate()?,
            clock.clone(),
            edge.clone(),
            instance.clone(),
            Some(recorder.clone()),
        );
        let service = match serving.await {
            Ok(service) => service,
            // Deposed before anything started (reading the state back is the first write
            // command): stand by again.
            Err(StartError::ChangeLog(ChangeLogError::NotOwner)) => {
                warn!("deposed while starting: standing by again");
                standby = Standby::start(&listener, &edge, &standing);
                first_try_after = config.takeover_interval();
                continue;
            }
            Err(e) => return Err(e),
        };
        tokio::select! {
            () = log.deposed() => {}
            () = &mut stop => {
                service.stop(StopMode::Graceful).await;
                let _ = recorder.send(recorder::Stop).await;
                return Ok(());
            }
        }
        error!(
            "no longer the owner of change DB {}: stepping down to a standby",
            log.location()
        );
        drop(log);
        service.stop(StopMode::HandOver).await;
        standby = Standby::start(&listener, &edge, &standing);
        // The other standbys' turn first: this one tries again after one takeover interval.
        first_try_after = config.takeover_interval();
    }
}

/// Opens the shared change DB once this instance owns it (the engine tries every takeover
/// interval meanwhile).
async fn open(config: &Config, url: &str) -> Result<ChangeLog, ChangeLogError> {
    let log = ChangeLog::open_postgres(PgOptions::new(url, config.takeover_interval())).await?;
    info!("owner of change DB {}", log.location());
    Ok(log)
}

/// Waits until this instance owns the change DB at `url`, answering as a standby on
/// `listener` meanwhile, and returns the opened change log. (For [`Service::start`]; a
/// deposed owner's step down is [`run`]'s.)
pub(crate) async fn own_change_db(
    config: &Config,
    url: &str,
    listener: &Listening,
    edge: &Edge,
) -> Result<ChangeLog, ChangeLogError> {
    let standby = Standby::start(listener, edge, None);
    let opened = open(config, url).await;
    standby.stop(StopMode::HandOver).await;
    opened
}

/// The standby server on the service's listening socket, while it runs.
struct Standby(Option<ServerHandle>);

impl Standby {
    /// Starts answering as a standby on a copy of `listener` (the socket stays bound and
    /// listening when this server stops), behind the access rule of `edge`, with `/status` and
    /// `/readyz` from `state`.
    fn start<'a>(
        listener: &Listening,
        edge: &Edge,
        state: impl Into<Option<&'a StandbyState>>,
    ) -> Standby {
        let access = edge.access.clone();
        let state = state.into().cloned().map(web::Data::new);
        let server = listener.duplicate().and_then(|l| {
            let server = HttpServer::new(move || {
                let app = App::new()
                    .wrap_fn(guard(&access))
                    .app_data(web::Data::new(access.clone()));
                match &state {
                    Some(state) => app.app_data(state.clone()).configure(standby_routes),
                    None => app.configure(standby_routes),
                }
            })
            .on_connect(no_delay)
            .workers(1)
            .disable_signals()
            .shutdown_timeout(1);
            edge.listen(server, l.listener)
                .map_err(|source| StartError::Bind {
                    addr: listener.addr.to_string(),
                    source,
                })
        });
        match server {
            Ok(server) => {
                info!(
                    "standby on {} until this instance owns the change DB",
                    listener.addr
                );
                let server = server.run();
                let handle = server.handle();
                actix_rt::spawn(server);
                Standby(Some(handle))
            }
            Err(e) => {
                warn!("standby: cannot answer on the listening socket meanwhile: {e}");
                Standby(None)
            }
        }
    }

    /// Stops answering. [`StopMode::Graceful`]: the open connections end first, at most one
    /// second; [`StopMode::HandOver`]: they are closed at once, so that a client keeping its
    /// connection alive (a probe polling `/status`) does not delay the owner's start on this
    /// socket.
    async fn stop(self, mode: StopMode) {
        if let Some(server) = self.0 {
            server.stop(mode.finishes_connections()).await;
        }
    }
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
    .route("/readyz", web::get().to(standby_readyz))
    .route("/status", web::get().to(standby_status))
    .route("/metrics", web::get().to(standby_metrics))
    .default_service(web::to(|| async {
        HttpResponse::NotFound()
            .content_type("text/plain")
            .body("not found\n")
    }));
}

async fn standby_metrics(access: web::Data<Arc<Access>>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(standby_gauge() + &auth_failures_text(&access.failures()))
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
