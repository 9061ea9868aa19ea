//! A database of its own for each PostgreSQL test, on the server the project's machines run.
//!
//! The server is `$CHANGE_STREAMER_TEST_PG` (default `postgres://postgres@127.0.0.1:5432`,
//! trust auth). Each [`TestDb`] creates a uniquely named database and drops it when dropped.
//! If no server answers, the test fails with how to start one: it never passes silently.

use std::sync::atomic::{AtomicU32, Ordering};

use tokio_postgres::{Client, NoTls};

const DEFAULT_SERVER: &str = "postgres://postgres@127.0.0.1:5432";

fn server() -> String {
    std::env::var("CHANGE_STREAMER_TEST_PG").unwrap_or_else(|_| DEFAULT_SERVER.to_string())
}

/// A fresh database, dropped (with whatever is still connected to it) at the end of the test.
pub struct TestDb {
    pub url: String,
    name: String,
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
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "cs_{}_{}_{}",
            tag.to_lowercase(),
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let admin = connect(&format!("{}/postgres", server())).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        TestDb {
            url: format!("{}/{name}", server()),
            name,
        }
    }

    /// A connection to the test database.
    pub async fn connect(&self) -> Client {
        connect(&self.url).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        // Its own thread and runtime: a drop may run inside or outside of any runtime.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test database");
            rt.block_on(async {
                let admin = connect(&format!("{}/postgres", server())).await;
                admin.batch_execute(&sql).await
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("dropping test database {}: {e}", self.name);
        }
    }
}
