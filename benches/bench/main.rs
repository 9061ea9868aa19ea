//! Benchmarks, measured rather than asserted: `cargo bench --bench bench [-- SECTION...]`.
//!
//! Sections (all by default), one file each: `fanout`, `stall`, `e2e`, `reservations`,
//! `changelog`, `poll`, `slow`. Each prints one JSON line (`{"bench": ...}`) and one line for
//! people ([`report`]). Where the original JavaScript implementation has the same workload
//! (`../shared/peer/broadcast-bench.mjs`), it is run in the same invocation with the same
//! parameters and the ratio is printed; pass `--no-peer` to skip it. The in-process sections run
//! on [`rig`], the end-to-end ones on the real binary ([`service`]). Figures and the machine they
//! were taken on are in `BENCHMARKS.md`.

mod changelog;
mod e2e;
mod fanout;
mod poll;
mod report;
mod reservations;
mod rig;
mod service;
mod slow;
mod stall;

use change_streamer_test_support as support;
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--bench"))
        .collect();
    let no_peer = args.iter().any(|a| a == "--no-peer");
    let all = [
        "fanout",
        "stall",
        "e2e",
        "reservations",
        "changelog",
        "poll",
        "slow",
    ];
    let chosen: Vec<&str> = {
        let named: Vec<&str> = args
            .iter()
            .map(String::as_str)
            .filter(|a| all.contains(a))
            .collect();
        if named.is_empty() {
            all.to_vec()
        } else {
            named
        }
    };
    let needs_peer = !no_peer && chosen.iter().any(|c| *c == "fanout" || *c == "stall");
    let peer_install = if needs_peer {
        support::installed_peer()
    } else {
        None
    };
    let peer = peer_install.as_ref().map(|(_, p)| p.clone());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!(
        "{}",
        json!({"machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "cpu": cpu}, "peer": peer.is_some()})
    );
    actix_rt::System::new().block_on(async move {
        for c in chosen {
            match c {
                "fanout" => fanout::fanout(&peer).await,
                "stall" => stall::stall(&peer).await,
                "e2e" => e2e::e2e().await,
                "reservations" => reservations::reservations().await,
                "changelog" => changelog::changelog().await,
                "poll" => poll::poll().await,
                "slow" => slow::slow().await,
                _ => {}
            }
        }
    });
}
