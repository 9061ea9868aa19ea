//! How the PostgreSQL engine reaches the change DB: the connection each thread drives on its
//! own runtime, the name each connection gives itself, and the URL as it may be shown (without
//! its password).

use log::warn;
use tokio::runtime::{Builder, Runtime};
use tokio_postgres::{Client, Config, NoTls};

use super::types::ChangeLogError;

/// The URL without its password, for logs and `/status`.
pub(super) fn redacted(config: &Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_default();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

/// `config` for the connection that serves `part` of this process (`writer`, `reader`,
/// `listen`, `records`, `standby`, `standby-reader`): named `change-streamer <part> pid <pid>`
/// (PostgreSQL's `application_name`, shown in `pg_stat_activity`), so that an operator can
/// tell which instance, and which part of it, a backend serves: the pid is the one in the
/// instance's id (`/status` `instance`). A name the URL sets is kept.
pub(super) fn named(config: &Config, part: &str) -> Config {
    let mut config = config.clone();
    if config.get_application_name().is_none() {
        config.application_name(format!("change-streamer {part} pid {}", std::process::id()));
    }
    config
}

/// The single-threaded runtime one engine thread drives its connection on.
pub(super) fn runtime() -> std::io::Result<Runtime> {
    Builder::new_current_thread().enable_all().build()
}

/// Connects and drives the connection on the current runtime.
pub(super) async fn connect(config: &Config) -> Result<Client, ChangeLogError> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            warn!("change DB connection ended: {e}");
        }
    });
    Ok(client)
}

/// `e` and its causes (written beside the change log's errors, which say theirs with it).
pub(super) use super::types::with_causes;
