//! Starting and stopping the whole service.
//!
//! [`Service::start`] opens the change log, reads back the safety state a previous run wrote
//! there (PROTOCOL.md §3, §13), binds the listening socket (so that a refused address fails before
//! anything else runs), starts the actors (streamer and purger always; the backup monitor's
//! three actors when `--litestream-backup-url` is set), the upstream client when `--upstream`
//! is set, and the HTTP server, and returns once it is listening.
//!
//! Each actor gets its part of the safety state before it starts: the purger the watermarks
//! scheduled and not yet purged, the cleanup actor the learned delay, the recorded watermarks
//! and the last scheduled one, the reservation actor the reservations open at the last stop
//! (orphans that end once the restored cleanup delay has passed since this start). Every
//! piece is written in its own transaction as it changes, so whatever moment a `kill -9` hit,
//! what is read back is a state the previous run had.
//!
//! [`Service::stop`] with [`StopMode::Graceful`] is the path taken on SIGINT/SIGTERM: stop
//! accepting, stop reading upstream, stop polling, close every reservation and subscription
//! with 1001 (each actor's `Stop` carries that end), wait until every session has ended
//! ([`crate::shutdown`]) and the HTTP server has stopped, wait until everything queued on the
//! change log is durable, then stop the remaining actors. [`StopMode::HandOver`] is the end of
//! an owner deposed from a shared change DB ([`crate::ownership`]): the same, but every session
//! is closed at once with 1011, nothing is flushed, and the listening socket is handed back.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_web::rt::net::TcpSocket;
use actix_web::{web, App, HttpServer};
use change_streamer_actors::changelog::{ChangeLog, ChangeLogError, SEGMENT_ROWS};
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::instance::recorder::{Holders, InstanceRecorder, Serve, StandBy};
use change_streamer_actors::instance::InstanceId;
use change_streamer_actors::monitor::{BackupSource, MonitorActor, MonitorConfig};
use change_streamer_actors::purger::Purger;
use change_streamer_actors::reservation::ReservationActor;
use change_streamer_actors::session_end::SessionEnd;
use change_streamer_actors::streamer::Streamer;
use change_streamer_actors::upstream::{self, UpstreamConfig, UpstreamHandle};
use change_streamer_actors::vfs::{HelperCommand, VfsError, VfsReader, VfsSource};
use change_streamer_actors::{cleanup, monitor, purger, reservation, streamer};
use log::{info, warn};

use crate::config::{Config, SecretFlagError};
use crate::edge::{no_delay, Edge};
use crate::http::access::guard;
use crate::http::{limit_header_size, routes, AppState, BackupActors};
use crate::ownership::own_change_db;
use crate::shutdown::{Drain, StopMode};
use crate::standby::{streamer_config, STANDBY_REASON};
use crate::tls::TlsError;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("--data-dir: {0}")]
    ChangeLog(#[from] ChangeLogError),
    #[error("--change-db: {0}")]
    ChangeDb(ChangeLogError),
    #[error("cannot listen on {addr} (--host, --port): {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("--litestream-vfs: {0}")]
    LitestreamVfs(VfsError),
    #[error(transparent)]
    Secret(#[from] SecretFlagError),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

impl StartError {
    /// The ids of the flags whose values the error is about.
    pub fn flags(&self) -> &'static [&'static str] {
        match self {
            StartError::ChangeLog(_) => &["data_dir"],
            StartError::ChangeDb(_) => &["change_db"],
            StartError::Bind { .. } => &["host", "port"],
            StartError::LitestreamVfs(_) => &["litestream_vfs"],
            StartError::Secret(e) => e.flags(),
            StartError::Tls(e) => match e.flag_id() {
                "tls_cert" => &["tls_cert"],
                "tls_key" => &["tls_key"],
                _ => &["upstream_ca_file"],
            },
        }
    }
}

/// A running service.
pub struct Service {
    addr: SocketAddr,
    state: AppState,
    server: actix_web::dev::ServerHandle,
    upstream: Option<UpstreamHandle>,
    drain: Drain,
}

impl Service {
    /// Starts everything on the current actix system; `clock` is the time the backup side
    /// reads (the system clock in production).
    pub async fn start(config: Config, clock: Clock) -> Result<Service, StartError> {
        let config = Arc::new(config);
        let edge = Edge::load(&config)?;
        // Bind before any actor starts, so that a refused address stops nothing but this. On a
        // shared change DB, bind first: a standby answers there until it owns it (PROTOCOL.md §14).
        let (log, listener) = match &config.change_db {
            None => {
                let log = ChangeLog::open_with(&config.data_dir, SEGMENT_ROWS, clock.clone())?;
                (log, listen(&config.host, config.port)?)
            }
            Some(url) => {
                let listener = listen(&config.host, config.port)?;
                let log = own_change_db(&config, url, &listener, &edge)
                    .await
                    .map_err(StartError::ChangeDb)?;
                (log, listener)
            }
        };
        let instance = InstanceId::new(listener.addr, &clock);
        Service::serve(config, log, listener, clock, edge, instance, None).await
    }

    /// Starts everything on an opened change log (owned, if it is a shared one), serving on
    /// `listener` as instance `instance`; `recorder` keeps its record in a shared change DB
    /// and is told what it serves with.
    pub(crate) async fn serve(
        config: Arc<Config>,
        log: ChangeLog,
        listener: Listening,
        clock: Clock,
        edge: Edge,
        instance: InstanceId,
        recorder: Option<Addr<InstanceRecorder>>,
    ) -> Result<Service, StartError> {
        let stats = log.stats().await?;
        let safety = log.load_state().await?;
        let drain = Drain::default();
        let vfs = match &config.litestream_vfs {
            Some(path) => Some(check_vfs(&config, path).await?),
            None => None,
        };

        let streamer = Streamer::new(streamer_config(&config), log.clone(), &stats).start();
        let purger = Purger::new(
            streamer.clone().recipient(),
            config.purge_delay(),
            config.change_log_retention(),
            clock.clone(),
        )
        .restore(&safety.scheduled)
        .start();

        let backup = match &config.litestream_backup_url {
            None => {
                warn!("no --litestream-backup-url: the backup monitor is off, nothing will be purged, and snapshot reservations are refused");
                None
            }
            Some(url) => {
                let cleanup = CleanupActor::new(
                    clock.clone(),
                    config.initial_cleanup_delay(),
                    config.min_cleanup_delay(),
                    purger.clone().recipient(),
                )
                .restore(&safety, log.clone())
                .start();
                // Orphans end after the delay this start goes on with: the learned one, never
                // below this run's starting delay (as the cleanup actor restores it).
                let cleanup_delay = safety
                    .cleanup_delay
                    .unwrap_or_default()
                    .max(config.starting_cleanup_delay());
                let mut reservations = ReservationActor::new(
                    clock.clone(),
                    url.clone(),
                    streamer.clone().recipient(),
                    cleanup.clone(),
                )
                .with_max_reservation(config.max_reservation())
                .restore(&safety.reservations, cleanup_delay, log.clone());
                if vfs.is_some() {
                    reservations = reservations.verifying_backups();
                }
                let reservations = reservations.start();
                let monitor = match vfs {
                    None => MonitorActor::new(
                        MonitorConfig::new(
                            config.litestream_metrics_url.clone(),
                            config.backup_check_interval(),
                        ),
                        cleanup.clone(),
                    ),
                    Some((source, reader)) => {
                        let mut cfg = MonitorConfig::with_source(
                            BackupSource::Vfs(source),
                            config.backup_check_interval(),
                        );
                        cfg.clock = clock.clone();
                        MonitorActor::new(cfg, cleanup.clone())
                            .with_vfs_reader(reader)
                            .reporting_backups_to(reservations.clone().recipient())
                    }
                }
                .start();
                Some(BackupActors {
                    reservations,
                    cleanup,
                    monitor,
                })
            }
        };

        let state = AppState {
            config: config.clone(),
            streamer: streamer.clone(),
            purger,
            log: log.clone(),
            backup,
            guards: drain.guards(),
            access: edge.access.clone(),
            instance,
            recorder,
        };
        if let Some(r) = &state.recorder {
            r.do_send(Serve(Holders {
                log: log.clone(),
                streamer: streamer.clone(),
                reservations: state.backup.as_ref().map(|b| b.reservations.clone()),
            }));
        }
        let app_state = web::Data::new(state.clone());
        let access = edge.access.clone();
        let server = HttpServer::new(move || {
            App::new()
                .wrap_fn(limit_header_size)
                // The last one wrapped runs first: the access rule before anything else.
                .wrap_fn(guard(&access))
                .app_data(app_state.clone())
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
        let addr = listener.addr;
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        info!(
            "change-streamer listening on {addr} ({}, change log {})",
            edge.scheme(),
            log.location()
        );
        edge.access
            .log_mode(&addr.to_string(), config.allow_unauthenticated);

        let upstream = config.upstream.as_ref().map(|url| {
            upstream::start(
                UpstreamConfig {
                    secret: edge.upstream_secret.clone(),
                    tls: edge.upstream_tls.clone(),
                    ..UpstreamConfig::new(url.clone())
                },
                log.clone(),
                streamer.clone(),
            )
        });
        if upstream.is_none() {
            warn!("no --upstream: serving the stored change log only; nothing new will arrive");
        }
        Ok(Service {
            addr,
            state,
            server: handle,
            upstream,
            drain,
        })
    }

    /// The address the HTTP server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Stops the service, `mode` saying how (see the module documentation): gracefully, or, as
    /// a deposed owner (PROTOCOL.md §14), handing the listening socket back to its standby. Nothing
    /// here sleeps: each step awaits the one before it, and only the wait for the sessions is
    /// bounded ([`SESSION_DRAIN`]).
    pub async fn stop(self, mode: StopMode) {
        match mode {
            StopMode::Graceful => info!("stopping change-streamer"),
            StopMode::HandOver => info!("stepping down: closing every session"),
        }
        let Service {
            state,
            server,
            upstream,
            drain,
            ..
        } = self;
        let AppState {
            streamer,
            purger,
            log,
            backup,
            recorder,
            ..
        } = state;
        // From here on this instance holds no subscriber or reservation.
        if let Some(r) = &recorder {
            r.do_send(StandBy);
        }
        // No new connections from here on; no more changes from upstream.
        server.pause().await;
        if let Some(u) = upstream {
            u.stop().await;
        }
        // Who closes the sessions: on a graceful stop the actors holding them, with 1001 after
        // their last frames; on a hand-over the drain, every session at once with 1011 (what
        // the reservation actor wrote down stays, so the next owner finds it orphaned, and the
        // change log refuses any write anyway: ChangeLogError::NotOwner).
        let end = match mode {
            StopMode::Graceful => Some(SessionEnd::ServiceStop),
            StopMode::HandOver => None,
        };
        if let Some(b) = &backup {
            let _ = b.monitor.send(monitor::Stop).await;
            let _ = b
                .reservations
                .send(reservation::Stop { end: end.clone() })
                .await;
        }
        match mode {
            StopMode::Graceful => {
                let _ = streamer.send(streamer::Stop { end }).await;
            }
            StopMode::HandOver => {
                if let Some(b) = &backup {
                    let _ = b.cleanup.send(cleanup::Stop).await;
                }
                let _ = purger.send(purger::Stop).await;
            }
        }
        // Each session drops its guard once its close frame is written and it has stopped.
        let closing = match mode {
            StopMode::Graceful => None,
            StopMode::HandOver => Some(SessionEnd::Unavailable(STANDBY_REASON.into())),
        };
        if !drain.stop(closing.as_ref(), SESSION_DRAIN).await {
            warn!(
                "sessions still open {} s after the stop notice; stopping without them",
                SESSION_DRAIN.as_secs()
            );
        }
        // On a hand-over, what is left are idle keep-alive connections, which should not hold
        // the socket back from the standby.
        server.stop(mode.finishes_connections()).await;
        match mode {
            StopMode::Graceful => {
                match log.barrier().await {
                    Ok(()) => info!("change log flushed"),
                    Err(e) => warn!("change log flush at stop: {e}"),
                }
                if let Some(b) = &backup {
                    let _ = b.cleanup.send(cleanup::Stop).await;
                }
                let _ = purger.send(purger::Stop).await;
                info!("stopped");
            }
            StopMode::HandOver => {
                let _ = streamer.send(streamer::Stop { end: None }).await;
                info!("stepped down: every session closed, nothing more is written");
            }
        }
    }
}

/// PROTOCOL.md §2: a `--litestream-vfs` that cannot be loaded stops the start. The reader that loaded
/// it is kept for the monitor's polls. Without `--litestream-backup-url` nothing will read the
/// backup, but a bad path is still an error, not a surprise for later.
async fn check_vfs(
    config: &Config,
    extension: &std::path::Path,
) -> Result<(VfsSource, VfsReader), StartError> {
    let helper = HelperCommand::for_service().map_err(|e| {
        StartError::LitestreamVfs(VfsError::Spawn {
            program: "change-streamer".into(),
            reason: e.to_string(),
        })
    })?;
    let source = VfsSource {
        helper,
        extension: extension.to_path_buf(),
        backup_url: config.litestream_backup_url.clone().unwrap_or_default(),
        query: config.backup_watermark_query.clone(),
    };
    let mut reader = VfsReader::new(source.clone());
    reader
        .start(VFS_LOAD_LIMIT)
        .await
        .map_err(StartError::LitestreamVfs)?;
    info!("loaded litestream's VFS extension {}", extension.display());
    Ok((source, reader))
}

/// How long loading the VFS extension at start may take (it takes ~0.3 s).
const VFS_LOAD_LIMIT: Duration = Duration::from_secs(10);

/// How long the stop waits for the sessions to close after the notice.
pub const SESSION_DRAIN: Duration = Duration::from_secs(10);

/// A bound listening socket, and how to name it in errors.
pub(crate) struct Listening {
    pub(crate) listener: std::net::TcpListener,
    pub(crate) addr: SocketAddr,
    name: String,
}

impl Listening {
    /// Another handle on the same socket (for a server that may stop before the socket should).
    pub(crate) fn duplicate(&self) -> Result<Listening, StartError> {
        let listener = self
            .listener
            .try_clone()
            .map_err(|source| StartError::Bind {
                addr: self.name.clone(),
                source,
            })?;
        Ok(Listening {
            listener,
            addr: self.addr,
            name: self.name.clone(),
        })
    }
}

/// Binds `host:port` (address reuse on, as actix-web's own `bind` does).
pub(crate) fn listen(host: &str, port: u16) -> Result<Listening, StartError> {
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
