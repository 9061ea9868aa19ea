//! The service's anonymous resident memory (`RssAnon` of `/proc/PID/status`): what PROTOCOL.md
//! §10.2 bounds, sampled through the run so that the report can give its peak.

use std::cell::Cell;
use std::fs;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::shared::Run;

/// `RssAnon` of process `pid` in KiB; `None` once it is gone.
pub fn rss_anon_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Samples the service's `RssAnon` every 100 ms into `peak` (KiB) until the run stops.
pub async fn sample_peak(run: Arc<Run>, peak: Rc<Cell<u64>>, pid: u32) {
    while !run.phases.stopped() {
        if let Some(kib) = rss_anon_kib(pid) {
            peak.set(peak.get().max(kib));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
