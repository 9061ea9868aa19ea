//! How long a process's threads ran and how long they waited on a run queue, runnable but not
//! running (`/proc/PID/task/*/schedstat`, ns): on a shared machine the second says how much of
//! a run's latency was other work holding the CPUs, rather than the service. With
//! `kernel.sched_autogroup_enabled`, `nice` only orders processes of one session: another
//! session's niced build still takes its fair share from this one.

use std::fs;

/// Nanoseconds run and waited runnable so far, summed over the threads of `pid` alive now.
pub fn run_wait_ns(pid: u32) -> (u64, u64) {
    let mut total = (0, 0);
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return total;
    };
    for t in tasks.flatten() {
        let Ok(s) = fs::read_to_string(t.path().join("schedstat")) else {
            continue;
        };
        let mut f = s.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
        total.0 += f.next().unwrap_or(0);
        total.1 += f.next().unwrap_or(0);
    }
    total
}

/// Of the PIDs a `--service-pid-file` lists now, the sum of [`run_wait_ns`].
pub fn listed_run_wait_ns(file: &str) -> (u64, u64) {
    crate::cpu::read_pids(file)
        .into_iter()
        .map(run_wait_ns)
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// `{"runMsPerS", "waitMsPerS"}` between two readings `secs` apart.
pub fn json(a: (u64, u64), b: (u64, u64), secs: f64) -> serde_json::Value {
    let per_s = |x: u64, y: u64| ((y.saturating_sub(x)) as f64 / 1e6 / secs * 10.0).round() / 10.0;
    serde_json::json!({"runMsPerS": per_s(a.0, b.0), "waitMsPerS": per_s(a.1, b.1)})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_run() {
        let (run, _) = run_wait_ns(std::process::id());
        assert!(run > 0);
        assert_eq!(run_wait_ns(u32::MAX), (0, 0));
        let j = json((0, 0), (2_000_000, 600_000), 2.0);
        assert_eq!(
            (j["runMsPerS"].as_f64(), j["waitMsPerS"].as_f64()),
            (Some(1.0), Some(0.3))
        );
    }
}
