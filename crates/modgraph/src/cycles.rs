//! The module graph of one crate root and its cycles. Each module stands for its whole subtree,
//! and an edge joins two sibling subtrees where code in one names a path into the other (through
//! any re-exports, to the module that owns the item): within every module, its children must form
//! a DAG, which is what lets a reader take the crate one layer at a time. A module naming its own
//! ancestor (`super::Key`) is not an edge: it is inside it. Test-only modules (`#[cfg(test)]`) are
//! left out: nothing depends on them, so they cannot close a cycle of the code that ships.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use petgraph::algo::tarjan_scc;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::refs::{Reference, reexports, references};
use crate::tree::{ModulePath, Sources, Tree};

/// How many lines of one file importing another a report quotes before it counts the rest.
const LINES_PER_IMPORT: usize = 3;

/// The import cycles of one crate root.
pub struct Cycles {
    /// The crate's module files.
    pub tree: Tree,
    /// Each cycle, with the references between its modules.
    pub cycles: Vec<Cycle>,
}

/// One strongly connected component of more than one sibling module.
pub struct Cycle {
    /// The sibling modules in the cycle (each with its subtree), sorted.
    pub modules: Vec<ModulePath>,
    /// Every reference from one module of the cycle into another.
    pub references: Vec<Reference>,
}

/// The two sibling modules a reference from `from` into `to` joins, if it joins two: the children
/// of their deepest common module that hold each end. `None` when one is inside the other.
fn siblings(from: &[String], to: &[String]) -> Option<(ModulePath, ModulePath)> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() || common == to.len() {
        return None;
    }
    Some((from[..=common].to_vec(), to[..=common].to_vec()))
}

/// Reads the crate rooted at `root` and finds its import cycles.
pub fn find(sources: &dyn Sources, root: &Path) -> anyhow::Result<Cycles> {
    let tree = Tree::load(sources, root)?;
    let reexported = reexports(&tree);
    let mut graph = DiGraph::<ModulePath, ()>::new();
    let mut nodes: BTreeMap<ModulePath, NodeIndex> = BTreeMap::new();
    let mut edges: BTreeMap<(ModulePath, ModulePath), Vec<Reference>> = BTreeMap::new();
    for reference in (0..tree.files.len()).flat_map(|i| references(&tree, &reexported, i)) {
        if tree.is_test_only(&reference.from_module) {
            continue;
        }
        let Some((from, to)) = siblings(&reference.from_module, &reference.to_module) else {
            continue;
        };
        let mut node = |module: &ModulePath| {
            *nodes
                .entry(module.clone())
                .or_insert_with(|| graph.add_node(module.clone()))
        };
        let (a, b) = (node(&from), node(&to));
        if graph.find_edge(a, b).is_none() {
            graph.add_edge(a, b, ());
        }
        edges.entry((from, to)).or_default().push(reference);
    }
    let mut cycles: Vec<Cycle> = tarjan_scc(&graph)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| {
            let mut modules: Vec<ModulePath> = component.iter().map(|node| graph[*node].clone()).collect();
            modules.sort();
            let references: Vec<Reference> = edges
                .iter()
                .filter(|((from, to), _)| modules.contains(from) && modules.contains(to))
                .flat_map(|(_, references)| references.iter().cloned())
                .collect();
            Cycle { modules, references }
        })
        .collect();
    cycles.sort_by(|a, b| a.modules.cmp(&b.modules));
    Ok(Cycles { tree, cycles })
}

/// `crate::a::b` for `["a", "b"]`.
fn module_name(module: &[String]) -> String {
    std::iter::once("crate")
        .chain(module.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::")
}

impl Cycles {
    /// The report a person reads: each cycle's files, then the lines by which they import each other.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for (number, cycle) in self.cycles.iter().enumerate() {
            let _ = writeln!(out, "  cycle {} ({} modules):", number + 1, cycle.modules.len());
            for module in &cycle.modules {
                let _ = writeln!(out, "    {}", module_name(module));
            }
            let _ = writeln!(out, "   imports that close it:");
            let mut by_pair: BTreeMap<(&Path, &Path), Vec<&Reference>> = BTreeMap::new();
            for reference in &cycle.references {
                let from = self.tree.files[reference.from].path.as_path();
                let to = self.tree.files[reference.to].path.as_path();
                by_pair.entry((from, to)).or_default().push(reference);
            }
            for ((from, to), references) in by_pair {
                let _ = writeln!(out, "    {} -> {}", from.display(), to.display());
                for reference in references.iter().take(LINES_PER_IMPORT) {
                    let text = &self.tree.files[reference.from].text;
                    let line = text
                        .lines()
                        .nth(reference.line.saturating_sub(1))
                        .unwrap_or("")
                        .trim();
                    let _ = writeln!(
                        out,
                        "      {}:{}: {line}   [{}]",
                        from.display(),
                        reference.line,
                        reference.written
                    );
                }
                if references.len() > LINES_PER_IMPORT {
                    let _ = writeln!(out, "      … and {} more", references.len() - LINES_PER_IMPORT);
                }
            }
        }
        out
    }
}
