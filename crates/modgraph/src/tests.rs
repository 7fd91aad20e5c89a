//! The cycle check over small crates held in memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::cycles::{Cycles, find};

/// A crate in memory from `(path under src/, text)` pairs.
fn krate(files: &[(&str, &str)]) -> BTreeMap<PathBuf, String> {
    files
        .iter()
        .map(|(path, text)| (Path::new("src").join(path), (*text).to_string()))
        .collect()
}

fn cycles_of(files: &[(&str, &str)]) -> Cycles {
    find(&krate(files), Path::new("src/lib.rs")).expect("the crate loads")
}

/// The files of each cycle, as paths under src/.
fn cycle_files(found: &Cycles) -> Vec<Vec<String>> {
    found
        .cycles
        .iter()
        .map(|cycle| {
            cycle
                .files
                .iter()
                .map(|f| {
                    found.tree.files[*f]
                        .path
                        .strip_prefix("src")
                        .unwrap()
                        .display()
                        .to_string()
                })
                .collect()
        })
        .collect()
}

#[test]
fn two_modules_naming_each_other_are_a_cycle_reported_with_their_lines() {
    let found = cycles_of(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b::B;\npub struct A(B);\n"),
        (
            "b.rs",
            "pub struct B;\npub fn make() -> crate::a::A {\n    todo!()\n}\n",
        ),
    ]);
    assert_eq!(cycle_files(&found), vec![vec!["a.rs", "b.rs"]]);
    let report = found.report();
    assert!(
        report.contains("src/a.rs:1: use crate::b::B;   [crate::b::B]"),
        "{report}"
    );
    assert!(
        report.contains("src/b.rs:2: pub fn make() -> crate::a::A {   [crate::a::A]"),
        "{report}"
    );
    assert!(
        !report.contains("lib.rs"),
        "mod declarations are not edges: {report}"
    );
}

#[test]
fn a_tree_whose_imports_point_one_way_passes() {
    let found = cycles_of(&[
        ("lib.rs", "pub mod model;\npub mod rules;\npub mod report;\n"),
        (
            "model.rs",
            "pub struct Node;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::model::Node as N;\n}\n",
        ),
        (
            "rules.rs",
            "use crate::model::Node;\npub fn check(_: &Node) -> bool { true }\n",
        ),
        (
            "report.rs",
            "use crate::{model, rules};\npub fn run(n: &model::Node) { assert!(rules::check(n)); }\n",
        ),
    ]);
    assert!(found.cycles.is_empty(), "{}", found.report());
}

#[test]
fn a_mod_rs_re_exporting_a_child_that_imports_super_is_a_cycle() {
    let found = cycles_of(&[
        ("lib.rs", "pub mod store;\n"),
        (
            "store/mod.rs",
            "mod entry;\npub use entry::Entry;\npub struct Key;\n",
        ),
        ("store/entry.rs", "use super::Key;\npub struct Entry(Key);\n"),
    ]);
    assert_eq!(cycle_files(&found), vec![vec!["store/entry.rs", "store/mod.rs"]]);
    let report = found.report();
    assert!(
        report.contains("src/store/mod.rs:2: pub use entry::Entry;   [entry::Entry]"),
        "{report}"
    );
    assert!(
        report.contains("src/store/entry.rs:1: use super::Key;   [super::Key]"),
        "{report}"
    );
}

#[test]
fn the_same_crate_passes_once_the_child_owns_what_it_needs_and_callers_import_from_it() {
    let found = cycles_of(&[
        ("lib.rs", "pub mod store;\nfn f(_: store::entry::Entry) {}\n"),
        ("store/mod.rs", "pub mod entry;\npub mod key;\n"),
        ("store/key.rs", "pub struct Key;\n"),
        ("store/entry.rs", "use super::key::Key;\npub struct Entry(Key);\n"),
    ]);
    assert!(found.cycles.is_empty(), "{}", found.report());
}

#[test]
fn paths_in_expressions_macros_and_self_paths_are_edges_too() {
    let found = cycles_of(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "pub fn f() -> u8 { crate::b::g() }\n"),
        ("b.rs", "pub fn g() -> u8 { assert_eq!(crate::c::h(), 1); 1 }\n"),
        (
            "c.rs",
            "pub fn h() -> u8 { let x: u8 = self::k(); x }\nfn k() -> u8 { crate::a::f() }\n",
        ),
    ]);
    assert_eq!(cycle_files(&found), vec![vec!["a.rs", "b.rs", "c.rs"]]);
}

#[test]
fn a_root_re_exporting_a_module_that_names_the_root_is_a_cycle() {
    let found = cycles_of(&[
        (
            "lib.rs",
            "mod error;\nmod parse;\npub use parse::parse;\npub type Result<T> = std::result::Result<T, error::Error>;\n",
        ),
        ("error.rs", "pub struct Error;\n"),
        ("parse.rs", "pub fn parse() -> crate::Result<()> { Ok(()) }\n"),
    ]);
    assert_eq!(cycle_files(&found), vec![vec!["lib.rs", "parse.rs"]]);
}

#[test]
fn inline_modules_and_path_attributes_resolve_to_their_files() {
    let found = cycles_of(&[
        ("lib.rs", "mod outer {\n    pub mod inner;\n}\nmod plain;\n"),
        (
            "outer/inner.rs",
            "pub fn f() { crate::plain::g() }\n#[cfg(test)]\n#[path = \"inner_tests.rs\"]\nmod tests;\n",
        ),
        ("outer/inner_tests.rs", "use super::f;\n"),
        ("plain.rs", "pub fn g() { crate::outer::inner::f() }\n"),
    ]);
    assert_eq!(cycle_files(&found), vec![vec!["outer/inner.rs", "plain.rs"]]);
    assert!(
        found
            .tree
            .files
            .iter()
            .any(|f| f.path == Path::new("src/outer/inner_tests.rs"))
    );
}

#[test]
fn a_missing_module_file_is_an_error_not_a_pass() {
    let error = find(&krate(&[("lib.rs", "mod gone;\n")]), Path::new("src/lib.rs"))
        .err()
        .expect("an error");
    assert!(format!("{error:#}").contains("gone"), "{error:#}");
}

#[test]
fn paths_in_derive_attributes_are_edges_too() {
    let found = cycles_of(&[
        ("lib.rs", "mod schema;\nmod types;\n"),
        (
            "types.rs",
            "#[derive(JsonSchema, Deserialize)]\n#[schemars(transform = crate::schema::rate)]\npub struct Rate {\n    #[serde(default = \"crate::schema::limit\")]\n    limit: u32,\n}\n",
        ),
        (
            "schema.rs",
            "pub fn rate(_: &mut u8) { let _ = crate::types::Rate::default; }\npub fn limit() -> u32 { 1 }\n",
        ),
    ]);
    assert_eq!(cycle_files(&found), vec![vec!["schema.rs", "types.rs"]]);
    let report = found.report();
    assert!(
        report.contains("src/types.rs:2: #[schemars(transform = crate::schema::rate)]"),
        "{report}"
    );
    assert!(
        report.contains("src/types.rs:4: #[serde(default = \"crate::schema::limit\")]"),
        "{report}"
    );
}
