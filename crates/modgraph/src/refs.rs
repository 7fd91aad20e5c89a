//! The paths a module file's code names into other modules: every `use` (re-exports included) and
//! every `crate::…`, `super::…`, `self::…` or `child::…` path in items, types, expressions,
//! patterns and macro arguments, resolved to the module file it points into.

use std::collections::BTreeMap;

use proc_macro2::Span;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned as _;
use syn::visit::{self, Visit};

use crate::tree::{ModulePath, Tree};

/// One place where a file names a path into another module file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The index (in the tree) of the file that names the path.
    pub from: usize,
    /// The index of the module file the path points into.
    pub to: usize,
    /// The module (inline ones included) whose code names the path.
    pub from_module: ModulePath,
    /// The module the path points into, through any re-exports on the way.
    pub to_module: ModulePath,
    /// The 1-based line of the path.
    pub line: usize,
    /// The path as written (`super::Key`, `crate::store::Entry`).
    pub written: String,
}

/// What each module re-exports (`pub use`, of any visibility but private): the name it gives to
/// the item, and the item's absolute path.
pub type Reexports = BTreeMap<ModulePath, BTreeMap<String, ModulePath>>;

/// Every reference from one module file of `tree` to another, re-exports followed to the module
/// that owns the item.
pub fn references(tree: &Tree, reexports: &Reexports, from: usize) -> Vec<Reference> {
    let file = &tree.files[from];
    let mut finder = Finder {
        tree,
        reexports: Some(reexports),
        from,
        module: file.module.clone(),
        found: Vec::new(),
        reexported: Vec::new(),
    };
    finder.visit_file(&file.ast);
    finder.found
}

/// Every module's re-exports in `tree`.
pub fn reexports(tree: &Tree) -> Reexports {
    let mut all = Reexports::new();
    for (from, file) in tree.files.iter().enumerate() {
        let mut finder = Finder {
            tree,
            reexports: None,
            from,
            module: file.module.clone(),
            found: Vec::new(),
            reexported: Vec::new(),
        };
        finder.visit_file(&file.ast);
        for (module, name, target) in finder.reexported {
            all.entry(module).or_default().insert(name, target);
        }
    }
    all
}

/// Walks one file, tracking the module (inline ones included) that the code is in. Without
/// `reexports` it only collects the file's re-exports (the first pass).
struct Finder<'t> {
    tree: &'t Tree,
    reexports: Option<&'t Reexports>,
    from: usize,
    module: ModulePath,
    found: Vec<Reference>,
    /// `(module, name, target)` of each re-export seen.
    reexported: Vec<(ModulePath, String, ModulePath)>,
}

/// How many re-exports one path is followed through (a chain longer than this is left where it
/// stops).
const REEXPORT_HOPS: usize = 8;

impl Finder<'_> {
    /// Records `segments` (named at `span`) if it points into a module file other than this one.
    /// `in_use`: a `use` may name a module alone (`use crate::store;`), other paths name items.
    fn record(&mut self, segments: &[String], span: Span, in_use: bool) {
        if segments.len() < 2 && !in_use {
            return;
        }
        let Some(mut target) = self.resolve(segments) else {
            return;
        };
        let Some(reexports) = self.reexports else {
            return;
        };
        // `crate::store::Entry` where `store` re-exports `entry::Entry`: the edge goes to `entry`.
        for _ in 0..REEXPORT_HOPS {
            let module = self.tree.module_of(&target);
            let Some(followed) = target
                .get(module.len())
                .and_then(|name| reexports.get(&module)?.get(name))
            else {
                break;
            };
            let mut next = followed.clone();
            next.extend(target[module.len() + 1..].iter().cloned());
            target = next;
        }
        let Some(to) = self.tree.file_of(&target) else {
            return;
        };
        if to != self.from {
            let written = segments.join("::");
            self.found.push(Reference {
                from: self.from,
                to,
                from_module: self.module.clone(),
                to_module: self.tree.module_of(&target),
                line: span.start().line,
                written,
            });
        }
    }

    /// The absolute path `segments` names from the current module, if it is inside this crate.
    fn resolve(&self, segments: &[String]) -> Option<ModulePath> {
        let first = segments.first()?;
        let (mut base, rest) = match first.as_str() {
            "crate" => (Vec::new(), &segments[1..]),
            "self" => (self.module.clone(), &segments[1..]),
            "super" => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                let keep = self.module.len().checked_sub(supers)?;
                (self.module[..keep].to_vec(), &segments[supers..])
            }
            name if self
                .tree
                .children
                .get(&self.module)
                .is_some_and(|c| c.contains(name)) =>
            {
                (self.module.clone(), segments)
            }
            _ => return None,
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// Records every leaf of a `use` tree under `prefix`.
    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(&path.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let leaf = name.ident.to_string();
                self.use_leaf(prefix, (leaf != "self").then_some(leaf), name.ident.span());
            }
            syn::UseTree::Rename(rename) => {
                let leaf = rename.ident.to_string();
                self.use_leaf(prefix, (leaf != "self").then_some(leaf), rename.ident.span());
            }
            syn::UseTree::Glob(glob) => self.use_leaf(prefix, None, glob.star_token.span),
            syn::UseTree::Group(group) => {
                for inner in &group.items {
                    self.use_tree(inner, prefix);
                }
            }
        }
    }

    /// Records each name a `pub use` gives, with the absolute path of what it names.
    fn collect_reexports(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        let give = |this: &mut Self, prefix: &[String], leaf: &syn::Ident, name: &syn::Ident| {
            let mut segments = prefix.to_vec();
            segments.push(leaf.to_string());
            if let Some(target) = this.resolve(&segments) {
                this.reexported
                    .push((this.module.clone(), name.to_string(), target));
            }
        };
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.collect_reexports(&path.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Name(name) if name.ident != "self" => give(self, prefix, &name.ident, &name.ident),
            syn::UseTree::Rename(rename) if rename.ident != "self" => {
                give(self, prefix, &rename.ident, &rename.rename);
            }
            syn::UseTree::Group(group) => {
                for inner in &group.items {
                    self.collect_reexports(inner, prefix);
                }
            }
            // A glob re-export is not followed (nothing in these crates uses one).
            _ => {}
        }
    }

    fn use_leaf(&mut self, prefix: &[String], leaf: Option<String>, span: Span) {
        let mut segments = prefix.to_vec();
        segments.extend(leaf);
        self.record(&segments, span, true);
    }
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // A `mod` declaration is not an edge; an inline module's code is in a module of its own.
        if let Some((_, items)) = &item.content {
            self.module.push(item.ident.to_string());
            for inner in items {
                self.visit_item(inner);
            }
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if self.reexports.is_none() {
            if !matches!(item.vis, syn::Visibility::Inherited) {
                self.collect_reexports(&item.tree, &mut Vec::new());
            }
            return;
        }
        self.use_tree(&item.tree, &mut Vec::new());
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.record(&segments, path.span(), false);
        visit::visit_path(self, path);
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        visit::visit_attribute(self, attr);
        // `#[schemars(transform = crate::schema::f)]`, `#[serde(default = "crate::x::f")]`: a
        // derive calls these, so they are imports as much as a `use`.
        let syn::Meta::List(list) = &attr.meta else { return };
        let parser = Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated;
        let Ok(items) = syn::parse::Parser::parse2(parser, list.tokens.clone()) else {
            return;
        };
        for item in &items {
            let syn::Meta::NameValue(pair) = item else {
                continue;
            };
            match &pair.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(text),
                    ..
                }) => {
                    if let Ok(path) = text.parse::<syn::Path>() {
                        let segments: Vec<String> =
                            path.segments.iter().map(|s| s.ident.to_string()).collect();
                        self.record(&segments, text.span(), false);
                    }
                }
                value => self.visit_expr(value),
            }
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        visit::visit_macro(self, mac);
        // Most macros (`assert_eq!`, `vec!`, `format!`, …) take expressions: read those too.
        let parser = Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated;
        if let Ok(args) = syn::parse::Parser::parse2(parser, mac.tokens.clone()) {
            for arg in &args {
                self.visit_expr(arg);
            }
        }
    }
}
