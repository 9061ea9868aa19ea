//! The default demo's view: the once-a-second lines drawn only from the service's own `/status`
//! and `/metrics`, the line printed when a subscriber leaves, and the legend printed at start.

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::status::Status;
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
    newest watermark each backup holds and since when, and how many times the backup itself was
    read to learn it
  cleanup delay: how long after litestream reports a watermark backed up before its cleanup
  cleanups scheduled / purge queue: cleanups made from litestream's reports / those waiting for
    their purge check (--purge-delay-ms); rows purged: change-log rows deleted by them
  flow control: sends that wait for acks; released by all (every subscriber acked) or by
    consensus (a majority acked and the others had --flow-control-consensus-padding-seconds)
  replicas: backup follows the stream and is what litestream backs up; r1..r3 reserve, restore,
    then subscribe; stalled stops reading after 4 s and is dropped once it misses a ping
";

/// Transactions stored: the change log's newest commit less its replicaVersion, plus one.
pub fn commits(st: &Status) -> u64 {
    let num = |w: Option<&String>| {
        w.and_then(|s| Watermark::parse(s).ok())
            .and_then(|w| w.to_u64())
    };
    let max = num(st
        .change_log
        .as_ref()
        .and_then(|c| c.max_watermark.as_ref()));
    match (max, num(st.replica_version.as_ref())) {
        (Some(max), Some(rv)) => max - rv + 1,
        _ => 0,
    }
}

/// What each backup holds, whatever its source (`backups[]`, PROTOCOL.md §8.4): `confirmed W
/// (name, T s ago)`, `-` while it holds nothing yet.
pub fn confirmed(st: &Status) -> String {
    let backups = st.backups.as_deref().unwrap_or_default();
    if backups.is_empty() {
        return "confirmed -".into();
    }
    backups
        .iter()
        .map(|b| match (&b.watermark, b.age_ms) {
            (Some(w), Some(age)) => format!(
                "confirmed {w} ({}, {:.1} s ago)",
                b.name,
                age as f64 / 1000.0
            ),
            (Some(w), None) => format!("confirmed {w} ({})", b.name),
            (None, _) => format!("confirmed - ({})", b.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The line printed when subscriber `id` is no longer connected.
pub fn departure(t: u64, id: &str, consensus: u64) -> String {
    if id == "stalled" {
        format!("t={t:>3}s  stalled dropped: it stopped reading, so it answered no ping within the 3 s --ping-interval-ms (until then flow control released {consensus} sends by consensus without it)")
    } else {
        format!("t={t:>3}s  {id} is no longer subscribed")
    }
}

pub fn view(t: u64, st: &Status, metrics: &str) -> String {
    let mut out = String::new();
    let log = st.change_log.as_ref();
    let dash = |w: Option<&String>| w.map_or("-".to_string(), String::clone);
    out.push_str(&format!(
        "t={t:>3}s  stored {} txns ({} rows now, log {}..{})  upstream {}\n",
        commits(st),
        log.map_or(0, |l| l.rows),
        dash(log.and_then(|l| l.min_watermark.as_ref())),
        dash(log.and_then(|l| l.max_watermark.as_ref())),
        if st.upstream.as_ref().is_some_and(|u| u.connected) {
            "connected"
        } else {
            "DOWN"
        },
    ));
    let reservations: Vec<String> = st
        .reservations
        .iter()
        .map(|r| format!("{} {}ms", r.task_id, r.held_ms))
        .collect();
    let backup = st.backup.as_ref();
    out.push_str(&format!(
        "        reservations [{}]  cleanup delay {:.1}s{}  cleanups scheduled {}  purge queue {}  rows purged {}\n",
        reservations.join(", "),
        backup.map_or(0, |b| b.cleanup_delay_ms) as f64 / 1000.0,
        if backup.is_some_and(|b| b.paused) { " (paused)" } else { "" },
        metric(metrics, "change_streamer_cleanups_scheduled_total"),
        st.purge.as_ref().map_or(0, |p| p.scheduled.len()),
        st.purge.as_ref().map_or(0, |p| p.rows_purged),
    ));
    let monitor = backup.and_then(|b| b.monitor.as_ref());
    out.push_str(&format!(
        "        backup via {}: {}  backup reads {}{}\n",
        backup.map_or("-", |b| b.source.as_str()),
        confirmed(st),
        monitor.map_or(0, |m| m.backup_reads_total),
        monitor
            .and_then(|m| m.last_error.as_ref())
            .map(|e| format!("  last error: {e}"))
            .unwrap_or_default(),
    ));
    out.push_str(&format!(
        "        flow control: {} tracked sends, released by all {} / by consensus {}\n",
        st.flow_control.as_ref().map_or(0, |f| f.tracked_sends),
        metric(
            metrics,
            "change_streamer_flow_control_releases_total{mode=\"all\"}"
        ),
        metric(
            metrics,
            "change_streamer_flow_control_releases_total{mode=\"consensus\"}"
        ),
    ));
    for s in &st.subscribers {
        out.push_str(&format!(
            "        {:<8} {:<7} acked {:<10} pending {:>6}  {:>8.0} msg/s\n",
            s.id, s.mode, s.acked, s.pending, s.process_rate,
        ));
    }
    out
}
