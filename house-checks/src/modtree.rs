//! A crate's module tree, read the way rustc finds it: from the root file, every `mod name;`
//! to `name.rs` or `name/mod.rs` (or its `#[path]`), every inline `mod name { … }` in its file.
//! Each module keeps what it defines (item names), what it imports (`use` leaves by local name,
//! globs) and its items, for the checks to resolve paths in and measure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;
use syn::{Attribute, Item, UseTree};

/// One module of a crate.
pub struct Module {
    /// The file holding its items (for an inline module, its parent's file).
    pub file: PathBuf,
    pub parent: Option<usize>,
    pub children: BTreeMap<String, usize>,
    /// Names of the items it defines, modules aside.
    pub defines: BTreeSet<String>,
    /// Each name a `use` brings in, with the path it names (`use a::b as c` → `c` → `a::b`).
    pub uses: BTreeMap<String, Vec<String>>,
    /// Its items (inline modules aside: they are modules of their own).
    pub items: Vec<Item>,
    /// Under `#[cfg(test)]` (itself or an ancestor).
    pub test: bool,
}

/// A crate's modules; module 0 is the root.
pub struct Tree {
    pub modules: Vec<Module>,
    /// Files named by a `mod` that could not be read, with why.
    pub missing: Vec<String>,
}

impl Tree {
    /// Reads the crate whose root file is `root`.
    pub fn read(root: &Path) -> Result<Tree, String> {
        let file = parse(root)?;
        let mut tree = Tree {
            modules: Vec::new(),
            missing: Vec::new(),
        };
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        tree.add(root, &dir, None, file.items, false);
        Ok(tree)
    }

    /// Adds the module made of `items`, kept in `file`, whose `mod x;` children are under `dir`.
    fn add(
        &mut self,
        file: &Path,
        dir: &Path,
        parent: Option<usize>,
        items: Vec<Item>,
        test: bool,
    ) -> usize {
        let id = self.modules.len();
        self.modules.push(Module {
            file: file.to_path_buf(),
            parent,
            children: BTreeMap::new(),
            defines: BTreeSet::new(),
            uses: BTreeMap::new(),
            items: Vec::new(),
            test,
        });
        let mut kept = Vec::new();
        for item in items {
            match item {
                Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let child_test = test || is_cfg_test(&m.attrs);
                    if let Some(child) = self.add_child(file, dir, id, m, child_test) {
                        self.modules[id].children.insert(name, child);
                    }
                }
                other => {
                    self.note(id, &other);
                    kept.push(other);
                }
            }
        }
        self.modules[id].items = kept;
        id
    }

    /// Adds the module `m` declares inside module `parent` (kept in `file`, children under `dir`).
    fn add_child(
        &mut self,
        file: &Path,
        dir: &Path,
        parent: usize,
        m: syn::ItemMod,
        test: bool,
    ) -> Option<usize> {
        let name = m.ident.to_string();
        if let Some((_, items)) = m.content {
            return Some(self.add(file, &dir.join(&name), Some(parent), items, test));
        }
        let here = file.parent().unwrap_or(Path::new("."));
        let (path, child_dir) = match path_attribute(&m.attrs) {
            // A `#[path]` file owns its folder, as a `mod.rs` does.
            Some(p) => {
                let path = here.join(p);
                let dir = path.parent().unwrap_or(here).to_path_buf();
                (path, dir)
            }
            None => {
                let flat = dir.join(format!("{name}.rs"));
                if flat.exists() {
                    (flat, dir.join(&name))
                } else {
                    (dir.join(&name).join("mod.rs"), dir.join(&name))
                }
            }
        };
        match parse(&path) {
            Ok(parsed) => Some(self.add(&path, &child_dir, Some(parent), parsed.items, test)),
            Err(e) => {
                self.missing.push(e);
                None
            }
        }
    }

    /// Records what `item` defines or imports into module `id`.
    fn note(&mut self, id: usize, item: &Item) {
        let module = &mut self.modules[id];
        if let Item::Use(u) = item {
            leaves(&u.tree, &mut Vec::new(), &mut |alias, path| {
                if let Some(alias) = alias {
                    module.uses.insert(alias, path);
                }
            });
            return;
        }
        if let Some(name) = defined_name(item) {
            module.defines.insert(name);
        }
        // `use` inside function bodies: taken as the module's (they name the same files).
        let mut inner = InnerUses(Vec::new());
        inner.visit_item(item);
        for tree in inner.0 {
            leaves(&tree, &mut Vec::new(), &mut |alias, path| {
                if let Some(alias) = alias {
                    module.uses.entry(alias).or_insert(path);
                }
            });
        }
    }

    /// The module's ancestors, nearest first.
    pub fn ancestors(&self, id: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(self.modules[id].parent, |&p| self.modules[p].parent)
    }
}

/// The `use` items nested in another item (function bodies).
struct InnerUses(Vec<UseTree>);

impl<'ast> Visit<'ast> for InnerUses {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.0.push(u.tree.clone());
    }
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
}

/// Calls `f(local name, full path)` for each leaf of a `use` tree; a glob's local name is `None`
/// and its path is the module it opens.
pub fn leaves(
    tree: &UseTree,
    prefix: &mut Vec<String>,
    f: &mut impl FnMut(Option<String>, Vec<String>),
) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            leaves(&p.tree, prefix, f);
            prefix.pop();
        }
        UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut path = prefix.clone();
            if name == "self" {
                let alias = prefix.last().cloned();
                f(alias, path);
            } else {
                path.push(name.clone());
                f(Some(name), path);
            }
        }
        UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            f(Some(r.rename.to_string()), path);
        }
        UseTree::Glob(_) => f(None, prefix.clone()),
        UseTree::Group(g) => {
            for t in &g.items {
                leaves(t, prefix, f);
            }
        }
    }
}

/// The name an item defines in its module's namespace, if any.
fn defined_name(item: &Item) -> Option<String> {
    let ident = match item {
        Item::Const(i) => &i.ident,
        Item::Enum(i) => &i.ident,
        Item::Fn(i) => &i.sig.ident,
        Item::Macro(i) => i.ident.as_ref()?,
        Item::Static(i) => &i.ident,
        Item::Struct(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::TraitAlias(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Whether an item is test code: under `#[cfg(test)]`, or a `#[test]` function.
pub fn is_test_item(item: &Item) -> bool {
    let attrs = match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => return false,
    };
    is_cfg_test(attrs) || attrs.iter().any(|a| a.path().is_ident("test"))
}

/// Whether the attributes hold `#[cfg(test)]` (or a `cfg` that needs `test`, as `all(test, …)`).
pub fn is_cfg_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        if !a.path().is_ident("cfg") {
            return false;
        }
        let tokens = a
            .meta
            .require_list()
            .map(|l| l.tokens.to_string())
            .unwrap_or_default();
        let words: Vec<&str> = tokens
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .collect();
        words.contains(&"test") && !words.contains(&"not") && !words.contains(&"any")
    })
}

/// The `#[path = "…"]` of a `mod`, if it has one.
fn path_attribute(attrs: &[Attribute]) -> Option<String> {
    attrs
        .iter()
        .find(|a| a.path().is_ident("path"))
        .and_then(|a| {
            let value = &a.meta.require_name_value().ok()?.value;
            match value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            }
        })
}

/// Reads and parses one source file.
pub fn parse(path: &Path) -> Result<syn::File, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    syn::parse_file(&text).map_err(|e| {
        let at = e.span().start();
        format!("{}:{}:{}: {e}", path.display(), at.line, at.column + 1)
    })
}
