//! What the tests, examples and benchmarks of change-streamer share: the fake outside world
//! (litestream's `/metrics`, the change source), real stock litestream with a backup replica for
//! it to replicate (to a `file://` folder or a local S3 server's bucket) and one harness that starts
//! it with the service ([`litestream_world`], feature `service`), a websocket client (with a secret and TLS when asked, [`access`]), the service in-process
//! (feature `service`), a TCP forward whose connections a test cuts, the vendored fixtures, the peer harness, a PostgreSQL database
//! of its own for each test, waiting on a condition, and a client's thread of its own.

pub mod access;
pub mod backup_files;
pub mod backup_replica;
pub mod client;
pub mod feed;
pub mod fixtures;
pub mod forward;
pub mod freeze;
pub mod litestream;
#[cfg(feature = "service")]
pub mod litestream_flags;
#[cfg(feature = "service")]
pub mod litestream_world;
pub mod load;
pub mod own_thread;
pub mod peer;
pub mod pg;
pub mod pg_cluster;
pub mod process;
pub mod s3;
pub mod s3s_fs;
#[cfg(feature = "service")]
pub mod service;
pub mod status;
pub mod stock_litestream;
pub mod stored;
pub mod upstream;
pub mod wait;

use std::path::{Path, PathBuf};

pub use peer::installed_peer;

/// A built example binary (cargo builds examples for `cargo test`).
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("examples").join(name);
    assert!(
        bin.exists(),
        "{} is not built; run `cargo test` (which builds examples)",
        bin.display()
    );
    bin
}
