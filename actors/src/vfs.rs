//! The monitor's side of the VFS reader (PROTOCOL.md §8.1b): starts the helper process that reads the
//! backup through litestream's VFS ([`crate::vfs_reader`], which says why it is a process),
//! asks it for the watermark once per poll, and kills it when it does not answer in time.
//!
//! A reader is started on the first poll and kept: loading the extension costs ~0.3 s, a poll
//! on a live reader only opens the backup and runs the query. When a poll gets no answer within
//! its timeout (no backup yet: the extension waits for one; or the VFS is wedged), the reader is
//! killed and the next poll starts a new one. A reader that exits or garbles the protocol is
//! replaced the same way.
//!
//! Loading is the exception: a reader still loading the extension when a poll's time runs out
//! is kept (that poll fails) and the next poll goes on waiting for it, up to [`LOAD_LIMIT`] in
//! all. Otherwise a poll timeout shorter than the load (`--backup-check-interval-ms` under
//! ~0.3 s, or a busy machine) would kill every new reader before it could ever answer.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use log::{debug, info};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::vfs_reader::{Reply, Request, ENV_EXTENSION, ENV_QUERY};

/// The default `--backup-watermark-query`.
pub const DEFAULT_WATERMARK_QUERY: &str = r#"SELECT stateVersion FROM "_zero.replicationState""#;

/// The change-streamer binary whose hidden subcommand the service runs as its reader, when it
/// is not the running executable; see [`HelperCommand::for_service`].
pub const ENV_READER: &str = "CHANGE_STREAMER_VFS_READER";

/// The longest a reader may take to load the extension, over as many polls as it takes; past
/// it the reader is killed like a wedged one.
pub const LOAD_LIMIT: Duration = Duration::from_secs(10);

/// How to start a reader process: a program that runs [`crate::vfs_reader::run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl HelperCommand {
    /// The reader the service starts: a change-streamer binary run with the hidden
    /// [`SUBCOMMAND`](crate::vfs_reader::SUBCOMMAND). That binary is `$`[`ENV_READER`] when set
    /// (tests that run the service inside the test process point it at the real binary), the
    /// running executable otherwise.
    pub fn for_service() -> std::io::Result<HelperCommand> {
        let program = match std::env::var_os(ENV_READER) {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()?,
        };
        Ok(HelperCommand {
            program,
            args: vec![crate::vfs_reader::SUBCOMMAND.into()],
        })
    }

    /// A program that is a reader by itself (the `change-streamer-vfs-reader` binary).
    pub fn program(program: impl Into<PathBuf>) -> HelperCommand {
        HelperCommand {
            program: program.into(),
            args: Vec::new(),
        }
    }
}

/// Where and how to read the backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfsSource {
    pub helper: HelperCommand,
    /// `--litestream-vfs`: the extension's path.
    pub extension: PathBuf,
    /// `--litestream-backup-url` (`file://`, `s3://`) as the reader's `LITESTREAM_REPLICA_URL`
    /// (a backup's `s3_` settings added, PROTOCOL.md §8.4); litestream's own environment
    /// variables (AWS credentials, region) reach the reader through the inherited environment.
    pub backup_url: String,
    /// `--backup-watermark-query`.
    pub query: String,
    /// Variables set (`Some`) or removed (`None`) in the reader's environment (a backup's
    /// `s3_credentials_file`, PROTOCOL.md §8.4).
    pub env: Vec<(String, Option<String>)>,
}

impl VfsSource {
    /// A variable of the reader's environment: [`VfsSource::env`]'s, else the service's.
    fn var(&self, name: &str) -> Option<String> {
        match self.env.iter().find(|(k, _)| k == name) {
            Some((_, v)) => v.clone(),
            None => std::env::var(name).ok(),
        }
    }

    /// PROTOCOL.md §8.4 "The environment": a variable that would break the reader's S3 client.
    pub fn check_environment(&self) -> Result<(), VfsError> {
        match crate::vfs_env::breaking_variable(&self.backup_url, |n| self.var(n)) {
            Some(why) => Err(VfsError::Environment(why)),
            None => Ok(()),
        }
    }
}

/// Why a poll through the VFS read no watermark.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VfsError {
    #[error("cannot start the VFS reader {program}: {reason}")]
    Spawn { program: String, reason: String },
    #[error("no answer within {0} ms (no backup yet, or the VFS is wedged); the reader is restarted on the next poll")]
    Timeout(u128),
    #[error(
        "the VFS reader is still loading the extension ({0} ms so far); the next poll waits on"
    )]
    Loading(u128),
    #[error("the VFS reader exited")]
    Exited,
    #[error("talking to the VFS reader: {0}")]
    Io(String),
    #[error("the VFS reader answered {0:?} out of turn")]
    Protocol(String),
    /// The reader's own error: the extension did not load, or opening or querying failed.
    #[error("{0}")]
    Read(String),
    /// The reader's environment would break litestream's S3 client (PROTOCOL.md §8.4).
    #[error("{0}")]
    Environment(String),
}

/// What one read of the backup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReading {
    /// The query's answer, as text.
    pub watermark: String,
    /// Page count × page size (PROTOCOL.md §6.3); `None` when the pragmas failed.
    pub bytes: Option<u64>,
}

struct Helper {
    // Killed when dropped.
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    /// When it was started, until it says it has loaded the extension.
    loading_since: Option<tokio::time::Instant>,
}

/// One reader process, started when needed; see the module documentation.
pub struct VfsReader {
    source: VfsSource,
    helper: Option<Helper>,
}

impl VfsReader {
    pub fn new(source: VfsSource) -> VfsReader {
        VfsReader {
            source,
            helper: None,
        }
    }

    /// Starts a reader if none runs and waits until it has loaded the extension, within
    /// `timeout`. The service calls this at start to reject a `--litestream-vfs` that cannot be
    /// loaded.
    pub async fn start(&mut self, timeout: Duration) -> Result<(), VfsError> {
        let res = tokio::time::timeout(timeout, self.ready()).await;
        self.settle(res, timeout)
    }

    /// Reads the backed-up watermark and the database's size, starting a reader first if needed,
    /// all within `timeout`.
    pub async fn read(&mut self, timeout: Duration) -> Result<BackupReading, VfsError> {
        let res = tokio::time::timeout(timeout, async {
            self.ready().await?;
            self.ask(Request::Poll).await
        })
        .await;
        self.settle(res, timeout)
    }

    /// A reader that timed out or broke the conversation is killed (dropped); one that merely
    /// reported an error is kept.
    fn settle<T>(
        &mut self,
        res: Result<Result<T, VfsError>, tokio::time::error::Elapsed>,
        timeout: Duration,
    ) -> Result<T, VfsError> {
        match res {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e @ VfsError::Read(_))) => Err(e),
            Ok(Err(e)) => {
                self.helper = None;
                Err(e)
            }
            Err(_) => {
                let loading = self.helper.as_ref().and_then(|h| h.loading_since);
                if let Some(since) = loading.filter(|s| s.elapsed() < LOAD_LIMIT) {
                    return Err(VfsError::Loading(since.elapsed().as_millis()));
                }
                if self.helper.take().is_some() {
                    info!(
                        "killed the VFS reader for {}: no answer in time",
                        self.source.backup_url
                    );
                }
                Err(VfsError::Timeout(timeout.as_millis()))
            }
        }
    }

    async fn ready(&mut self) -> Result<(), VfsError> {
        match &self.helper {
            Some(h) if h.loading_since.is_none() => return Ok(()),
            // Started by an earlier call whose time ran out: go on waiting for it.
            Some(_) => return self.loaded().await,
            None => {}
        }
        let s = &self.source;
        s.check_environment()?;
        let mut command = Command::new(&s.helper.program);
        for (k, v) in &s.env {
            match v {
                Some(v) => command.env(k, v),
                None => command.env_remove(k),
            };
        }
        let mut child = command
            .args(&s.helper.args)
            .env("LITESTREAM_REPLICA_URL", &s.backup_url)
            .env(ENV_EXTENSION, &s.extension)
            .env(ENV_QUERY, &s.query)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| VfsError::Spawn {
                program: s.helper.program.display().to_string(),
                reason: e.to_string(),
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(VfsError::Io("the reader's pipes are missing".into()));
        };
        debug!(
            "started the VFS reader (pid {:?}) for {}",
            child.id(),
            s.backup_url
        );
        self.helper = Some(Helper {
            _child: child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
            loading_since: Some(tokio::time::Instant::now()),
        });
        self.loaded().await
    }

    /// Waits for the reader's first reply: loaded, or why not. Cancel-safe (reading lines is),
    /// so a later call can take over the wait.
    async fn loaded(&mut self) -> Result<(), VfsError> {
        match self.next_reply().await? {
            Reply::Ready => {
                if let Some(h) = self.helper.as_mut() {
                    h.loading_since = None;
                }
                Ok(())
            }
            Reply::Error(e) => Err(VfsError::Spawn {
                program: self.source.helper.program.display().to_string(),
                reason: crate::vfs_env::explain(&self.source.backup_url, e),
            }),
            other => Err(VfsError::Protocol(format!("{other:?}"))),
        }
    }

    async fn ask(&mut self, req: Request) -> Result<BackupReading, VfsError> {
        let helper = self.helper.as_mut().ok_or(VfsError::Exited)?;
        let mut line = serde_json::to_string(&req).map_err(|e| VfsError::Io(e.to_string()))?;
        line.push('\n');
        helper
            .stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| VfsError::Io(e.to_string()))?;
        match self.next_reply().await? {
            Reply::Backup { watermark, bytes } => Ok(BackupReading { watermark, bytes }),
            Reply::Error(e) => Err(VfsError::Read(crate::vfs_env::explain(
                &self.source.backup_url,
                e,
            ))),
            other => Err(VfsError::Protocol(format!("{other:?}"))),
        }
    }

    /// The next reply line; the extension's own log lines on the same pipe are passed to the log.
    async fn next_reply(&mut self) -> Result<Reply, VfsError> {
        let helper = self.helper.as_mut().ok_or(VfsError::Exited)?;
        loop {
            let line = helper
                .stdout
                .next_line()
                .await
                .map_err(|e| VfsError::Io(e.to_string()))?
                .ok_or(VfsError::Exited)?;
            match serde_json::from_str::<Reply>(&line) {
                Ok(reply) => return Ok(reply),
                Err(_) => info!("litestream vfs: {line}"),
            }
        }
    }
}
