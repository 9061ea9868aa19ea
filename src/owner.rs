//! The owner's side of an instance (PROTOCOL.md §14): the actors that ingest, store, purge
//! and watch the backup, started on a change log this instance owns (SQLite's, always; a
//! shared change DB's once it took ownership), and stopped again.
//!
//! [`Owner::start`] reads back the safety state a previous run (or owner) wrote (PROTOCOL.md
//! §3, §13), starts the actors (streamer and purger always; the backup monitor's three actors
//! when `--litestream-backup-url` is set) and the upstream client when `--upstream` is set. A
//! standby that took over hands it its streamer with every subscriber ([`Kept`]): the streamer
//! switches to ingesting before the upstream client starts, so its subscribers go on with what
//! the new owner ingests, with no close, gap or duplicate (PROTOCOL.md §14.1); its
//! reservations are handed to the new reservation actor, which adopts them as its own (their
//! sockets open, written down, cleanup paused).
//!
//! Each actor gets its part of the safety state before it starts: the purger the watermarks
//! scheduled and not yet purged, the cleanup actor the learned delay, the recorded watermarks
//! and the last scheduled one, the reservation actor the reservations open at the last stop
//! (orphans that end once the restored cleanup delay has passed since this start). Every
//! piece is written in its own transaction as it changes, so whatever moment a `kill -9` hit,
//! what is read back is a state the previous run had.
//!
//! [`Owner::stop`] with [`StopMode::Graceful`] is the path taken on SIGINT/SIGTERM: stop
//! reading upstream, stop polling, close every reservation and subscription with 1001 (each
//! actor's `Stop` carries that end), wait until every session has ended ([`crate::shutdown`]),
//! wait until everything queued on the change log is durable, then stop the remaining actors.
//! [`StopMode::HandOver`] is the end of an owner deposed from a shared change DB: the same,
//! but every session is closed at once with 1011 and nothing is flushed. The HTTP server is
//! the instance's ([`crate::instance`]), not the owner's: it outlives every phase.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::ChangeLog;
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::clock::Clock;
use change_streamer_actors::instance::recorder::{Holders, InstanceRecorder, Serve, StandBy};
use change_streamer_actors::instance::InstanceId;
use change_streamer_actors::monitor::{BackupSource, ControlSource, MonitorActor, MonitorConfig};
use change_streamer_actors::purger::Purger;
use change_streamer_actors::reservation::records::ReservationHolder;
use change_streamer_actors::reservation::standby::{HandOver, StandbyReservations};
use change_streamer_actors::reservation::ReservationActor;
use change_streamer_actors::session_end::SessionEnd;
use change_streamer_actors::streamer::{Ingest, ReportBackupAcks, Streamer};
use change_streamer_actors::upstream::{self, UpstreamConfig, UpstreamHandle};
use change_streamer_actors::vfs::{HelperCommand, VfsError, VfsReader, VfsSource};
use change_streamer_actors::{cleanup, monitor, purger, reservation, streamer};
use log::{info, warn};

use crate::config::Config;
use crate::edge::Edge;
use crate::http::standby::STANDBY_REASON;
use crate::http::{AppState, BackupActors};
use crate::shutdown::{Drain, StopMode, SESSION_DRAIN};
use crate::start_error::StartError;

/// A standby's streamer, its reservations and the guards of its sessions, handed to the
/// owner it becomes.
pub(crate) struct Kept {
    pub streamer: Addr<Streamer>,
    /// Handed to the owner's reservation actor once it runs (PROTOCOL.md §14.1); both exist
    /// exactly when `--litestream-backup-url` is set.
    pub reservations: Option<Addr<StandbyReservations>>,
    pub drain: Drain,
}

/// The owner's actors, while they run.
pub struct Owner {
    state: AppState,
    upstream: Option<UpstreamHandle>,
    drain: Drain,
}

impl Owner {
    /// Starts the owner's actors on `log` (owned), as instance `instance`, keeping the
    /// streamer of a standby that took over (`kept`); `recorder` keeps the instance's record
    /// in a shared change DB and is told what it serves with.
    pub(crate) async fn start(
        config: Arc<Config>,
        log: ChangeLog,
        kept: Option<Kept>,
        clock: Clock,
        edge: &Edge,
        instance: InstanceId,
        recorder: Option<Addr<InstanceRecorder>>,
    ) -> Result<Owner, StartError> {
        let read = async {
            let stats = log.stats().await?;
            let safety = log.load_state().await?;
            let vfs = match &config.litestream_vfs {
                Some(path) => Some(check_vfs(&config, path).await?),
                None => None,
            };
            Ok::<_, StartError>((stats, safety, vfs))
        };
        let (stats, safety, vfs) = match read.await {
            Ok(read) => read,
            Err(e) => {
                // A kept streamer's subscribers have nothing more coming, nor will its
                // reservations pause anything: close them.
                if let Some(k) = kept {
                    let end = Some(SessionEnd::Unavailable(STANDBY_REASON.into()));
                    k.streamer.do_send(streamer::Stop { end: end.clone() });
                    if let Some(r) = k.reservations {
                        r.do_send(reservation::Stop { end });
                    }
                }
                return Err(e);
            }
        };

        // A standby that takes over keeps its streamer and every subscriber of it; it ingests
        // from here on (the upstream client starts below, after this).
        let (streamer, kept_reservations, drain) = match kept {
            Some(Kept {
                streamer,
                reservations,
                drain,
            }) => {
                let _ = streamer
                    .send(Ingest {
                        log: log.clone(),
                        stats: stats.clone(),
                    })
                    .await;
                (streamer, reservations, drain)
            }
            None => (
                Streamer::new(config.streamer(), log.clone(), &stats).start(),
                None,
                Drain::default(),
            ),
        };
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
                // The reservation actor's address first: on a shared change DB the cleanup
                // actor asks it at each poll for the other instances' reservations.
                let reservations_ctx = Context::<ReservationActor>::new();
                let mut cleanup = CleanupActor::new(
                    clock.clone(),
                    config.initial_cleanup_delay(),
                    config.min_cleanup_delay(),
                    purger.clone().recipient(),
                )
                .restore(&safety, log.clone());
                if recorder.is_some() {
                    cleanup = cleanup.with_others(reservations_ctx.address().recipient());
                }
                let cleanup = cleanup.start();
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
                if let Some(r) = &recorder {
                    reservations = reservations.with_records(r.clone());
                }
                let reservations = reservations_ctx.run(reservations);
                // The standby's reservations are this actor's now (adopted before anything
                // the owner's door could send it), their sessions' messages forwarded to it.
                if let Some(r) = &kept_reservations {
                    let to = reservations.clone();
                    if let Ok(n) = r.send(HandOver { to }).await {
                        info!("{n} snapshot reservation(s) of the standby phase adopted, their sockets kept");
                    }
                }
                let monitor = match (vfs, control_source(&config)) {
                    // PROTOCOL.md §8.1c: the streamer tells the monitor each backup ack.
                    (None, Some(source)) => {
                        let mut cfg = MonitorConfig::with_source(
                            BackupSource::Control(source),
                            config.backup_check_interval(),
                        );
                        cfg.clock = clock.clone();
                        let monitor = MonitorActor::new(cfg, cleanup.clone()).start();
                        streamer.do_send(ReportBackupAcks {
                            to: monitor.clone().recipient(),
                        });
                        monitor
                    }
                    (None, None) => MonitorActor::new(
                        MonitorConfig::new(
                            config.litestream_metrics_url.clone(),
                            config.backup_check_interval(),
                        ),
                        cleanup.clone(),
                    )
                    .start(),
                    (Some((source, reader)), _) => {
                        let mut cfg = MonitorConfig::with_source(
                            BackupSource::Vfs(source),
                            config.backup_check_interval(),
                        );
                        cfg.clock = clock.clone();
                        MonitorActor::new(cfg, cleanup.clone())
                            .with_vfs_reader(reader)
                            .reporting_backups_to(reservations.clone().recipient())
                            .start()
                    }
                };
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
                reservations: state.backup.as_ref().map(|b| ReservationHolder {
                    list: b.reservations.clone().recipient(),
                    ended: b.reservations.clone().recipient(),
                    record_rows: false,
                }),
            }));
        }
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
        Ok(Owner {
            state,
            upstream,
            drain,
        })
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Stops the owner's actors, `mode` saying how (see the module documentation): gracefully,
    /// or as a deposed owner (PROTOCOL.md §14). Nothing here sleeps: each step awaits the one
    /// before it, and only the wait for the sessions is bounded ([`SESSION_DRAIN`]).
    pub async fn stop(self, mode: StopMode) {
        match mode {
            StopMode::Graceful => info!("stopping change-streamer"),
            StopMode::HandOver => info!("stepping down: closing every session"),
        }
        let Owner {
            state,
            upstream,
            drain,
        } = self;
        let AppState {
            streamer,
            purger,
            log,
            backup,
            recorder,
            ..
        } = state;
        // No more changes from upstream.
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
        // Only now does this instance hold no subscriber or reservation: until its sessions
        // were closed, its record held their floor for the next owner's purge.
        if let Some(r) = &recorder {
            r.do_send(StandBy);
        }
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

/// `--litestream-control-url` with its `--litestream-db-path` (PROTOCOL.md §8.1c); clap makes
/// sure that one comes with the other.
fn control_source(config: &Config) -> Option<ControlSource> {
    Some(ControlSource {
        url: config.litestream_control_url.clone()?,
        db_path: config.litestream_db_path.clone()?,
    })
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
