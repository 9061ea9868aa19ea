//! A serving standby's running parts (PROTOCOL.md §14.1): while an instance stands by on a shared
//! change DB with `--standby-serves` (the default), a [`Streamer`] of its own serves
//! `/changes` from the change DB, fed by a [`follower`] of the owner's commits and storing
//! nothing; its joining subscribers are recorded in the change DB first, so that the owner's
//! purge holds them back ([`InstanceRecorder`](change_streamer_actors::instance::recorder)).
//! With `--litestream-backup-url` it also holds `/snapshot` reservations
//! ([`StandbyReservations`]), recorded in the change DB so that they pause the owner's cleanup.
//! Its follower and its change log's reader report to a [`StallWatch`] of its own (stages
//! `follower` and `catchup`, PROTOCOL.md §11.1), which its `/readyz` and `/metrics` ask.
//! What the standby answers over HTTP is `http/standby.rs`.
//!
//! Its end is one of two: [`StandbyServing::stop`] (a graceful stop, or an error the instance
//! cannot go on after: subscribers closed with 1001), or [`StandbyServing::take_over`]: this
//! instance became the owner, and the streamer, with every subscriber, goes on as the owner's
//! ([`Kept`]). Its reservations go on too, on the same sockets: [`Kept`] carries their actor,
//! and the owner's start hands them to its own reservation actor, which adopts them as its own
//! (PROTOCOL.md §14.1; `HandOver` in `reservation/standby/handover.rs`).

use actix::prelude::*;
use change_streamer_actors::changelog::{ChangeLog, LogStats};
use change_streamer_actors::clock::Clock;
use change_streamer_actors::follower::{self, FollowerHandle};
use change_streamer_actors::instance::recorder::{Holders, InstanceRecorder, Serve, StandBy};
use change_streamer_actors::instance::InstanceId;
use change_streamer_actors::reservation;
use change_streamer_actors::reservation::records::ReservationHolder;
use change_streamer_actors::reservation::standby::StandbyReservations;
use change_streamer_actors::session_end::SessionEnd;
use change_streamer_actors::stall::{self, stage, StallReport, StallWatch};
use change_streamer_actors::streamer::{self, Streamer};
use log::{info, warn};

use crate::config::{Config, SourceSpec};
use crate::http::standby::Serving;
use crate::owner::Kept;
use crate::shutdown::{Drain, SESSION_DRAIN};

/// A serving standby's streamer, follower and sessions.
pub(crate) struct StandbyServing {
    streamer: Addr<Streamer>,
    reservations: Option<Addr<StandbyReservations>>,
    follower: FollowerHandle,
    drain: Drain,
    recorder: Addr<InstanceRecorder>,
    stall: Addr<StallWatch>,
}

impl StandbyServing {
    /// Starts serving from the change DB at `url`, recording through `recorder`; answers what
    /// the standby's handlers serve with. `None` (not serving, with a warning) if the change
    /// DB's handle cannot be made.
    pub(crate) async fn start(
        config: &Config,
        url: &str,
        recorder: &Addr<InstanceRecorder>,
        instance: &InstanceId,
        clock: &Clock,
    ) -> Option<(StandbyServing, Serving)> {
        let log = match ChangeLog::open_standby(url) {
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
        let streamer = Streamer::new(config.streamer(), log.clone(), &stats)
            .following(recorder.clone().recipient())
            .start();
        let stall = StallWatch::new(config.stall_alarm()).start();
        log.report_read_stalls_to(&stall);
        let follower = follower::start_reporting(
            url.to_string(),
            log.clone(),
            streamer.clone(),
            stats.max_watermark.clone(),
            StallReport::to(&stall, stage::FOLLOWER),
        );
        let drain = Drain::default();
        let backups = config.backups();
        let verifying = backups
            .iter()
            .any(|b| matches!(b.source, SourceSpec::Vfs { .. }));
        let reservations = backups.first().map(|b| b.url.clone()).map(|backup_url| {
            let r = StandbyReservations::new(
                clock.clone(),
                instance.clone(),
                backup_url.clone(),
                streamer.clone().recipient(),
                recorder.clone(),
            )
            .with_max_reservation(config.max_reservation());
            if verifying { r.verifying_backups() } else { r }.start()
        });
        recorder.do_send(Serve(Holders {
            log: log.clone(),
            streamer: streamer.clone(),
            reservations: reservations.as_ref().map(|r| ReservationHolder {
                list: r.clone().recipient(),
                ended: r.clone().recipient(),
                record_rows: true,
            }),
        }));
        let serving = Serving {
            streamer: streamer.clone(),
            reservations: reservations.clone(),
            log,
            guards: drain.guards(),
            stall: stall.clone(),
        };
        let running = StandbyServing {
            streamer,
            reservations,
            follower,
            drain,
            recorder: recorder.clone(),
            stall,
        };
        Some((running, serving))
    }

    /// Stops serving: every subscriber is closed with 1001.
    pub(crate) async fn stop(self) {
        let StandbyServing {
            streamer,
            reservations,
            follower,
            drain,
            recorder,
            stall,
        } = self;
        // The reservation rows stay as last recorded: the owner orphans them once this
        // instance is gone.
        if let Some(r) = reservations {
            let _ = r
                .send(reservation::Stop {
                    end: Some(SessionEnd::ServiceStop),
                })
                .await;
        }
        follower.stop().await;
        let _ = stall.send(stall::Stop).await;
        let _ = streamer
            .send(streamer::Stop {
                end: Some(SessionEnd::ServiceStop),
            })
            .await;
        if !drain.stop(None, SESSION_DRAIN).await {
            warn!(
                "standby: sessions still open {} s after the stop notice; stopping without them",
                SESSION_DRAIN.as_secs()
            );
        }
        // Only now: its subscribers were held in the record while they were served.
        recorder.do_send(StandBy);
    }

    /// This instance owns the change DB: the follower stops where it stands, and the
    /// streamer with every subscriber goes to the owner, whose `Ingest` has them read the rest
    /// from the change log; the reservations go to the owner too, whose reservation actor
    /// adopts them.
    pub(crate) async fn take_over(self) -> Kept {
        let StandbyServing {
            streamer,
            reservations,
            follower,
            drain,
            stall,
            ..
        } = self;
        follower.stop().await;
        // The owner's stall watch takes over (its own stages; the follower is gone).
        let _ = stall.send(stall::Stop).await;
        info!("taking over: the standby's streamer and its subscribers go to the owner");
        Kept {
            streamer,
            reservations,
            drain,
        }
    }
}
