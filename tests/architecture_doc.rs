//! ARCHITECTURE.md checked against the code (issue 43, "a map read in minutes"), by reading
//! files only: no service is started.
//!
//! What fails, each failure naming what is wrong:
//! - **The file list** (the fenced block under `## Where things live`): a file of the
//!   repository's source folders that no line lists, or a listed file that does not exist. A
//!   line is `FOLDER/ NAME NAME … # comment`; a folder may take several lines; the name `*`
//!   lists every file under the folder. The folders whose every file must be listed are
//!   [`LISTED_ROOTS`] (the workspace crates' sources, their tests, examples and benches, the
//!   scripts and docs), build output, `__pycache__` and `*.pyc` left out.
//! - **A path named in the document** in backticks (no space in it, a `/` in it or a `.rs`
//!   ending, not an HTTP path such as `/status`) that does not exist: anywhere, one starting with one of those folders
//!   (`src/owner.rs`, `actors/src/streamer/`); on the opening page, any other, taken from
//!   `actors/src/` (`streamer/join.rs`, `cleanup.rs`).
//! - **The opening page**, everything before the document's second `## ` heading:
//!   - an actor not named on it. An actor is a line `impl Actor for NAME` (or
//!     `impl actix::Actor for NAME`) in a `.rs` file under `src/` or `actors/src/`;
//!   - a message not named on it. A message is a `#[derive(…)]` line whose list holds
//!     `Message` (or `actix::Message`), followed, past other attribute lines, doc comments and
//!     blank lines, by a line declaring `struct NAME` or `enum NAME`, in those same files;
//!   - a message not named in the row of the actor that receives it: the actors table's row
//!     (a line starting with `|`) whose first cell, bold and backticks removed, is the actor's
//!     name must name every `M` of an `impl Handler<M> for ACTOR` in those files;
//!   - a PROTOCOL.md section (`## N.` and `### N.M` headings of `docs/PROTOCOL.md`) not cited
//!     on it as `§N` or `§N.M`.
//!
//!   Test code is left out of those scans: a file declared by `#[cfg(test)] mod NAME;` (and
//!   its folder), and an inline `#[cfg(test)]` module, from its `mod NAME {` line to the line
//!   holding only `}` at that line's indentation (the code is rustfmt-formatted).
//! - **Length**: the file past [`MAX_LINES`] lines.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines ARCHITECTURE.md may have.
const MAX_LINES: usize = 500;

/// Folders (from the repository's root) whose every file the file list must name.
const LISTED_ROOTS: &[&str] = &[
    "src",
    "actors",
    "test-support",
    "loadgen",
    "examples",
    "tests",
    "benches",
    "scripts",
    "docs",
    ".ci",
];

/// Folders scanned for actors, messages and handlers.
const CODE_ROOTS: &[&str] = &["src", "actors/src"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn doc() -> String {
    fs::read_to_string(root().join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md")
}

/// Every file under `dir`, as paths relative to the repository's root with `/` separators.
fn walk(dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "target" || name == "__pycache__" || name.ends_with(".pyc") {
            continue;
        }
        if path.is_dir() {
            walk(&path, out);
        } else {
            let rel = path.strip_prefix(root()).expect("under the root");
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The document's opening page: every line before its second `## ` heading.
fn opening_page(doc: &str) -> String {
    let mut seen = 0;
    let mut page = Vec::new();
    for line in doc.lines() {
        if line.starts_with("## ") {
            seen += 1;
            if seen == 2 {
                break;
            }
        }
        page.push(line);
    }
    assert_eq!(
        seen, 2,
        "ARCHITECTURE.md has no second `## ` heading to end its opening page"
    );
    page.join("\n")
}

/// What the file list names: exact files, and folders listed whole (`*`).
struct FileList {
    files: BTreeSet<String>,
    whole: BTreeSet<String>,
}

fn file_list(doc: &str) -> FileList {
    let start = doc
        .lines()
        .position(|l| l.trim() == "## Where things live")
        .expect("ARCHITECTURE.md has a `## Where things live` section");
    let mut lines = doc
        .lines()
        .skip(start + 1)
        .skip_while(|l| !l.starts_with("```"));
    lines
        .next()
        .expect("`## Where things live` holds a fenced block");
    let mut list = FileList {
        files: BTreeSet::new(),
        whole: BTreeSet::new(),
    };
    for line in lines.take_while(|l| !l.starts_with("```")) {
        let names = line.split(" #").next().unwrap_or("");
        let mut words = names.split_whitespace();
        let Some(folder) = words.next() else { continue };
        assert!(
            folder.ends_with('/'),
            "file list line does not start with a folder ending in `/`: {line:?}"
        );
        let folder = if folder == "./" { "" } else { folder };
        for name in words {
            if name == "*" {
                list.whole.insert(folder.trim_end_matches('/').to_string());
            } else {
                list.files.insert(format!("{folder}{name}"));
            }
        }
    }
    list
}

#[test]
fn every_source_file_is_listed_and_every_listed_file_exists() {
    let doc = doc();
    let list = file_list(&doc);
    let mut problems = Vec::new();
    for file in &list.files {
        if !root().join(file).is_file() {
            problems.push(format!("listed but missing: {file}"));
        }
    }
    for folder in &list.whole {
        if !root().join(folder).is_dir() {
            problems.push(format!("folder listed whole (`*`) but missing: {folder}/"));
        }
    }
    let mut present = Vec::new();
    for dir in LISTED_ROOTS {
        walk(&root().join(dir), &mut present);
    }
    for file in present {
        let whole = list
            .whole
            .iter()
            .any(|w| file.starts_with(&format!("{w}/")));
        if !whole && !list.files.contains(&file) {
            problems.push(format!(
                "not in the file list (## Where things live): {file}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's file list:\n{}",
        problems.join("\n")
    );
}

/// The words in backticks of `text` that look like file paths: no space, not an HTTP path
/// (`/status`), and a `/` in them or a `.rs` ending.
fn backticked_paths(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| !w.contains(char::is_whitespace) && !w.contains('*') && !w.starts_with('/'))
        .filter(|w| w.contains('/') || w.ends_with(".rs"))
        .collect()
}

#[test]
fn every_path_the_document_names_exists() {
    let doc = doc();
    let mut missing = BTreeSet::new();
    for path in backticked_paths(&doc) {
        let first = path.split('/').next().unwrap_or("");
        if LISTED_ROOTS.contains(&first) && !root().join(path).exists() {
            missing.insert(path.to_string());
        }
    }
    // The opening page names the actor library's files from `actors/src/`.
    for path in backticked_paths(&opening_page(&doc)) {
        let first = path.split('/').next().unwrap_or("");
        if !LISTED_ROOTS.contains(&first) && !root().join("actors/src").join(path).exists() {
            missing.insert(format!("{path} (opening page: under actors/src/)"));
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

/// The non-test lines of every `.rs` file under [`CODE_ROOTS`], by file.
fn code() -> BTreeMap<String, Vec<String>> {
    let mut files = Vec::new();
    for dir in CODE_ROOTS {
        walk(&root().join(dir), &mut files);
    }
    files.retain(|f| f.ends_with(".rs"));
    files.sort();
    let mut test_paths: Vec<String> = Vec::new();
    let mut out = BTreeMap::new();
    for file in &files {
        let text = fs::read_to_string(root().join(file)).expect("read a source file");
        let (lines, test_mods) = without_test_modules(&text);
        let dir = module_dir(file);
        test_paths.extend(test_mods.iter().map(|m| format!("{dir}{m}")));
        out.insert(file.clone(), lines);
    }
    out.retain(|file, _| {
        !test_paths
            .iter()
            .any(|t| *file == format!("{t}.rs") || file.starts_with(&format!("{t}/")))
    });
    out
}

/// Where the submodules of `file` live: its folder for `mod.rs`, `lib.rs` and `main.rs`,
/// else a folder named for it.
fn module_dir(file: &str) -> String {
    let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
    if matches!(name, "mod.rs" | "lib.rs" | "main.rs") {
        format!("{dir}/")
    } else {
        format!("{dir}/{}/", name.trim_end_matches(".rs"))
    }
}

/// A file's lines outside its inline `#[cfg(test)]` modules, and the names of the test modules
/// it declares out of line (`#[cfg(test)] mod NAME;`).
fn without_test_modules(text: &str) -> (Vec<String>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = Vec::new();
    let mut out_of_line = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim_start().starts_with("#[") {
                j += 1;
            }
            if let Some(decl) = lines.get(j).and_then(|l| module_decl(l)) {
                match decl {
                    Module::OutOfLine(name) => {
                        out_of_line.push(name);
                        i = j + 1;
                    }
                    Module::Inline => {
                        let indent = &lines[j][..lines[j].len() - lines[j].trim_start().len()];
                        let close = format!("{indent}}}");
                        let end = (j + 1..lines.len())
                            .find(|&k| lines[k] == close)
                            .unwrap_or(lines.len());
                        i = end + 1;
                    }
                }
                continue;
            }
        }
        kept.push(lines[i].to_string());
        i += 1;
    }
    (kept, out_of_line)
}

enum Module {
    Inline,
    OutOfLine(String),
}

fn module_decl(line: &str) -> Option<Module> {
    let t = line.trim();
    let t = t
        .strip_prefix("pub(crate) ")
        .or_else(|| t.strip_prefix("pub(super) "))
        .or_else(|| t.strip_prefix("pub "))
        .unwrap_or(t);
    let rest = t.strip_prefix("mod ")?;
    if let Some(name) = rest.strip_suffix(';') {
        Some(Module::OutOfLine(name.trim().to_string()))
    } else if rest.ends_with('{') {
        Some(Module::Inline)
    } else {
        None
    }
}

/// The identifier at the start of `s` (generics and the rest cut off).
fn ident(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

fn actors(code: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for (file, lines) in code {
        for line in lines {
            let t = line.trim_start();
            let rest = t
                .strip_prefix("impl Actor for ")
                .or_else(|| t.strip_prefix("impl actix::Actor for "));
            if let Some(rest) = rest {
                found.insert(ident(rest), file.clone());
            }
        }
    }
    found
}

fn messages(code: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for (file, lines) in code {
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let Some(list) = t.strip_prefix("#[derive(") else {
                continue;
            };
            let derives_message = list
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .any(|d| d == "Message" || d == "actix::Message");
            if !derives_message {
                continue;
            }
            let decl = lines[i + 1..].iter().map(|l| l.trim()).find(|l| {
                !(l.is_empty()
                    || l.starts_with("#[")
                    || l.starts_with("///")
                    || l.starts_with("//"))
            });
            let decl = decl.unwrap_or_else(|| panic!("{file}: a Message derive with no item"));
            let name = decl
                .split_once("struct ")
                .or_else(|| decl.split_once("enum "))
                .map(|(_, rest)| ident(rest))
                .unwrap_or_else(|| panic!("{file}: a Message derive on {decl:?}"));
            found.insert(name, file.clone());
        }
    }
    found
}

/// (actor, message) for every `impl Handler<M> for A`.
fn handlers(code: &BTreeMap<String, Vec<String>>) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for lines in code.values() {
        for line in lines {
            let Some(rest) = line.trim_start().strip_prefix("impl Handler<") else {
                continue;
            };
            let Some((message, actor)) = rest.split_once("> for ") else {
                continue;
            };
            found.insert((ident(actor), ident(message)));
        }
    }
    found
}

/// Whether `name` occurs in `text` as a whole word.
fn names(text: &str, name: &str) -> bool {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|w| w == name)
}

/// The opening page's table row for `actor`.
fn row<'a>(page: &'a str, actor: &str) -> Option<&'a str> {
    page.lines().filter(|l| l.starts_with('|')).find(|l| {
        let first = l.trim_start_matches('|').split('|').next().unwrap_or("");
        first.replace(['*', '`'], "").trim() == actor
    })
}

#[test]
fn opening_page_names_every_actor_and_message_at_its_receiver() {
    let doc = doc();
    let page = opening_page(&doc);
    let code = code();
    let actors = actors(&code);
    let messages = messages(&code);
    assert!(
        actors.contains_key("Streamer"),
        "the actor scan found no Streamer: {actors:?}"
    );
    assert!(
        messages.contains_key("UpstreamBatch"),
        "the message scan missed: {messages:?}"
    );
    let mut problems = Vec::new();
    for (actor, file) in &actors {
        if row(&page, actor).is_none() {
            problems.push(format!(
                "actor {actor} ({file}) has no row on the opening page"
            ));
        }
    }
    for (message, file) in &messages {
        if !names(&page, message) {
            problems.push(format!(
                "message {message} ({file}) is not named on the opening page"
            ));
        }
    }
    for (actor, message) in handlers(&code) {
        if let Some(row) = row(&page, &actor) {
            if !names(row, &message) {
                problems.push(format!(
                    "{actor}'s row does not name {message}, which it receives"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's opening page:\n{}",
        problems.join("\n")
    );
}

#[test]
fn opening_page_cites_every_protocol_section() {
    let doc = doc();
    let page = opening_page(&doc);
    let protocol =
        fs::read_to_string(root().join("docs/PROTOCOL.md")).expect("read docs/PROTOCOL.md");
    let mut missing = Vec::new();
    for line in protocol.lines() {
        let Some(rest) = line
            .strip_prefix("## ")
            .or_else(|| line.strip_prefix("### "))
        else {
            continue;
        };
        let number: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
        let number = number.trim_end_matches('.');
        if number.is_empty() || !number.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        let cited = page.match_indices(&format!("§{number}")).any(|(at, m)| {
            let next = page[at + m.len()..].chars().next();
            !matches!(next, Some(c) if c.is_alphanumeric() || c == '.' && {
                page[at + m.len() + 1..].starts_with(|d: char| d.is_ascii_digit())
            })
        });
        if !cited {
            missing.push(format!("§{number} ({rest})"));
        }
    }
    assert!(
        missing.is_empty(),
        "PROTOCOL.md sections not cited on ARCHITECTURE.md's opening page: {missing:?}"
    );
}

#[test]
fn the_map_stays_short() {
    let lines = doc().lines().count();
    assert!(
        lines <= MAX_LINES,
        "ARCHITECTURE.md has {lines} lines, more than {MAX_LINES}"
    );
}
