//! The peer harness: the original JavaScript implementation, run from the project's `shared/peer`
//! folder. Tests that compare with it skip, saying what is missing and how to get it, when node
//! or the harness is absent, unless `CHANGE_STREAMER_REQUIRE_PEER=1` (as in CI) makes that a
//! failure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set to `1` to fail, rather than skip, a peer test that cannot run.
const REQUIRE_PEER: &str = "CHANGE_STREAMER_REQUIRE_PEER";

/// Overrides where the project's `shared/` folder is.
const SHARED_DIR: &str = "CHANGE_STREAMER_SHARED";

/// The project's `shared/` folder: `../shared` beside the repository, or `$CHANGE_STREAMER_SHARED`.
fn shared_dir() -> PathBuf {
    if let Ok(p) = std::env::var(SHARED_DIR) {
        return PathBuf::from(p);
    }
    // CARGO_MANIFEST_DIR is `<repository>/test-support`.
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support sits in the repository");
    repository.parent().unwrap_or(repository).join("shared")
}

/// What keeps the peer from running here, with how to get it; `None` when nothing does.
fn missing() -> Option<String> {
    for tool in ["node", "npm"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Some(format!(
                "`{tool}` is not on PATH; install Node.js with npm (e.g. `apt-get install nodejs npm`)"
            ));
        }
    }
    let peer = shared_dir().join("peer");
    if !peer.join("setup.sh").is_file() {
        return Some(format!(
            "the peer harness {} is missing; put the project's shared/ folder beside the repository or set {SHARED_DIR} to it",
            peer.display()
        ));
    }
    None
}

/// Copies `shared/peer` to a temporary folder (`shared/` may be read-only) and installs it with
/// its `setup.sh` (from the npm registry). When node or the harness is missing: `None` after one
/// line on stderr saying so, or a panic with that line if `CHANGE_STREAMER_REQUIRE_PEER=1`.
pub fn installed_peer() -> Option<(tempfile::TempDir, PathBuf)> {
    if let Some(why) = missing() {
        let line = format!("the original implementation cannot run: {why}");
        assert!(
            std::env::var(REQUIRE_PEER).as_deref() != Ok("1"),
            "{line}; {REQUIRE_PEER}=1 makes this a failure"
        );
        // Straight to stderr: the test harness captures `eprintln!` of passing tests, and a skip
        // must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "{line}; skipped ({REQUIRE_PEER}=1 makes this a failure)"
        );
        return None;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dest = tmp.path().join("peer");
    let src = shared_dir().join("peer");
    let out = Command::new("cp")
        .arg("-r")
        .arg(&src)
        .arg(&dest)
        .output()
        .expect("run cp");
    assert!(
        out.status.success(),
        "copying {} to {} failed: {}",
        src.display(),
        dest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
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
