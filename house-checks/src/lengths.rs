//! `lengths`: no production function over the limit, counted from its `fn` line to its closing
//! brace (both included; the doc comment and attributes above it are not counted). Free functions,
//! methods and trait default methods, nested ones measured on their own too. Test code is left
//! out: modules and items under `#[cfg(test)]`, `#[test]` functions, and the tests and benches
//! targets (not read at all, see `targets`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

use crate::modtree::{is_cfg_test, Tree};
use crate::shown;
use crate::targets::CrateRoot;

/// One function over the limit.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Long {
    pub file: PathBuf,
    pub line: usize,
    pub name: String,
    pub lines: usize,
}

/// Prints every production function over `max` lines; returns how many there are.
pub fn report(root: &Path, crates: &[CrateRoot], max: usize) -> Result<usize, String> {
    let mut long = BTreeSet::new();
    for krate in crates {
        let tree = Tree::read(&krate.root)?;
        for missing in &tree.missing {
            eprintln!("lengths: {}: not read: {missing}", krate.name);
        }
        long_functions(&tree, max, &mut long);
    }
    for l in &long {
        println!(
            "{}:{}: {} is {} lines (over {max})",
            shown(root, &l.file),
            l.line,
            l.name,
            l.lines
        );
    }
    if long.is_empty() {
        println!(
            "lengths: no production function over {max} lines in {} crates",
            crates.len()
        );
    } else {
        println!(
            "lengths: {} function(s) over {max} lines; split each by what its parts do",
            long.len()
        );
    }
    Ok(long.len())
}

/// Adds the crate's production functions over `max` lines to `long`.
pub fn long_functions(tree: &Tree, max: usize, long: &mut BTreeSet<Long>) {
    for module in tree.modules.iter().filter(|m| !m.test) {
        let mut visitor = Measure {
            file: &module.file,
            max,
            within: Vec::new(),
            long,
        };
        for item in &module.items {
            visitor.visit_item(item);
        }
    }
}

/// Walks a module's items, noting functions over the limit.
struct Measure<'a> {
    file: &'a Path,
    max: usize,
    /// The `impl`/`trait` being walked, to name its methods (`Type::method`).
    within: Vec<String>,
    long: &'a mut BTreeSet<Long>,
}

impl Measure<'_> {
    fn measure(&mut self, fn_token: &syn::token::Fn, ident: &syn::Ident, block: &syn::Block) {
        let start = fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        let lines = end + 1 - start;
        if lines > self.max {
            let name = match self.within.last() {
                Some(owner) => format!("{owner}::{ident}"),
                None => ident.to_string(),
            };
            self.long.insert(Long {
                file: self.file.to_path_buf(),
                line: start,
                name,
                lines,
            });
        }
    }
}

/// Whether an item's attributes make it test code.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    is_cfg_test(attrs) || attrs.iter().any(|a| a.path().is_ident("test"))
}

impl<'ast> Visit<'ast> for Measure<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        self.measure(&f.sig.fn_token, &f.sig.ident, &f.block);
        // Functions nested in it are measured with their own name.
        let outer = std::mem::take(&mut self.within);
        syn::visit::visit_item_fn(self, f);
        self.within = outer;
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        self.measure(&f.sig.fn_token, &f.sig.ident, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        if let Some(block) = &f.default {
            self.measure(&f.sig.fn_token, &f.sig.ident, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test(&i.attrs) {
            return;
        }
        let mut owner = type_name(&i.self_ty);
        if let Some((_, trait_, _)) = &i.trait_ {
            owner = format!("<{owner} as {}>", path_name(trait_));
        }
        self.within.push(owner);
        syn::visit::visit_item_impl(self, i);
        self.within.pop();
    }
    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        if is_test(&t.attrs) {
            return;
        }
        self.within.push(t.ident.to_string());
        syn::visit::visit_item_trait(self, t);
        self.within.pop();
    }
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
}

/// A short name for a type: its path's last segment with its generic arguments.
fn type_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => path_name(&p.path),
        syn::Type::Reference(r) => format!("&{}", type_name(&r.elem)),
        _ => "_".to_string(),
    }
}

/// A path's last segment with its type arguments (`Handler<Join>`).
fn path_name(path: &syn::Path) -> String {
    let Some(last) = path.segments.last() else {
        return String::new();
    };
    let mut name = last.ident.to_string();
    if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
        let types: Vec<String> = args
            .args
            .iter()
            .filter_map(|a| match a {
                syn::GenericArgument::Type(t) => Some(type_name(t)),
                _ => None,
            })
            .collect();
        if !types.is_empty() {
            name = format!("{name}<{}>", types.join(", "));
        }
    }
    name
}
