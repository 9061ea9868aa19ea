//! `circles`: no file of a crate may, through the items it names, come back to itself.
//!
//! A file A depends on a file B when A names an item that B's module holds: a `use` leaf
//! (`use crate::a::b::Item`, `use super::x::Y`, `use self::c::Z`, `use child::W`) or a path in
//! the code (`crate::a::b::f()`, `super::x::Y::new()`, `child::g()`, or through a name a `use`
//! brought in: `use super::catchup; catchup::f()`). Naming a module itself (`use super::catchup;`)
//! is no edge; the items later named through it are.
//!
//! What ties parent and child: a `mod child;` declaration is no edge; a parent naming a child's
//! items is (`changelog/mod.rs` → `changelog/postgres/mod.rs` for `PgOptions`). A module naming
//! an item of one of its own ancestors (`super::Streamer`, `crate::Ctx` from a crate root's child)
//! is not counted: a child is a part of its parent, which declares it and whose private items it
//! sees by design, so every split-out `impl Handler<…> for Streamer` would otherwise be a circle.
//! A circle is then a loop between parts that stand apart: siblings, cousins, or a parent that
//! names a child's item while the child names an item of the parent's sibling that leads back.
//!
//! Test code (`#[cfg(test)]` modules and items, `#[test]` functions) is left out: a test may name
//! whatever it needs to build its fixtures without shaping the production structure, and the
//! tests and benches targets are not read (see `targets`).
//!
//! A `pub use` re-export is resolved to the re-exporting file, not followed to the definition:
//! that file is the interface the naming file is written against (`crate::changelog::
//! ChangeLogError` depends on `changelog/mod.rs` exporting it), and following would hide a circle
//! through a facade, such as issue 43's `unreachable.rs` → `changelog/mod.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::punctuated::Punctuated;
use syn::visit::Visit;
use syn::Item;

use crate::modtree::{is_test_item, leaves, Tree};
use crate::shown;
use crate::targets::CrateRoot;

/// File → file, with the names that tie them.
type Edges = BTreeMap<(PathBuf, PathBuf), BTreeSet<String>>;

/// Prints every circle of every crate; returns how many there are.
pub fn report(root: &Path, crates: &[CrateRoot]) -> Result<usize, String> {
    let mut found = 0;
    let mut seen: BTreeSet<Vec<PathBuf>> = BTreeSet::new();
    for krate in crates {
        let tree = Tree::read(&krate.root)?;
        for missing in &tree.missing {
            eprintln!("circles: {}: not read: {missing}", krate.name);
        }
        let edges = edges(&tree);
        for circle in circles(&edges) {
            // A file shared by two targets (loadgen's `frames.rs`) shows its circle once.
            if !seen.insert(circle.clone()) {
                continue;
            }
            found += 1;
            let files: Vec<String> = circle.iter().map(|f| shown(root, f)).collect();
            println!(
                "circle {found} in {}: {} files: {}",
                krate.name,
                files.len(),
                files.join(", ")
            );
            for ((from, to), names) in &edges {
                if circle.contains(from) && circle.contains(to) {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    println!(
                        "  {} -> {}: {}",
                        shown(root, from),
                        shown(root, to),
                        names.join(", ")
                    );
                }
            }
        }
    }
    if found == 0 {
        println!("circles: none in {} crates", crates.len());
    } else {
        println!("circles: {found} module circle(s); break each along its seam (issue 43)");
    }
    Ok(found)
}

/// Every file → file edge of the crate.
pub fn edges(tree: &Tree) -> Edges {
    let mut edges = Edges::new();
    for (id, module) in tree.modules.iter().enumerate().filter(|(_, m)| !m.test) {
        // (path, whether it is a glob: `use a::b::*` names every item of `a::b`)
        let mut paths: Vec<(Vec<String>, bool)> = Vec::new();
        let mut named = Paths(Vec::new());
        for item in module.items.iter().filter(|i| !is_test_item(i)) {
            match item {
                Item::Use(u) => leaves(&u.tree, &mut Vec::new(), &mut |alias, path| {
                    paths.push((path, alias.is_none()))
                }),
                other => named.visit_item(other),
            }
        }
        paths.extend(
            named
                .0
                .into_iter()
                .filter(|p| p.len() > 1)
                .map(|p| (p, false)),
        );
        for (path, glob) in paths {
            let name = match resolve(tree, id, &path, 0) {
                Some((target, Some(name))) => Some((target, name)),
                Some((target, None)) if glob => Some((target, "*".to_string())),
                _ => None,
            };
            let Some((target, name)) = name else { continue };
            let to = &tree.modules[target].file;
            if to == &module.file || tree.ancestors(id).any(|a| a == target) {
                continue;
            }
            edges
                .entry((module.file.clone(), to.clone()))
                .or_default()
                .insert(name);
        }
    }
    edges
}

/// The module holding the item `path` names from module `from`, and the item's name (none when
/// the path names the module itself); `None` for something outside the crate (another crate, a
/// generic, `Self`).
fn resolve(
    tree: &Tree,
    from: usize,
    path: &[String],
    depth: u8,
) -> Option<(usize, Option<String>)> {
    let (first, rest) = path.split_first()?;
    if depth > 8 {
        return None;
    }
    let here = &tree.modules[from];
    let start = match first.as_str() {
        "crate" => 0,
        "self" => from,
        "super" => here.parent?,
        name if here.children.contains_key(name) => here.children[name],
        name if here.uses.contains_key(name) => {
            let mut full = here.uses[name].clone();
            full.extend(rest.iter().cloned());
            return resolve(tree, from, &full, depth + 1);
        }
        name if here.defines.contains(name) => return Some((from, Some(name.to_string()))),
        _ => return None,
    };
    let mut at = start;
    for segment in rest {
        let module = &tree.modules[at];
        if segment == "super" {
            at = module.parent?;
        } else if let Some(&child) = module.children.get(segment.as_str()) {
            at = child;
        } else {
            return Some((at, Some(segment.clone())));
        }
    }
    Some((at, None))
}

/// Every path written in an item, macro arguments included when they parse as expressions.
struct Paths(Vec<Vec<String>>);

impl<'ast> Visit<'ast> for Paths {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.0
            .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        syn::visit::visit_macro(self, mac);
        let parser = Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated;
        if let Ok(args) = mac.parse_body_with(parser) {
            for arg in &args {
                self.visit_expr(arg);
            }
        }
    }
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        leaves(&u.tree, &mut Vec::new(), &mut |_, path| self.0.push(path));
    }
}

/// The circles of the graph: its strongly connected parts of more than one file, each sorted.
pub fn circles(edges: &Edges) -> Vec<Vec<PathBuf>> {
    let mut next: BTreeMap<&PathBuf, Vec<&PathBuf>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
        next.entry(to).or_default();
    }
    // Two files are in one circle when each reaches the other.
    let reach = |start: &PathBuf| -> BTreeSet<PathBuf> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start];
        while let Some(f) = stack.pop() {
            for &n in next.get(f).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    stack.push(n);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&PathBuf, BTreeSet<PathBuf>> =
        next.keys().map(|&f| (f, reach(f))).collect();
    let mut out: BTreeSet<Vec<PathBuf>> = BTreeSet::new();
    for (&f, from_f) in &reaches {
        if !from_f.contains(f) {
            continue;
        }
        let part: Vec<PathBuf> = from_f
            .iter()
            .filter(|g| reaches.get(g).is_some_and(|r| r.contains(f)))
            .cloned()
            .collect();
        out.insert(part);
    }
    out.into_iter().collect()
}
