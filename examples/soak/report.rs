//! The soak's report: the samples as CSV, one line per part (ingest, streams, subscribers,
//! reservations, kills, RssAnon, fds), the PNG, and the one-line verdict; the exit status says it
//! (0 on PASS, 1 on FAIL).

use std::io::Write;

use crate::check::Tally;
use crate::restore;
use crate::sample::{Sample, Trend, MIN_JUDGED_LIFE_S};
use crate::source::{w, SourceState, FIRST};
use crate::subscriber::Stats;
use crate::{plot, Args, Kills};

#[allow(clippy::too_many_arguments)]
pub fn report(
    args: &Args,
    elapsed: f64,
    src: &SourceState,
    tally: &Tally,
    stats: &Stats,
    rs: &restore::RestoreStats,
    kills: &Kills,
    samples: &[Sample],
    final_status: &serde_json::Value,
) {
    let soaked = Soaked {
        args,
        elapsed,
        src,
        tally,
        stats,
        rs,
        kills,
        samples,
    };
    soaked.write_csv();
    let judged_life_s = (args.kill_min_s as f64).max(MIN_JUDGED_LIFE_S);
    let rss = Trend::rss_anon(judged_life_s, samples);
    let fds = Trend::own_fds(judged_life_s, samples);
    soaked.print_parts(final_status);
    println!("{}", rss.describe());
    println!("{}", fds.describe());
    soaked.plot();
    let pass = soaked.verdict(&rss, &fds);
    std::process::exit(if pass { 0 } else { 1 });
}

/// What the soak saw, for its report.
struct Soaked<'a> {
    args: &'a Args,
    elapsed: f64,
    src: &'a SourceState,
    tally: &'a Tally,
    stats: &'a Stats,
    rs: &'a restore::RestoreStats,
    kills: &'a Kills,
    samples: &'a [Sample],
}

impl Soaked<'_> {
    /// The samples as `samples.csv` in `--out`.
    fn write_csv(&self) {
        let csv = self.args.out.join("samples.csv");
        if let Ok(mut f) = std::fs::File::create(&csv) {
            let _ = writeln!(f, "t_s,life,age_s,rss_anon_kb,fds,soak_sockets");
            for s in self.samples {
                let _ = writeln!(
                    f,
                    "{:.1},{},{:.1},{},{},{}",
                    s.t, s.life, s.age, s.rss_anon_kb, s.fds, s.sockets
                );
            }
        }
    }

    /// One line per part: ingest, streams, subscribers, reservations, kills (with their
    /// evidence), then the first problems.
    fn print_parts(&self, final_status: &serde_json::Value) {
        let (args, elapsed, src, tally, stats, rs, kills) = (
            self.args,
            self.elapsed,
            self.src,
            self.tally,
            self.stats,
            self.rs,
            self.kills,
        );
        let acked: u64 = src.acked.get();
        println!(
            "soak: {elapsed:.0} s, {} txns/s offered, {} subscribers + a backup replicator, 2 restoring tasks, kill -9 every {}-{} s",
            args.rate, args.subscribers, args.kill_min_s, args.kill_max_s
        );
        println!(
            "ingest: {} transactions sent (resends included), last acked upstream {} ({} transactions, {:.0}/s); final /status changeLog {}",
            src.sent.get(),
            w(acked),
            acked.saturating_sub(FIRST) + 1,
            (acked.saturating_sub(FIRST) + 1) as f64 / elapsed,
            final_status["changeLog"]
        );
        println!(
            "streams: {} transactions checked whole; gaps {}, duplicates {}, malformed {}",
            tally.commits.get(),
            tally.gaps.get(),
            tally.duplicates.get(),
            tally.malformed.get()
        );
        println!(
            "subscribers: {} joins, {} left, {} killed, {} stalled; closed by the service {:?}; refused by type {:?}",
            stats.joins.get(),
            stats.leaves.get(),
            stats.kills.get(),
            stats.stalls.get(),
            stats.closed_by_service.borrow(),
            stats.refused.borrow()
        );
        println!(
            "reservations: {} opened, {} without status, {} abandoned, {} ended by the task's subscription (1000), restores served {} refused {}, backup below minWatermark {}",
            rs.opened.get(),
            rs.no_status.get(),
            rs.abandoned.get(),
            rs.ended_by_subscription.get(),
            rs.restores_served.get(),
            rs.restores_refused.get(),
            rs.backup_below_min.get()
        );
        println!(
            "kills: {} (kill -9, restart on the same port and data dir); acked-but-lost {}; restarts not serving the last acked commit {}",
            kills.count, kills.acked_but_lost, kills.unserved
        );
        for e in &kills.evidence {
            println!("  evidence: {e}");
        }
        for p in tally.first_problems.borrow().iter() {
            println!("  problem: {p}");
        }
    }

    /// The PNG of RssAnon and fds over time, `soak.png` in `--out`.
    fn plot(&self) {
        let png = self.args.out.join("soak.png");
        let title = format!(
            "change-streamer soak: {:.0} min, {} txns/s, {} kill -9",
            self.elapsed / 60.0,
            self.args.rate,
            self.kills.count
        );
        match plot::draw(&png, &title, self.samples, &self.kills.restarts_at) {
            Ok(()) => println!("plot: {}", png.display()),
            Err(e) => println!("plot: not drawn: {e}"),
        }
    }

    /// Prints the one-line verdict; whether the soak passed.
    fn verdict(&self, rss: &Trend, fds: &Trend) -> bool {
        let (tally, stats, rs, kills) = (self.tally, self.stats, self.rs, self.kills);
        let acked: u64 = self.src.acked.get();
        let refused: u64 = stats.refused.borrow().values().sum();
        let pass = tally.gaps.get() == 0
            && tally.duplicates.get() == 0
            && tally.malformed.get() == 0
            && kills.acked_but_lost == 0
            && kills.unserved == 0
            && refused == 0
            && rs.backup_below_min.get() == 0
            && rss.flat()
            && fds.flat()
            && acked > FIRST;
        println!(
            "VERDICT: {} — {:.0} s, {} kills, {} txns checked: gaps {}, duplicates {}, malformed {}, acked-but-lost {}, unserved {}, refused {}, RssAnon {} ({:+.1} MiB), fds {} ({:+.1})",
            if pass { "PASS" } else { "FAIL" },
            self.elapsed,
            kills.count,
            tally.commits.get(),
            tally.gaps.get(),
            tally.duplicates.get(),
            tally.malformed.get(),
            kills.acked_but_lost,
            kills.unserved,
            refused,
            if rss.plateaus.len() < 2 { "not judged (under 2 judged lives)" } else if rss.flat() { "flat" } else { "RISING" },
            rss.rise(),
            if fds.plateaus.len() < 2 { "not judged" } else if fds.flat() { "flat" } else { "RISING" },
            fds.rise(),
        );
        pass
    }
}
