//! The service's side of sharing a PostgreSQL change DB (PROTOCOL.md §14): standing by until this
//! instance owns it, serving as the owner, and standing by again once deposed.
//!
//! The change log's PostgreSQL engine holds ownership and fences every write
//! ([`change_streamer_actors::ownership`]). [`run`] is the instance's life:
//!
//! 1. **Standby.** While it waits to own the change DB, a standby server answers on the
//!    service's own listening socket ([`Standby`]): `/healthz`, `/readyz`, `/status`
//!    (`"role": "standby"`, the change DB's state, its subscribers), `/metrics`
//!    (`change_streamer_owner 0`) and, with `--standby-serves` (the default), `/changes` from the
//!    change DB, following the owner's commits (PROTOCOL.md §14.1). The engine tries to take
//!    ownership every `--takeover-interval-ms`.
//! 2. **Owner.** Once it owns the change DB the standby server stops and the service starts
//!    on the same socket ([`Service::serve`]).
//! 3. **Deposed.** Once the engine finds it no longer owns the change DB (the fence refused a
//!    write, its session ended, or the idle check failed), it refuses every further write, so
//!    nothing more is stored or acked upstream, and reports it
//!    ([`ChangeLog::deposed`]). The service then steps down ([`Service::stop`] with
//!    [`StopMode::HandOver`]): it stops
//!    reading upstream, halts the actors that write, closes every session with 1011
//!    `standby: not the owner` and stops its HTTP server; after one takeover interval (the other
//!    standbys' turn first) it is a standby again, at 1. A standby that becomes the owner closes
//!    the subscribers it served with 1011 first; they reconnect and catch up from the change DB.
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
use change_streamer_actors::changelog::{ChangeLog, ChangeLogError, PgOptions};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::instance::recorder::{self, InstanceRecorder};
use change_streamer_actors::instance::InstanceId;
use log::{error, info, warn};

use crate::config::Config;
use crate::edge::Edge;
use crate::http::standby_status::StandbyState;
use crate::server::{listen, Listening, Service, StartError};
use crate::shutdown::StopMode;
use crate::standby::Standby;

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
        serving: None,
    };
    tokio::pin!(stop);
    let mut standby = Standby::start(&listener, &edge, &standing).await;
    let mut first_try_after = Duration::ZERO;
    loop {
        let opened = tokio::select! {
            opened = async {
                actix_rt::time::sleep(first_try_after).await;
                open(&config, &url, Some(&instance)).await
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
                standby = Standby::start(&listener, &edge, &standing).await;
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
        standby = Standby::start(&listener, &edge, &standing).await;
        // The other standbys' turn first: this one tries again after one takeover interval.
        first_try_after = config.takeover_interval();
    }
}

/// Opens the shared change DB once this instance owns it (the engine tries every takeover
/// interval meanwhile).
/// `instance`: this instance's id, whose own subscribers its purge does not read from the
/// records (its streamer checks them).
async fn open(
    config: &Config,
    url: &str,
    instance: Option<&InstanceId>,
) -> Result<ChangeLog, ChangeLogError> {
    let options = PgOptions {
        instance: instance.map(|i| i.as_str().to_string()),
        ..PgOptions::new(url, config.takeover_interval())
    };
    let log = ChangeLog::open_postgres(options).await?;
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
    let standby = Standby::start(listener, edge, None).await;
    let opened = open(config, url, None).await;
    standby.stop(StopMode::HandOver).await;
    opened
}
