//! The owner's side of an instance (PROTOCOL.md §14): the actors that ingest, store, purge
//! and watch the backup, started on a change log this instance owns (SQLite's, always; a
//! shared change DB's once it took ownership), and stopped again.
//!
//! [`Owner::start`] reads back the safety state a previous run (or owner) wrote (PROTOCOL.md
//! §3, §13), starts the actors (streamer and purger always; the backup's actors, in
//! [`backup`], when `--litestream-backup-url` or `--backups` is set) and the upstream client when `--upstream` is set. A
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
//! [`StopMode::StepDown`] is the end of an owner deposed from a shared change DB: the same,
//! but every session is closed at once with 1011 and nothing is flushed. The HTTP server is
//! the instance's ([`crate::instance`]), not the owner's: it outlives every phase.

use std::sync::Arc;

use actix::prelude::*;
use change_streamer_actors::changelog::{ChangeLog, LogStats, SafetyState};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::instance::recorder::{Holders, InstanceRecorder, Serve, StandBy};
use change_streamer_actors::instance::InstanceId;
use change_streamer_actors::purger::Purger;
use change_streamer_actors::reservation::records::ReservationHolder;
use change_streamer_actors::reservation::standby::StandbyReservations;
use change_streamer_actors::session_end::SessionEnd;
use change_streamer_actors::streamer::{Ingest, Streamer};
use change_streamer_actors::upstream::{self, UpstreamConfig, UpstreamHandle};
use change_streamer_actors::{cleanup, monitor, purger, reservation, streamer};
use log::{info, warn};

use crate::config::Config;
use crate::edge::Edge;
use crate::http::standby::STANDBY_REASON;
use crate::http::{AppState, BackupActors};
use crate::shutdown::{Drain, StopMode, SESSION_DRAIN};
use crate::start_error::StartError;

mod backup;
use backup::{check_vfs, Watched};

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

/// What an owner is started from: the change log it owns, and the instance's parts it runs in.
pub(crate) struct OwnerStart<'a> {
    pub config: Arc<Config>,
    /// The change log this instance owns.
    pub log: ChangeLog,
    /// The streamer of a standby that took over, with its subscribers and reservations.
    pub kept: Option<Kept>,
    pub clock: Clock,
    pub edge: &'a Edge,
    pub instance: InstanceId,
    /// Keeps the instance's record in a shared change DB; told what the owner serves with.
    pub recorder: Option<Addr<InstanceRecorder>>,
}

/// What [`Owner::start`] reads back before it starts anything.
struct ReadBack {
    stats: LogStats,
    safety: SafetyState,
    /// Each backup's source (PROTOCOL.md §8.4), its VFS reader loaded when it has one.
    sources: Vec<Watched>,
}

impl Owner {
    /// Starts the owner's actors (see the module documentation), in the order that each one's
    /// peers exist before it: read back, streamer, purger, the backup's three actors, then the
    /// record of what it serves with and the upstream client.
    pub(crate) async fn start(mut start: OwnerStart<'_>) -> Result<Owner, StartError> {
        let kept = start.kept.take();
        let read = match start.read_back().await {
            Ok(read) => read,
            Err(e) => {
                if let Some(k) = kept {
                    k.close();
                }
                return Err(e);
            }
        };
        let (streamer, kept_reservations, drain) = start.streamer(kept, &read.stats).await;
        let purger = start.purger(&streamer, &read.safety);
        let backup = start
            .backup(&streamer, &purger, read, kept_reservations)
            .await;
        let state = AppState {
            config: start.config.clone(),
            streamer,
            purger,
            log: start.log.clone(),
            backup,
            guards: drain.guards(),
            access: start.edge.access.clone(),
            instance: start.instance.clone(),
            recorder: start.recorder.clone(),
        };
        record_serving(&state);
        let upstream = start.upstream(&state.streamer);
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
            StopMode::Graceful => self.stop_gracefully().await,
            StopMode::StepDown => self.step_down().await,
        }
    }

    /// SIGINT/SIGTERM: the actors holding the sessions close them with 1001 after their last
    /// frames, and the change log is flushed before the purge stops.
    async fn stop_gracefully(self) {
        info!("stopping change-streamer");
        let Owner {
            state,
            upstream,
            drain,
        } = self;
        let end = Some(SessionEnd::ServiceStop);
        stop_intake(upstream, &state.backup, end.clone()).await;
        let _ = state.streamer.send(streamer::Stop { end }).await;
        drain_sessions(drain, None).await;
        stand_by(&state);
        match state.log.barrier().await {
            Ok(()) => info!("change log flushed"),
            Err(e) => warn!("change log flush at stop: {e}"),
        }
        stop_purging(&state).await;
        info!("stopped");
    }

    /// A deposed owner: the purge stops first, then the drain closes every session at once
    /// with 1011 (what the reservation actor wrote down stays, so the next owner finds it
    /// orphaned, and the change log refuses any write anyway: `ChangeLogError::NotOwner`).
    async fn step_down(self) {
        info!("stepping down: closing every session");
        let Owner {
            state,
            upstream,
            drain,
        } = self;
        stop_intake(upstream, &state.backup, None).await;
        stop_purging(&state).await;
        let closing = SessionEnd::Unavailable(STANDBY_REASON.into());
        drain_sessions(drain, Some(&closing)).await;
        stand_by(&state);
        let _ = state.streamer.send(streamer::Stop { end: None }).await;
        info!("stepped down: every session closed, nothing more is written");
    }
}

impl Kept {
    /// A kept streamer's subscribers have nothing more coming, nor will its reservations
    /// pause anything: close them.
    fn close(self) {
        let end = Some(SessionEnd::Unavailable(STANDBY_REASON.into()));
        self.streamer.do_send(streamer::Stop { end: end.clone() });
        if let Some(r) = self.reservations {
            r.do_send(reservation::Stop { end });
        }
    }
}

impl OwnerStart<'_> {
    /// The safety state a previous run (or owner) wrote, and the VFS, checked before anything
    /// starts.
    async fn read_back(&self) -> Result<ReadBack, StartError> {
        let stats = self.log.stats().await?;
        let safety = self.log.load_state().await?;
        let backups = self.config.backups();
        if let (true, Some(path)) = (backups.is_empty(), &self.config.litestream_vfs) {
            let query = self.config.backup_watermark_query.clone();
            check_vfs(path, String::new(), query).await?;
        }
        let sources = self.watched(backups).await?;
        Ok(ReadBack {
            stats,
            safety,
            sources,
        })
    }

    /// A standby that takes over keeps its streamer and every subscriber of it; it ingests
    /// from here on (the upstream client starts after this). Otherwise a new streamer.
    async fn streamer(
        &self,
        kept: Option<Kept>,
        stats: &LogStats,
    ) -> (Addr<Streamer>, Option<Addr<StandbyReservations>>, Drain) {
        match kept {
            Some(Kept {
                streamer,
                reservations,
                drain,
            }) => {
                let _ = streamer
                    .send(Ingest {
                        log: self.log.clone(),
                        stats: stats.clone(),
                    })
                    .await;
                (streamer, reservations, drain)
            }
            None => (
                Streamer::new(self.config.streamer(), self.log.clone(), stats).start(),
                None,
                Drain::default(),
            ),
        }
    }

    fn purger(&self, streamer: &Addr<Streamer>, safety: &SafetyState) -> Addr<Purger> {
        Purger::new(
            streamer.clone().recipient(),
            self.config.purge_delay(),
            self.config.change_log_retention(),
            self.clock.clone(),
        )
        .restore(&safety.scheduled)
        .start()
    }

    fn upstream(&self, streamer: &Addr<Streamer>) -> Option<UpstreamHandle> {
        let Some(url) = &self.config.upstream else {
            warn!("no --upstream: serving the stored change log only; nothing new will arrive");
            return None;
        };
        Some(upstream::start(
            UpstreamConfig {
                secret: self.edge.upstream_secret.clone(),
                tls: self.edge.upstream_tls.clone(),
                ping_interval: self.config.upstream_ping_interval(),
                ..UpstreamConfig::new(url.clone())
            },
            self.log.clone(),
            streamer.clone(),
        ))
    }
}

/// On a shared change DB, the instance's record learns what the owner serves with.
fn record_serving(state: &AppState) {
    if let Some(r) = &state.recorder {
        r.do_send(Serve(Holders {
            log: state.log.clone(),
            streamer: state.streamer.clone(),
            reservations: state.backup.as_ref().map(|b| ReservationHolder {
                list: b.reservations.clone().recipient(),
                ended: b.reservations.clone().recipient(),
                record_rows: false,
            }),
        }));
    }
}

/// The first steps of either stop: no more changes from upstream, no more polls, and the
/// reservations closed with `end` (`None`: the drain closes their sockets).
async fn stop_intake(
    upstream: Option<UpstreamHandle>,
    backup: &Option<BackupActors>,
    end: Option<SessionEnd>,
) {
    if let Some(u) = upstream {
        u.stop().await;
    }
    if let Some(b) = backup {
        for m in &b.monitors {
            let _ = m.send(monitor::Stop).await;
        }
        let _ = b.reservations.send(reservation::Stop { end }).await;
    }
}

/// Each session drops its guard once its close frame is written and it has stopped; with
/// `closing`, the drain writes that frame to every session itself.
async fn drain_sessions(drain: Drain, closing: Option<&SessionEnd>) {
    if !drain.stop(closing, SESSION_DRAIN).await {
        warn!(
            "sessions still open {} s after the stop notice; stopping without them",
            SESSION_DRAIN.as_secs()
        );
    }
}

/// Only once its sessions are closed does this instance hold no subscriber or reservation:
/// until then, its record held their floor for the next owner's purge.
fn stand_by(state: &AppState) {
    if let Some(r) = &state.recorder {
        r.do_send(StandBy);
    }
}

async fn stop_purging(state: &AppState) {
    if let Some(b) = &state.backup {
        let _ = b.cleanup.send(cleanup::Stop).await;
    }
    let _ = state.purger.send(purger::Stop).await;
}
