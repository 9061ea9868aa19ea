//! PROTOCOL.md §2's flag table checked against the binary's `--help`, both ways (issue 29): every
//! flag the binary takes is in the table and every flag of the table is in `--help`, each with the
//! same environment variable and the same default. A flag added, renamed or given another
//! default fails here until the document says so too.

use std::collections::BTreeMap;
use std::process::Command;

/// What one flag says of itself: its environment variable, its default, and whether it takes
/// a value (`--flag <VALUE>`) or is a switch.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Flag {
    env: Option<String>,
    default: Option<String>,
    switch: bool,
}

/// The flags as the binary's `--help` lists them (without `--help` and `--version`).
fn from_help() -> BTreeMap<String, Flag> {
    let out = Command::new(env!("CARGO_BIN_EXE_change-streamer"))
        .arg("--help")
        .output()
        .expect("run change-streamer --help");
    assert!(out.status.success(), "--help failed");
    let text = String::from_utf8(out.stdout).expect("--help is UTF-8");
    // One block a flag: its first line, and every more indented line after it (clap wraps).
    let mut blocks: Vec<String> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("--") || trimmed.starts_with("-h,") || trimmed.starts_with("-V,") {
            blocks.push(trimmed.to_string());
        } else if line.starts_with(' ') && !trimmed.is_empty() {
            if let Some(b) = blocks.last_mut() {
                b.push(' ');
                b.push_str(trimmed);
            }
        } else if let Some(b) = blocks.last_mut() {
            // A heading or a blank line ends the block.
            b.push('\n');
        }
    }
    let mut flags = BTreeMap::new();
    for block in blocks {
        let block = block.split('\n').next().unwrap_or_default();
        let block = block.split_whitespace().collect::<Vec<_>>().join(" ");
        let name = block
            .split_whitespace()
            .find(|w| w.starts_with("--"))
            .expect("a flag block names its flag")
            .trim_end_matches(',')
            .to_string();
        if name == "--help" || name == "--version" {
            continue;
        }
        let after_name = &block[block.find(&name).unwrap_or(0) + name.len()..];
        let switch = !after_name.trim_start().starts_with('<');
        let env = bracket(&block, "[env: ").map(|e| e.trim_end_matches('=').to_string());
        // A default that depends on another flag is not clap's (it shows none); the help says
        // it as `(default VALUE, or …)`.
        let default = bracket(&block, "[default: ")
            .map(|d| unquote(&d))
            .or_else(|| stated_default(&block));
        flags.insert(
            name,
            Flag {
                env,
                default,
                switch,
            },
        );
    }
    flags
}

/// The text of `[prefix…]` in `block`, if there is one.
fn bracket(block: &str, prefix: &str) -> Option<String> {
    let start = block.find(prefix)? + prefix.len();
    let end = block[start..].find(']')? + start;
    Some(block[start..end].to_string())
}

/// The `VALUE` of a `(default VALUE, or …)` in a flag's help text.
fn stated_default(block: &str) -> Option<String> {
    let start = block.find("(default ")? + "(default ".len();
    let end = block[start..].find([',', ')'])? + start;
    Some(block[start..end].to_string())
}

/// clap quotes a default with spaces and escapes its quotes.
fn unquote(value: &str) -> String {
    match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => inner.replace("\\\"", "\""),
        None => value.to_string(),
    }
}

/// The flags as PROTOCOL.md §2's table lists them. A row may name two flags and their two
/// variables (`--tls-cert`, `--tls-key`); its default is the first value in backticks, or
/// `none`.
fn from_protocol() -> BTreeMap<String, (Option<String>, Option<String>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PROTOCOL.md");
    let doc = std::fs::read_to_string(path).expect("read docs/PROTOCOL.md");
    let section = doc
        .split("\n## 2. Running")
        .nth(1)
        .and_then(|s| s.split("\n## 3.").next())
        .expect("PROTOCOL.md has §2");
    let mut flags = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with("| `--")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        assert!(cells.len() >= 4, "a §2 row of four cells: {row}");
        let names = ticked(cells[0]);
        let envs = ticked(cells[1]);
        assert_eq!(names.len(), envs.len(), "as many variables as flags: {row}");
        let default = if cells[2].trim() == "none" {
            None
        } else {
            Some(ticked(cells[2]).into_iter().next().unwrap_or_default())
        };
        for (name, env) in names.into_iter().zip(envs) {
            let first = flags.insert(name.clone(), (Some(env), default.clone()));
            assert!(first.is_none(), "{name} is listed twice in §2");
        }
    }
    flags
}

/// Every value in backticks in `cell`, in order.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn protocol_flag_table_matches_help_both_ways() {
    let help = from_help();
    let doc = from_protocol();
    assert!(help.len() > 20, "{help:?}");
    for (name, flag) in &help {
        let Some((env, default)) = doc.get(name) else {
            panic!("{name} is in --help but not in PROTOCOL.md §2's table");
        };
        assert_eq!(&flag.env, env, "{name}: the environment variable");
        match (&flag.default, default) {
            (a, b) if a == b => {}
            // A switch has no default in --help; the table says it is off.
            (None, Some(off)) if flag.switch && off == "false" => {}
            (a, b) => panic!("{name}: --help's default {a:?}, PROTOCOL.md §2's {b:?}"),
        }
    }
    for name in doc.keys() {
        assert!(
            help.contains_key(name),
            "{name} is in PROTOCOL.md §2's table but not in --help"
        );
    }
}
