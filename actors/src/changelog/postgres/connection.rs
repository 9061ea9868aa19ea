//! How the PostgreSQL engine reaches the change DB: the connection each thread drives on its
//! own runtime, the name each connection gives itself, the URL as it may be shown (without
//! its password), and the bounds within which the change DB must answer (PROTOCOL.md §14.2,
//! a silent change DB): TCP keepalives and a user timeout on every connection, both ends,
//! the server's `statement_timeout`, the writer's idle timeouts, and [`within`], the bound of
//! every call.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use log::warn;
use tokio::runtime::{Builder, Runtime};
use tokio_postgres::{Client, Config, NoTls};

use super::types::ChangeLogError;

/// The change DB lease's floor (PROTOCOL.md §14.2).
pub const MIN_LEASE: Duration = Duration::from_secs(5);

/// The change DB lease, in ms, for every connection made from now on: set at start
/// ([`set_lease`]); 10 s (that of the default takeover interval) until then.
static LEASE_MS: AtomicU64 = AtomicU64::new(10_000);

/// The change DB lease of an instance that tries to own every `takeover_interval`
/// (PROTOCOL.md §14.2): ten intervals, at least [`MIN_LEASE`].
pub fn lease_for(takeover_interval: Duration) -> Duration {
    takeover_interval.saturating_mul(10).max(MIN_LEASE)
}

/// Sets the change DB lease for the connections made from now on (the process's one
/// configuration, set once at start; an actor test sets its own).
pub fn set_lease(lease: Duration) {
    LEASE_MS.store(lease.as_millis().max(1) as u64, Ordering::Relaxed);
}

/// Which session a connection is: the writer's holds the ownership lock, so the server ends
/// it when it hears nothing from it for the lease (PROTOCOL.md §14.2, the server frees the
/// lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Session {
    Writer,
    Other,
}

/// The bounds derived from the lease L (PROTOCOL.md §14.2, a silent change DB).
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub lease: Duration,
}

impl Bounds {
    pub fn current() -> Bounds {
        Bounds {
            lease: Duration::from_millis(LEASE_MS.load(Ordering::Relaxed)),
        }
    }

    /// 3L/5: how long the service waits for the answer to one call (the writer's: see
    /// [`Bounds::late`]).
    pub fn call(&self) -> Duration {
        self.lease * 3 / 5
    }

    /// 2L/5: how long the writer waits for a call's answer before it asks whether the server
    /// is working on it (`liveness.rs`).
    pub fn late(&self) -> Duration {
        self.lease * 2 / 5
    }

    /// L/5: how long the writer waits for that question's answer, and between two questions.
    pub fn probe(&self) -> Duration {
        self.lease / 5
    }

    /// L/2: the server's `statement_timeout` (every session but the writer's), the TCP user
    /// timeout, and connecting.
    pub fn statement(&self) -> Duration {
        self.lease / 2
    }

    /// L/5, in whole seconds (at least 1): the first keepalive probe.
    fn keepalive_idle(&self) -> Duration {
        whole_seconds(self.lease / 5)
    }

    /// L/10, in whole seconds (at least 1): between probes.
    fn keepalive_interval(&self) -> Duration {
        whole_seconds(self.lease / 10)
    }

    /// The server's side of the same bounds, as `(setting, value)`: each one the server
    /// lacks is skipped ([`settle`]).
    fn server_settings(&self, session: Session) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| d.as_millis().to_string();
        let mut settings = vec![
            ("tcp_user_timeout", ms(self.statement())),
            (
                "tcp_keepalives_idle",
                self.keepalive_idle().as_secs().to_string(),
            ),
            (
                "tcp_keepalives_interval",
                self.keepalive_interval().as_secs().to_string(),
            ),
            ("tcp_keepalives_count", KEEPALIVE_RETRIES.to_string()),
        ];
        match session {
            // The writer's statements may rightly take long (a large transaction's commit):
            // its calls are heard out while the server works on them (`liveness.rs`), and
            // the server ends its session once it hears nothing from it for the lease.
            Session::Writer => {
                settings.push(("idle_session_timeout", ms(self.lease)));
                settings.push(("idle_in_transaction_session_timeout", ms(self.lease)));
            }
            Session::Other => settings.push(("statement_timeout", ms(self.statement()))),
        }
        settings
    }
}

/// Unanswered keepalive probes after which a connection is dead.
const KEEPALIVE_RETRIES: u32 = 3;

fn whole_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs_f64().ceil().max(1.0) as u64)
}

/// `f`, given up with [`ChangeLogError::Silent`] if it does not end within `bound` (dropped:
/// the caller gives up the connection it ran on, whose state is then unknown).
pub(super) async fn within<T, E>(
    bound: Duration,
    f: impl Future<Output = Result<T, E>>,
) -> Result<T, ChangeLogError>
where
    ChangeLogError: From<E>,
{
    match tokio::time::timeout(bound, f).await {
        Ok(r) => r.map_err(ChangeLogError::from),
        Err(_) => Err(ChangeLogError::Silent(bound)),
    }
}

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
/// instance's id (`/status` `instance`). A name the URL sets is kept. Its TCP keepalives and
/// user timeout are the lease's (PROTOCOL.md §14.2).
pub(super) fn named(config: &Config, part: &str) -> Config {
    let mut config = config.clone();
    if config.get_application_name().is_none() {
        config.application_name(format!("change-streamer {part} pid {}", std::process::id()));
    }
    let b = Bounds::current();
    config
        .connect_timeout(b.statement())
        .keepalives(true)
        .keepalives_idle(b.keepalive_idle())
        .keepalives_interval(b.keepalive_interval())
        .keepalives_retries(KEEPALIVE_RETRIES)
        .tcp_user_timeout(b.statement());
    config
}

/// The single-threaded runtime one engine thread drives its connection on.
pub(super) fn runtime() -> std::io::Result<Runtime> {
    Builder::new_current_thread().enable_all().build()
}

/// Connects (the handshake included, within L/2), drives the connection on the current
/// runtime and gives the session the server's side of the bounds ([`settle`]).
pub(super) async fn connect(config: &Config, session: Session) -> Result<Client, ChangeLogError> {
    let (client, connection) = within(Bounds::current().statement(), config.connect(NoTls)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            warn!("change DB connection ended: {e}");
        }
    });
    settle(&client, session).await?;
    Ok(client)
}

/// Sets the server's side of the bounds on this session (PROTOCOL.md §14.2): keepalives, user
/// timeout and `statement_timeout`, and the writer's idle timeouts; a setting the server does
/// not know (an older version) is skipped.
pub(super) async fn settle(client: &Client, session: Session) -> Result<(), ChangeLogError> {
    let b = Bounds::current();
    let (names, values): (Vec<&str>, Vec<String>) = b.server_settings(session).into_iter().unzip();
    within(
        b.call(),
        client.query(
            "SELECT set_config(s.name, v.setting, false)
             FROM unnest($1::text[], $2::text[]) AS v(name, setting)
             JOIN pg_settings s ON s.name = v.name",
            &[&names, &values],
        ),
    )
    .await?;
    Ok(())
}

/// `e` and its causes (written beside the change log's errors, which say theirs with it).
pub(super) use super::types::with_causes;

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_lease_is_ten_takeover_intervals_at_least_five_seconds() {
        assert_eq!(lease_for(ms(1_000)), ms(10_000));
        assert_eq!(lease_for(ms(200)), MIN_LEASE);
        assert_eq!(lease_for(ms(1)), MIN_LEASE);
        assert_eq!(lease_for(ms(5_000)), ms(50_000));
    }

    #[test]
    fn each_bound_is_its_share_of_the_lease_keepalives_in_whole_seconds() {
        let b = Bounds { lease: ms(10_000) };
        assert_eq!(b.call(), ms(6_000));
        assert_eq!(b.late(), ms(4_000));
        assert_eq!(b.probe(), ms(2_000));
        assert_eq!(b.statement(), ms(5_000));
        assert_eq!(b.keepalive_idle(), ms(2_000));
        assert_eq!(b.keepalive_interval(), ms(1_000));
        // At the floor, L/10 is half a second: a probe interval is at least a whole one (the
        // socket's and the server's settings count seconds; 0 would be the system's default).
        let short = Bounds { lease: MIN_LEASE };
        assert_eq!(short.keepalive_idle(), ms(1_000));
        assert_eq!(short.keepalive_interval(), ms(1_000));
    }

    #[test]
    fn only_the_writers_session_is_ended_by_the_server_when_silent() {
        let b = Bounds { lease: ms(10_000) };
        let names = |s| -> Vec<&str> { b.server_settings(s).into_iter().map(|(n, _)| n).collect() };
        let writer = b.server_settings(Session::Writer);
        assert!(writer.contains(&("idle_session_timeout", "10000".into())));
        assert!(writer.contains(&("idle_in_transaction_session_timeout", "10000".into())));
        assert!(writer.contains(&("tcp_keepalives_interval", "1".into())));
        assert!(!names(Session::Writer).contains(&"statement_timeout"));
        assert!(names(Session::Other).contains(&"statement_timeout"));
        for other in [
            "idle_session_timeout",
            "idle_in_transaction_session_timeout",
        ] {
            assert!(!names(Session::Other).contains(&other), "{other}");
        }
        assert!(names(Session::Other).contains(&"tcp_user_timeout"));
    }
}
