//! Shared helpers of the end-to-end tests: where `../shared` is, a copy of the peer harness,
//! and the fake outside world (litestream, the change source).

#![allow(dead_code)]

pub mod client;
pub mod litestream;
pub mod upstream;

use std::path::{Path, PathBuf};
use std::process::Command;

/// `../shared` beside the repository (`CHANGE_STREAMER_SHARED` overrides).
pub fn shared_dir() -> PathBuf {
    if let Ok(p) = std::env::var("CHANGE_STREAMER_SHARED") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("shared")
}

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

/// Copies `../shared/peer` to a temporary folder (shared/ is read-only in CI) and installs it
/// with its `setup.sh`. `None` when node is not installed.
pub fn installed_peer() -> Option<(tempfile::TempDir, PathBuf)> {
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("node is not installed: skipping the comparison with the live peer");
        return None;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dest = tmp.path().join("peer");
    let status = Command::new("cp")
        .arg("-r")
        .arg(shared_dir().join("peer"))
        .arg(&dest)
        .status()
        .expect("cp");
    assert!(status.success(), "copying the peer failed");
    let _ = Command::new("chmod")
        .arg("-R")
        .arg("u+w")
        .arg(&dest)
        .status();
    let out = Command::new("bash")
        .arg("setup.sh")
        .current_dir(&dest)
        .output()
        .expect("run setup.sh");
    assert!(
        out.status.success(),
        "peer setup.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((tmp, dest))
}
