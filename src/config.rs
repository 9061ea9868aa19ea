//! Flags and environment variables (PROTOCOL.md §2).
//!
//! Every flag also reads the environment variable named in its help; a flag given on the command
//! line wins. Values are checked here, at start, so that a bad one stops the service with a
//! message naming the flag, before anything is opened or bound.

use std::path::PathBuf;
use std::time::Duration;

use backups::parse_backups_file;
pub use backups::{
    AuditSpec, BackupSpec, BackupsFile, SourceSpec, DEFAULT_METRICS_URL, DEFAULT_WATERMARK_QUERY,
    SINGLE_BACKUP,
};
use change_streamer_actors::changelog::ChangeDb;
use change_streamer_actors::litestream_control::ControlUrl;
use change_streamer_actors::secret::{Secret, Secrets};
use change_streamer_actors::streamer::StreamerConfig;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use values::{
    parse_control_url, parse_http_url, parse_non_empty, parse_padding, parse_postgres_url,
    parse_secret, parse_ws_url,
};

pub use values::{SecretArg, SecretFlagError};

mod backups;
mod values;

/// Streams an upstream database's change log to replicas over websockets, and purges the log
/// only once litestream has backed it up, no replica is restoring an older backup, and every
/// connected subscriber has passed it.
#[derive(Parser, Debug, Clone)]
#[command(name = "change-streamer", version, about, long_about = None)]
pub struct Config {
    /// ws:// or wss:// URL of the custom change source. Without it the service serves what
    /// the change log already holds and receives nothing new.
    #[arg(help_heading = "Upstream", long, env = "ZERO_UPSTREAM_URL", value_parser = parse_ws_url)]
    pub upstream: Option<String>,

    /// File whose content (one trailing newline stripped) is sent to the change source as
    /// `Authorization: Bearer <secret>`.
    #[arg(help_heading = "Upstream", long, env = "ZERO_UPSTREAM_SECRET_FILE")]
    pub upstream_secret_file: Option<PathBuf>,

    /// Extra PEM root certificate(s) trusted for a wss:// --upstream, beside the system's.
    #[arg(help_heading = "Upstream", long, env = "ZERO_UPSTREAM_CA_FILE")]
    pub upstream_ca_file: Option<PathBuf>,

    /// The change source's liveness: ping period in ms; nothing heard from it for two periods
    /// ends the connection (1001 "no pong for N ms"), and a connect must complete within two.
    #[arg(help_heading = "Upstream", long, env = "ZERO_UPSTREAM_PING_INTERVAL_MS", default_value_t = 30_000, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_ping_interval_ms: u64,

    /// Litestream backup URL: enables the backup monitor and is sent to restoring replicas.
    /// Without it nothing is polled or purged and snapshot reservations are refused.
    #[arg(help_heading = "Backup", long, env = "ZERO_LITESTREAM_BACKUP_URL", value_parser = parse_non_empty)]
    pub litestream_backup_url: Option<String>,

    /// litestream's Prometheus endpoint (http:// or https://).
    #[arg(
        help_heading = "Backup",
        long,
        env = "ZERO_LITESTREAM_METRICS_URL",
        default_value = DEFAULT_METRICS_URL,
        value_parser = parse_http_url
    )]
    pub litestream_metrics_url: String,

    /// Period of the litestream metrics poll, in ms (≥ 1). The first poll comes one period
    /// after start.
    #[arg(help_heading = "Backup", long, env = "ZERO_BACKUP_CHECK_INTERVAL_MS", default_value_t = 60_000, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub backup_check_interval_ms: u64,

    /// Starting cleanup delay in ms; raised to --min-cleanup-delay-ms.
    #[arg(
        help_heading = "Backup",
        long,
        env = "ZERO_INITIAL_CLEANUP_DELAY_MS",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub initial_cleanup_delay_ms: u64,

    /// Floor of the cleanup delay in ms: a backed-up watermark is cleaned up no sooner.
    #[arg(
        help_heading = "Backup",
        long,
        env = "ZERO_MIN_CLEANUP_DELAY_MS",
        default_value_t = 30_000,
        allow_negative_numbers = true
    )]
    pub min_cleanup_delay_ms: u64,

    /// A snapshot reservation held longer than this, in ms, is ended with 1011 (PROTOCOL.md §6.6);
    /// 0: no cap.
    #[arg(
        help_heading = "Backup",
        long,
        env = "ZERO_MAX_RESERVATION_MS",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub max_reservation_ms: u64,

    /// Path of litestream 0.5's SQLite VFS extension (`litestream-vfs.so`): the backup monitor
    /// reads the backed-up watermark out of the backup itself instead of the metrics.
    #[arg(help_heading = "Backup", long, env = "ZERO_LITESTREAM_VFS")]
    pub litestream_vfs: Option<PathBuf>,

    /// Run on the backup through the VFS: the first column of the first row is the backed-up
    /// watermark.
    #[arg(
        help_heading = "Backup",
        long,
        env = "ZERO_BACKUP_WATERMARK_QUERY",
        default_value = DEFAULT_WATERMARK_QUERY,
        value_parser = parse_non_empty
    )]
    pub backup_watermark_query: String,

    /// litestream's control API, `unix:/path/to/litestream.sock` or `http://host:port`: the
    /// backup monitor asks it to sync and wait at each commit the backup replicator acks,
    /// reading nothing of the backup (PROTOCOL.md §8.1c). Needs --litestream-db-path.
    #[arg(help_heading = "Backup", long, env = "ZERO_LITESTREAM_CONTROL_URL",
          value_parser = parse_control_url, requires = "litestream_db_path",
          requires = "litestream_backup_url")]
    pub litestream_control_url: Option<ControlUrl>,

    /// Period of the audit that reads the backup through the VFS and compares it with what
    /// the control API confirmed; a backup that reads back less stops every purge
    /// (PROTOCOL.md §8.1d). Unset: 60000 with --litestream-control-url and --litestream-vfs,
    /// else no audit; 0: no audit.
    #[arg(
        help_heading = "Backup",
        long,
        env = "ZERO_BACKUP_AUDIT_INTERVAL_MS",
        requires = "litestream_vfs",
        requires = "litestream_control_url"
    )]
    pub backup_audit_interval_ms: Option<u64>,

    /// The backup replica's SQLite file as litestream.yml names it, for
    /// --litestream-control-url.
    #[arg(help_heading = "Backup", long, env = "ZERO_LITESTREAM_DB_PATH",
          value_parser = parse_non_empty, requires = "litestream_control_url")]
    pub litestream_db_path: Option<String>,

    /// A TOML file listing several backups, one `[[backup]]` table each (name, url, source and
    /// its settings), each with its own backup replicator and monitor (PROTOCOL.md §8.4).
    /// Replaces the single-backup flags above, which cannot be given with it.
    #[arg(help_heading = "Backup", long, env = "ZERO_BACKUPS", value_name = "FILE",
          value_parser = parse_backups_file,
          conflicts_with_all = ["litestream_backup_url", "litestream_metrics_url", "litestream_vfs",
                                "backup_watermark_query", "litestream_control_url", "litestream_db_path"])]
    pub backups: Option<BackupsFile>,

    /// K: a watermark may be purged only once K of the backups hold it (PROTOCOL.md §8.4);
    /// 1 ≤ K ≤ the number of backups, default all of them.
    #[arg(help_heading = "Backup", long, env = "ZERO_PURGE_QUORUM", value_name = "K", allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub purge_quorum: Option<u64>,

    /// Directory holding the change log database (created if missing).
    #[arg(
        help_heading = "Change log",
        long,
        env = "ZERO_CHANGE_STREAMER_DATA_DIR",
        default_value = "./change-streamer-data"
    )]
    pub data_dir: PathBuf,

    /// Wait in ms between a scheduled cleanup and its purge check (and between retries).
    #[arg(
        help_heading = "Change log",
        long,
        env = "ZERO_PURGE_DELAY_MS",
        default_value_t = 30_000,
        allow_negative_numbers = true
    )]
    pub purge_delay_ms: u64,

    /// A change-log row is purged only once it has been stored this long, in ms (PROTOCOL.md §9).
    #[arg(
        help_heading = "Change log",
        long,
        env = "ZERO_CHANGE_LOG_RETENTION_MS",
        default_value_t = 60_000,
        allow_negative_numbers = true
    )]
    pub change_log_retention_ms: u64,

    /// postgres:// URL of a change DB shared by several instances: the change log and the
    /// service's state live there instead of in SQLite under --data-dir; one instance owns it,
    /// the others stand by.
    #[arg(help_heading = "Change log", long, env = "ZERO_CHANGE_DB", value_parser = parse_postgres_url)]
    pub change_db: Option<String>,

    /// Seconds that the subscribers outside a majority get after the latest ack before flow
    /// control moves on without them; negative waits for every subscriber.
    #[arg(
        help_heading = "Subscribers",
        long,
        env = "ZERO_CHANGE_STREAMER_FLOW_CONTROL_CONSENSUS_PADDING_SECONDS",
        default_value_t = 1.0,
        allow_negative_numbers = true,
        value_parser = parse_padding
    )]
    pub flow_control_consensus_padding_seconds: f64,

    /// Websocket liveness: ping period in ms; a connection silent for a whole period is
    /// dropped.
    #[arg(help_heading = "Subscribers", long, env = "ZERO_PING_INTERVAL_MS", default_value_t = 30_000, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub ping_interval_ms: u64,

    /// A subscriber still lagging on the same tracked send this many ms after it began lagging
    /// (another subscriber acked it, it did not) is closed with 1013; 0 never evicts.
    #[arg(
        help_heading = "Subscribers",
        long,
        env = "ZERO_FLOW_CONTROL_SLOW_SUBSCRIBER_GRACE_MS",
        default_value_t = 30_000,
        allow_negative_numbers = true
    )]
    pub slow_subscriber_grace_ms: u64,

    /// The most changes held in memory for one subscriber (sent and not acked, or queued);
    /// past it the subscriber reads from the change log instead (≥ 1).
    #[arg(help_heading = "Subscribers", long, env = "ZERO_MAX_SUBSCRIBER_QUEUE_CHANGES", default_value_t = 20_000, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_subscriber_queue_changes: u64,

    /// The most bytes of change payload held in memory for one subscriber, counted in the same
    /// changes (a change shared with others counts for each); past it the subscriber reads
    /// from the change log instead (≥ 65536).
    #[arg(help_heading = "Subscribers", long, env = "ZERO_MAX_SUBSCRIBER_QUEUE_BYTES", default_value_t = 16 << 20, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(65536..))]
    pub max_subscriber_queue_bytes: u64,

    /// How much payload a catch-up sends ahead of the subscriber's acks: it reads and sends
    /// while what the subscriber has not acked is under this, so one that acks late or only at
    /// commits still gets a continuous stream (≥ 65536; above --max-subscriber-queue-bytes the
    /// service does not start).
    #[arg(help_heading = "Subscribers", long, env = "ZERO_CATCHUP_WINDOW_BYTES", default_value_t = 4 << 20, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(65536..))]
    pub catchup_window_bytes: u64,

    /// The most bytes of change payload held in memory for all subscribers together; past it
    /// the subscriber holding the most reads from the change log first (≥ 65536).
    #[arg(help_heading = "Subscribers", long, env = "ZERO_MAX_QUEUED_BYTES", default_value_t = 256 << 20, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(65536..))]
    pub max_queued_bytes: u64,

    /// HTTP and websocket port (0 picks a free one).
    #[arg(
        help_heading = "Access",
        long,
        env = "ZERO_CHANGE_STREAMER_PORT",
        default_value_t = 4849,
        allow_negative_numbers = true
    )]
    pub port: u16,

    /// Address to bind.
    #[arg(
        help_heading = "Access",
        long,
        env = "ZERO_CHANGE_STREAMER_HOST",
        default_value = "0.0.0.0"
    )]
    pub host: String,

    /// File whose content (one trailing newline stripped) is the shared secret that clients
    /// must present as `Authorization: Bearer <secret>` on every path but /healthz, /readyz and
    /// /metrics (PROTOCOL.md §15); 16 to 4096 visible ASCII bytes (e.g. `openssl rand -hex 32`).
    /// To rotate, give it twice (current and next) or write two lines: either secret is
    /// accepted. Re-read on SIGHUP and when it changes (PROTOCOL.md §15.1).
    #[arg(
        help_heading = "Access",
        long,
        env = "ZERO_CHANGE_STREAMER_SECRET_FILE",
        action = clap::ArgAction::Append
    )]
    pub secret_file: Vec<PathBuf>,

    /// The shared secret itself (as --secret-file); prefer the file or the variable: a flag
    /// shows in `ps`.
    #[arg(help_heading = "Access", long, env = "ZERO_CHANGE_STREAMER_SECRET", hide_env_values = true,
          allow_hyphen_values = true, value_name = "SECRET", value_parser = parse_secret)]
    pub secret: Option<SecretArg>,

    /// Without a secret, serve the guarded paths (all but /healthz, /readyz and /metrics) to
    /// clients that are not on loopback too (otherwise they get 403).
    #[arg(
        help_heading = "Access",
        long,
        env = "ZERO_CHANGE_STREAMER_ALLOW_UNAUTHENTICATED"
    )]
    pub allow_unauthenticated: bool,

    /// PEM certificate chain: with --tls-key, every endpoint is served over TLS 1.2+ on
    /// --port (HTTPS, wss://).
    #[arg(help_heading = "Access", long, env = "ZERO_CHANGE_STREAMER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(help_heading = "Access", long, env = "ZERO_CHANGE_STREAMER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// How often, in ms (≥ 1), a standby tries to become the owner of --change-db. Ten of
    /// them, at least 5 s, are the change DB lease: a change DB silent for longer is out of
    /// reach, and its owner steps down (PROTOCOL.md §14.2).
    #[arg(help_heading = "Instances", long, env = "ZERO_TAKEOVER_INTERVAL_MS", default_value_t = 1_000, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub takeover_interval_ms: u64,

    /// With --change-db, whether a standby serves /changes from the change DB (catch-up, then
    /// the owner's commits as they are made) while it stands by, and keeps those subscribers
    /// when it takes over; `--standby-serves=false` closes those websockets with 1011
    /// `standby: not the owner`. /snapshot at a serving standby holds its reservation there,
    /// recorded in the change DB so that the owner pauses cleanup for it (PROTOCOL.md §14.1);
    /// at one that does not serve it is closed with 1011 the same way.
    #[arg(help_heading = "Instances", long, env = "ZERO_STANDBY_SERVES", default_value_t = true, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub standby_serves: bool,
}

impl Config {
    pub fn backup_check_interval(&self) -> Duration {
        Duration::from_millis(self.backup_check_interval_ms)
    }
    /// PROTOCOL.md §8.1d: the single backup's audit period, `None` without an audit.
    pub fn backup_audit_interval(&self) -> Option<Duration> {
        if self.litestream_control_url.is_none() || self.litestream_vfs.is_none() {
            return None;
        }
        backups::audit_interval(self.backup_audit_interval_ms)
    }
    pub fn purge_delay(&self) -> Duration {
        Duration::from_millis(self.purge_delay_ms)
    }
    pub fn ping_interval(&self) -> Duration {
        Duration::from_millis(self.ping_interval_ms)
    }
    pub fn upstream_ping_interval(&self) -> Duration {
        Duration::from_millis(self.upstream_ping_interval_ms)
    }
    pub fn takeover_interval(&self) -> Duration {
        Duration::from_millis(self.takeover_interval_ms)
    }
    pub fn initial_cleanup_delay(&self) -> Duration {
        Duration::from_millis(self.initial_cleanup_delay_ms)
    }
    pub fn min_cleanup_delay(&self) -> Duration {
        Duration::from_millis(self.min_cleanup_delay_ms)
    }
    pub fn change_log_retention(&self) -> Duration {
        Duration::from_millis(self.change_log_retention_ms)
    }
    /// `--max-reservation-ms`; `None` (the flag's 0): no cap.
    pub fn max_reservation(&self) -> Option<Duration> {
        (self.max_reservation_ms > 0).then(|| Duration::from_millis(self.max_reservation_ms))
    }
    /// `--slow-subscriber-grace-ms`; `None` (the flag's 0): never evict.
    pub fn slow_subscriber_grace(&self) -> Option<Duration> {
        (self.slow_subscriber_grace_ms > 0)
            .then(|| Duration::from_millis(self.slow_subscriber_grace_ms))
    }
    /// The change log's engine (PROTOCOL.md §2): `--change-db`'s shared change DB, else SQLite
    /// under `--data-dir`.
    pub fn engine(&self) -> ChangeDb {
        match &self.change_db {
            Some(url) => ChangeDb::Postgres { url: url.clone() },
            None => ChangeDb::Sqlite {
                dir: self.data_dir.clone(),
            },
        }
    }

    /// The streamer's tunables, from the same flags at the owner and at a serving standby.
    pub fn streamer(&self) -> StreamerConfig {
        StreamerConfig {
            padding: self.padding(),
            max_queue_changes: self.max_subscriber_queue_changes as usize,
            max_queue_bytes: self.max_subscriber_queue_bytes as usize,
            catchup_window_bytes: self.catchup_window_bytes as usize,
            max_queued_bytes: self.max_queued_bytes as usize,
            slow_grace: self.slow_subscriber_grace(),
            ..StreamerConfig::default()
        }
    }
    /// The flow-control padding; `None` (the flag's negative seconds): wait for every
    /// subscriber. The flag's parser keeps it finite.
    pub fn padding(&self) -> Option<Duration> {
        let seconds = self.flow_control_consensus_padding_seconds;
        (seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
    }
    /// The secrets clients may present (`--secret-file`, once or twice, or `--secret`),
    /// checked; `None` in protected or open mode.
    pub fn secret(&self) -> Result<Option<Secrets>, SecretFlagError> {
        let bad = |flag| move |source| SecretFlagError::Bad { flag, source };
        match (&self.secret, &self.secret_file[..]) {
            (Some(_), [_, ..]) => Err(SecretFlagError::Both),
            (Some(SecretArg(s)), []) => s
                .clone()
                .map(|s| Some(Secrets::one(s)))
                .map_err(bad("secret")),
            (None, []) => Ok(None),
            (None, files) => Secrets::from_files(files)
                .map(Some)
                .map_err(bad("secret-file")),
        }
    }
    /// The secret sent to the change source (`--upstream-secret-file`), checked.
    pub fn upstream_secret(&self) -> Result<Option<Secret>, SecretFlagError> {
        self.upstream_secret_file
            .as_deref()
            .map(Secret::from_file)
            .transpose()
            .map_err(|source| SecretFlagError::Bad {
                flag: "upstream-secret-file",
                source,
            })
    }
    /// `--catchup-window-bytes` within `--max-subscriber-queue-bytes` (PROTOCOL.md §2, §10.2):
    /// a larger window is refused rather than cut, so that no value is silently ignored.
    pub fn check_catchup_window(&self) -> Result<(), CatchupWindowError> {
        if self.catchup_window_bytes > self.max_subscriber_queue_bytes {
            return Err(CatchupWindowError {
                window: self.catchup_window_bytes,
                bound: self.max_subscriber_queue_bytes,
            });
        }
        Ok(())
    }
    /// The cleanup delay the service starts with.
    pub fn starting_cleanup_delay(&self) -> Duration {
        self.initial_cleanup_delay().max(self.min_cleanup_delay())
    }
}

/// `--catchup-window-bytes` above `--max-subscriber-queue-bytes` ([`Config::check_catchup_window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("--catchup-window-bytes {window} is above --max-subscriber-queue-bytes {bound}: a catch-up's window must fit in what one subscriber may hold (PROTOCOL.md §10.2)")]
pub struct CatchupWindowError {
    pub window: u64,
    pub bound: u64,
}

/// Parses the command line and the environment; on a bad value prints clap's message, naming
/// the environment variable too when that is where the value came from, and exits non-zero.
/// The matches tell later errors where each value came from ([`env_sources`]).
pub fn parse_or_exit() -> (Config, ArgMatches) {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match parse_from(&args) {
        Ok(parsed) => parsed,
        Err(e) => e.exit(),
    }
}

/// [`parse_or_exit`] without the exit.
fn parse_from(args: &[std::ffi::OsString]) -> Result<(Config, ArgMatches), clap::Error> {
    let mut command = Config::command();
    let matches = command
        .try_get_matches_from_mut(args)
        .map_err(|e| name_env_source(e, &command, args))?;
    let config = Config::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
    config
        .check_purge_quorum()
        .map_err(|msg| command.error(ErrorKind::ValueValidation, msg))?;
    Ok((config, matches))
}

/// A value that failed to parse has no `value_source` (there are no matches yet), so the source
/// is told the way clap chose it: the flag was not on the command line and its variable is set.
fn name_env_source(
    mut e: clap::Error,
    command: &clap::Command,
    args: &[std::ffi::OsString],
) -> clap::Error {
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return e;
    }
    let Some(ContextValue::String(shown)) = e.get(ContextKind::InvalidArg).cloned() else {
        return e;
    };
    let Some(arg) = command.get_arguments().find(|a| {
        a.get_long()
            .is_some_and(|long| shown.starts_with(&format!("--{long}")))
    }) else {
        return e;
    };
    let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) else {
        return e;
    };
    let flag = format!("--{long}");
    let on_command_line = args.iter().skip(1).any(|a| {
        let a = a.to_string_lossy();
        a == flag || a.starts_with(&format!("{flag}="))
    });
    if !on_command_line && std::env::var_os(env).is_some() {
        e.insert(
            ContextKind::InvalidArg,
            ContextValue::String(format!(
                "{shown} (from environment variable {})",
                env.to_string_lossy()
            )),
        );
    }
    e
}

/// For the flags `ids` whose value came from the environment, ` (--flag from VARIABLE, …)`;
/// empty when none did.
pub fn env_sources(matches: &ArgMatches, ids: &[&str]) -> String {
    let command = Config::command();
    let named: Vec<String> = ids
        .iter()
        .filter(|id| matches.value_source(id) == Some(ValueSource::EnvVariable))
        .filter_map(|id| command.get_arguments().find(|a| a.get_id() == *id))
        .filter_map(|a| {
            Some(format!(
                "--{} from {}",
                a.get_long()?,
                a.get_env()?.to_string_lossy()
            ))
        })
        .collect();
    if named.is_empty() {
        String::new()
    } else {
        format!(" ({})", named.join(", "))
    }
}

#[cfg(test)]
mod tests;
