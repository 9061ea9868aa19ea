//! The service's footprint over time, read from `/proc/PID`: `RssAnon` (its heap, not the mapped
//! binary or the page cache) and the number of open file descriptors, with the sockets the soak
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

/// Samples younger than this in their life are warm-up (caches filling, subscribers catching
/// up after the restart) and left out of the trends.
pub const WARM_UP_S: f64 = 30.0;

/// Least-squares slope of `y` over `x` (per unit of `x`), 0 with fewer than 3 points.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 3 {
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

/// The trend of one quantity: per life (median after warm-up, and the rise from the first half
/// of the life to the second), and across lives (slope of the whole run after warm-ups).
pub struct Trend {
    pub name: &'static str,
    pub unit: &'static str,
    pub per_life_median: Vec<f64>,
    /// Largest rise, within one life, of the second half's median over the first half's.
    pub worst_rise_in_life: f64,
    /// Rise of the whole run, from its slope, over its length.
    pub rise_over_run: f64,
    pub overall_median: f64,
    /// How much rise still counts as flat.
    pub tolerance: f64,
}

impl Trend {
    pub fn of(
        name: &'static str,
        unit: &'static str,
        samples: &[Sample],
        value: impl Fn(&Sample) -> f64,
        tolerance: impl Fn(f64) -> f64,
    ) -> Trend {
        let warm: Vec<&Sample> = samples.iter().filter(|s| s.age >= WARM_UP_S).collect();
        let lives = samples.iter().map(|s| s.life).max().map_or(0, |l| l + 1);
        let mut per_life_median = Vec::new();
        let mut worst_rise_in_life = 0f64;
        for life in 0..lives {
            let in_life: Vec<&Sample> = warm.iter().copied().filter(|s| s.life == life).collect();
            if in_life.is_empty() {
                continue;
            }
            per_life_median.push(median(in_life.iter().map(|s| value(s)).collect()));
            let half = in_life.len() / 2;
            if half >= 3 {
                let a = median(in_life[..half].iter().map(|s| value(s)).collect());
                let b = median(in_life[half..].iter().map(|s| value(s)).collect());
                worst_rise_in_life = worst_rise_in_life.max(b - a);
            }
        }
        let points: Vec<(f64, f64)> = warm.iter().map(|s| (s.t, value(s))).collect();
        let span = match (points.first(), points.last()) {
            (Some(a), Some(b)) => b.0 - a.0,
            _ => 0.0,
        };
        let overall_median = median(points.iter().map(|p| p.1).collect());
        Trend {
            name,
            unit,
            per_life_median,
            worst_rise_in_life,
            rise_over_run: slope(&points) * span,
            overall_median,
            tolerance: tolerance(overall_median),
        }
    }

    pub fn flat(&self) -> bool {
        self.rise_over_run <= self.tolerance && self.worst_rise_in_life <= self.tolerance
    }

    pub fn describe(&self) -> String {
        let mut s = format!(
            "{}: median {:.1} {u}, rise over the run {:+.1} {u}, worst rise within a life {:+.1} {u} (flat: at most {:.1} {u}); per life:",
            self.name,
            self.overall_median,
            self.rise_over_run,
            self.worst_rise_in_life,
            self.tolerance,
            u = self.unit
        );
        for m in &self.per_life_median {
            let _ = write!(s, " {m:.1}");
        }
        s
    }
}
