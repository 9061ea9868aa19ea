//! CPU time from `/proc`: utime + stime of a process and all its descendants (zero runs as a
//! process tree: runner, dispatcher, change-streamer), and of this generator itself; and of
//! the processes a PID file lists, read anew at each snapshot (a file that a script rewrites
//! as they come and go: the PostgreSQL backends of one database).

use std::collections::HashMap;
use std::fs;

/// Seconds per clock tick of `/proc/*/stat` times.
fn tick_s() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1.0 / if t > 0 { t as f64 } else { 100.0 }
}

/// (ppid, utime + stime in ticks) of one `/proc/<pid>/stat`.
fn stat(pid: &str) -> Option<(u32, u64)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ppid = f.get(1)?.parse().ok()?;
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some((ppid, ticks))
}

/// CPU seconds used so far by `root` and every living descendant.
pub fn tree_cpu_s(root: u32) -> f64 {
    let mut kids: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut ticks: HashMap<u32, u64> = HashMap::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(pid) = name.parse::<u32>() else {
                continue;
            };
            if let Some((ppid, t)) = stat(name) {
                ticks.insert(pid, t);
                kids.entry(ppid).or_default().push(pid);
            }
        }
    }
    let (mut total, mut todo) = (0u64, vec![root]);
    while let Some(p) = todo.pop() {
        total += ticks.get(&p).copied().unwrap_or(0);
        todo.extend(kids.get(&p).into_iter().flatten());
    }
    total as f64 * tick_s()
}

/// The PIDs a `--service-pid-file` lists now (whitespace-separated; other words ignored).
pub fn read_pids(file: &str) -> Vec<u32> {
    fs::read_to_string(file)
        .map(|s| {
            s.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// CPU seconds used so far by the tree of each PID that `file` lists now.
pub fn listed_cpu_s(file: &str) -> HashMap<u32, f64> {
    read_pids(file)
        .into_iter()
        .map(|p| (p, tree_cpu_s(p)))
        .collect()
}

/// CPU seconds spent between two [`listed_cpu_s`] of one file: a process listed at the end
/// only counts from its start (it is listed soon after it starts), one gone by then not at all.
pub fn spent_s(a: &HashMap<u32, f64>, b: &HashMap<u32, f64>) -> f64 {
    b.iter()
        .map(|(p, t)| (t - a.get(p).copied().unwrap_or(0.0)).max(0.0))
        .sum()
}

/// CPU seconds used so far by this generator.
pub fn own_cpu_s() -> f64 {
    stat("self").map_or(0.0, |(_, t)| t as f64 * tick_s())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_process_counts_what_it_spent_in_the_window() {
        let a = HashMap::from([(1, 10.0), (2, 5.0)]);
        // 1 spent 2 s, 2 is gone, 3 started in the window and spent 1.5 s.
        let b = HashMap::from([(1, 12.0), (3, 1.5)]);
        assert_eq!(spent_s(&a, &b), 3.5);
        assert_eq!(spent_s(&b, &b), 0.0);
    }
}
