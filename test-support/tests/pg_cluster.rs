//! The throwaway PostgreSQL cluster that `cargo test` starts where no server answers
//! (test-support/src/pg_cluster.rs): it serves, and it is gone once its holder lets go.

use std::time::Duration;

use change_streamer_test_support::{pg, pg_cluster, wait::wait_until};

/// A cluster of our own accepts trust-auth connections as `postgres`, creates databases, and
/// stops (its folder removed) as soon as the pipe to its reaper closes, as it does when the test
/// process ends.
#[actix_rt::test]
async fn own_cluster_serves_then_stops_when_released() {
    let cluster = pg_cluster::start().unwrap_or_else(|why| panic!("{why}"));
    let client = pg::connect(&format!("{}/postgres", cluster.url)).await;
    client
        .batch_execute("CREATE DATABASE own_cluster_check")
        .await
        .expect("creating a database on the throwaway cluster");
    let row = client
        .query_one("SELECT current_user::text, count(*) FROM pg_database WHERE datname = 'own_cluster_check'", &[])
        .await
        .expect("reading the catalogue");
    assert_eq!(row.get::<_, String>(0), "postgres");
    assert_eq!(row.get::<_, i64>(1), 1);
    drop(client);

    let dir = cluster.dir.clone();
    assert!(
        dir.join("data").is_dir(),
        "the cluster's data folder exists while it runs"
    );
    drop(cluster);
    wait_until(
        "the reaper stops the cluster and removes its folder",
        Duration::from_secs(60),
        || !dir.exists(),
    )
    .await;
}
