//! What the tests that load the real binary send and measure: transactions of one large change,
//! and the process's anonymous resident memory (`RssAnon` of `/proc/PID/status`).

use change_streamer_actors::watermark::Watermark;

/// `RssAnon` of process `pid`, in bytes.
pub fn rss_anon(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon");
    kib * 1024
}

/// The frames of transaction `n`: one insert of a ~`bytes` payload.
pub fn large_txn(n: u64, bytes: usize) -> Vec<String> {
    let wm = Watermark::from_u64(n);
    vec![
        format!(r#"["begin",{{"tag":"begin"}},{{"commitWatermark":"{wm}"}}]"#),
        format!(
            r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"t"}},"new":{{"id":{n},"s":"{}"}}}}]"#,
            "x".repeat(bytes)
        ),
        format!(r#"["commit",{{"tag":"commit"}},{{"watermark":"{wm}"}}]"#),
    ]
}
