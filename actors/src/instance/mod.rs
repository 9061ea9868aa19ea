//! What an instance of the service is to the others sharing its change DB (PROTOCOL.md §14.1):
//! its id, the record it keeps there, and when that record means it is gone.
//!
//! Every instance has an [`InstanceId`], shown as `/status` `instance` (SQLite included). With
//! a shared change DB each instance also writes an [`InstanceRecord`] there and refreshes it
//! every [`REFRESH_EVERY`] ([`recorder::InstanceRecorder`]); the owner reads the others back as
//! [`InstanceSeen`]. An instance is **gone** once its record is older than [`GONE_AFTER`], or
//! earlier, once PostgreSQL shows the session that wrote it ended (the only earlier sign
//! PROTOCOL.md §14.1 allows): a process killed with `kill -9` loses its connection at once, so
//! the server notices without waiting out the 10 s.

pub mod recorder;

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::clock::Clock;
use crate::ownership::Role;
use crate::watermark::Watermark;

/// How often an instance refreshes its record: twice within the second PROTOCOL.md §14.1
/// asks for, so that one slow refresh does not make it late.
pub const REFRESH_EVERY: Duration = Duration::from_millis(500);

/// How old a record may get before its instance is gone (PROTOCOL.md §14.1).
pub const GONE_AFTER: Duration = Duration::from_secs(10);

/// How long after the start of its last successful refresh a serving standby goes on
/// trusting that its record holds its subscribers' floor: well within [`GONE_AFTER`], so that
/// it gives them up before the owner can count it gone (its clock and the change DB's run at
/// the same rate; the margin covers a refresh's own time).
pub const LEASE: Duration = Duration::from_secs(8);

/// This instance's id, stable for the life of the process: the machine's name, the port it
/// listens on, its process id and when the id was made, so that a restart on the same port
/// is another instance (its predecessor's record must age out, not be taken over).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct InstanceId(String);

impl InstanceId {
    /// The id of the instance listening on `addr`, made now (`clock`).
    pub fn new(addr: SocketAddr, clock: &Clock) -> InstanceId {
        InstanceId(format!(
            "{}:{}-{}-{}",
            host_name().unwrap_or_else(|| addr.ip().to_string()),
            addr.port(),
            std::process::id(),
            clock.now_ms()
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for InstanceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The machine's name (Linux), for an id an operator can place.
fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// What an instance writes about itself at each refresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRecord {
    pub id: InstanceId,
    pub role: Role,
    /// Its connected subscribers: id and the watermark each acked.
    pub subscribers: Vec<(String, Watermark)>,
    /// The reservations its sockets hold.
    pub reservations: u32,
}

/// An instance that is not gone, as read from its record (the owner's `/status` `instances`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSeen {
    pub id: String,
    pub role: String,
    pub subscribers: u32,
    pub reservations: u32,
    /// The age of its record, on the change DB's clock.
    pub last_seen_ms: u64,
}

/// What a refresh found of the record it replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refreshed {
    /// The record was there and younger than [`GONE_AFTER`]: the others never saw it gone.
    Continuous,
    /// There was no record, or it was old enough to count as gone: the first refresh, or the
    /// instance was out of reach for long enough that the others may have treated it as gone.
    New,
}
