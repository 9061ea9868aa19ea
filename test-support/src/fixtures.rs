//! The data the tests read, vendored in `test-support/fixtures/` so that a clone with nothing
//! beside it passes its tests: litestream `/metrics` pages (`litestream/`, copied from the
//! project's `shared/fixtures/`) and the backup-monitor scenarios with the output the original
//! implementation recorded for them (`scenarios/`, copied from `shared/peer/scenarios/`, and one
//! of ours, 09, recorded with the peer's harness).

use std::path::{Path, PathBuf};

/// `test-support/fixtures/` of this checkout.
fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The litestream `/metrics` page `fixtures/litestream/{name}`.
pub fn litestream_page(name: &str) -> String {
    let path = fixtures_dir().join("litestream").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The folder of the backup-monitor scenarios (`NN-name.json`, each beside its
/// `NN-name.expected.jsonl`).
pub fn scenarios_dir() -> PathBuf {
    fixtures_dir().join("scenarios")
}

/// Every scenario file, in name order.
pub fn scenarios() -> Vec<PathBuf> {
    let dir = scenarios_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}
