//! Our own writes, laid over a watch cache until it has caught up with them: a remediation created
//! or updated in one pass is seen by the next even before its watch event arrives. The writer
//! records into the overlays ([`Overlays`]); the caches only read them.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use gpu_remediation_api::{GpuHardwareRecord, GpuRemediation};

use super::cached_node::{CachedNode, NodeView};

/// What an overlay reads of the objects it keeps: the name it keys them by, and what tells a later
/// version of the same object.
pub trait Versioned {
    /// The object's name.
    fn key(&self) -> &str;
    /// Its UID.
    fn uid_of(&self) -> Option<&str>;
    /// Its resourceVersion.
    fn version_of(&self) -> Option<&str>;
}

/// Our kinds, read through their metadata.
macro_rules! versioned_by_metadata {
    ($($kind:ty),*) => {$(
        impl Versioned for $kind {
            fn key(&self) -> &str {
                self.metadata.name.as_deref().unwrap_or_default()
            }
            fn uid_of(&self) -> Option<&str> {
                self.metadata.uid.as_deref()
            }
            fn version_of(&self) -> Option<&str> {
                self.metadata.resource_version.as_deref()
            }
        }
    )*};
}

versioned_by_metadata!(GpuRemediation, GpuHardwareRecord);

impl Versioned for CachedNode {
    fn key(&self) -> &str {
        self.node_name()
    }

    fn uid_of(&self) -> Option<&str> {
        self.node_uid()
    }

    fn version_of(&self) -> Option<&str> {
        self.version()
    }
}

/// How long a write the cache has never shown stays laid over it. A watch delivers our own write
/// within milliseconds; a write still missing after this is of an object deleted since, and must
/// not haunt the view (a ghost remediation would hold a budget slot forever).
const UNSEEN_WRITE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// A write we made, and when.
type Written<K> = (Arc<K>, std::time::Instant);

/// Our own writes, laid over a watch cache until it has caught up with them.
pub struct Overlay<K> {
    written: Arc<Mutex<HashMap<String, Written<K>>>>,
}

impl<K> Clone for Overlay<K> {
    fn clone(&self) -> Self {
        Self {
            written: self.written.clone(),
        }
    }
}

impl<K> Default for Overlay<K> {
    fn default() -> Self {
        Self {
            written: Arc::default(),
        }
    }
}

impl<K> Overlay<K> {
    /// Forgets our write of an object that is gone.
    pub fn forget(&self, name: &str) {
        let mut written = self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        written.remove(name);
    }
}

impl<K: Versioned> Overlay<K> {
    /// Records the object the API server returned for a create or an update, in the shape its
    /// cache keeps (a node as a `CachedNode`, pruned as the node watch prunes).
    pub fn record(&self, object: K) {
        let mut written = self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        written.insert(
            object.key().to_owned(),
            (Arc::new(object), std::time::Instant::now()),
        );
    }

    /// The newer of the cached object and our last write of it.
    #[must_use]
    pub fn pick(&self, name: &str, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        let mut written = self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match (written.get(name), cached) {
            (Some((ours, _)), Some(cached)) if is_newer(ours.as_ref(), &cached) => Some(ours.clone()),
            (Some(_), Some(cached)) => {
                written.remove(name);
                Some(cached)
            }
            (Some((_, at)), None) if at.elapsed() > UNSEEN_WRITE_GRACE => {
                written.remove(name);
                None
            }
            (Some((ours, _)), None) => Some(ours.clone()),
            (None, cached) => cached,
        }
    }

    /// The names of the objects written and not yet caught up with (as far as the last look knew).
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// The cache's objects with newer written versions swapped in and written ones the cache has
    /// not seen yet added; entries the cache caught up with, or never showed within the grace
    /// period, are dropped.
    #[must_use]
    pub fn merge(&self, cached: Vec<Arc<K>>) -> Vec<Arc<K>> {
        let mut written = self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Almost always: nothing of ours is waiting for its watch event, and the fleet's cache
        // is the view as it is (a pass over 50,000 nodes must not copy their names to find that).
        if written.is_empty() {
            return cached;
        }
        let mut merged: Vec<Arc<K>> = Vec::with_capacity(cached.len() + written.len());
        // The written objects the cache holds (caught up with or not); the others are added.
        let mut cached_too = std::collections::HashSet::new();
        for object in cached {
            let name = object.key();
            match written.get(name) {
                Some((ours, _)) if is_newer(ours.as_ref(), &object) => {
                    cached_too.insert(name.to_owned());
                    merged.push(ours.clone());
                }
                Some(_) => {
                    written.remove(name);
                    merged.push(object);
                }
                None => merged.push(object),
            }
        }
        written.retain(|name, (_, at)| cached_too.contains(name) || at.elapsed() <= UNSEEN_WRITE_GRACE);
        for (name, (ours, _)) in written.iter() {
            if !cached_too.contains(name) {
                merged.push(ours.clone());
            }
        }
        merged
    }
}

/// Whether `ours` is a later version than `cached` of the same object. Resource versions are
/// opaque in general, but etcd's are increasing integers; when either does not parse, the cache
/// wins (it is the safe side: at worst one idempotent step repeats).
fn is_newer<K: Versioned>(ours: &K, cached: &K) -> bool {
    if ours.uid_of() != cached.uid_of() {
        return false;
    }
    let version = |r: &K| r.version_of().and_then(|v| v.parse::<u64>().ok());
    matches!((version(ours), version(cached)), (Some(a), Some(b)) if a > b)
}

/// Our own writes of the kinds the passes read from caches, laid over those caches until their
/// watches catch up. The writer records into them; the caches read them.
#[derive(Clone, Default)]
pub struct Overlays {
    /// Remediations created or updated.
    pub remediations: Overlay<GpuRemediation>,
    /// Nodes edited (cordon, release, quarantine), kept as the node cache keeps them.
    pub nodes: Overlay<CachedNode>,
    /// Hardware records created or updated.
    pub hardware_records: Overlay<GpuHardwareRecord>,
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{GpuRemediation, policy::Action};

    use super::*;
    use kube::ResourceExt;

    fn remediation(name: &str, version: &str) -> GpuRemediation {
        let mut r = crate::test_fixtures::remediation(name, "gpu-1", "p", None, Action::Replace);
        r.metadata.resource_version = Some(version.into());
        r.metadata.uid = Some(format!("uid-{name}"));
        r
    }

    #[test]
    fn a_remediation_just_created_is_seen_before_its_watch_event() {
        let overlay = Overlay::<GpuRemediation>::default();
        overlay.record(remediation("new", "10"));
        let merged = overlay.merge(vec![Arc::new(remediation("old", "5"))]);
        let mut names: Vec<_> = merged.iter().map(|r| r.name_any()).collect();
        names.sort();
        assert_eq!(names, vec!["new", "old"]);
    }

    #[test]
    fn our_newer_write_wins_until_the_cache_catches_up() {
        let overlay = Overlay::<GpuRemediation>::default();
        overlay.record(remediation("r", "12"));
        let merged = overlay.merge(vec![Arc::new(remediation("r", "11"))]);
        assert_eq!(merged[0].resource_version().as_deref(), Some("12"));
        let merged = overlay.merge(vec![Arc::new(remediation("r", "12"))]);
        assert_eq!(merged.len(), 1);
        assert!(
            overlay.written.lock().unwrap().is_empty(),
            "caught up: the overlay entry is dropped"
        );
    }

    #[test]
    fn a_write_the_cache_never_shows_stops_haunting_the_view() {
        let overlay = Overlay::<GpuRemediation>::default();
        overlay.record(remediation("deleted-since", "10"));
        let backdated = std::time::Instant::now()
            .checked_sub(UNSEEN_WRITE_GRACE * 2)
            .unwrap();
        overlay
            .written
            .lock()
            .unwrap()
            .get_mut("deleted-since")
            .unwrap()
            .1 = backdated;
        assert!(overlay.merge(vec![]).is_empty());
        assert!(overlay.pick("deleted-since", None).is_none());
    }
}
