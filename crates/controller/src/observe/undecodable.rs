//! Objects of our own kinds that the controller cannot decode (stored before a schema bound
//! existed, or written by a newer version): one of them must never fail a watch as a whole, nor
//! stop the other policies from being governed.
//!
//! The policy and remediation watches read `DynamicObject`s; [`Decoder`] decodes each one into
//! its type. What does not decode is left out of the cache (a known object that stops decoding is
//! deleted from it) and reported: a log line and the `gpu_remediator_undecodable_objects{kind,name}`
//! gauge at once, then, from a task of its own, a `Warning` Event on the object and, on a policy,
//! `Ready=False`/`Invalid=True` conditions naming the error. Only the leader writes them (a follower
//! reports what it found once it leads), the status under its claim like every other write.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, LazyLock, Mutex, PoisonError},
};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt, api::DynamicObject, runtime::watcher};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

/// The Event and condition reason of an object the controller cannot decode.
pub const REASON: &str = "Undecodable";

/// Labels of the gauge: the kind and the name of the object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ObjectLabels {
    kind: String,
    name: String,
}

/// `undecodable_objects{kind,name}`: 1 while a stored object cannot be decoded. One series for the
/// process: the watches find such objects before any registry is handed to them, and
/// `telemetry::Metrics` registers this family in every registry it builds.
pub static GAUGE: LazyLock<Family<ObjectLabels, Gauge>> = LazyLock::new(Family::default);

/// An object that does not decode, for the reporting task ([`crate::act::undecodable`]).
#[derive(Debug, Clone)]
pub struct Finding {
    /// The object.
    pub reference: ObjectReference,
    /// Its `metadata.generation`, as stored.
    pub generation: Option<i64>,
    /// Its `resourceVersion`, as stored (a status write is made over it only).
    pub resource_version: Option<String>,
    /// Why it does not decode.
    pub error: String,
}

/// The findings of an [`Undecodable`] registry, in the order found, for its reporting task.
pub type Findings = mpsc::UnboundedReceiver<Finding>;

/// The objects that do not decode now, by `(kind, name)`, with why. Shared by both watches.
#[derive(Clone, Debug)]
pub struct Undecodable {
    found: Arc<Mutex<BTreeMap<(String, String), String>>>,
    reports: mpsc::UnboundedSender<Finding>,
}

impl Undecodable {
    /// A registry, and the findings it sends for a reporting task to report
    /// ([`crate::act::undecodable::report`]); findings sent after that task ends are dropped.
    #[must_use]
    pub fn new() -> (Self, Findings) {
        let (reports, findings) = mpsc::unbounded_channel();
        let registry = Self {
            found: Arc::default(),
            reports,
        };
        (registry, findings)
    }

    /// Every object that does not decode now: `(kind, name, why)`.
    #[must_use]
    pub fn list(&self) -> Vec<(String, String, String)> {
        self.lock()
            .iter()
            .map(|((kind, name), why)| (kind.clone(), name.clone(), why.clone()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), String>> {
        self.found.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn found(&self, object: &DynamicObject, kind: &str, error: String) {
        let name = object.name_any();
        let key = (kind.to_owned(), name.clone());
        if self.lock().get(&key) == Some(&error) {
            return;
        }
        tracing::error!(%kind, %name, %error, "stored object cannot be decoded; it is left out until fixed or deleted");
        GAUGE
            .get_or_create(&ObjectLabels {
                kind: kind.to_owned(),
                name,
            })
            .set(1);
        self.lock().insert(key, error.clone());
        let finding = Finding {
            reference: reference(object, kind),
            generation: object.metadata.generation,
            resource_version: object.metadata.resource_version.clone(),
            error,
        };
        // The reporting task ends only with the runtime (or, in tests, is never started).
        let _ = self.reports.send(finding);
    }

    fn cleared(&self, kind: &str, name: &str) {
        if self.lock().remove(&(kind.to_owned(), name.to_owned())).is_some() {
            tracing::info!(%kind, %name, "object decodes again");
            GAUGE.remove(&ObjectLabels {
                kind: kind.to_owned(),
                name: name.to_owned(),
            });
        }
    }
}

fn reference(object: &DynamicObject, kind: &str) -> ObjectReference {
    ObjectReference {
        api_version: object.types.as_ref().map(|t| t.api_version.clone()),
        kind: Some(kind.to_owned()),
        name: Some(object.name_any()),
        uid: object.metadata.uid.clone(),
        resource_version: object.metadata.resource_version.clone(),
        ..ObjectReference::default()
    }
}

/// `object` decoded as a `K`, or why it does not decode (shared with the command line's listings,
/// `cli::stored`).
pub fn decode<K: DeserializeOwned>(object: &DynamicObject) -> Result<K, String> {
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// Turns one watch's events of `DynamicObject` into events of `K`, leaving out (and reporting)
/// what does not decode.
pub struct Decoder<K> {
    kind: String,
    known: HashMap<String, K>,
    listed: HashSet<String>,
    undecodable: Undecodable,
}

impl<K: Resource<DynamicType = ()> + Clone + DeserializeOwned> Decoder<K> {
    /// A decoder for the watch of `K`, reporting into `undecodable`.
    #[must_use]
    pub fn new(undecodable: Undecodable) -> Self {
        Self {
            kind: K::kind(&()).into_owned(),
            known: HashMap::new(),
            listed: HashSet::new(),
            undecodable,
        }
    }

    /// The event of `K` that `event` amounts to, if any.
    pub fn event(&mut self, event: watcher::Event<DynamicObject>) -> Option<watcher::Event<K>> {
        match event {
            watcher::Event::Init => {
                self.listed.clear();
                Some(watcher::Event::Init)
            }
            watcher::Event::InitDone => {
                // A (re)list is the whole truth: an object it did not show is gone.
                let gone: Vec<_> = self
                    .undecodable
                    .list()
                    .into_iter()
                    .filter(|(kind, name, _)| *kind == self.kind && !self.listed.contains(name))
                    .collect();
                for (kind, name, _) in gone {
                    self.undecodable.cleared(&kind, &name);
                }
                self.known.retain(|name, _| self.listed.contains(name));
                Some(watcher::Event::InitDone)
            }
            watcher::Event::InitApply(object) => {
                self.listed.insert(object.name_any());
                self.apply(&object).map(watcher::Event::InitApply)
            }
            watcher::Event::Apply(object) => match self.apply(&object) {
                Some(decoded) => Some(watcher::Event::Apply(decoded)),
                // It decoded before: it leaves the cache rather than stay there as it was.
                None => self.known.remove(&object.name_any()).map(watcher::Event::Delete),
            },
            watcher::Event::Delete(object) => {
                let name = object.name_any();
                self.undecodable.cleared(&self.kind, &name);
                let last = self.known.remove(&name);
                decode::<K>(&object).ok().or(last).map(watcher::Event::Delete)
            }
        }
    }

    fn apply(&mut self, object: &DynamicObject) -> Option<K> {
        let name = object.name_any();
        match decode::<K>(object) {
            Ok(decoded) => {
                self.undecodable.cleared(&self.kind, &name);
                self.known.insert(name, decoded.clone());
                Some(decoded)
            }
            Err(error) => {
                self.undecodable.found(object, &self.kind, error);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy};
    use serde_json::json;

    use super::*;

    fn object(name: &str, priority: i64) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediationPolicy",
            "metadata": {"name": name, "uid": format!("uid-{name}")},
            "spec": {"priority": priority, "triggers": [{"conditionType": "GpuHealthy", "status": "False"}]},
        }))
        .unwrap()
    }

    fn registry() -> (Undecodable, mpsc::UnboundedReceiver<Finding>) {
        let (reports, findings) = mpsc::unbounded_channel();
        (
            Undecodable {
                found: Arc::default(),
                reports,
            },
            findings,
        )
    }

    fn names<K: Resource>(event: Option<&watcher::Event<K>>) -> Option<(&'static str, String)> {
        event.map(|event| match event {
            watcher::Event::Apply(k) => ("apply", k.meta().name.clone().unwrap()),
            watcher::Event::InitApply(k) => ("init-apply", k.meta().name.clone().unwrap()),
            watcher::Event::Delete(k) => ("delete", k.meta().name.clone().unwrap()),
            watcher::Event::Init => ("init", String::new()),
            watcher::Event::InitDone => ("init-done", String::new()),
        })
    }

    #[test]
    fn a_list_with_one_undecodable_policy_yields_the_others_and_reports_that_one() {
        let (undecodable, mut findings) = registry();
        let mut decoder = Decoder::<GpuRemediationPolicy>::new(undecodable.clone());
        assert!(decoder.event(watcher::Event::Init).is_some());
        let good = decoder.event(watcher::Event::InitApply(object("good", 10)));
        assert_eq!(names(good.as_ref()), Some(("init-apply", "good".to_owned())));
        let bad = decoder.event(watcher::Event::InitApply(object("huge", 3_000_000_000)));
        assert!(bad.is_none());
        assert!(decoder.event(watcher::Event::InitDone).is_some());

        let listed = undecodable.list();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].0.as_str(), listed[0].1.as_str()),
            ("GpuRemediationPolicy", "huge")
        );
        assert!(listed[0].2.contains("3000000000"), "{}", listed[0].2);
        let finding = findings.try_recv().expect("one report");
        assert_eq!(finding.reference.uid.as_deref(), Some("uid-huge"));
        assert!(findings.try_recv().is_err(), "reported once");
        let gauge = GAUGE
            .get_or_create(&ObjectLabels {
                kind: "GpuRemediationPolicy".into(),
                name: "huge".into(),
            })
            .get();
        assert_eq!(gauge, 1);
    }

    #[test]
    fn a_known_object_that_stops_decoding_leaves_the_cache_and_comes_back_when_fixed() {
        let (undecodable, _findings) = registry();
        let mut decoder = Decoder::<GpuRemediationPolicy>::new(undecodable.clone());
        decoder.event(watcher::Event::Apply(object("p", 1)));
        let broken = decoder.event(watcher::Event::Apply(object("p", 5_000_000_000)));
        assert_eq!(names(broken.as_ref()), Some(("delete", "p".to_owned())));
        assert_eq!(undecodable.list().len(), 1);
        let again = decoder.event(watcher::Event::Apply(object("p", 2)));
        assert_eq!(names(again.as_ref()), Some(("apply", "p".to_owned())));
        assert!(undecodable.list().is_empty());
    }

    #[test]
    fn deleting_an_undecodable_object_clears_it_and_a_relist_forgets_what_it_does_not_show() {
        let (undecodable, _findings) = registry();
        let mut decoder = Decoder::<GpuRemediationPolicy>::new(undecodable.clone());
        decoder.event(watcher::Event::Apply(object("a", 5_000_000_000)));
        decoder.event(watcher::Event::Apply(object("b", 5_000_000_000)));
        assert!(
            decoder
                .event(watcher::Event::Delete(object("a", 5_000_000_000)))
                .is_none()
        );
        assert_eq!(undecodable.list().len(), 1);
        decoder.event(watcher::Event::Init);
        decoder.event(watcher::Event::InitDone);
        assert!(undecodable.list().is_empty());
    }

    #[test]
    fn a_remediation_whose_status_count_is_out_of_range_does_not_decode() {
        let (undecodable, _findings) = registry();
        let mut decoder = Decoder::<GpuRemediation>::new(undecodable.clone());
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediation",
            "metadata": {"name": "gpu-1-abc"},
            "spec": {"nodeName": "gpu-1", "policyName": "p", "action": "None",
                     "trigger": {"conditionType": "GpuHealthy", "status": "False"}},
            "status": {"phase": "Draining", "drain": {"podsTotal": 5_000_000_000_i64}},
        }))
        .unwrap();
        assert!(decoder.event(watcher::Event::Apply(object)).is_none());
        assert_eq!(undecodable.list()[0].1, "gpu-1-abc");
    }
}
