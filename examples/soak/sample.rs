//! The service's footprint over time, read from `/proc/PID`: `RssAnon` (its heap, SQLite's page cache
//! included; not the mapped binary, not the kernel's page cache) and the number of open file descriptors, with the sockets the soak
//! holds open at that moment (each is one fd of the service), and what "flat" means for them:
//! no upward trend within each life of the process and none across its restarts.

use std::fmt::Write;

/// One reading.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Seconds since the soak began.
    pub t: f64,
    /// Which start of the service (0 = the first).
    pub life: usize,
    /// Seconds since this life began.
    pub age: f64,
    pub rss_anon_kb: u64,
    pub fds: u64,
    /// Subscriber and reservation sockets the soak held open then.
    pub sockets: i64,
}

impl Sample {
    /// The fds that are not the soak's sockets: listeners, the change log, the upstream
    /// connection, and anything leaked.
    pub fn own_fds(&self) -> i64 {
        self.fds as i64 - self.sockets
    }
}

/// `RssAnon` (kB) and the open fds of `pid`, or `None` once it is gone.
pub fn read(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

/// The shortest life that is judged, whatever the kill interval: a life needs about 2-3
/// minutes to settle (SQLite's page cache fills over the change log, stalled subscribers fill
/// their bounds). The soak passes its shortest kill interval when that is longer (see
/// [`Trend::of`]).
pub const MIN_JUDGED_LIFE_S: f64 = 150.0;

/// The window at the end of a life whose median is its plateau, compared with the window
/// before it.
pub const WINDOW_S: f64 = 60.0;

/// Least-squares slope of `y` over `x` (per unit of `x`), 0 with fewer than 2 points.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The trend of one quantity. A life of the service starts cold (RssAnon grows while SQLite's
/// page cache fills over the change log), so "flat" is judged where a life has settled:
/// - **within each life**: the median of its last [`WINDOW_S`] against the highest median of
///   its earlier windows (each [`WINDOW_S`], counted back from the last): a life that keeps
///   growing sets a new high at its end; one that has filled its bounds and moves within them
///   (stalled subscribers fill and release their queues, a few MiB at a time) does not. The
///   rule compared the last window with the one just before until stop 39, and failed two
///   30-minute runs on such steps (+3.3 and +3.7 MiB) in lives whose peaks were no higher
///   than the earlier lives';
/// - **across lives**: the plateaus (last-window medians) of the lives in order, their
///   least-squares slope times the number of steps between the first and the last: no life
///   settles higher than the one before it.
pub struct Trend {
    pub name: &'static str,
    pub unit: &'static str,
    /// Each judged life's plateau.
    pub plateaus: Vec<f64>,
    /// Largest rise, within one life, of its last window over the highest earlier window.
    pub worst_rise_in_life: f64,
    /// The plateaus' rise over the run, from their slope.
    pub rise_across_lives: f64,
    pub max: f64,
    /// How much rise still counts as flat.
    pub tolerance: f64,
    /// The shortest life judged.
    pub judged_life_s: f64,
}

impl Trend {
    /// `judged_life_s`: a life shorter than this is drawn, not judged. The soak passes its
    /// shortest kill interval (at least [`MIN_JUDGED_LIFE_S`]): every life the soak kills is
    /// judged, and the last life, which the end of the run cuts at any age, is judged only when
    /// it lived as long as the shortest killed life may, so it is judged on the same footing
    /// rather than while still filling (stop 38's third run failed on a 224 s last life whose
    /// last minute was still filling to the stalled subscribers' bounds).
    pub fn of(
        name: &'static str,
        unit: &'static str,
        judged_life_s: f64,
        samples: &[Sample],
        value: impl Fn(&Sample) -> f64,
        tolerance: impl Fn(f64) -> f64,
    ) -> Trend {
        let lives = samples.iter().map(|s| s.life).max().map_or(0, |l| l + 1);
        let mut plateaus = Vec::new();
        let mut worst_rise_in_life = f64::MIN;
        for life in 0..lives {
            let in_life: Vec<&Sample> = samples.iter().filter(|s| s.life == life).collect();
            let Some(end) = in_life.last().map(|s| s.age) else {
                continue;
            };
            if end < judged_life_s {
                continue;
            }
            let window = |from: f64, to: f64| {
                median(
                    in_life
                        .iter()
                        .filter(|s| s.age >= from && s.age < to)
                        .map(|s| value(s))
                        .collect(),
                )
            };
            let last = window(end - WINDOW_S, f64::MAX);
            // The highest of the life's earlier minutes, counted back from its last.
            let mut before = f64::MIN;
            let mut to = end - WINDOW_S;
            while to > WINDOW_S / 2.0 {
                before = before.max(window(to - WINDOW_S, to));
                to -= WINDOW_S;
            }
            plateaus.push(last);
            worst_rise_in_life = worst_rise_in_life.max(last - before);
        }
        let steps: Vec<(f64, f64)> = plateaus
            .iter()
            .enumerate()
            .map(|(i, p)| (i as f64, *p))
            .collect();
        let rise_across_lives = slope(&steps) * (steps.len().max(1) - 1) as f64;
        let max = samples.iter().map(&value).fold(0.0, f64::max);
        let tolerance = tolerance(median(plateaus.clone()));
        Trend {
            name,
            unit,
            plateaus,
            worst_rise_in_life: worst_rise_in_life.max(0.0),
            rise_across_lives,
            max,
            tolerance,
            judged_life_s,
        }
    }

    /// RssAnon in MiB, flat within 10 % of the lives' median plateau (3 MiB at least).
    pub fn rss_anon(judged_life_s: f64, samples: &[Sample]) -> Trend {
        Trend::of(
            "RssAnon",
            "MiB",
            judged_life_s,
            samples,
            |s| s.rss_anon_kb as f64 / 1024.0,
            |m| (m * 0.10).max(3.0),
        )
    }

    /// The fds that are not the soak's sockets ([`Sample::own_fds`]), flat within 3.
    pub fn own_fds(judged_life_s: f64, samples: &[Sample]) -> Trend {
        Trend::of(
            "fds less the soak's sockets",
            "fds",
            judged_life_s,
            samples,
            |s| s.own_fds() as f64,
            |_| 3.0,
        )
    }

    /// Flat, and judged on at least two lives.
    pub fn flat(&self) -> bool {
        self.plateaus.len() >= 2
            && self.rise_across_lives <= self.tolerance
            && self.worst_rise_in_life <= self.tolerance
    }

    /// The larger of the two rises.
    pub fn rise(&self) -> f64 {
        self.rise_across_lives.max(self.worst_rise_in_life)
    }

    pub fn describe(&self) -> String {
        let mut s = format!(
            "{}: max {:.1} {u}; rise across lives {:+.1} {u}, worst rise of a life's last minute over its earlier high {:+.1} {u} (flat: at most {:.1} {u}, over at least 2 lives of {:.0} s or more); plateau of each life:",
            self.name,
            self.max,
            self.rise_across_lives,
            self.worst_rise_in_life,
            self.tolerance,
            self.judged_life_s,
            u = self.unit
        );
        for m in &self.plateaus {
            let _ = write!(s, " {m:.1}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    //! What "flat" means (the soak's verdict on RssAnon and fds): run by `cargo test`
    //! (`[[example]] soak`, `test = true`).
    use super::*;

    /// Samples every 2 s of lives of the given lengths, `mib(life, age)` each.
    fn lives(lengths: &[f64], mib: impl Fn(usize, f64) -> f64) -> Vec<Sample> {
        let mut out = Vec::new();
        let mut t = 0.0;
        for (life, &len) in lengths.iter().enumerate() {
            let mut age = 0.0;
            while age <= len {
                out.push(Sample {
                    t: t + age,
                    life,
                    age,
                    rss_anon_kb: (mib(life, age) * 1024.0) as u64,
                    fds: 30,
                    sockets: 2,
                });
                age += 2.0;
            }
            t += len;
        }
        out
    }

    fn rss(samples: &[Sample], judged_life_s: f64) -> Trend {
        Trend::rss_anon(judged_life_s, samples)
    }

    #[test]
    fn a_life_that_steps_within_its_bounds_is_flat_and_one_that_sets_a_new_high_at_its_end_is_not()
    {
        // Fills for 2 minutes, then steps down 4 MiB and back up to its high, ending 0.5 MiB
        // above it: the minute-over-minute rule saw +4.5 MiB here.
        let steps = |_: usize, age: f64| match age {
            a if a < 120.0 => 20.0 * a / 120.0,
            a if a < 180.0 => 20.0,
            a if a < 240.0 => 16.0,
            _ => 20.5,
        };
        let t = rss(&lives(&[300.0, 300.0, 300.0], steps), 240.0);
        assert_eq!(t.plateaus.len(), 3);
        assert!(t.flat(), "{}", t.describe());
        // Growing 5 MiB a minute to the end of every life: a new high at each end.
        let leak = |_: usize, age: f64| 10.0 + 5.0 * age / 60.0;
        let t = rss(&lives(&[300.0, 300.0], leak), 240.0);
        assert!(!t.flat(), "{}", t.describe());
        assert!(t.worst_rise_in_life > 3.0, "{}", t.describe());
    }

    #[test]
    fn plateaus_that_rise_from_life_to_life_are_not_flat() {
        let climbing = |life: usize, age: f64| (age / 60.0).min(1.0) * (20.0 + 5.0 * life as f64);
        let t = rss(&lives(&[300.0, 300.0, 300.0], climbing), 240.0);
        assert!(t.rise_across_lives > 3.0, "{}", t.describe());
        assert!(!t.flat(), "{}", t.describe());
    }

    #[test]
    fn a_last_life_shorter_than_the_shortest_kill_interval_is_drawn_not_judged() {
        // Two killed lives that settled; the last, cut at 200 s, still filling.
        let filling = |life: usize, age: f64| if life < 2 { 20.0 } else { 5.0 + age / 10.0 };
        let t = rss(&lives(&[300.0, 300.0, 200.0], filling), 240.0);
        assert_eq!(t.plateaus.len(), 2, "the last life is not judged");
        assert!(t.flat(), "{}", t.describe());
        // Judged on a 150 s floor, it would be, and it would fail.
        let t = rss(&lives(&[300.0, 300.0, 200.0], filling), MIN_JUDGED_LIFE_S);
        assert_eq!(t.plateaus.len(), 3);
        assert!(!t.flat(), "{}", t.describe());
    }
}
