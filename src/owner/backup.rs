//! The owner's backup side (PROTOCOL.md §8, §8.4, §13.1): each backup it watches read from its
//! spec (its VFS extension loaded and checked at start), and the actors that watch them: the
//! cleanup actor, the reservations, the quorum and one monitor per backup, each with its audit
//! when it has one (§8.1d). [`super::Owner::start`] calls these in that order.

use std::time::Duration;

use actix::prelude::*;
use change_streamer_actors::changelog::SafetyState;
use change_streamer_actors::cleanup::CleanupActor;
use change_streamer_actors::monitor::{
    AuditConfig, BackupQuorum, BackupSource, ControlSource, MonitorActor, MonitorConfig,
};
use change_streamer_actors::purger::Purger;
use change_streamer_actors::reservation::standby::{HandOver, StandbyReservations};
use change_streamer_actors::reservation::ReservationActor;
use change_streamer_actors::restart_catch_up::RestartCatchUp;
use change_streamer_actors::streamer::{ReportBackupAcks, RouteBackupAcks, Streamer};
use change_streamer_actors::vfs::{HelperCommand, VfsError, VfsReader, VfsSource};
use log::{info, warn};

use super::{OwnerStart, ReadBack};
use crate::config::{BackupSpec, SourceSpec};
use crate::http::BackupActors;
use crate::start_error::StartError;

/// One backup as its monitor will watch it.
pub(super) struct Watched {
    spec: BackupSpec,
    source: BackupSource,
    /// The VFS source's reader, loaded at start.
    reader: Option<VfsReader>,
    /// A control backup's audit (PROTOCOL.md §8.1d): what it reads, and how often. Its
    /// extension was loaded at start; each audit read starts a reader of its own.
    audit: Option<(VfsSource, Duration)>,
}

impl OwnerStart<'_> {
    /// Each backup the service watches, its source read from its spec and its VFS extension
    /// loaded (PROTOCOL.md §8.4).
    pub(super) async fn watched(
        &self,
        backups: Vec<BackupSpec>,
    ) -> Result<Vec<Watched>, StartError> {
        let mut sources = Vec::with_capacity(backups.len());
        for spec in backups {
            let (source, reader, audit) = match &spec.source {
                SourceSpec::Metrics { url } => {
                    (BackupSource::Metrics { url: url.clone() }, None, None)
                }
                SourceSpec::Control {
                    url,
                    db_path,
                    audit,
                } => {
                    let audit = match audit {
                        Some(a) => {
                            let (vfs, _) = self.load_vfs(&spec, &a.extension, &a.query).await?;
                            a.interval.map(|every| (vfs, every))
                        }
                        None => None,
                    };
                    warn_breaking_environment(&spec);
                    let source = BackupSource::Control(ControlSource {
                        url: url.clone(),
                        db_path: db_path.clone(),
                    });
                    (source, None, audit)
                }
                SourceSpec::Vfs { extension, query } => {
                    let (source, reader) = self.load_vfs(&spec, extension, query).await?;
                    (BackupSource::Vfs(source), Some(reader), None)
                }
            };
            sources.push(Watched {
                spec,
                source,
                reader,
                audit,
            });
        }
        Ok(sources)
    }

    /// `spec`'s VFS extension, loaded and checked (PROTOCOL.md §2): a start error naming the
    /// file, the backup and the key when it came from `--backups`.
    async fn load_vfs(
        &self,
        spec: &BackupSpec,
        extension: &std::path::Path,
        query: &str,
    ) -> Result<(VfsSource, VfsReader), StartError> {
        // PROTOCOL.md §8.4 "On S3": the reader reads with the backup's s3_ settings.
        let checked = check_vfs_with(
            extension,
            spec.s3.reader_url(&spec.url),
            query.to_string(),
            spec.s3.reader_env(),
        )
        .await;
        match (checked, &self.config.backups) {
            (Ok(loaded), _) => Ok(loaded),
            (Err(StartError::LitestreamVfs(source)), Some(file)) => Err(StartError::BackupVfs {
                file: file.path.display().to_string(),
                backup: spec.name.clone(),
                source,
            }),
            (Err(e), _) => Err(e),
        }
    }

    /// The backup monitor's actors, with `--litestream-backup-url` or `--backups`: cleanup,
    /// reservations, the quorum and a monitor per backup; they adopt the reservations of a
    /// standby that took over.
    pub(super) async fn backup(
        &self,
        streamer: &Addr<Streamer>,
        purger: &Addr<Purger>,
        read: ReadBack,
        kept: Option<Addr<StandbyReservations>>,
    ) -> Option<BackupActors> {
        let Some(url) = read.sources.first().map(|w| w.spec.url.clone()) else {
            warn!("no --litestream-backup-url: the backup monitor is off, nothing will be purged, and snapshot reservations are refused");
            return None;
        };
        let url = &url;
        // The reservation actor's address first: on a shared change DB the cleanup actor asks
        // it at each poll for the other instances' reservations.
        let reservations_ctx = Context::<ReservationActor>::new();
        let cleanup = self.cleanup(purger, &read.safety, &reservations_ctx);
        let reservations = self.reservations(url, streamer, &cleanup, &read, reservations_ctx);
        // The standby's reservations are this actor's now (adopted before anything the owner's
        // door could send it), their sessions' messages forwarded to it.
        if let Some(r) = kept {
            let to = reservations.clone();
            if let Ok(n) = r.send(HandOver { to }).await {
                info!(
                    "{n} snapshot reservation(s) of the standby phase adopted, their sockets kept"
                );
            }
        }
        let (monitors, quorum) =
            self.monitors(read.sources, streamer, purger, &cleanup, &reservations);
        Some(BackupActors {
            reservations,
            cleanup,
            monitors,
            quorum,
        })
    }

    fn cleanup(
        &self,
        purger: &Addr<Purger>,
        safety: &SafetyState,
        reservations: &Context<ReservationActor>,
    ) -> Addr<CleanupActor> {
        let mut cleanup = CleanupActor::new(
            self.clock.clone(),
            self.config.initial_cleanup_delay(),
            self.config.min_cleanup_delay(),
            purger.clone().recipient(),
        )
        .restore(safety, self.log.clone())
        .telling_covered(reservations.address().recipient());
        if self.recorder.is_some() {
            cleanup = cleanup.with_others(reservations.address().recipient());
        }
        cleanup.start()
    }

    fn reservations(
        &self,
        url: &str,
        streamer: &Addr<Streamer>,
        cleanup: &Addr<CleanupActor>,
        read: &ReadBack,
        ctx: Context<ReservationActor>,
    ) -> Addr<ReservationActor> {
        // Orphans end after the delay this start goes on with: the learned one, never below
        // this run's starting delay (as the cleanup actor restores it).
        let cleanup_delay = read
            .safety
            .cleanup_delay
            .unwrap_or_default()
            .max(self.config.starting_cleanup_delay());
        let mut reservations = ReservationActor::new(
            self.clock.clone(),
            url.to_string(),
            streamer.clone().recipient(),
            cleanup.clone(),
        )
        .with_max_reservation(self.config.max_reservation())
        .restore(&read.safety.reservations, cleanup_delay, self.log.clone());
        if read.sources.iter().any(|w| w.reader.is_some()) {
            reservations = reservations.verifying_backups();
        }
        if RestartCatchUp::from_state(&read.safety).is_some() {
            reservations = reservations.held_until_backup_covers();
        }
        if let Some(r) = &self.recorder {
            reservations = reservations.with_records(r.clone());
        }
        ctx.run(reservations)
    }

    /// One monitor per backup, each handing its polls to the quorum, which hands the cleanup
    /// actor what K backups hold (PROTOCOL.md §8.4). A monitor polls the metrics; or reads the
    /// backup itself through the VFS, and the quorum tells the reservations (PROTOCOL.md §6.7);
    /// or asks litestream's control API to sync at each commit its backup replicator acks,
    /// which the streamer reports to it (PROTOCOL.md §8.1c): with several backups, each
    /// backup's replicator's acks to its own monitor (PROTOCOL.md §7.1).
    fn monitors(
        &self,
        sources: Vec<Watched>,
        streamer: &Addr<Streamer>,
        purger: &Addr<Purger>,
        cleanup: &Addr<CleanupActor>,
        reservations: &Addr<ReservationActor>,
    ) -> (Vec<Addr<MonitorActor>>, Addr<BackupQuorum>) {
        let interval = self.config.backup_check_interval();
        let several = sources.len() > 1;
        let names = sources
            .iter()
            .map(|w| (w.spec.name.clone(), w.source.name().to_string()))
            .collect();
        let mut quorum = BackupQuorum::new(
            self.clock.clone(),
            self.config.purge_quorum(),
            names,
            cleanup.clone(),
        );
        if sources.iter().any(|w| w.reader.is_some()) {
            quorum = quorum.reporting_backups_to(reservations.clone().recipient());
        }
        let quorum = quorum.start();
        let mut monitors = Vec::with_capacity(sources.len());
        for (i, w) in sources.into_iter().enumerate() {
            let Watched {
                spec,
                source,
                reader,
                audit,
            } = w;
            let control = matches!(source, BackupSource::Control(_));
            if let (BackupSource::Control(c), None) = (&source, &audit) {
                info!(
                    backup:% = spec.name; "no audit of backup {}: it needs a VFS to read it through (PROTOCOL.md §8.1d); {} is trusted as it answers",
                    spec.name, c.url
                );
            }
            let mut cfg = MonitorConfig::with_source(source, interval);
            cfg.clock = self.clock.clone();
            cfg.backup = several.then(|| spec.name.clone());
            cfg.audit = audit.map(|(vfs, interval)| AuditConfig {
                backup: spec.name.clone(),
                vfs,
                interval,
            });
            let mut monitor = MonitorActor::new(cfg, cleanup.clone())
                .in_quorum(i, quorum.clone().recipient())
                .auditing_to(purger.clone().recipient());
            if let Some(reader) = reader {
                monitor = monitor.with_vfs_reader(reader);
            }
            let monitor = monitor.start();
            let to = monitor.clone().recipient();
            if several {
                streamer.do_send(RouteBackupAcks {
                    backup: spec.name,
                    to,
                });
            } else if control {
                streamer.do_send(ReportBackupAcks { to });
            }
            monitors.push(monitor);
        }
        (monitors, quorum)
    }
}

/// PROTOCOL.md §2: a `--litestream-vfs` that cannot be loaded stops the start. The reader that loaded
/// it is kept for the monitor's polls. Without `--litestream-backup-url` nothing will read the
/// backup, but a bad path is still an error, not a surprise for later.
pub(super) async fn check_vfs(
    extension: &std::path::Path,
    backup_url: String,
    query: String,
) -> Result<(VfsSource, VfsReader), StartError> {
    check_vfs_with(extension, backup_url, query, Vec::new()).await
}

/// [`check_vfs`] with the reader's environment `env` (PROTOCOL.md §8.4, "On S3"); an
/// environment that would break litestream's S3 client is a start error too.
async fn check_vfs_with(
    extension: &std::path::Path,
    backup_url: String,
    query: String,
    env: Vec<(String, Option<String>)>,
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
        backup_url,
        query,
        env,
    };
    let mut reader = VfsReader::new(source.clone());
    reader
        .start(VFS_LOAD_LIMIT)
        .await
        .map_err(StartError::LitestreamVfs)?;
    info!("loaded litestream's VFS extension {}", extension.display());
    Ok((source, reader))
}

/// PROTOCOL.md §8.4 "The environment": a control backup on `s3://` cannot see litestream's
/// environment, only the service's; a variable there that would break litestream's S3 client is
/// said at start, since a litestream started with the same environment fails to start.
fn warn_breaking_environment(spec: &BackupSpec) {
    let get = |n: &str| std::env::var(n).ok();
    if let Some(why) = change_streamer_actors::vfs_env::breaking_variable(&spec.url, get) {
        warn!(
            "backup {}: {why}; a litestream replicate started with this environment does not start, and the control source then says `cannot connect`",
            spec.name
        );
    }
}

/// How long loading the VFS extension at start may take (it takes ~0.3 s).
const VFS_LOAD_LIMIT: Duration = Duration::from_secs(10);
