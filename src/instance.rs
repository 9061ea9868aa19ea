//! One instance of the service, for its whole life: the only way to start it.
//!
//! [`Instance::start`] binds the listening socket first (so that a refused address fails before
//! anything else runs), starts the instance's one HTTP server on it, and returns once it
//! listens. That server lives as long as the instance; what its routes do follows the
//! instance's phase ([`Phase`], through the [`Door`]):
//!
//! - **SQLite** (no `--change-db`): the owner from the start ([`Owner`]).
//! - **A shared change DB** (PROTOCOL.md §14): the instance keeps its record there
//!   ([`InstanceRecorder`], PROTOCOL.md §14.1) and goes through these phases for as long as it
//!   runs:
//!   1. **Standby.** It answers as a standby (`http/standby.rs`) and, with `--standby-serves`
//!      (the default), serves `/changes` from the change DB ([`StandbyServing`]). The change
//!      log's engine tries to take ownership every `--takeover-interval-ms`.
//!   2. **Owner.** Once it owns the change DB, the standby's streamer, with every subscriber,
//!      becomes the owner's: the follower hands on the last commits the old owner made durable,
//!      the streamer switches to ingesting, and the upstream client starts ([`Owner::start`]).
//!      Its `/snapshot` reservations become the owner's own, on the same sockets. Its
//!      websocket connections never see the change: the server is the same (PROTOCOL.md
//!      §14.1, takeover keeps subscribers and reservations).
//!   3. **Deposed.** Once the engine finds it no longer owns the change DB (the fence refused a
//!      write, its session ended, or the idle check failed), it refuses every further write,
//!      so nothing more is stored or acked upstream, and reports it ([`ChangeLog::deposed`]).
//!      The owner then steps down ([`Owner::stop`] with [`StopMode::StepDown`]): it stops
//!      reading upstream, halts the actors that write and closes every session with 1011
//!      `standby: not the owner` (what it forwarded may not all be durable); after one takeover
//!      interval (the other standbys' turn first) it tries again, standing by at 1.
//!
//! [`Instance::stop`] (SIGINT or SIGTERM: [`run`]) ends any phase: the server stops accepting,
//! the phase stops as its own `stop` says, the record is deleted, then the server stops.

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_web::dev::ServerHandle;
use actix_web::rt::net::TcpSocket;
use actix_web::{web, App, HttpServer};
use change_streamer_actors::changelog::{
    change_db_lease_for, set_change_db_lease, ChangeDb, ChangeLog, ChangeLogError, PgOptions,
    SEGMENT_ROWS,
};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::instance::recorder::{self, InstanceRecorder};
use change_streamer_actors::instance::InstanceId;
use log::{error, info, warn};
use tokio::sync::{oneshot, watch};

use crate::config::Config;
use crate::edge::{no_delay, Edge};
use crate::http::access::guard;
use crate::http::standby::StandbyState;
use crate::http::{limit_header_size, routes, Door, Phase};
use crate::owner::{Owner, OwnerStart};
use crate::shutdown::StopMode;
use crate::standby::StandbyServing;
use crate::start_error::StartError;

/// A running instance.
pub struct Instance {
    addr: SocketAddr,
    server: ServerHandle,
    stop: Option<oneshot::Sender<StopMode>>,
    /// The instance's life ended by itself: an error it cannot go on after.
    ended: oneshot::Receiver<Result<(), StartError>>,
}

/// How the instance lives, by its change log's engine (see the module documentation).
enum LifeOf {
    /// SQLite: the owner throughout.
    Own(Box<Owner>),
    /// A shared change DB at `url`: its phases, the instance's record kept by `recorder`.
    Share {
        url: String,
        recorder: Addr<InstanceRecorder>,
    },
}

/// What the instance's life needs, whatever its phases.
struct Life {
    config: Arc<Config>,
    clock: Clock,
    edge: Edge,
    addr: SocketAddr,
    instance: InstanceId,
    phase: watch::Sender<Phase>,
    server: ServerHandle,
}

impl Instance {
    /// Starts the instance on the current actix system; `clock` is the time the backup side
    /// reads (the system clock in production). Returns once it listens (see the module
    /// documentation); on SQLite, once the owner's actors run.
    pub async fn start(config: Config, clock: Clock) -> Result<Instance, StartError> {
        let config = Arc::new(config);
        config.check_catchup_window()?;
        let edge = Edge::load(&config)?;
        let engine = config.engine();
        engine.check().map_err(StartError::ChangeDb)?;
        let listener = listen(&config.host, config.port)?;
        let addr = listener.addr;
        let instance = InstanceId::new(addr, &clock);
        let (first, life_of) = match engine {
            ChangeDb::Sqlite { dir } => {
                let log = ChangeLog::open_with(&dir, SEGMENT_ROWS, clock.clone())?;
                let owner = Owner::start(OwnerStart {
                    config: config.clone(),
                    log,
                    kept: None,
                    clock: clock.clone(),
                    edge: &edge,
                    instance: instance.clone(),
                    recorder: None,
                })
                .await?;
                (
                    Phase::Owner(owner.state().clone()),
                    LifeOf::Own(Box::new(owner)),
                )
            }
            ChangeDb::Postgres { url } => {
                // Every connection to the change DB answers within the lease's bounds
                // (PROTOCOL.md §14.2, a silent change DB), set before the first is made.
                let lease = change_db_lease_for(config.takeover_interval());
                set_change_db_lease(lease);
                info!("change DB lease {lease:?}: a change DB silent for longer is out of reach");
                // One id and one record for the whole run, whatever the phase (PROTOCOL.md
                // §14.1).
                let recorder = InstanceRecorder::new(instance.clone(), url.clone()).start();
                let standing = standing(&config, &edge, &instance, &recorder);
                (Phase::Standby(standing), LifeOf::Share { url, recorder })
            }
        };
        let (phase, door) = watch::channel(first);
        let server = serve_http(&edge, listener, Door::new(door))?;
        edge.access
            .log_mode(&addr.to_string(), config.allow_unauthenticated);
        let (stop, stop_rx) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        let life = Life {
            config,
            clock,
            edge,
            addr,
            instance,
            phase,
            server: server.clone(),
        };
        actix_rt::spawn(async move {
            let result = match life_of {
                LifeOf::Own(owner) => life.own(*owner, stop_rx).await,
                LifeOf::Share { url, recorder } => life.share(url, recorder, stop_rx).await,
            };
            let _ = ended_tx.send(result);
        });
        Ok(Instance {
            addr,
            server,
            stop: Some(stop),
            ended,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the instance, `mode` saying how its phase ends ([`StopMode::Graceful`]: every
    /// session closed with 1001, the change log flushed), then its HTTP server. Answers how its
    /// life ended.
    pub async fn stop(mut self, mode: StopMode) -> Result<(), StartError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(mode);
        }
        let ended = (&mut self.ended).await.unwrap_or(Err(StartError::Ended));
        self.server.stop(mode.finishes_connections()).await;
        ended
    }
}

/// Runs an instance until `stop` resolves (SIGINT or SIGTERM), then stops it gracefully; or
/// until its life ends by itself with an error.
pub async fn run(
    config: Config,
    clock: Clock,
    stop: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let mut instance = Instance::start(config, clock).await?;
    tokio::pin!(stop);
    tokio::select! {
        () = &mut stop => instance.stop(StopMode::Graceful).await,
        ended = &mut instance.ended => {
            instance.server.stop(true).await;
            ended.unwrap_or(Err(StartError::Ended))
        }
    }
}

/// A standby's state for its handlers, serving nothing yet.
fn standing(
    config: &Arc<Config>,
    edge: &Edge,
    instance: &InstanceId,
    recorder: &Addr<InstanceRecorder>,
) -> StandbyState {
    StandbyState {
        config: config.clone(),
        instance: instance.clone(),
        recorder: recorder.clone(),
        access: edge.access.clone(),
        serving: None,
    }
}

impl Life {
    fn announce_owner(&self, log: &ChangeLog) {
        info!(
            "change-streamer listening on {} ({}, change log {})",
            self.addr,
            self.edge.scheme(),
            log.location()
        );
    }

    /// The owner throughout (SQLite) until asked to stop.
    async fn own(self, owner: Owner, stop: oneshot::Receiver<StopMode>) -> Result<(), StartError> {
        self.announce_owner(&owner.state().log);
        let mode = stop.await.unwrap_or(StopMode::Graceful);
        self.stopping(mode).await;
        owner.stop(mode).await;
        Ok(())
    }

    /// The server stops accepting before a graceful stop ends the phase.
    async fn stopping(&self, mode: StopMode) {
        if mode == StopMode::Graceful {
            self.server.pause().await;
        }
    }

    /// The phases of a shared change DB (see the module documentation) until asked to stop.
    async fn share(
        self,
        url: String,
        recorder: Addr<InstanceRecorder>,
        mut stop: oneshot::Receiver<StopMode>,
    ) -> Result<(), StartError> {
        let standing = standing(&self.config, &self.edge, &self.instance, &recorder);
        let mut first_try_after = Duration::ZERO;
        // A standby's serving parts live across failed attempts to own the change DB.
        let mut serving: Option<StandbyServing> = None;
        let result = loop {
            // 1. Standby.
            self.stand_by(&url, &recorder, &standing, &mut serving)
                .await;
            let opened = tokio::select! {
                opened = async {
                    actix_rt::time::sleep(first_try_after).await;
                    open(&self.config, &url, &self.instance).await
                } => opened,
                mode = &mut stop => {
                    info!("stopping the standby");
                    self.stopping(mode.unwrap_or(StopMode::Graceful)).await;
                    break Ok(());
                }
            };
            first_try_after = self.config.takeover_interval();
            let log = match opened {
                Ok(log) => log,
                Err(e) => {
                    warn!("taking over the change DB failed: {e}; standing by again");
                    continue;
                }
            };
            // 2. Owner.
            let owner = match self.take_over(&log, &mut serving, &recorder).await {
                Ok(Some(owner)) => owner,
                Ok(None) => continue,
                Err(e) => break Err(e),
            };
            if self
                .own_until_deposed(owner, log, &standing, &mut stop)
                .await
            {
                break Ok(());
            }
            // 3. Deposed: the other standbys' turn first, this one tries again after one
            // takeover interval.
        };
        if let Some(s) = serving {
            s.stop().await;
        }
        let _ = recorder.send(recorder::Stop).await;
        info!("stopped");
        result
    }

    /// Phase 1: answers as a standby, serving `/changes` and `/snapshot` from the change DB
    /// with `--standby-serves` (its serving parts started once, kept across attempts).
    async fn stand_by(
        &self,
        url: &str,
        recorder: &Addr<InstanceRecorder>,
        standing: &StandbyState,
        serving: &mut Option<StandbyServing>,
    ) {
        if serving.is_none() && self.config.standby_serves {
            if let Some((s, handlers)) =
                StandbyServing::start(&self.config, url, recorder, &self.instance, &self.clock)
                    .await
            {
                *serving = Some(s);
                self.phase.send_replace(Phase::Standby(StandbyState {
                    serving: Some(handlers),
                    ..standing.clone()
                }));
            }
        }
        if serving.is_none() {
            self.phase.send_replace(Phase::Standby(standing.clone()));
        }
        info!(
            "standby on {} until this instance owns the change DB ({})",
            self.addr,
            if serving.is_some() {
                "serving /changes and /snapshot from the change DB"
            } else {
                "not serving /changes"
            }
        );
    }

    /// Phase 2 begins: the owner's actors start on `log`, keeping the standby's streamer.
    /// `Ok(None)`: deposed, or the change DB failed, before anything started (reading the
    /// state back is the first write command): stand by again.
    async fn take_over(
        &self,
        log: &ChangeLog,
        serving: &mut Option<StandbyServing>,
        recorder: &Addr<InstanceRecorder>,
    ) -> Result<Option<Owner>, StartError> {
        // Still the owner (the first command)? Else the standby goes on serving.
        if let Err(e) = log.stats().await {
            warn!("deposed or failed while starting ({e}): standing by again");
            return Ok(None);
        }
        let kept = match serving.take() {
            Some(s) => Some(s.take_over().await),
            None => None,
        };
        let started = Owner::start(OwnerStart {
            config: self.config.clone(),
            log: log.clone(),
            kept,
            clock: self.clock.clone(),
            edge: &self.edge,
            instance: self.instance.clone(),
            recorder: Some(recorder.clone()),
        })
        .await;
        match started {
            Ok(owner) => Ok(Some(owner)),
            Err(StartError::ChangeLog(e)) | Err(StartError::ChangeDb(e)) => {
                warn!("deposed or failed while starting ({e}): standing by again");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Phase 2 until it ends: asked to stop (`true`, stopped as asked), or deposed (`false`,
    /// phase 3: stepped down to a standby).
    async fn own_until_deposed(
        &self,
        owner: Owner,
        log: ChangeLog,
        standing: &StandbyState,
        stop: &mut oneshot::Receiver<StopMode>,
    ) -> bool {
        self.phase.send_replace(Phase::Owner(owner.state().clone()));
        self.announce_owner(&log);
        tokio::select! {
            () = log.deposed() => {}
            mode = stop => {
                let mode = mode.unwrap_or(StopMode::Graceful);
                self.stopping(mode).await;
                owner.stop(mode).await;
                return true;
            }
        }
        error!(
            "no longer the owner of change DB {}: stepping down to a standby",
            log.location()
        );
        self.phase.send_replace(Phase::Standby(standing.clone()));
        drop(log);
        owner.stop(StopMode::StepDown).await;
        false
    }
}

/// Opens the shared change DB once this instance owns it (the engine tries every takeover
/// interval meanwhile). `instance`'s own subscribers are its streamer's to check, so its purge
/// reads only the others' records.
async fn open(
    config: &Config,
    url: &str,
    instance: &InstanceId,
) -> Result<ChangeLog, ChangeLogError> {
    let options = PgOptions {
        instance: Some(instance.as_str().to_string()),
        ..PgOptions::new(url, config.takeover_interval())
    };
    let log = ChangeLog::open_postgres(options).await?;
    info!("owner of change DB {}", log.location());
    Ok(log)
}

/// Starts the instance's one HTTP server on `listener`, behind the header limit and the
/// access rule, its routes asking `door` which phase serves them.
fn serve_http(edge: &Edge, listener: Listening, door: Door) -> Result<ServerHandle, StartError> {
    let access = edge.access.clone();
    let door = web::Data::new(door);
    let server = HttpServer::new(move || {
        App::new()
            .wrap_fn(limit_header_size)
            .wrap_fn(guard(&access))
            .app_data(door.clone())
            .configure(routes)
    })
    .on_connect(no_delay)
    .workers(2)
    .shutdown_timeout(5)
    .disable_signals();
    let server = edge
        .listen(server, listener.listener)
        .map_err(|source| StartError::Bind {
            addr: listener.name.clone(),
            source,
        })?;
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    Ok(handle)
}

/// The bound listening socket.
struct Listening {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    /// As given (`--host:--port`), for errors.
    name: String,
}

fn listen(host: &str, port: u16) -> Result<Listening, StartError> {
    let name = format!("{host}:{port}");
    let bind_error = |source| StartError::Bind {
        addr: name.clone(),
        source,
    };
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(bind_error)?
        .next()
        .ok_or_else(|| bind_error(std::io::Error::other("the host resolves to no address")))?;
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(bind_error)?;
    socket.set_reuseaddr(true).map_err(bind_error)?;
    socket.bind(addr).map_err(bind_error)?;
    let listener = socket
        .listen(1024)
        .and_then(|l| l.into_std())
        .map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    Ok(Listening {
        listener,
        addr,
        name,
    })
}
