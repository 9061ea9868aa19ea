//! A standby's routes (PROTOCOL.md §11, §14, §14.1): what an instance that does not own the shared
//! change DB answers, all in one place. The instance's one HTTP server calls these while it
//! stands by ([`super::Phase::Standby`]).
//!
//! - `/replication/v{N}/changes`: with `--standby-serves` (the default), served from the change
//!   DB by the standby's own streamer ([`Serving`], `src/standby.rs`), with the owner's checks
//!   and framing; else closed with 1011 `standby: not the owner`.
//! - `/replication/v{N}/snapshot`: with `--standby-serves`, the owner's checks, then a
//!   reservation held by the standby's [`StandbyReservations`] and recorded in the change DB
//!   (PROTOCOL.md §14.1); else closed with 1011 `standby: not the owner`.
//! - `/status`: its role and instance id, the change DB's state as the owner last stored it
//!   (`replicaVersion`, `changeLog`, `backup`), read through the instance's record connection,
//!   and the subscribers and reservations it serves. It knows nothing of the owner's upstream
//!   or purges beyond what is stored, so `upstream` and `purge` are null.
//! - `/readyz`: a serving standby is ready once the change DB it follows holds a replicaVersion
//!   and none of its stages is stalled (`stalled: STAGE for N ms`, PROTOCOL.md §11.1, asked of
//!   its stall watch first); one that does not serve is never ready (`standby`); either says
//!   `change DB unreachable` when its last record refresh failed.
//! - `/metrics`: `change_streamer_owner 0`, the access rule's refusals and, serving, its stages'
//!   `change_streamer_stage_stalled`.

use std::sync::Arc;

use actix::Addr;
use actix_web::{web, HttpRequest, HttpResponse};
use change_streamer_actors::changelog::{ChangeLog, ChangeLogError};
use change_streamer_actors::instance::recorder::{GetChangeDbView, InstanceRecorder, IsReachable};
use change_streamer_actors::instance::InstanceId;
use change_streamer_actors::reservation::standby::StandbyReservations;
use change_streamer_actors::reservation::ListReservations;
use change_streamer_actors::session_end::SessionEnd;
use change_streamer_actors::stall::{GetStages, StageState, StallWatch};
use change_streamer_actors::streamer::{GetStreamerState, Streamer};
use log::warn;

use super::access::Access;
use super::changes::{subscribe, Subscribing};
use super::metrics::{page, standby_page};
use super::readyz::{answer, NotReady};
use super::snapshot::{reserve, Reserving};
use super::status::{respond, Status};
use super::{close_at_once, open_websocket, refuse, Opening};
use crate::config::Config;
use crate::shutdown::Guards;
use crate::websocket::snapshot_socket::Reservations;

/// The close reason a standby, and an owner that steps down, gives websocket clients (1011).
pub const STANDBY_REASON: &str = "standby: not the owner";

/// What a standby's handlers reach.
#[derive(Clone)]
pub struct StandbyState {
    pub config: Arc<Config>,
    pub instance: InstanceId,
    pub recorder: Addr<InstanceRecorder>,
    pub access: Arc<Access>,
    /// What a serving standby serves `/changes` with (`--standby-serves`).
    pub serving: Option<Serving>,
}

/// A serving standby's streamer, its handle on the change DB and its sessions' guards.
#[derive(Clone)]
pub struct Serving {
    pub streamer: Addr<Streamer>,
    /// Its snapshot reservations (present with `--litestream-backup-url`).
    pub reservations: Option<Addr<StandbyReservations>>,
    pub log: ChangeLog,
    pub guards: Guards,
    /// Its follower's and reader's stall watch (PROTOCOL.md §11.1).
    pub stall: Addr<StallWatch>,
}

/// `/replication/v{N}/changes` at a standby.
pub fn changes(
    req: &HttpRequest,
    stream: web::Payload,
    version: &str,
    state: &StandbyState,
) -> Result<HttpResponse, actix_web::Error> {
    let Some(serving) = &state.serving else {
        return refuse_session(req, stream, version);
    };
    let with = Subscribing {
        streamer: serving.streamer.clone(),
        reservations: serving.reservations.clone().map(Addr::recipient),
        ping_interval: state.config.ping_interval(),
        guards: &serving.guards,
    };
    subscribe(req, stream, version, with)
}

/// `/replication/v{N}/snapshot` at a standby.
pub fn snapshot(
    req: &HttpRequest,
    stream: web::Payload,
    version: &str,
    state: &StandbyState,
) -> Result<HttpResponse, actix_web::Error> {
    let Some(serving) = &state.serving else {
        return refuse_session(req, stream, version);
    };
    let with = Reserving {
        reservations: serving.reservations.clone().map(Reservations::of),
        ping_interval: state.config.ping_interval(),
        guards: &serving.guards,
    };
    reserve(req, stream, version, with)
}

/// The same checks as the owner's endpoints (a 1002 for a bad version stays a 1002), then
/// 1011 [`STANDBY_REASON`].
pub fn refuse_session(
    req: &HttpRequest,
    stream: web::Payload,
    version: &str,
) -> Result<HttpResponse, actix_web::Error> {
    match open_websocket(req, version) {
        Opening::Answer(response) => Ok(response),
        Opening::Refuse(reason) => refuse(req, stream, reason),
        Opening::Proceed(_) => {
            close_at_once(req, stream, SessionEnd::Unavailable(STANDBY_REASON.into()))
        }
    }
}

pub async fn metrics(state: &StandbyState) -> HttpResponse {
    let stages = match &state.serving {
        // Stopped: it follows nothing, so no stage of it is stalled.
        Some(s) => s.stall.send(GetStages).await.unwrap_or_default(),
        None => Vec::new(),
    };
    page(standby_page(&state.access.failures(), &stages))
}

pub async fn readyz(state: &StandbyState) -> HttpResponse {
    answer(readiness(state).await)
}

async fn readiness(state: &StandbyState) -> Result<(), NotReady> {
    if let Some(s) = &state.serving {
        if s.guards.guard().is_none() {
            return Err(NotReady::Stopping);
        }
        // PROTOCOL.md §11.1: before the questions a silent change DB would hold. A watch gone
        // (at a takeover) follows nothing: no stage of it is stalled.
        let stages = s.stall.send(GetStages).await.unwrap_or_default();
        if let Some(reason) = StageState::readyz_reason(&stages) {
            return Err(NotReady::Stalled(reason));
        }
    }
    if state.recorder.send(IsReachable).await.ok().flatten() == Some(false) {
        return Err(NotReady::ChangeDbUnreachable);
    }
    let Some(serving) = &state.serving else {
        return Err(NotReady::Standby);
    };
    match serving.log.stats().await {
        Ok(stats) if stats.replica_version.is_some() => Ok(()),
        Ok(_) => Err(NotReady::NotInitialised),
        Err(ChangeLogError::Closed) => Err(NotReady::Stopping),
        Err(_) => Err(NotReady::ChangeDbUnreachable),
    }
}

pub async fn status(state: &StandbyState) -> HttpResponse {
    let subscribers = async {
        match &state.serving {
            Some(s) => s
                .streamer
                .send(GetStreamerState)
                .await
                .map(|s| s.subscribers)
                .unwrap_or_default(), // stopped: it serves nobody
            None => Vec::new(),
        }
    };
    let reservations = async {
        match state.serving.as_ref().and_then(|s| s.reservations.as_ref()) {
            Some(r) => r.send(ListReservations).await.unwrap_or_default(),
            None => Vec::new(),
        }
    };
    let (view, subscribers, reservations) = futures_util::future::join3(
        state.recorder.send(GetChangeDbView),
        subscribers,
        reservations,
    )
    .await;
    let view = match view {
        Ok(Ok(view)) => Some(view),
        Ok(Err(e)) => {
            warn!("standby /status: reading the change DB failed: {e}");
            None
        }
        Err(_) => None, // the recorder stopped: the standby is stopping
    };
    let status = Status::standby(
        &state.config,
        &state.instance,
        view.as_ref(),
        subscribers,
        reservations,
    );
    respond(&status)
}
