//! The takeover demo's view: the legend, the once-a-second block (each instance's role from its
//! own `/status`, each subscriber's counters) and the summary line.

use change_streamer_actors::watermark::Watermark;
use serde_json::{json, Value};

use super::follow::Followed;
use super::instance::{role, Instance};

/// The demo's legend in this mode.
pub const LEGEND: &str = "\
legend (three instances on one PostgreSQL change DB):
  access: all three instances ask every client for a secret generated for this run (never shown)
  A, B and C are change-streamer processes sharing the change DB; exactly one is the OWNER (it
    holds a PostgreSQL advisory lock on its writer connection, reads upstream, stores, NOTIFYs
    each commit group and serves); the others are STANDBYS, which serve /changes too: catch-up
    from the change DB, then the owner's commits as its NOTIFYs announce them; a standby tries
    to take the lock every --takeover-interval-ms (200 ms here)
  serving N: the subscribers the instance serves now (from its /status)
  kill -9 (Enter, or --kill-after N): the owner dies; PostgreSQL ends its session and with it the
    lock; a standby owns within the takeover interval + 1 s, keeps its own subscribers on their
    sockets and asks the change source to resume after the last durable watermark; the killed
    instance is started again and comes back as a standby
  s1..s6: subscribers, two started at each instance, each following the instance it is on and
    acking every commit; `on A>B`: the instances that served it, in order
    commits: commits received; gaps: commits that were not the one after the last; repeats:
      commits seen again (both stay 0)
    drops: subscriptions that ended (a close or a lost connection) and were made again from the
      last acked commit, at the same instance if it is up, else at another live one: 1 for each
      subscriber of the killed owner, 0 for every subscriber of the others, the new owner's too
";

/// A subscriber's instances, as `A>B`.
pub fn path(s: &Followed, names: &[char]) -> String {
    s.on.iter()
        .map(|&i| names[i].to_string())
        .collect::<Vec<_>>()
        .join(">")
}

fn watermark(w: Option<u64>) -> String {
    w.map(|w| Watermark::from_u64(w).to_string())
        .unwrap_or("-".into())
}

/// One instance's line: its role (asked over `/status` while it is up) and what it serves.
pub async fn instance_line(inst: &Instance, up: bool, killed: bool) -> String {
    let a = match &inst.addr {
        Some(a) if up => a,
        _ if killed => return format!("{}  down     (killed; started again shortly)", inst.name),
        _ => return format!("{}  starting", inst.name),
    };
    let Some(st) = role(a).await else {
        return format!("{}  down     {a} (no answer to /status)", inst.name);
    };
    let serving = st.subscribers.len();
    if st.role == "owner" {
        format!(
            "{}  OWNER    {a}  stored up to {}, upstream {}, serving {serving}",
            inst.name,
            st.change_log
                .as_ref()
                .and_then(|l| l.max_watermark.as_deref())
                .unwrap_or("-"),
            if st.upstream.as_ref().is_some_and(|u| u.connected) {
                "connected"
            } else {
                "DOWN"
            }
        )
    } else {
        format!("{}  {:<8} {a}  serving {serving}", inst.name, st.role)
    }
}

/// One subscriber's line.
pub fn subscriber_line(s: &Followed, names: &[char]) -> String {
    format!(
        "{:<3} on {:<6} {:>6} commits, at {}, gaps {}, repeats {}, drops {}",
        s.name,
        path(s, names),
        s.commits,
        watermark(s.last),
        s.gaps,
        s.repeats,
        s.drops
    )
}

/// The subscribers at an instance when it was killed.
pub struct Kill {
    pub instance: usize,
    /// Indexes into the subscribers.
    pub victims: Vec<usize>,
}

/// The view's last lines once the owner was killed: who was dropped, and who was not.
pub fn since_kill(kill: &Kill, subs: &[&Followed], names: &[char]) -> String {
    let (victims, others): (Vec<(usize, &&Followed)>, Vec<_>) = subs
        .iter()
        .enumerate()
        .partition(|(k, _)| kill.victims.contains(k));
    let list = |group: &[(usize, &&Followed)]| {
        let names: Vec<&str> = group.iter().map(|(_, s)| s.name.as_str()).collect();
        names.join(" ")
    };
    let drops = |group: &[(usize, &&Followed)]| group.iter().map(|(_, s)| s.drops).sum::<u64>();
    let mut at: Vec<char> = victims
        .iter()
        .filter_map(|(_, s)| s.now_on())
        .filter(|&i| i != kill.instance)
        .map(|i| names[i])
        .collect();
    at.sort_unstable();
    at.dedup();
    let at: Vec<String> = at.iter().map(char::to_string).collect();
    let killed = names[kill.instance];
    format!(
        "since the kill of {killed}: the survivors' subscribers ({}) {} drops;\n            \
         {killed}'s ({}) {} drops, going on at {}",
        list(&others),
        drops(&others),
        list(&victims),
        drops(&victims),
        if at.is_empty() {
            "-".to_string()
        } else {
            at.join(" ")
        },
    )
}

/// What the run showed, for the `summary:` line.
pub struct Summary<'a> {
    pub seconds: u64,
    pub names: &'a [char],
    pub killed: &'a [usize],
    pub owner: Option<usize>,
    pub takeover_ms: &'a [u128],
    /// Each instance's `/status` `role` at the end (`down` when it did not answer).
    pub roles: Vec<String>,
    pub subs: Vec<&'a Followed>,
    pub views: usize,
}

impl Summary<'_> {
    pub fn json(&self) -> Value {
        let names = self.names;
        let total = |f: fn(&Followed) -> u64| self.subs.iter().map(|s| f(s)).sum::<u64>();
        let subscribers: Vec<Value> = self
            .subs
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "on": s.on.iter().map(|&i| names[i].to_string()).collect::<Vec<_>>(),
                    "commits": s.commits,
                    "afterTakeover": s.at_takeover.map(|at| s.commits - at),
                    "gaps": s.gaps,
                    "repeats": s.repeats,
                    "drops": s.drops,
                })
            })
            .collect();
        let roles: serde_json::Map<String, Value> = names
            .iter()
            .zip(&self.roles)
            .map(|(n, r)| (n.to_string(), json!(r)))
            .collect();
        json!({
            "seconds": self.seconds,
            "killed": self.killed.iter().map(|&i| names[i].to_string()).collect::<Vec<_>>(),
            "owner": self.owner.map(|i| names[i].to_string()),
            "takeoverMs": self.takeover_ms,
            "rolesAtEnd": roles,
            "subscribers": subscribers,
            "gaps": total(|s| s.gaps),
            "repeats": total(|s| s.repeats),
            "drops": total(|s| s.drops),
            "views": self.views,
        })
    }
}
