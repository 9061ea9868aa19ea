//! The house rules of issue 43, checked over the workspace's own sources: `circles` fails on any
//! module circle in any crate, `lengths` on any production function over 80 lines. Each names the
//! offenders (files, functions, lines) and exits 1; `.ci/run` runs both
//! (`cargo run -q -p house-checks -- circles` and `-- lengths`).

mod circles;
mod lengths;
mod modtree;
mod targets;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The longest a production function may be, from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 80;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(check) = args.first() else {
        eprintln!("usage: house-checks circles|lengths [WORKSPACE_DIR]");
        return ExitCode::from(2);
    };
    let root = args.get(1).map(PathBuf::from).unwrap_or_else(workspace_dir);
    let crates = match targets::crate_roots(&root) {
        Ok(crates) => crates,
        Err(e) => {
            eprintln!("house-checks: cannot list the workspace's crates: {e}");
            return ExitCode::from(2);
        }
    };
    let offenders = match check.as_str() {
        "circles" => circles::report(&root, &crates),
        "lengths" => lengths::report(&root, &crates, MAX_FN_LINES),
        other => {
            eprintln!("house-checks: unknown check {other:?} (circles|lengths)");
            return ExitCode::from(2);
        }
    };
    match offenders {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("house-checks {check}: {e}");
            ExitCode::from(2)
        }
    }
}

/// The workspace this crate belongs to: the parent of its own manifest's folder.
fn workspace_dir() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// `path` relative to the workspace, for messages.
pub fn shown(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}
