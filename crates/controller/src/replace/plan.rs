//! What a replacement strategy's builder decides to write, for the acting half ([`super::act`])
//! to hand to the one writer: the builders are pure (what was read in, a [`Plan`] out), so each
//! strategy is tested from YAML fixtures of the objects it reads, and the writes are made in one
//! place.

use gpu_remediation_api::object_reference::ObjectReference;
use kube::api::{ApiResource, DynamicObject};

/// One write of a trigger.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Nothing to write (a retry that finds the work done, or an object already going); why.
    Nothing {
        /// For the log and the tests.
        reason: String,
    },
    /// Sets annotation `key` on the remediation, over the version read (a person's edit since is
    /// a conflict, and the next pass reads again).
    AnnotateRemediation {
        /// The remediation.
        name: String,
        /// The version read (the precondition).
        resource_version: Option<String>,
        /// The annotation.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// Deletes the object of `uid` named `name` (the claim stamped first: `Writer::delete_stamped`):
    /// an object re-created under the same name since the read is not deleted in its place.
    DeleteWithUid {
        /// Its kind, as served.
        resource: ApiResource,
        /// Its namespace, if namespaced.
        namespace: Option<String>,
        /// Its name.
        name: String,
        /// The UID read.
        uid: String,
    },
    /// Creates `object` (controlled by the remediation); a create that finds an object of its name
    /// is a retry when that object is ours, else a refusal.
    Create {
        /// Its kind, as served.
        resource: ApiResource,
        /// The object, with its namespace set when its kind is namespaced.
        object: Box<DynamicObject>,
    },
}

/// What a trigger writes, and the object that carries the replacement out.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// For `status.replacement`; a created object's UID is filled in once it is created.
    pub reference: ObjectReference,
    /// In order.
    pub writes: Vec<Write>,
}

impl Plan {
    /// Nothing to write, for `reason`; `reference` carries the replacement.
    #[must_use]
    pub fn nothing(reference: ObjectReference, reason: String) -> Self {
        Self {
            reference,
            writes: vec![Write::Nothing { reason }],
        }
    }
}

/// The reference to the remediated node itself (`v1` `Node` `name`, of `uid` when known): what a
/// delete strategy records when the node is already gone or, for `DeleteNode`, what it deletes.
#[must_use]
pub fn node_reference(name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: name.to_owned(),
        namespace: None,
        uid,
    }
}
