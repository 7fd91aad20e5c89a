//! The one writer, checked over the source: no module outside `src/write/` calls a mutating verb
//! of kube's `Api` (`create`, `replace`, `patch`, `delete`, their status, subresource and
//! collection forms, `evict`). The compiler already keeps the writer's client private (no other
//! module can reach a client through `Context`); this test catches the other way round, a module
//! that builds an `Api` from a client it was handed (the watches' client, the CLI's) and writes
//! with it.
//!
//! A call counts as an `Api` write when the method has one of those names, as many arguments as
//! kube's method of that name, and one of them is a `&…Params`/`&params` or a `Patch::` (kube's
//! request parameters): `str::replace(a, b)` and the like have neither.

use std::{fs, path::Path};

/// Each mutating method of `kube::Api` and how many arguments it takes.
const MUTATING: &[(&str, usize)] = &[
    ("create", 2),
    ("replace", 3),
    ("patch", 3),
    ("delete", 2),
    ("delete_collection", 2),
    ("evict", 2),
    ("create_subresource", 4),
    ("patch_status", 3),
    ("replace_status", 3),
    ("patch_subresource", 4),
    ("replace_subresource", 4),
    ("patch_metadata", 3),
];

/// The arguments of the call whose `(` is at `open`, split at top-level commas.
fn arguments(text: &str, open: usize) -> Vec<String> {
    let mut depth = 0_i32;
    let mut current = String::new();
    let mut arguments = Vec::new();
    for c in text[open..].chars() {
        match c {
            '(' | '[' | '{' => {
                depth += 1;
                if depth > 1 {
                    current.push(c);
                }
            }
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
                current.push(c);
            }
            ',' if depth == 1 => arguments.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    if !current.trim().is_empty() {
        arguments.push(current);
    }
    arguments.into_iter().map(|a| a.trim().to_owned()).collect()
}

fn is_request_parameter(argument: &str) -> bool {
    let compact: String = argument.split_whitespace().collect();
    (compact.starts_with('&') && (compact.contains("Params") || compact.contains("params")))
        || compact.contains("Patch::")
}

/// The `Api` writes in `text`, as `line: call`.
fn api_writes(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (name, count) in MUTATING {
        let needle = format!(".{name}(");
        let mut from = 0;
        while let Some(at) = text[from..].find(&needle) {
            let start = from + at;
            let open = start + needle.len() - 1;
            let arguments = arguments(text, open);
            if arguments.len() == *count && arguments.iter().any(|a| is_request_parameter(a)) {
                let line = text[..start].lines().count();
                found.push(format!("{line}: .{name}({})", arguments.join(", ")));
            }
            from = open;
        }
    }
    found
}

fn rust_files(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).expect("the source tree reads") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

#[test]
fn no_module_outside_the_writer_calls_a_mutating_api_verb() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut offenders = Vec::new();
    for file in files {
        if file.starts_with(src.join("write")) {
            continue;
        }
        let text = fs::read_to_string(&file).expect("a source file reads");
        for write in api_writes(&text) {
            offenders.push(format!(
                "{}:{write}",
                file.strip_prefix(&src).unwrap_or(&file).display()
            ));
        }
    }
    assert!(
        offenders.is_empty(),
        "writes outside crate::write (add a verb to the writer instead):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_check_finds_each_form_of_an_api_write_and_nothing_else() {
    let text = r#"
        api.create(&PostParams::default(), &object).await;
        nodes.replace(&name, &post_params(), &node).await;
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await;
        api.delete(name, &params).await;
        pods.create_subresource("eviction", &pod.name, &params, &eviction).await;
        api.patch_status(name, &apply, &Patch::Apply(&patch)).await;
        text.replace("a", "b");
        map.create(1, 2);
        value.patch(a, b, c);
    "#;
    let found = api_writes(text);
    assert_eq!(found.len(), 6, "{found:#?}");
}
