//! Starting and stopping the whole service.
//!
//! [`Service::start`] opens the change log, starts the actors (streamer and purger always; the
//! backup monitor's three actors when `--litestream-backup-url` is set), the upstream client
//! when `--upstream` is set, and the HTTP server, and returns once it is listening.
//! [`Service::stop`] is the graceful path taken on SIGINT/SIGTERM: stop polling, close every
//! reservation and subscription with 1001, stop reading upstream, stop the HTTP server, and
//! wait until everything queued on the change log is durable.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_web::{web, App, HttpServer};
use change_streamer_actors::changelog::{ChangeLog, ChangeLogError};
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::monitor::{MonitorActor, MonitorConfig, Stop};
use change_streamer_actors::reservation::{CloseAll, ReservationActor};
use change_streamer_actors::streamer::Purger;
use change_streamer_actors::streamer::{CloseAllSubscribers, Streamer, StreamerConfig};
use change_streamer_actors::upstream::{self, UpstreamConfig, UpstreamHandle};
use log::{info, warn};

use crate::config::Config;
use crate::http::{routes, AppState, BackupActors};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("--data-dir: {0}")]
    ChangeLog(#[from] ChangeLogError),
    #[error("cannot listen on {addr} (--host, --port): {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// A running service.
pub struct Service {
    addr: SocketAddr,
    state: AppState,
    server: actix_web::dev::ServerHandle,
    upstream: Option<UpstreamHandle>,
}

impl Service {
    /// Starts everything on the current actix system; `clock` is the time the backup side
    /// reads (the system clock in production).
    pub async fn start(config: Config, clock: Clock) -> Result<Service, StartError> {
        let config = Arc::new(config);
        let log = ChangeLog::open(&config.data_dir)?;
        let stats = log.stats().await?;

        let streamer_cfg = StreamerConfig {
            padding_ms: config.padding_ms(),
            ..StreamerConfig::default()
        };
        let streamer = Streamer::new(streamer_cfg, log.clone(), &stats).start();
        let purger = Purger::new(streamer.clone().recipient(), config.purge_delay()).start();

        let backup = match &config.litestream_backup_url {
            None => {
                warn!("no --litestream-backup-url: the backup monitor is off, nothing will be purged, and snapshot reservations are refused");
                None
            }
            Some(url) => {
                let cleanup = CleanupActor::new(
                    clock.clone(),
                    config.initial_cleanup_delay_ms as i64,
                    config.min_cleanup_delay_ms as i64,
                    purger.clone().recipient(),
                )
                .start();
                let reservations = ReservationActor::new(
                    clock.clone(),
                    url.clone(),
                    streamer.clone().recipient(),
                    cleanup.clone(),
                )
                .start();
                let monitor = MonitorActor::new(
                    MonitorConfig::new(
                        config.litestream_metrics_url.clone(),
                        config.backup_check_interval(),
                    ),
                    cleanup.clone(),
                )
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
        };
        let app_state = web::Data::new(state.clone());
        let bind = (config.host.clone(), config.port);
        let server =
            HttpServer::new(move || App::new().app_data(app_state.clone()).configure(routes))
                // Replication frames are small and latency matters: no Nagle delay.
                .on_connect(|conn, _| {
                    if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
                        let _ = tcp.set_nodelay(true);
                    }
                })
                .workers(2)
                .shutdown_timeout(5)
                .disable_signals()
                .bind(bind.clone())
                .map_err(|source| StartError::Bind {
                    addr: format!("{}:{}", bind.0, bind.1),
                    source,
                })?;
        let addr = server
            .addrs()
            .first()
            .copied()
            .ok_or_else(|| StartError::Bind {
                addr: format!("{}:{}", bind.0, bind.1),
                source: std::io::Error::other("no address bound"),
            })?;
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        info!(
            "change-streamer listening on {addr} (change log {})",
            log.path().display()
        );

        let upstream = config.upstream.as_ref().map(|url| {
            upstream::start(
                UpstreamConfig::new(url.clone()),
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
        })
    }

    /// The address the HTTP server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Graceful stop (see the module documentation).
    pub async fn stop(mut self) {
        info!("stopping change-streamer");
        if let Some(b) = &self.state.backup {
            let _ = b.monitor.send(Stop).await;
            let _ = b.reservations.send(CloseAll).await;
        }
        let _ = self.state.streamer.send(CloseAllSubscribers).await;
        if let Some(u) = self.upstream.take() {
            u.stop().await;
        }
        // Let the sessions write their close frames before the server goes.
        actix_rt::time::sleep(Duration::from_millis(50)).await;
        self.server.stop(true).await;
        match self.state.log.barrier().await {
            Ok(()) => info!("change log flushed; stopped"),
            Err(e) => warn!("change log flush at stop: {e}"),
        }
    }
}
