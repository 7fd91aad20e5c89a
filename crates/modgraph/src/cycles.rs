//! The module graph of one crate root (a node per module file, an edge per file that names a path
//! into another) and its cycles: every strongly connected component of more than one file, with
//! the lines that form it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use petgraph::algo::tarjan_scc;
use petgraph::graph::DiGraph;

use crate::refs::{Reference, references};
use crate::tree::{Sources, Tree};

/// How many lines of one file importing another a report quotes before it counts the rest.
const LINES_PER_IMPORT: usize = 3;

/// The import cycles of one crate root.
pub struct Cycles {
    /// The crate's module files.
    pub tree: Tree,
    /// Each cycle: the indices of its files (sorted by path) and the references between them.
    pub cycles: Vec<Cycle>,
}

/// One strongly connected component of more than one module file.
pub struct Cycle {
    /// The files in the cycle, as indices into the tree, sorted by path.
    pub files: Vec<usize>,
    /// Every reference from a file of the cycle to another file of it.
    pub references: Vec<Reference>,
}

/// Reads the crate rooted at `root` and finds its import cycles.
pub fn find(sources: &dyn Sources, root: &Path) -> anyhow::Result<Cycles> {
    let tree = Tree::load(sources, root)?;
    let mut graph = DiGraph::<usize, ()>::new();
    let nodes: Vec<_> = (0..tree.files.len()).map(|i| graph.add_node(i)).collect();
    let all: Vec<Reference> = (0..tree.files.len()).flat_map(|i| references(&tree, i)).collect();
    for reference in &all {
        let (from, to) = (nodes[reference.from], nodes[reference.to]);
        if graph.find_edge(from, to).is_none() {
            graph.add_edge(from, to, ());
        }
    }
    let mut cycles: Vec<Cycle> = tarjan_scc(&graph)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| {
            let mut files: Vec<usize> = component.iter().map(|node| graph[*node]).collect();
            files.sort_by(|a, b| tree.files[*a].path.cmp(&tree.files[*b].path));
            let references = all
                .iter()
                .filter(|r| files.contains(&r.from) && files.contains(&r.to))
                .cloned()
                .collect();
            Cycle { files, references }
        })
        .collect();
    cycles.sort_by(|a, b| tree.files[a.files[0]].path.cmp(&tree.files[b.files[0]].path));
    Ok(Cycles { tree, cycles })
}

impl Cycles {
    /// The report a person reads: each cycle's files, then the lines by which they import each other.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for (number, cycle) in self.cycles.iter().enumerate() {
            let _ = writeln!(out, "  cycle {} ({} modules):", number + 1, cycle.files.len());
            for file in &cycle.files {
                let _ = writeln!(out, "    {}", self.tree.files[*file].path.display());
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
