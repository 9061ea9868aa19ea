//! CPU time from `/proc`: utime + stime of a process and all its descendants (zero runs as a
//! process tree: runner, dispatcher, change-streamer), and of this generator itself.

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

/// CPU seconds used so far by this generator.
pub fn own_cpu_s() -> f64 {
    stat("self").map_or(0.0, |(_, t)| t as f64 * tick_s())
}
