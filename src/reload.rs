//! Rotation without a restart (PROTOCOL.md §15.1): the one owner of the files the service
//! re-reads, the secret files (`--secret-file`), the TLS pair (`--tls-cert`, `--tls-key`) and
//! the upstream secret (`--upstream-secret-file`).
//!
//! ### One owner, immutable snapshots
//! A single task owns the paths, what it last saw of them and the senders; it re-reads on
//! `SIGHUP` and when a file's modification time or size changes (looked at every
//! [`POLL`]), and publishes each new value whole on a `tokio::sync::watch` channel. The readers
//! (the access rule on every HTTP worker, the TLS resolver, the upstream client at its next
//! connect) only take the latest snapshot, an `Arc` or a small clone, never a lock held across
//! work, and never wait for a reload. Nothing else writes them.
//!
//! ### A bad file changes nothing
//! A file that cannot be read or holds nothing valid is logged as an ERROR naming its flag and
//! path (never its content), and the snapshot before stays; the next change or `SIGHUP` tries
//! again.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use change_streamer_actors::secret::{LiveSecret, Secret, Secrets};
use log::{error, info};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

use crate::tls;

/// How often the files' modification times are looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// What is seen of a file without reading it: its modification time and size (`None`: it
/// cannot be looked at).
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &PathBuf) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// One flag's files and the channel their value is published on.
struct Watched<T> {
    /// The flag, as the log names it.
    flag: &'static str,
    files: Vec<PathBuf>,
    stamps: Vec<Stamp>,
    load: fn(&[PathBuf]) -> Result<T, String>,
    /// What a value is, for the log (never the value itself).
    describe: fn(&T) -> String,
    tx: watch::Sender<T>,
}

/// A [`Watched`] whatever its value.
trait Group {
    /// Whether a file changed since last looked at (and notes what it saw).
    fn changed(&mut self) -> bool;
    /// Reads the files and publishes what they hold; `None` (logged) if they hold nothing
    /// usable, the value before then staying. Answers what was loaded, for the log.
    fn reload(&mut self) -> Option<String>;
}

impl<T> Group for Watched<T> {
    fn changed(&mut self) -> bool {
        let now: Vec<Stamp> = self.files.iter().map(stamp).collect();
        now != std::mem::replace(&mut self.stamps, now.clone())
    }

    fn reload(&mut self) -> Option<String> {
        match (self.load)(&self.files) {
            Ok(value) => {
                let what = format!("{} ({})", self.flag, (self.describe)(&value));
                self.tx.send_replace(value);
                Some(what)
            }
            Err(e) => {
                let files: Vec<String> =
                    self.files.iter().map(|f| f.display().to_string()).collect();
                error!(
                    "reload: {} ({}): {e}; keeping what was loaded before (fix the file, it is read again when it changes or on SIGHUP)",
                    self.flag,
                    files.join(", ")
                );
                None
            }
        }
    }
}

fn watched<T: 'static>(
    flag: &'static str,
    files: Vec<PathBuf>,
    load: fn(&[PathBuf]) -> Result<T, String>,
    describe: fn(&T) -> String,
    tx: watch::Sender<T>,
) -> Box<dyn Group> {
    let stamps = files.iter().map(stamp).collect();
    Box::new(Watched {
        flag,
        files,
        stamps,
        load,
        describe,
        tx,
    })
}

/// The owner of what is re-read (see the module documentation).
pub struct Reloader {
    groups: Vec<Box<dyn Group>>,
}

/// What the start loaded, and the snapshots the readers follow.
pub struct Loaded {
    pub secrets: Option<watch::Receiver<Arc<Secrets>>>,
    pub certificate: Option<watch::Receiver<Arc<CertifiedKey>>>,
    pub upstream_secret: Option<LiveSecret>,
}

impl Reloader {
    /// The reloader of the values the start loaded from these files (`secret_files` empty:
    /// none, or `--secret`, which is not re-read).
    pub fn new(
        secrets: Option<(Secrets, Vec<PathBuf>)>,
        pair: Option<(CertifiedKey, PathBuf, PathBuf)>,
        upstream: Option<(Secret, PathBuf)>,
    ) -> (Reloader, Loaded) {
        let mut groups = Vec::new();
        let secrets = secrets.map(|(value, files)| {
            let (tx, rx) = watch::channel(Arc::new(value));
            if !files.is_empty() {
                groups.push(watched(
                    "--secret-file",
                    files,
                    load_secrets,
                    |s| format!("{} secret(s)", s.len()),
                    tx,
                ));
            }
            rx
        });
        let certificate = pair.map(|(value, cert, key)| {
            let (tx, rx) = watch::channel(Arc::new(value));
            groups.push(watched(
                "--tls-cert/--tls-key",
                vec![cert, key],
                load_pair,
                |_| "new handshakes use it".into(),
                tx,
            ));
            rx
        });
        let upstream_secret = upstream.map(|(value, file)| {
            let (tx, rx) = watch::channel(value);
            groups.push(watched(
                "--upstream-secret-file",
                vec![file],
                load_upstream,
                |_| "used from the next connect".into(),
                tx,
            ));
            rx
        });
        let loaded = Loaded {
            secrets,
            certificate,
            upstream_secret,
        };
        (Reloader { groups }, loaded)
    }

    /// Takes over `SIGHUP` at once (it never stops the service from now on) and runs the
    /// reloader on the current runtime for as long as it runs.
    pub fn start(mut self) {
        #[cfg(unix)]
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(s) => Some(s),
            Err(e) => {
                error!("reload: cannot take over SIGHUP ({e}): files are re-read when they change only");
                None
            }
        };
        actix_rt::spawn(async move {
            let mut poll = tokio::time::interval(POLL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                #[cfg(unix)]
                let hup = async {
                    match hangup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let hup = std::future::pending::<Option<()>>();
                tokio::select! {
                    _ = poll.tick() => self.poll(),
                    _ = hup => self.hangup(),
                }
            }
        });
    }

    /// Re-reads the files that changed.
    fn poll(&mut self) {
        for g in &mut self.groups {
            if g.changed() {
                if let Some(what) = g.reload() {
                    info!("reload: {what}: the file changed");
                }
            }
        }
    }

    /// `SIGHUP`: re-reads everything, and says so in one line.
    fn hangup(&mut self) {
        let mut done = Vec::new();
        for g in &mut self.groups {
            g.changed();
            done.extend(g.reload());
        }
        if self.groups.is_empty() {
            info!("SIGHUP: nothing to reload (no --secret-file, --tls-cert or --upstream-secret-file)");
        } else if done.is_empty() {
            info!("SIGHUP: nothing reloaded: every file was refused (see the errors above)");
        } else {
            info!("SIGHUP: reloaded {}", done.join(", "));
        }
    }
}

fn load_secrets(files: &[PathBuf]) -> Result<Arc<Secrets>, String> {
    Secrets::from_files(files)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

fn load_pair(files: &[PathBuf]) -> Result<Arc<CertifiedKey>, String> {
    tls::certified_key(&files[0], &files[1])
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

fn load_upstream(files: &[PathBuf]) -> Result<Secret, String> {
    Secret::from_file(&files[0]).map_err(|e| e.to_string())
}
