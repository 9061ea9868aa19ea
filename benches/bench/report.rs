//! How a benchmark reports: medians and percentiles of its runs, one JSON line and one line for
//! people, and the original implementation's figure for the same workload.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The median of `v` (the lower middle of an even count); 0 when empty.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[(v.len() - 1) / 2]
    }
}

/// The `p` quantile of `v` (nearest rank); 0 when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Prints the JSON line, then the line for people.
pub fn report(v: Value, human: String) {
    println!("{v}");
    println!("  {human}");
}

/// Runs `node broadcast-bench.mjs ARGS` in an installed copy of the peer; its JSON line.
pub fn peer_bench(peer: &Option<PathBuf>, args: &[&str]) -> Option<Value> {
    let dir = peer.as_ref()?;
    let out = Command::new("node")
        .arg("broadcast-bench.mjs")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
}
