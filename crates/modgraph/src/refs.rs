//! The paths a module file's code names into other modules: every `use` (re-exports included) and
//! every `crate::…`, `super::…`, `self::…` or `child::…` path in items, types, expressions,
//! patterns and macro arguments, resolved to the module file it points into.

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
    /// The 1-based line of the path.
    pub line: usize,
    /// The path as written (`super::Key`, `crate::store::Entry`).
    pub written: String,
}

/// Every reference from one module file of `tree` to another.
pub fn references(tree: &Tree, from: usize) -> Vec<Reference> {
    let file = &tree.files[from];
    let mut finder = Finder {
        tree,
        from,
        module: file.module.clone(),
        found: Vec::new(),
    };
    finder.visit_file(&file.ast);
    finder.found
}

/// Walks one file, tracking the module (inline ones included) that the code is in.
struct Finder<'t> {
    tree: &'t Tree,
    from: usize,
    module: ModulePath,
    found: Vec<Reference>,
}

impl Finder<'_> {
    /// Records `segments` (named at `span`) if it points into a module file other than this one.
    /// `in_use`: a `use` may name a module alone (`use crate::store;`), other paths name items.
    fn record(&mut self, segments: &[String], span: Span, in_use: bool) {
        if segments.len() < 2 && !in_use {
            return;
        }
        let Some(target) = self.resolve(segments) else {
            return;
        };
        let Some(to) = self.tree.file_of(&target) else {
            return;
        };
        if to != self.from {
            let written = segments.join("::");
            self.found.push(Reference {
                from: self.from,
                to,
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
