//! The default demo's view: the once-a-second lines drawn only from the service's own `/status`
//! and `/metrics`, the line printed when a subscriber leaves, and the legend printed at start.

use change_streamer_actors::watermark::Watermark;
use serde_json::Value;

pub fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// A count from the `/metrics` text (the text format writes every value as a float).
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v.round() as u64)
}

/// What the view's words and numbers mean, printed once at start.
pub const LEGEND: &str = "\
legend:
  access: the service asks every client for a secret generated for this run (--secret; it is
    never shown); without one, it would serve loopback clients only
  watermarks (e.g. 3lgdk) are the upstream's commit positions as LexiVersions: base-36 strings
    that sort in commit order; the log spans min..max of them
  reservations [task ms]: replicas restoring a snapshot; while any is open (paused) nothing the
    backup may still need is purged
  backup: where the service learns what is backed up (control: litestream's control API syncs
    and confirms each commit the backup replica acks; metrics: the stand-in /metrics page), the
    newest watermark confirmed, and how many times the backup itself was read to learn it
  cleanup delay: how long after litestream reports a watermark backed up before its cleanup
  cleanups scheduled / purge queue: cleanups made from litestream's reports / those waiting for
    their purge check (--purge-delay-ms); rows purged: change-log rows deleted by them
  flow control: sends that wait for acks; released by all (every subscriber acked) or by
    consensus (a majority acked and the others had --flow-control-consensus-padding-seconds)
  replicas: backup follows the stream and is what litestream backs up; r1..r3 reserve, restore,
    then subscribe; stalled stops reading after 4 s and is dropped once it misses a ping
";

pub fn commits(st: &Value) -> u64 {
    let w = |k: &str| {
        st["changeLog"][k]
            .as_str()
            .and_then(|s| Watermark::parse(s).ok())
            .and_then(|w| w.to_u64())
    };
    match (
        w("maxWatermark"),
        st["replicaVersion"]
            .as_str()
            .and_then(|s| Watermark::parse(s).ok())
            .and_then(|w| w.to_u64()),
    ) {
        (Some(max), Some(rv)) => max - rv + 1,
        _ => 0,
    }
}

/// The line printed when subscriber `id` is no longer connected.
pub fn departure(t: u64, id: &str, consensus: u64) -> String {
    if id == "stalled" {
        format!("t={t:>3}s  stalled dropped: it stopped reading, so it answered no ping within the 3 s --ping-interval-ms (until then flow control released {consensus} sends by consensus without it)")
    } else {
        format!("t={t:>3}s  {id} is no longer subscribed")
    }
}

pub fn view(t: u64, st: &Value, metrics: &str) -> String {
    let mut out = String::new();
    let subs = st["subscribers"].as_array().cloned().unwrap_or_default();
    out.push_str(&format!(
        "t={t:>3}s  stored {} txns ({} rows now, log {}..{})  upstream {}\n",
        commits(st),
        n(&st["changeLog"]["rows"]),
        st["changeLog"]["minWatermark"].as_str().unwrap_or("-"),
        st["changeLog"]["maxWatermark"].as_str().unwrap_or("-"),
        if st["upstream"]["connected"] == true {
            "connected"
        } else {
            "DOWN"
        },
    ));
    let reservations: Vec<String> = st["reservations"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|r| {
                    format!(
                        "{} {}ms",
                        r["taskID"].as_str().unwrap_or("?"),
                        n(&r["heldMs"])
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.push_str(&format!(
        "        reservations [{}]  cleanup delay {:.1}s{}  cleanups scheduled {}  purge queue {}  rows purged {}\n",
        reservations.join(", "),
        n(&st["backup"]["cleanupDelayMs"]) as f64 / 1000.0,
        if st["backup"]["paused"] == true { " (paused)" } else { "" },
        metric(metrics, "change_streamer_cleanups_scheduled_total"),
        st["purge"]["scheduled"].as_array().map(Vec::len).unwrap_or(0),
        n(&st["purge"]["rowsPurged"]),
    ));
    out.push_str(&format!(
        "        backup via {}: confirmed {}  backup reads {}{}\n",
        st["backup"]["source"].as_str().unwrap_or("-"),
        st["backup"]["monitor"]["backupWatermark"]
            .as_str()
            .unwrap_or("-"),
        n(&st["backup"]["monitor"]["backupReadsTotal"]),
        st["backup"]["monitor"]["lastError"]
            .as_str()
            .map(|e| format!("  last error: {e}"))
            .unwrap_or_default(),
    ));
    out.push_str(&format!(
        "        flow control: {} tracked sends, released by all {} / by consensus {}\n",
        n(&st["flowControl"]["trackedSends"]),
        metric(
            metrics,
            "change_streamer_flow_control_releases_total{mode=\"all\"}"
        ),
        metric(
            metrics,
            "change_streamer_flow_control_releases_total{mode=\"consensus\"}"
        ),
    ));
    for s in subs {
        out.push_str(&format!(
            "        {:<8} {:<7} acked {:<10} pending {:>6}  {:>8.0} msg/s\n",
            s["id"].as_str().unwrap_or("?"),
            s["mode"].as_str().unwrap_or("?"),
            s["acked"].as_str().unwrap_or("-"),
            n(&s["pending"]),
            s["processRate"].as_f64().unwrap_or(0.0),
        ));
    }
    out
}
