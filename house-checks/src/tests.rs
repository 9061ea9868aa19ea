//! The two checks on small crates written for each case into a temporary folder: what is a
//! circle and what is not, and what is a long production function and what is not.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::circles::{circles, edges};
use crate::lengths::long_functions;
use crate::modtree::Tree;

/// A crate made of `files` (path under `src/`, text) in a new temporary folder; its root.
fn krate(files: &[(&str, &str)]) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("house-checks-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let path = dir.join("src").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir.join("src")
}

/// The circles of the crate, each as its files' paths under `src/`.
fn circles_of(src: &Path) -> Vec<Vec<String>> {
    let tree = Tree::read(&src.join("lib.rs")).unwrap();
    assert!(tree.missing.is_empty(), "{:?}", tree.missing);
    let shown = |f: &PathBuf| f.strip_prefix(src).unwrap().display().to_string();
    circles(&edges(&tree))
        .iter()
        .map(|c| c.iter().map(shown).collect())
        .collect()
}

#[test]
fn siblings_naming_each_other_are_a_circle_named_by_their_files() {
    let src = krate(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "use crate::b::B;\npub struct A;\n"),
        // An inline path, and a module brought in by `use` then named through.
        ("b.rs", "use super::c;\npub struct B(c::C);\n"),
        ("c.rs", "pub struct C;\nfn f() { let _ = crate::a::A; }\n"),
    ]);
    assert_eq!(circles_of(&src), vec![vec!["a.rs", "b.rs", "c.rs"]]);
}

#[test]
fn a_parent_and_its_child_are_no_circle_through_super() {
    // The parent declares the child and names its items; the child names the parent's.
    let src = krate(&[
        ("lib.rs", "mod s;\n"),
        (
            "s/mod.rs",
            "mod join;\npub struct S;\nfn f() { join::g(); }\n",
        ),
        (
            "s/join.rs",
            "use super::S;\npub fn g() {}\nimpl S { fn h() { crate::s::S; } }\n",
        ),
    ]);
    assert!(circles_of(&src).is_empty());
}

#[test]
fn a_circle_through_a_re_exporting_parent_is_found() {
    // issue 43's first circle in small: the error type re-exported by `log/mod.rs`, named from
    // outside it by a file `log/pg.rs` needs.
    let src = krate(&[
        ("lib.rs", "mod log;\nmod unreachable;\n"),
        (
            "log/mod.rs",
            "mod pg;\nmod types;\npub use self::types::Error;\nfn f() { pg::open(); }\n",
        ),
        ("log/types.rs", "pub struct Error;\n"),
        (
            "log/pg.rs",
            "use crate::unreachable::Unreachable;\npub fn open() {}\n",
        ),
        (
            "unreachable.rs",
            "use crate::log::Error;\npub struct Unreachable;\n",
        ),
    ]);
    assert_eq!(
        circles_of(&src),
        vec![vec!["log/mod.rs", "log/pg.rs", "unreachable.rs"]]
    );
}

#[test]
fn test_code_and_modules_alone_tie_nothing() {
    let src = krate(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        // `use crate::b;` names a module, not an item of it.
        (
            "a.rs",
            "use crate::b;\npub struct A;\n#[cfg(test)]\nmod tests { use crate::b::B; }\n",
        ),
        (
            "b.rs",
            "pub struct B;\nfn f() -> crate::a::A { crate::a::A }\n",
        ),
    ]);
    assert!(circles_of(&src).is_empty());
}

/// A function of `body` lines between its `fn` line and its closing brace.
fn function(name: &str, body: usize) -> String {
    format!("fn {name}() {{\n{}}}\n", "    let _x = 1;\n".repeat(body))
}

#[test]
fn functions_over_80_lines_are_named_and_test_code_is_not() {
    let text = [
        "/// Eighty lines from `fn` to `}`: allowed.\n".to_string(),
        function("eighty", 78),
        function("eighty_one", 79),
        "struct S;\nimpl S {\n".into(),
        function("method", 90),
        "}\n#[test]\n".into(),
        function("a_test", 90),
        "#[cfg(test)]\nmod tests {\n".into(),
        function("helper", 90),
        "}\n".into(),
    ]
    .concat();
    let src = krate(&[("lib.rs", &text)]);
    let tree = Tree::read(&src.join("lib.rs")).unwrap();
    let mut long = BTreeSet::new();
    long_functions(&tree, 80, &mut long);
    let found: Vec<(String, usize, usize)> = long
        .into_iter()
        .map(|l| (l.name, l.line, l.lines))
        .collect();
    assert_eq!(
        found,
        vec![
            ("eighty_one".to_string(), 82, 81),
            ("S::method".into(), 165, 92)
        ]
    );
}
