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

/// The modules of each cycle, as `crate::…` paths.
fn cycle_modules(found: &Cycles) -> Vec<Vec<String>> {
    found
        .cycles
        .iter()
        .map(|cycle| {
            cycle
                .modules
                .iter()
                .map(|module| format!("crate::{}", module.join("::")))
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
    assert_eq!(cycle_modules(&found), vec![vec!["crate::a", "crate::b"]]);
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
fn a_child_naming_its_parent_is_inside_it_not_a_cycle() {
    let found = cycles_of(&[
        ("lib.rs", "pub mod store;\n"),
        (
            "store/mod.rs",
            "mod entry;\npub use entry::Entry;\npub struct Key;\n",
        ),
        ("store/entry.rs", "use super::Key;\npub struct Entry(Key);\n"),
    ]);
    assert!(found.cycles.is_empty(), "{}", found.report());
}

#[test]
fn siblings_naming_each_other_through_their_parents_re_export_are_a_cycle() {
    let found = cycles_of(&[
        ("lib.rs", "pub mod store;\n"),
        ("store/mod.rs", "mod a;\nmod entry;\npub use entry::Entry;\n"),
        ("store/a.rs", "use super::Entry;\npub struct A(Entry);\n"),
        (
            "store/entry.rs",
            "pub struct Entry;\npub fn f() -> super::a::A {\n    todo!()\n}\n",
        ),
    ]);
    assert_eq!(
        cycle_modules(&found),
        vec![vec!["crate::store::a", "crate::store::entry"]]
    );
    let report = found.report();
    assert!(
        report.contains("src/store/a.rs:1: use super::Entry;   [super::Entry]"),
        "the re-export is followed to its owner: {report}"
    );
}

#[test]
fn a_cycle_between_subtrees_through_a_grandchild_is_found() {
    let found = cycles_of(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a/mod.rs", "mod inner;\npub struct Y;\n"),
        ("a/inner.rs", "pub fn f(_: crate::b::X) {}\n"),
        ("b.rs", "pub struct X(crate::a::Y);\n"),
    ]);
    assert_eq!(cycle_modules(&found), vec![vec!["crate::a", "crate::b"]]);
}

#[test]
fn a_test_only_module_importing_from_above_closes_no_cycle() {
    let found = cycles_of(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        (
            "a.rs",
            "pub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\n",
        ),
        ("b.rs", "pub struct B(crate::a::A);\n"),
    ]);
    assert!(found.cycles.is_empty(), "{}", found.report());
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
    assert_eq!(
        cycle_modules(&found),
        vec![vec!["crate::a", "crate::b", "crate::c"]]
    );
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
    assert_eq!(cycle_modules(&found), vec![vec!["crate::outer", "crate::plain"]]);
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
    assert_eq!(cycle_modules(&found), vec![vec!["crate::schema", "crate::types"]]);
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
