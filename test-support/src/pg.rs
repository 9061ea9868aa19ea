//! A database of its own for each PostgreSQL test, on the server the project's machines run.
//!
//! Which server, decided once per test process:
//! - `$CHANGE_STREAMER_TEST_PG` set to a URL (trust auth, user `postgres`): that server;
//! - `CHANGE_STREAMER_TEST_PG=own`: a throwaway cluster of this process's own
//!   ([`crate::pg_cluster`]), even where a server answers (`.ci/run` tests the fallback so);
//! - unset: `postgres://postgres@127.0.0.1:5432` if something answers there, else a throwaway
//!   cluster; where no server binaries are installed, the test fails saying what to install.
//!
//! Each [`TestDb`] creates a uniquely named database and drops it when dropped. Nothing here
//! passes silently without a server.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

use crate::pg_cluster;

const DEFAULT_SERVER: &str = "postgres://postgres@127.0.0.1:5432";
const DEFAULT_ADDR: &str = "127.0.0.1:5432";

/// The server's URL (without a database), or why there is none.
fn server() -> String {
    static SERVER: OnceLock<Result<String, String>> = OnceLock::new();
    match SERVER.get_or_init(choose_server) {
        Ok(url) => url.clone(),
        Err(why) => panic!("no PostgreSQL server for the tests: {why}"),
    }
}

fn choose_server() -> Result<String, String> {
    match std::env::var("CHANGE_STREAMER_TEST_PG").ok().as_deref() {
        Some("own") => own_cluster(),
        Some(url) if !url.is_empty() => Ok(url.to_string()),
        _ if default_answers() => Ok(DEFAULT_SERVER.to_string()),
        _ => own_cluster(),
    }
}

/// Whether anything accepts a connection at 127.0.0.1:5432 (refused is immediate; the timeout
/// only bounds a filtered port).
fn default_answers() -> bool {
    let addr: SocketAddr = DEFAULT_ADDR.parse().expect("a literal socket address");
    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
}

/// Starts the throwaway cluster, kept (and its reaper's pipe held open) for the process's life.
fn own_cluster() -> Result<String, String> {
    static CLUSTER: OnceLock<pg_cluster::Cluster> = OnceLock::new();
    let cluster = pg_cluster::start()?;
    let url = cluster.url.clone();
    eprintln!("change-streamer tests: a throwaway PostgreSQL cluster at {url}");
    let _ = CLUSTER.set(cluster);
    Ok(url)
}

/// A fresh database, dropped (with whatever is still connected to it) at the end of the test.
pub struct TestDb {
    pub url: String,
    name: String,
    /// The server's URL, without a database.
    server: String,
}

/// Connects to `url`, driving the connection on the current runtime.
pub async fn connect(url: &str) -> Client {
    match tokio_postgres::connect(url, NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(connection);
            client
        }
        Err(e) => panic!(
            "no PostgreSQL server answers at {url} ({e}). These tests need one: start it \
             (on the project's machines: `pg_ctlcluster --skip-systemctl-redirect \
             $(ls /etc/postgresql) main start`; elsewhere e.g. `docker run -p 5432:5432 \
             -e POSTGRES_HOST_AUTH_METHOD=trust postgres`) or point CHANGE_STREAMER_TEST_PG at \
             one (trust auth, user postgres)."
        ),
    }
}

impl TestDb {
    pub async fn create(tag: &str) -> TestDb {
        Self::create_on(&server(), tag).await
    }

    /// A fresh database on the server at `server` (a URL without a database), e.g. a
    /// [`pg_cluster::Cluster`] of the test's own.
    pub async fn create_on(server: &str, tag: &str) -> TestDb {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "cs_{}_{}_{}",
            tag.to_lowercase(),
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let admin = connect(&format!("{server}/postgres")).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        TestDb {
            url: format!("{server}/{name}"),
            name,
            server: server.to_string(),
        }
    }

    /// A connection to the test database.
    pub async fn connect(&self) -> Client {
        connect(&self.url).await
    }

    /// The server's TCP address (`host:port` of the URL), for a proxy to stand in front of.
    pub fn server_addr(&self) -> SocketAddr {
        let (_, host_port) = self.authority();
        host_port
            .parse()
            .unwrap_or_else(|e| panic!("the test server's address {host_port:?}: {e}"))
    }

    /// The test database's URL with `addr` in place of the server's address: the same
    /// database reached through, say, a [`crate::freeze::FreezeProxy`].
    pub fn url_via(&self, addr: SocketAddr) -> String {
        let (user, _) = self.authority();
        format!("postgres://{user}@{addr}/{}", self.name)
    }

    /// The URL's user and `host:port`.
    fn authority(&self) -> (&str, &str) {
        let rest = self
            .server
            .strip_prefix("postgres://")
            .unwrap_or(&self.server);
        let rest = rest.split('/').next().unwrap_or(rest);
        rest.split_once('@').unwrap_or(("postgres", rest))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let server = self.server.clone();
        // Its own thread and runtime: a drop may run inside or outside of any runtime.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test database");
            rt.block_on(async {
                let admin = connect(&format!("{server}/postgres")).await;
                admin.batch_execute(&sql).await
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("dropping test database {}: {e}", self.name);
        }
    }
}
