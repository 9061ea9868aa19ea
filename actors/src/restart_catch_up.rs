//! No backward walk after a restart (PROTOCOL.md §13.1, rocicorp/mono #6465).
//!
//! Before a stop the service had confirmed the backup up to some watermark: the highest it
//! recorded, or the last it scheduled, both read back from the safety state at the start. After
//! the start the backup may show less for a while (a litestream restarted with uploads pending,
//! a VFS that has not listed the newest files, a replica rolled back); a replica sent to it then
//! would restore a state older than the one recorded. So, until an observation made since this
//! start reaches that watermark, no reservation gets its status and `/readyz` is not ready.
//!
//! The [`CleanupActor`] keeps the [`RestartCatchUp`]: it judges by what it receives as
//! `PollResult`s, whatever source (or, with several backups, whatever quorum) produced them, and
//! tells the reservations [`BackupCovered`] once. This file is a leaf: it names neither actor.
//!
//! [`CleanupActor`]: crate::cleanup::CleanupActor

use actix::prelude::*;
use log::info;
use serde::Serialize;

use crate::changelog::SafetyState;
use crate::litestream::BackupSample;
use crate::watermark::Watermark;

/// The backup now covers the watermark recorded before the restart: statuses may be sent.
#[derive(Message, Debug, Clone, Copy, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct BackupCovered;

/// `/status` `backup.restartCatchUp` and the reason of `/readyz` while the backup is behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CatchUpView {
    /// The watermark recorded before the restart.
    pub recorded: Watermark,
    /// The highest watermark observed since the start, if any.
    pub backup: Option<Watermark>,
}

impl CatchUpView {
    /// `/readyz`'s line: `backup behind its recorded watermark (recorded W, backup shows B)`.
    pub fn reason(&self) -> String {
        format!(
            "backup behind its recorded watermark (recorded {}, backup shows {})",
            self.recorded,
            self.backup.as_ref().map_or("none", |b| b.as_str())
        )
    }
}

/// The wait of a start whose safety state recorded a backed-up watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartCatchUp {
    view: CatchUpView,
}

impl RestartCatchUp {
    /// The wait this start owes, from what the previous run wrote down: the highest recorded
    /// watermark or the last scheduled one; `None` when nothing was ever recorded.
    pub fn from_state(state: &SafetyState) -> Option<RestartCatchUp> {
        let recorded = state
            .recorded
            .iter()
            .map(|r| &r.watermark)
            .chain(state.last_scheduled.as_ref())
            .max()?
            .clone();
        Some(RestartCatchUp {
            view: CatchUpView {
                recorded,
                backup: None,
            },
        })
    }

    /// Takes one poll's samples; `true` once they reach the recorded watermark.
    pub fn observe(&mut self, samples: &[BackupSample]) -> bool {
        let Some(top) = samples.iter().map(|s| &s.watermark).max() else {
            return false;
        };
        if self.view.backup.as_ref().is_none_or(|b| top > b) {
            self.view.backup = Some(top.clone());
        }
        if *top >= self.view.recorded {
            info!(
                watermark:% = self.view.recorded; "the backup covers watermark={} recorded before the restart (it shows {top})",
                self.view.recorded
            );
            return true;
        }
        false
    }

    pub fn view(&self) -> &CatchUpView {
        &self.view
    }
}
