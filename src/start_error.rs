//! Why the service could not start, naming the flags whose values are at fault (the binary
//! prints the error and where each flag's value came from, then exits non-zero).

use change_streamer_actors::changelog::ChangeLogError;
use change_streamer_actors::vfs::VfsError;

use crate::config::{CatchupWindowError, SecretFlagError};
use crate::tls::TlsError;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("--data-dir: {0}")]
    ChangeLog(#[from] ChangeLogError),
    #[error("--change-db: {0}")]
    ChangeDb(ChangeLogError),
    #[error("cannot listen on {addr} (--host, --port): {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("--litestream-vfs: {0}")]
    LitestreamVfs(VfsError),
    /// The VFS extension of a backup of `--backups` (PROTOCOL.md §8.4) cannot be loaded.
    #[error("--backups {file}: backup {backup:?}: key `vfs`: {source}")]
    BackupVfs {
        file: String,
        backup: String,
        source: VfsError,
    },
    #[error(transparent)]
    Secret(#[from] SecretFlagError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    CatchupWindow(#[from] CatchupWindowError),
    /// The instance's life stopped without saying why (it panicked: the log says where).
    #[error("the instance stopped unexpectedly (see the log)")]
    Ended,
    /// The change log's writer stopped while the owner ran (its thread ended: the log says
    /// why); nothing more can be stored (PROTOCOL.md §11.1).
    #[error("the change log's writer stopped unexpectedly (change log {location}); see the log")]
    WriterEnded { location: String },
    /// The HTTP server stopped by itself: nothing is served any more (PROTOCOL.md §11.1).
    #[error("the HTTP server stopped unexpectedly: {0}")]
    ServerEnded(String),
}

impl StartError {
    /// The ids of the flags whose values the error is about.
    pub fn flags(&self) -> &'static [&'static str] {
        match self {
            StartError::ChangeLog(_) => &["data_dir"],
            StartError::ChangeDb(_) => &["change_db"],
            StartError::Bind { .. } => &["host", "port"],
            StartError::LitestreamVfs(_) => &["litestream_vfs"],
            StartError::BackupVfs { .. } => &["backups"],
            StartError::Secret(e) => e.flags(),
            StartError::Ended | StartError::WriterEnded { .. } | StartError::ServerEnded(_) => &[],
            StartError::CatchupWindow(_) => &["catchup_window_bytes", "max_subscriber_queue_bytes"],
            StartError::Tls(e) => match e.flag_id() {
                "tls_cert" => &["tls_cert"],
                "tls_key" => &["tls_key"],
                _ => &["upstream_ca_file"],
            },
        }
    }
}
