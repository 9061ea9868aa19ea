//! The demo's command line: `--seconds N`, `--backup-source metrics|control`, and
//! `--change-db URL [--kill-after N]` for the takeover demo.

use super::takeover;

pub const USAGE: &str = "usage: cargo run --release --example demo [-- [--seconds N] [--backup-source metrics|control] [--change-db postgres://… [--kill-after N]]]";

const FLAGS: &str = "\
flags:
  --seconds N      stop by itself after N seconds (otherwise Ctrl-C stops it)
  --backup-source metrics|control
                   how the service learns what is backed up: a stand-in litestream /metrics
                   page, or real litestream's control API (needs scripts/install-litestream.sh);
                   default: control when litestream is installed, else metrics
  --change-db URL  the takeover demo: three service processes sharing this PostgreSQL database
                   (create it first), two subscribers at each, instead of one instance on its
                   embedded SQLite change log with a backup, litestream and restoring replicas
  --kill-after N   with --change-db: kill -9 the owner after N seconds (Enter kills it too)
";

/// `--backup-source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupSource {
    Metrics,
    Control,
}

/// The demo's flags.
#[derive(Default)]
pub struct Args {
    pub seconds: Option<u64>,
    /// `None`: control when stock litestream is installed, else metrics.
    pub backup_source: Option<BackupSource>,
    /// Three instances sharing this PostgreSQL change DB ([`takeover`]).
    pub change_db: Option<String>,
    /// With `change_db`: kill the owner after this many seconds (also on Enter).
    pub kill_after: Option<u64>,
}

pub fn parse_args() -> Args {
    let fail = |why: &str| -> ! {
        eprintln!("demo: {why}\n{USAGE}");
        std::process::exit(2);
    };
    let seconds = |v: Option<String>, flag: &str| -> u64 {
        v.and_then(|s| s.parse().ok())
            .unwrap_or_else(|| fail(&format!("{flag} takes a whole number of seconds")))
    };
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => args.seconds = Some(seconds(it.next(), "--seconds")),
            "--kill-after" => args.kill_after = Some(seconds(it.next(), "--kill-after")),
            "--backup-source" => {
                args.backup_source = match it.next().as_deref() {
                    Some("metrics") => Some(BackupSource::Metrics),
                    Some("control") => Some(BackupSource::Control),
                    _ => fail("--backup-source takes metrics or control"),
                }
            }
            "--change-db" => {
                args.change_db = Some(
                    it.next()
                        .unwrap_or_else(|| fail("--change-db takes a postgres:// URL")),
                )
            }
            "-h" | "--help" => {
                println!("{USAGE}\n\n{FLAGS}\n{}", takeover::LEGEND);
                std::process::exit(0);
            }
            other => fail(&format!("unknown argument {other}")),
        }
    }
    if args.kill_after.is_some() && args.change_db.is_none() {
        fail("--kill-after needs --change-db");
    }
    args
}
