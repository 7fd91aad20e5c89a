//! The module tree of one crate root: which file each module lives in, found by following the
//! `mod` declarations from the root file (inline `mod x { … }` blocks belong to the file that holds
//! them). Reads through [`Sources`], so tests build crates in memory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// Where source files come from: the disk, or a map in tests.
pub trait Sources {
    /// The text of `path`, or `None` when there is no such file.
    fn read(&self, path: &Path) -> Option<String>;
}

/// Source files read from the file system.
pub struct Disk;

impl Sources for Disk {
    fn read(&self, path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }
}

impl Sources for BTreeMap<PathBuf, String> {
    fn read(&self, path: &Path) -> Option<String> {
        self.get(path).cloned()
    }
}

/// A module path from the crate root: `[]` is the root, `["store", "entry"]` is `crate::store::entry`.
pub type ModulePath = Vec<String>;

/// One module file, parsed.
pub struct ModuleFile {
    /// The file's path as it was read.
    pub path: PathBuf,
    /// The module the file is.
    pub module: ModulePath,
    /// The file's text (for quoting the lines that import).
    pub text: String,
    /// The parsed file.
    pub ast: syn::File,
}

/// Every module file of one crate root, and which file each module (inline ones too) is in.
pub struct Tree {
    /// The files, the root first.
    pub files: Vec<ModuleFile>,
    /// Module path to the index in `files` of the file that holds it.
    pub modules: BTreeMap<ModulePath, usize>,
    /// The child modules each module declares.
    pub children: BTreeMap<ModulePath, BTreeSet<String>>,
    /// The modules declared under `#[cfg(test)]` (their descendants are test-only too).
    pub test_only: BTreeSet<ModulePath>,
}

impl Tree {
    /// Reads the crate whose root file is `root` (a `lib.rs`, `main.rs` or `src/bin/*.rs`).
    pub fn load(sources: &dyn Sources, root: &Path) -> anyhow::Result<Self> {
        let mut tree = Tree {
            files: Vec::new(),
            modules: BTreeMap::new(),
            children: BTreeMap::new(),
            test_only: BTreeSet::new(),
        };
        let dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
        tree.load_file(sources, root.to_path_buf(), &Vec::new(), &dir)?;
        Ok(tree)
    }

    /// The file index of the module that `path` names, or of its closest enclosing module.
    pub fn file_of(&self, path: &[String]) -> Option<usize> {
        (0..=path.len())
            .rev()
            .find_map(|len| self.modules.get(&path[..len]).copied())
    }

    /// The deepest module of this crate that `path` is in (`crate::a::b::Item` is in `a::b`).
    pub fn module_of(&self, path: &[String]) -> ModulePath {
        (0..=path.len())
            .rev()
            .map(|len| path[..len].to_vec())
            .find(|module| self.modules.contains_key(module))
            .unwrap_or_default()
    }

    /// Whether `module` is compiled only for tests (it or a module around it is `#[cfg(test)]`).
    pub fn is_test_only(&self, module: &[String]) -> bool {
        (1..=module.len()).any(|len| self.test_only.contains(&module[..len]))
    }

    /// Parses `path` as module `module`, whose `mod x;` children live in `child_dir`.
    fn load_file(
        &mut self,
        sources: &dyn Sources,
        path: PathBuf,
        module: &ModulePath,
        child_dir: &Path,
    ) -> anyhow::Result<()> {
        let text = sources
            .read(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let ast = syn::parse_file(&text).with_context(|| format!("cannot parse {}", path.display()))?;
        let index = self.files.len();
        self.modules.insert(module.clone(), index);
        let file_dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
        let items = ast.items.clone();
        self.files.push(ModuleFile {
            path,
            module: module.clone(),
            text,
            ast,
        });
        self.walk_items(sources, &items, module, child_dir, Some(&file_dir), index)
    }

    /// Registers the modules declared in `items` (of module `module`, in file `index`).
    /// `file_dir` is the directory of the file when `items` are its top level (where a `#[path]`
    /// is relative to), `None` inside an inline module.
    fn walk_items(
        &mut self,
        sources: &dyn Sources,
        items: &[syn::Item],
        module: &ModulePath,
        child_dir: &Path,
        file_dir: Option<&Path>,
        index: usize,
    ) -> anyhow::Result<()> {
        for item in items {
            let syn::Item::Mod(declared) = item else { continue };
            let name = declared.ident.to_string();
            let mut child = module.clone();
            child.push(name.clone());
            self.children
                .entry(module.clone())
                .or_default()
                .insert(name.clone());
            if is_cfg_test(&declared.attrs) {
                self.test_only.insert(child.clone());
            }
            let path_attr = path_attribute(&declared.attrs);
            if let Some((_, content)) = &declared.content {
                self.modules.insert(child.clone(), index);
                let inner_dir = match &path_attr {
                    Some(dir) => child_dir.join(dir),
                    None => child_dir.join(&name),
                };
                self.walk_items(sources, content, &child, &inner_dir, None, index)?;
                continue;
            }
            let (file, is_mod_rs) = if let Some(relative) = path_attr {
                let file = file_dir.unwrap_or(child_dir).join(&relative);
                let is_mod_rs = file.file_name().is_some_and(|n| n == "mod.rs");
                (file, is_mod_rs)
            } else {
                let flat = child_dir.join(format!("{name}.rs"));
                let nested = child_dir.join(&name).join("mod.rs");
                match (sources.read(&flat).is_some(), sources.read(&nested).is_some()) {
                    (true, false) => (flat, false),
                    (false, true) => (nested, true),
                    (true, true) => bail!(
                        "module {name}: both {} and {} exist",
                        flat.display(),
                        nested.display()
                    ),
                    (false, false) => bail!(
                        "module {name}: neither {} nor {} exists",
                        flat.display(),
                        nested.display()
                    ),
                }
            };
            // A `mod.rs` file's children sit beside it; `foo.rs`'s children in `foo/`.
            let grandchild_dir = if is_mod_rs {
                file.parent().unwrap_or(Path::new("")).to_path_buf()
            } else {
                file.with_extension("")
            };
            self.load_file(sources, file, &child, &grandchild_dir)?;
        }
        Ok(())
    }
}

/// The value of a `#[path = "…"]` attribute, if any.
fn path_attribute(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| {
        let syn::Meta::NameValue(pair) = &attr.meta else {
            return None;
        };
        if !pair.path.is_ident("path") {
            return None;
        }
        match &pair.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(text),
                ..
            }) => Some(text.value()),
            _ => None,
        }
    })
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Path>()
                .is_ok_and(|path| path.is_ident("test"))
    })
}
