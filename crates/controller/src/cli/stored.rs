//! Our kinds as the cluster stores them, listed for the command line the way the controller's
//! watches read them (`observe::undecodable`): each object decoded on its own, so that one stored
//! object that does not decode (stored before a schema bound existed, or by a newer version) is
//! skipped and named, instead of failing `explain` or `history` as a whole.

use std::fmt;

use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams},
};
use serde::de::DeserializeOwned;

use crate::observe::undecodable::decode;

/// An object left out because it does not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Its kind, e.g. `GpuRemediationPolicy`.
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Why it does not decode.
    pub why: String,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "warning: skipped {} {}: it does not decode ({}); fix or delete it",
            self.kind, self.name, self.why
        )
    }
}

/// The objects of a list that decode, and those skipped.
#[derive(Clone, Debug)]
pub struct Listed<K> {
    /// The objects that decode, in the server's order.
    pub items: Vec<K>,
    /// Those that do not.
    pub skipped: Vec<Skipped>,
}

/// Decodes each of `objects` as a `K` on its own.
#[must_use]
pub fn sort<K>(objects: Vec<DynamicObject>) -> Listed<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let kind = K::kind(&()).into_owned();
    let mut listed = Listed {
        items: Vec::new(),
        skipped: Vec::new(),
    };
    for object in objects {
        match decode::<K>(&object) {
            Ok(decoded) => listed.items.push(decoded),
            Err(why) => listed.skipped.push(Skipped {
                kind: kind.clone(),
                name: object.name_any(),
                why,
            }),
        }
    }
    listed
}

/// Lists every `K` that `params` selects, skipping (and naming on stderr) what does not decode.
///
/// # Errors
/// When the list call fails.
pub async fn list<K>(client: Client, params: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let resource = ApiResource::erase::<K>(&());
    let objects = Api::<DynamicObject>::all_with(client, &resource)
        .list(params)
        .await?;
    let listed = sort::<K>(objects.items);
    for skipped in &listed.skipped {
        eprintln!("{skipped}");
    }
    Ok(listed.items)
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy};
    use serde_json::json;

    use super::*;

    fn policy(name: &str, priority: i64) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediationPolicy",
            "metadata": {"name": name},
            "spec": {"priority": priority, "triggers": [{"conditionType": "GpuHealthy", "status": "False"}]},
        }))
        .unwrap()
    }

    #[test]
    fn an_object_that_does_not_decode_is_skipped_and_named_the_others_kept() {
        let listed = sort::<GpuRemediationPolicy>(vec![
            policy("a", 10),
            policy("huge", 3_000_000_000),
            policy("b", 20),
        ]);
        let names: Vec<String> = listed.items.iter().map(ResourceExt::name_any).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(listed.skipped.len(), 1);
        let line = listed.skipped[0].to_string();
        assert!(
            line.starts_with("warning: skipped GpuRemediationPolicy huge: it does not decode ("),
            "{line}"
        );
        assert!(line.contains("3000000000"), "says why: {line}");
    }

    #[test]
    fn a_remediation_without_its_spec_is_skipped() {
        let broken: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
            "metadata": {"name": "gpu-1-abc"}, "spec": {"nodeName": "gpu-1"},
        }))
        .unwrap();
        let listed = sort::<GpuRemediation>(vec![broken]);
        assert!(listed.items.is_empty());
        assert_eq!(listed.skipped[0].kind, "GpuRemediation");
        assert_eq!(listed.skipped[0].name, "gpu-1-abc");
    }
}
