//! A standby's server on the service's listening socket (PROTOCOL.md §14, §14.1): what an
//! instance that does not own the shared change DB answers while it stands by.
//!
//! It answers `/healthz`, `/readyz`, `/status` (`"role": "standby"`, the change DB's state and
//! its own subscribers) and `/metrics` (`change_streamer_owner 0`). With `--standby-serves`
//! (the default) it also serves `/replication/v{N}/changes` from the change DB: a [`Streamer`]
//! of its own, following the owner's commits ([`follower`]) and storing nothing, with the same
//! checks, framing and bounds as the owner's; its subscribers are recorded in the change DB
//! so that the owner's purge holds them back ([`InstanceRecorder`]). `/snapshot` is closed
//! with 1011 `standby: not the owner` (reservations are the owner's), and so is `/changes` with
//! `--standby-serves=false`.
//!
//! [`Standby::stop`] closes its subscribers first: with 1001 on a graceful stop, with 1011
//! when the socket goes to the owner's server of this process (its subscribers reconnect, to
//! this instance or another, and catch up from the change DB).

use std::sync::Arc;

use actix::prelude::*;
use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use actix_web_actors::ws;
use change_streamer_actors::changelog::{ChangeLog, LogStats};
use change_streamer_actors::follower::{self, FollowerHandle};
use change_streamer_actors::instance::recorder::{Holders, Serve, StandBy};
use change_streamer_actors::session_end::SessionEnd;
use change_streamer_actors::streamer::{self, Streamer, StreamerConfig};
use log::{info, warn};

use crate::config::Config;
use crate::edge::{no_delay, Edge};
use crate::http::access::{guard, Access};
use crate::http::changes::{subscribe, Subscribing};
use crate::http::metrics::auth_failures_text;
use crate::http::readyz::standby_readyz;
use crate::http::standby_status::{standby_status, Serving, StandbyState};
use crate::http::{limit_header_size, open_websocket, refuse, status::healthz, Opening};
use crate::server::{Listening, StartError, SESSION_DRAIN};
use crate::shutdown::{Drain, StopMode};
use crate::websocket::close;

/// The close reason a standby, and an owner that steps down, gives websocket clients (1011).
pub const STANDBY_REASON: &str = "standby: not the owner";

/// The close reason of a serving standby's subscribers when it becomes the owner (1011).
pub const TAKING_OVER_REASON: &str = "standby: becoming the owner; reconnect to go on";

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

/// The standby server while it runs.
pub(crate) struct Standby {
    server: Option<ServerHandle>,
    serving: Option<Served>,
}

/// What a serving standby runs beside its server.
struct Served {
    streamer: Addr<Streamer>,
    follower: FollowerHandle,
    drain: Drain,
    state: StandbyState,
}

impl Standby {
    /// Starts answering as a standby on a copy of `listener` (the socket stays bound and
    /// listening when this server stops), behind the access rule of `edge`, with `/status` and
    /// `/readyz` from `state`; with `--standby-serves` and a `state`, serving `/changes` from
    /// the change DB at `url`.
    pub(crate) async fn start<'a>(
        listener: &Listening,
        edge: &Edge,
        state: impl Into<Option<&'a StandbyState>>,
    ) -> Standby {
        let mut state = state.into().cloned();
        let serving = match &mut state {
            Some(s) if s.config.standby_serves => match s.config.change_db.clone() {
                Some(url) => serve(s, url).await,
                None => None,
            },
            _ => None,
        };
        let workers = if serving.is_some() { 2 } else { 1 };
        let access = edge.access.clone();
        let data = state.clone().map(web::Data::new);
        let server = listener.duplicate().and_then(|l| {
            let server = HttpServer::new(move || {
                let app = App::new()
                    .wrap_fn(limit_header_size)
                    .wrap_fn(guard(&access))
                    .app_data(web::Data::new(access.clone()));
                match &data {
                    Some(state) => app.app_data(state.clone()).configure(standby_routes),
                    None => app.configure(standby_routes),
                }
            })
            .on_connect(no_delay)
            .workers(workers)
            .disable_signals()
            .shutdown_timeout(1);
            edge.listen(server, l.listener)
                .map_err(|source| StartError::Bind {
                    addr: listener.addr.to_string(),
                    source,
                })
        });
        let server = match server {
            Ok(server) => {
                info!(
                    "standby on {} until this instance owns the change DB ({})",
                    listener.addr,
                    if serving.is_some() {
                        "serving /changes from the change DB"
                    } else {
                        "not serving /changes"
                    }
                );
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
        Standby { server, serving }
    }

    /// Stops answering. [`StopMode::Graceful`]: subscribers are closed with 1001 and the open
    /// connections end first, at most one second; [`StopMode::HandOver`]: subscribers are
    /// closed with 1011 [`TAKING_OVER_REASON`] and the connections at once, so that a client
    /// keeping its connection alive (a probe polling `/status`) does not delay the owner's
    /// start on this socket.
    pub(crate) async fn stop(self, mode: StopMode) {
        let Standby { server, serving } = self;
        if let Some(s) = serving {
            s.stop(mode).await;
        }
        if let Some(server) = server {
            server.stop(mode.finishes_connections()).await;
        }
    }
}

/// Starts what serving `/changes` at a standby takes, and tells `state` and the instance's
/// recorder; `None` (not serving, with a warning) if the change DB's handle cannot be made.
async fn serve(state: &mut StandbyState, url: String) -> Option<Served> {
    let log = match ChangeLog::open_postgres_standby(&url) {
        Ok(log) => log,
        Err(e) => {
            warn!("standby: cannot serve /changes from the change DB: {e}");
            return None;
        }
    };
    // Where the follower starts: the newest commit now. Unreadable, it starts from the
    // beginning and finds its place as it reads (or rebases past a purge).
    let stats = log.stats().await.unwrap_or_else(|e| {
        warn!("standby: reading the change DB's range failed ({e}); following from its start");
        LogStats::default()
    });
    let streamer = Streamer::new(streamer_config(&state.config), log.clone(), &stats)
        .following(state.recorder.clone().recipient())
        .start();
    let follower = follower::start(
        url,
        log.clone(),
        streamer.clone(),
        stats.max_watermark.clone(),
    );
    let drain = Drain::default();
    state.serving = Some(Serving {
        streamer: streamer.clone(),
        log: log.clone(),
        guards: drain.guards(),
    });
    state.recorder.do_send(Serve(Holders {
        log,
        streamer: streamer.clone(),
        reservations: None,
    }));
    Some(Served {
        streamer,
        follower,
        drain,
        state: state.clone(),
    })
}

impl Served {
    async fn stop(self, mode: StopMode) {
        let Served {
            streamer,
            follower,
            drain,
            state,
        } = self;
        state.recorder.do_send(StandBy);
        follower.stop().await;
        let closing = match mode {
            StopMode::Graceful => {
                let _ = streamer
                    .send(streamer::Stop {
                        end: Some(SessionEnd::ServiceStop),
                    })
                    .await;
                None
            }
            StopMode::HandOver => Some(SessionEnd::Unavailable(TAKING_OVER_REASON.into())),
        };
        if !drain.stop(closing.as_ref(), SESSION_DRAIN).await {
            warn!(
                "standby: sessions still open {} s after the stop notice; stopping without them",
                SESSION_DRAIN.as_secs()
            );
        }
        if mode == StopMode::HandOver {
            let _ = streamer.send(streamer::Stop { end: None }).await;
        }
    }
}

/// The streamer's tunables, from the same flags as the owner's.
pub(crate) fn streamer_config(config: &Config) -> StreamerConfig {
    StreamerConfig {
        padding: config.padding(),
        max_queue_changes: config.max_subscriber_queue_changes as usize,
        max_queue_bytes: config.max_subscriber_queue_bytes as usize,
        max_queued_bytes: config.max_queued_bytes as usize,
        slow_grace: config.slow_subscriber_grace(),
        ..StreamerConfig::default()
    }
}

fn standby_routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/replication/{version}/snapshot",
        web::get().to(refuse_session),
    )
    .route("/replication/{version}/changes", web::get().to(changes))
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

/// A subscription: served from the change DB by a serving standby, else refused as at
/// `/snapshot`.
async fn changes(
    req: HttpRequest,
    stream: web::Payload,
    version: web::Path<String>,
    state: Option<web::Data<StandbyState>>,
) -> Result<HttpResponse, actix_web::Error> {
    let serving = state.as_ref().and_then(|s| Some((s, s.serving.as_ref()?)));
    let Some((state, serving)) = serving else {
        return refuse_session(req, stream, version).await;
    };
    let with = Subscribing {
        streamer: serving.streamer.clone(),
        reservations: None,
        ping_interval: state.config.ping_interval(),
        guards: &serving.guards,
    };
    subscribe(&req, stream, &version, with)
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
