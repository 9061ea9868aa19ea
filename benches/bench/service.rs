//! The real binary for the end-to-end sections (`e2e`, `reservations`, `slow`), started by
//! test-support's [`ServiceProcess`] on an ephemeral port and a fresh data directory, and what
//! they read of it from `/proc`: CPU seconds and memory.

use change_streamer_test_support::process::ServiceProcess;

/// A running service and its data directory (removed when it is dropped, after the process).
pub struct Service {
    pub process: ServiceProcess,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Service {
    /// Starts the service with `args`, logging only warnings (and the line saying where it
    /// listens), and returns once it listens.
    pub fn start(args: &[&str]) -> Service {
        let dir = tempfile::tempdir().unwrap();
        let process = ServiceProcess::spawn_logging(
            env!("CARGO_BIN_EXE_change-streamer").as_ref(),
            0,
            dir.path(),
            args,
            "warn,change_streamer::instance=info",
        );
        let port = process
            .addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the service's port");
        Service {
            process,
            port,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// CPU seconds (user + system) a process has used (`pid` or `self`).
pub fn cpu_seconds(pid: &str) -> f64 {
    let ticks = 100.0; // USER_HZ on Linux
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rsplit(')').next()?.split_whitespace().collect::<Vec<_>>();
            let u: f64 = after.get(11)?.parse().ok()?;
            let st: f64 = after.get(12)?.parse().ok()?;
            Some((u + st) / ticks)
        })
        .unwrap_or(0.0)
}

/// A memory line of `/proc/PID/status` (`VmRSS:`, `VmHWM:`), in KiB.
pub fn rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
