//! `BackupQuorum`: several backups, a quorum before any purge (PROTOCOL.md §8.4).
//!
//! It sits between the backups' [`MonitorActor`]s (one per backup, each polling its own
//! source) and the [`CleanupActor`]. Each monitor hands it what each poll observed
//! ([`BackupPolled`]); it keeps, per backup, the watermarks observed above the last one it
//! recorded, the highest one held and since when, and the latest poll's error. It hands the
//! cleanup actor, as one [`PollResult`] per poll, only watermarks that K of the M backups hold,
//! each dated when the K-th backup got there; the cleanup actor's rules (§8.2, §8.3) and its
//! persistence do not change.
//!
//! A backup *holds* W from the earliest time one of its observations was at or above W (a
//! backup holding W holds all that comes before it). Held by fewer backups as W grows, so the
//! watermarks recorded stop at the K-th highest of the backups' highest held watermarks: the
//! *purge floor*. With one backup every sample is handed on as it is, exactly as a monitor
//! without a quorum does.
//!
//! With the VFS, the reservations (PROTOCOL.md §6.7) are told the floor, so that a reservation
//! is verified once K backups hold the change log's minWatermark.
//!
//! [`MonitorActor`]: super::MonitorActor

use std::collections::{BTreeMap, BTreeSet};

use actix::prelude::*;
use log::{debug, info};
use serde::Serialize;

use super::PollOutcome;
use crate::cleanup::{CleanupActor, PollResult};
use crate::clock::Clock;
use crate::litestream::BackupSample;
use crate::reservation::BackupRead;
use crate::watermark::Watermark;

/// The most observations kept per backup above the last recorded watermark; past it every other
/// older one is dropped, which only makes later times count (PROTOCOL.md §8.4).
pub const MAX_OBSERVATIONS: usize = 4096;

/// What one poll of backup number `backup` observed (its monitor's [`PollResult`], with the
/// outcome and, for the VFS source, what it read).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct BackupPolled {
    /// The backup's position in the list the quorum was made with.
    pub backup: usize,
    pub samples: Vec<BackupSample>,
    pub outcome: PollOutcome,
    /// The VFS source's read, for the reservations.
    pub read: Option<BackupRead>,
}

/// `/status` `backups` and `backup.purgeQuorum`, `backup.quorumWatermark` (PROTOCOL.md §11).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "QuorumState")]
pub struct GetQuorumState;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuorumState {
    /// K.
    pub purge_quorum: usize,
    /// The K-th highest of the backups' highest held watermarks; `None` while fewer than K
    /// backups hold anything.
    pub quorum_watermark: Option<Watermark>,
    pub backups: Vec<BackupState>,
}

/// One backup, as `/status` `backups[]` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupState {
    pub name: String,
    pub source: String,
    /// Its highest held watermark.
    pub watermark: Option<Watermark>,
    /// How long ago it first held that watermark.
    pub age_ms: Option<i64>,
    /// Why its latest poll failed; `None` once one succeeds.
    pub last_error: Option<String>,
}

/// What the quorum keeps of one backup.
struct Backup {
    name: String,
    source: String,
    /// Observations above the last recorded watermark: watermark → earliest time observed.
    observed: BTreeMap<Watermark, i64>,
    /// The highest watermark it holds, and since when.
    head: Option<(Watermark, i64)>,
    last_error: Option<String>,
    /// The size its latest VFS read found.
    replica_size: Option<u64>,
}

impl Backup {
    fn observe(&mut self, s: &BackupSample) {
        let t = s.backed_up_at_ms;
        self.observed
            .entry(s.watermark.clone())
            .and_modify(|at| *at = (*at).min(t))
            .or_insert(t);
        match &mut self.head {
            Some((w, at)) if *w == s.watermark => *at = (*at).min(t),
            Some((w, _)) if *w > s.watermark => {}
            _ => self.head = Some((s.watermark.clone(), t)),
        }
        if self.observed.len() > MAX_OBSERVATIONS {
            let older: Vec<Watermark> = self
                .observed
                .keys()
                .rev()
                .skip(1)
                .step_by(2)
                .cloned()
                .collect();
            debug!(
                backup:% = self.name; "backup {}: {} observations above the last recorded watermark; dropping {} older ones",
                self.name,
                self.observed.len(),
                older.len()
            );
            for w in older {
                self.observed.remove(&w);
            }
        }
    }
}

/// See the module documentation.
pub struct BackupQuorum {
    clock: Clock,
    k: usize,
    backups: Vec<Backup>,
    cleanup: Addr<CleanupActor>,
    /// Told the floor after each poll (PROTOCOL.md §6.7); `None` unless some backup is read
    /// through the VFS.
    reservations: Option<Recipient<BackupRead>>,
    /// The highest watermark handed to the cleanup actor.
    recorded: Option<Watermark>,
}

impl BackupQuorum {
    /// A quorum of `k` among `backups` (each a name and its source's name), `1 ≤ k ≤ M`.
    pub fn new(
        clock: Clock,
        k: usize,
        backups: Vec<(String, String)>,
        cleanup: Addr<CleanupActor>,
    ) -> Self {
        let k = k.clamp(1, backups.len().max(1));
        BackupQuorum {
            clock,
            k,
            backups: backups
                .into_iter()
                .map(|(name, source)| Backup {
                    name,
                    source,
                    observed: BTreeMap::new(),
                    head: None,
                    last_error: None,
                    replica_size: None,
                })
                .collect(),
            cleanup,
            reservations: None,
            recorded: None,
        }
    }

    /// Tells `recipient` the floor after each poll (PROTOCOL.md §6.7, §8.4).
    pub fn reporting_backups_to(mut self, recipient: Recipient<BackupRead>) -> Self {
        self.reservations = Some(recipient);
        self
    }

    /// The K-th highest of the backups' highest held watermarks, and the size the backup at
    /// that place last read.
    fn floor(&self) -> Option<(Watermark, Option<u64>)> {
        let mut heads: Vec<(&Watermark, Option<u64>)> = self
            .backups
            .iter()
            .filter_map(|b| b.head.as_ref().map(|(w, _)| (w, b.replica_size)))
            .collect();
        heads.sort_by(|a, b| b.0.cmp(a.0));
        heads.get(self.k - 1).map(|(w, size)| ((*w).clone(), *size))
    }

    /// The watermarks above the last recorded one that K backups hold, each dated when the
    /// K-th got there; the observations they cover are dropped.
    ///
    /// ### Why one sweep, from the floor down
    /// Only watermarks at or below the floor (the K-th highest head) can be held by K. Walking
    /// the candidates from the floor down, each backup's "held since" of a candidate is the
    /// earliest of its observations at or above it: a running minimum that only takes in
    /// more observations as the candidate falls. So each observation is read once per poll,
    /// instead of every candidate scanning every observation above it (quadratic in the
    /// observations kept, up to [`MAX_OBSERVATIONS`] per backup while the quorum is short).
    fn held_by_quorum(&mut self) -> Vec<BackupSample> {
        let Some((floor, _)) = self.floor() else {
            return Vec::new();
        };
        let above = |w: &Watermark| self.recorded.as_ref().is_none_or(|r| w > r);
        let candidates: BTreeSet<&Watermark> = self
            .backups
            .iter()
            .flat_map(|b| b.observed.range(..=floor.clone()).map(|(w, _)| w))
            .filter(|w| above(w))
            .collect();
        // Per backup: its observations from the top down, and the earliest time among those
        // already passed (at or above the current candidate).
        let mut sweeps: Vec<_> = self
            .backups
            .iter()
            .map(|b| (b.observed.iter().rev().peekable(), None::<i64>))
            .collect();
        let mut held = Vec::new();
        for w in candidates.into_iter().rev() {
            let mut since: Vec<(i64, &str)> = Vec::with_capacity(self.backups.len());
            for ((obs, min), b) in sweeps.iter_mut().zip(&self.backups) {
                while let Some((_, &t)) = obs.next_if(|(o, _)| *o >= w) {
                    *min = Some(min.map_or(t, |m| m.min(t)));
                }
                if let Some(t) = *min {
                    since.push((t, b.name.as_str()));
                }
            }
            if since.len() < self.k {
                // At or below the floor the K backups of the highest heads hold it; the rule
                // is checked all the same.
                continue;
            }
            since.sort();
            let quorum = &since[..self.k];
            held.push(BackupSample {
                watermark: w.clone(),
                replica: quorum.iter().map(|(_, n)| *n).collect::<Vec<_>>().join("+"),
                backed_up_at_ms: quorum[self.k - 1].0,
            });
        }
        held.reverse();
        if let Some(last) = held.last() {
            let last = last.watermark.clone();
            for b in &mut self.backups {
                b.observed = b.observed.split_off(&last);
                b.observed.remove(&last);
            }
            self.recorded = Some(last);
        }
        held
    }
}

impl Actor for BackupQuorum {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        let names: Vec<&str> = self.backups.iter().map(|b| b.name.as_str()).collect();
        info!(
            "purge quorum: {} of {} backup(s) ({})",
            self.k,
            self.backups.len(),
            names.join(", ")
        );
    }
}

impl Handler<BackupPolled> for BackupQuorum {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, msg: BackupPolled, _: &mut Context<Self>) -> Self::Result {
        let single = self.backups.len() == 1;
        let Some(b) = self.backups.get_mut(msg.backup) else {
            return Box::pin(async {});
        };
        match &msg.outcome {
            PollOutcome::Failed(reason) => b.last_error = Some(reason.clone()),
            PollOutcome::Read { .. } => b.last_error = None,
            PollOutcome::StillInFlight | PollOutcome::Aborted => {}
        }
        for s in &msg.samples {
            b.observe(s);
        }
        if let Some(read) = &msg.read {
            b.replica_size = read.replica_size;
        }
        let (samples, read) = if single {
            // One backup: its samples and reads, as they are (PROTOCOL.md §8.4).
            b.observed.clear();
            (msg.samples, msg.read)
        } else {
            let read = self.floor().map(|(watermark, replica_size)| BackupRead {
                watermark,
                replica_size,
            });
            (self.held_by_quorum(), read)
        };
        if let (Some(r), Some(read)) = (&self.reservations, read) {
            r.do_send(read);
        }
        // Queued now, in the order of the polls; answered once the cleanup actor acted on it.
        let sent = self.cleanup.send(PollResult { samples });
        Box::pin(async move {
            let _ = sent.await;
        })
    }
}

impl Handler<GetQuorumState> for BackupQuorum {
    type Result = MessageResult<GetQuorumState>;
    fn handle(&mut self, _: GetQuorumState, _: &mut Context<Self>) -> Self::Result {
        let now = self.clock.now_ms();
        MessageResult(QuorumState {
            purge_quorum: self.k,
            quorum_watermark: self.floor().map(|(w, _)| w),
            backups: self
                .backups
                .iter()
                .map(|b| BackupState {
                    name: b.name.clone(),
                    source: b.source.clone(),
                    watermark: b.head.as_ref().map(|(w, _)| w.clone()),
                    age_ms: b.head.as_ref().map(|(_, at)| (now - at).max(0)),
                    last_error: b.last_error.clone(),
                })
                .collect(),
        })
    }
}
