//! `stall`: a stalled minority of 5 sessions (2, then 1, never ack) at a padding of 100 ms, each
//! transaction one tracked send of 64 KiB: how long after the third ack each send is released,
//! beside the original's release time for 1 stalled.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use change_streamer_actors::streamer::UpstreamBatch;
use serde_json::json;

use crate::report::{peer_bench, percentile, report};
use crate::rig::{rig, workload};

pub async fn stall(peer: &Option<PathBuf>) {
    let padding = 100.0;
    for stalled_n in [2usize, 1] {
        let mut stalled = vec![false; 5];
        for s in stalled.iter_mut().skip(5 - stalled_n) {
            *s = true;
        }
        let r = rig(Duration::from_secs_f64(padding / 1000.0), &stalled).await;
        let mut after_third = Vec::new();
        let mut release = Vec::new();
        // Each transaction carries a 64 KiB change, so each is (at least) one tracked send.
        for next in 2..22u64 {
            let mut msgs = workload(next, 1, 1, 70_000);
            while !msgs.is_empty() {
                let reply = r
                    .streamer
                    .send(UpstreamBatch(std::mem::take(&mut msgs)))
                    .await
                    .unwrap()
                    .unwrap();
                msgs = reply.rest;
                if let Some(rx) = reply.release {
                    let t0 = Instant::now();
                    let _ = rx.await;
                    let released = Instant::now();
                    release.push((released - t0).as_secs_f64() * 1000.0);
                    let times = r.ack_times.lock().unwrap();
                    let third = times
                        .values()
                        .filter(|v| v.len() >= 3)
                        .filter_map(|v| v.iter().max().copied())
                        .max();
                    drop(times);
                    if let Some(third) = third {
                        after_third.push((released - third).as_secs_f64() * 1000.0);
                    }
                    r.ack_times.lock().unwrap().clear();
                }
            }
        }
        let p50 = percentile(&mut after_third.clone(), 0.5);
        let p99 = percentile(&mut after_third.clone(), 0.99);
        let theirs = if stalled_n == 1 {
            peer_bench(
                peer,
                &[
                    "--phases",
                    "stall",
                    "--stall-subs",
                    "5",
                    "--padding",
                    "0.1",
                    "--stall-sends",
                    "5",
                ],
            )
            .map(|v| v["stall"].clone())
        } else {
            None
        };
        report(
            json!({"bench": "stall", "subscribers": 5, "stalled": stalled_n, "paddingMs": padding, "sends": after_third.len(),
                   "after_third_ack_ms_p50": (p50 * 10.0).round() / 10.0, "after_third_ack_ms_p99": (p99 * 10.0).round() / 10.0,
                   "release_ms_max": (release.iter().cloned().fold(0.0, f64::max) * 10.0).round() / 10.0,
                   "peer": theirs}),
            format!(
                "stalled minority ({stalled_n} of 5 never ack, padding {padding} ms): release {p50:.1} ms (p50) / {p99:.1} ms (p99) after the third ack{}",
                theirs
                    .as_ref()
                    .and_then(|t| t["release_ms_mean"].as_f64())
                    .map(|m| format!("; original (1 stalled): {m:.1} ms mean after the send"))
                    .unwrap_or_default()
            ),
        );
    }
}
