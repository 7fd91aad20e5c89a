//! Where a field lives in a YAML file: `spec.triggers[0].status` → the line it is written on.
//! Pure.
//!
//! Policies are written in block style, so indentation alone finds a field: a key at the block's
//! indent, then its nested block, then the n-th `- ` item of a list. Where the path goes on inside
//! a flow collection (`values: [a, b]`) or names a field that is not written (a required field
//! that is missing, a default), the line of the deepest part that is written is given, which is
//! where a person would fix it.

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// `spec.triggers[0].reasons[1]` → `spec`, `triggers`, 0, `reasons`, 1. Stops at the first part
/// that is not a plain key or index (the rest cannot be located anyway).
fn steps(field: &str) -> Vec<Step<'_>> {
    let mut out = Vec::new();
    for part in field.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Step::Key(key));
        }
        while !rest.is_empty() {
            let Some((index, after)) = rest.split_once(']') else {
                return out;
            };
            let Ok(index) = index.parse() else {
                return out;
            };
            out.push(Step::Index(index));
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    out
}

/// One line of the document as the search sees it: its indentation and its text. List items are
/// entered by blanking their `- `, which makes the item's first key an ordinary key.
#[derive(Clone, Debug)]
struct Line {
    number: usize,
    indent: usize,
    text: String,
}

fn lines(document: &str, first_line: usize) -> Vec<Line> {
    document
        .lines()
        .enumerate()
        .filter_map(|(i, raw)| {
            let text = raw.trim_start();
            (!text.is_empty() && !text.starts_with('#')).then(|| Line {
                number: first_line + i,
                indent: raw.len() - text.len(),
                text: text.to_owned(),
            })
        })
        .collect()
}

/// Whether `text` is `key:` followed by the end of the line or a space.
fn is_key(text: &str, key: &str) -> bool {
    let quoted = [format!("{key}:"), format!("\"{key}\":"), format!("'{key}':")];
    quoted.iter().any(|prefix| {
        text.strip_prefix(prefix.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
    })
}

fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

/// The lines after `lines[at]` that are nested under it: up to the next line indented no deeper.
/// A key's list may also be written at the key's own indent (`triggers:` then `- ...`), so for a
/// key, items at its indent belong to it; for an item, they are its siblings.
fn nested(lines: &[Line], at: usize, of_key: bool) -> &[Line] {
    let indent = lines[at].indent;
    let end = lines[at + 1..]
        .iter()
        .position(|l| l.indent < indent || (l.indent == indent && !(of_key && is_item(&l.text))))
        .map_or(lines.len(), |p| at + 1 + p);
    &lines[at + 1..end]
}

/// The line of `field` in `document`, whose first line is line `first_line` of its file. `None`
/// when not even the field's first key is written.
#[must_use]
pub fn line_of(document: &str, first_line: usize, field: &str) -> Option<usize> {
    let all = lines(document, first_line);
    let mut block: Vec<Line> = all;
    let mut found = None;
    for step in steps(field) {
        let Some(indent) = block.first().map(|l| l.indent) else {
            break;
        };
        match step {
            Step::Key(key) => {
                let Some(at) = block
                    .iter()
                    .position(|l| l.indent == indent && is_key(&l.text, key))
                else {
                    break;
                };
                found = Some(block[at].number);
                block = nested(&block, at, true).to_vec();
            }
            Step::Index(index) => {
                let Some(at) = block
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| l.indent == indent && is_item(&l.text))
                    .map(|(i, _)| i)
                    .nth(index)
                else {
                    break;
                };
                found = Some(block[at].number);
                // The item's own line holds its first key: blank the `- ` so that key sits at the
                // indent of the keys below it.
                let mut item = vec![block[at].clone()];
                item.extend(nested(&block, at, false).iter().cloned());
                let head = &mut item[0];
                let content = head.text[1..].trim_start().to_owned();
                head.indent += head.text.len() - content.len();
                head.text = content;
                if item[0].text.is_empty() {
                    item.remove(0);
                }
                block = item;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = "\
apiVersion: gpuremediation.dev/v1alpha1
kind: GpuRemediationPolicy
metadata:
  name: p
spec:
  # which nodes
  nodeSelector:
    matchExpressions:
      - key: nvidia.com/gpu.product
        operator: In
        values: [H100]
  triggers:
  - conditionType: GpuHealthy
    status: \"False\"
  -
    conditionType: GpuHealthy
    status: Unknown
    reasons:
      - XID79
      - GpuMissing
  safety:
    rate: {limit: 0, per: 1h}
";

    #[test]
    fn a_nested_key_is_found_on_its_own_line() {
        assert_eq!(line_of(POLICY, 1, "metadata.name"), Some(4));
        assert_eq!(
            line_of(POLICY, 1, "spec.nodeSelector.matchExpressions[0].operator"),
            Some(10)
        );
    }

    #[test]
    fn list_items_are_counted_whether_indented_or_not_and_with_the_key_on_the_dash_line_or_below() {
        assert_eq!(line_of(POLICY, 1, "spec.triggers[0].status"), Some(14));
        assert_eq!(line_of(POLICY, 1, "spec.triggers[1].status"), Some(17));
        assert_eq!(line_of(POLICY, 1, "spec.triggers[1].reasons[1]"), Some(20));
        assert_eq!(
            line_of(POLICY, 1, "spec.nodeSelector.matchExpressions[0].key"),
            Some(9)
        );
    }

    #[test]
    fn a_field_inside_a_flow_collection_is_given_the_line_of_its_collection() {
        assert_eq!(line_of(POLICY, 1, "spec.safety.rate.limit"), Some(22));
        assert_eq!(
            line_of(POLICY, 1, "spec.nodeSelector.matchExpressions[0].values[0]"),
            Some(11)
        );
    }

    #[test]
    fn a_field_that_is_not_written_is_given_the_line_of_its_deepest_written_parent() {
        assert_eq!(line_of(POLICY, 1, "spec.drain.timeout"), Some(5));
        assert_eq!(line_of(POLICY, 1, "spec.triggers[5].status"), Some(12));
        assert_eq!(line_of(POLICY, 1, "status"), None);
    }

    #[test]
    fn lines_count_from_where_the_document_starts_in_its_file() {
        assert_eq!(line_of(POLICY, 31, "metadata.name"), Some(34));
    }

    #[test]
    fn a_key_that_only_starts_like_the_wanted_one_is_not_taken_for_it() {
        let doc = "spec:\n  triggersOld: 1\n  triggers: []\n";
        assert_eq!(line_of(doc, 1, "spec.triggers"), Some(3));
    }
}
