//! The crates the checks read: every library, binary and example target of every workspace
//! member, as `cargo metadata` lists them (so `[[bin]]`/`[[example]]` paths and `src/bin/*.rs`
//! are found the way cargo finds them). Tests and benches are test code and not read.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One crate: a target of a workspace member, read from its root file.
#[derive(Debug, Clone)]
pub struct CrateRoot {
    /// `package/target (kind)`, for messages.
    pub name: String,
    pub root: PathBuf,
}

/// The library, binary and example targets of the workspace at `dir`.
pub fn crate_roots(dir: &Path) -> Result<Vec<CrateRoot>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let mut roots = Vec::new();
    for package in meta["packages"].as_array().into_iter().flatten() {
        let package_name = package["name"].as_str().unwrap_or("?");
        for target in package["targets"].as_array().into_iter().flatten() {
            let kinds: Vec<&str> = target["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str())
                .collect();
            let Some(kind) = kinds.iter().find(|k| PRODUCTION.contains(k)) else {
                continue;
            };
            let (Some(name), Some(src)) = (target["name"].as_str(), target["src_path"].as_str())
            else {
                continue;
            };
            roots.push(CrateRoot {
                name: format!("{package_name}/{name} ({kind})"),
                root: PathBuf::from(src),
            });
        }
    }
    roots.sort_by(|a, b| a.root.cmp(&b.root));
    Ok(roots)
}

/// Target kinds that are production code.
const PRODUCTION: [&str; 6] = ["lib", "rlib", "cdylib", "proc-macro", "bin", "example"];
