//! The watches behind the caches: each kind's watch with its reflector, run on the runtime, and
//! the waker that tells the loop what changed (a key, or a completed list) when an object's
//! fingerprint moves. [`super::Caches::start`] composes them; what each kind keeps and how it is
//! pruned is decided there and in [`super::relevant`] and [`super::labels`].

use std::{collections::HashMap, sync::Arc};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use tokio::sync::{Notify, watch};

use super::{
    Changes,
    cached_node::CachedNode,
    initial_list, labels,
    node_store::{NodeStore, node_store},
    overlay::Overlay,
    relevant::{node_fingerprint, prune_node},
    undecodable::{self, Undecodable},
};
/// A kind the caches keep: what a reflector and its watch need of it.
pub(super) trait Cached:
    Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static
{
}

impl<K> Cached for K where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// Runs a watch (`events`, with its backoff) with its reflector on the runtime; returns its store.
pub(super) fn spawn_reflector<K, M, F>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    prune: M,
    fingerprint: F,
    wake: Waker,
    written: Option<Overlay<K>>,
) -> Store<K>
where
    K: Cached,
    M: FnMut(&mut K) + Send + 'static,
    F: Fn(&K) -> u64 + Send + 'static,
{
    let (store, writer) = reflector::store();
    let events = events.modify(prune).reflect(writer);
    tokio::spawn(wake_on_change(events, fingerprint, wake, written));
    store
}

/// The node watch with its store of [`CachedNode`]s, on the runtime; returns the store. Nodes are what is many:
/// their initial list is streamed, falling back to pages if that fails (`initial_list`); the other
/// kinds are few and keep paginated lists, which a server whose watch cache is still starting
/// (just after a CRD is created, or after a restart) serves from etcd instead of refusing with 429
/// until it is ready. Each list keeps the labels `labels` names as it starts, and the watch lists
/// afresh when `relist` changes (`labels::relisting`).
pub(super) fn spawn_node_reflector(
    client: &Client,
    labels: &labels::NodeLabels,
    relist: watch::Receiver<u64>,
    changes: &Changes,
    wake: Arc<Notify>,
    written: &Overlay<CachedNode>,
) -> NodeStore {
    let events = labels::relisting(
        {
            let (client, labels) = (client.clone(), labels.clone());
            move || {
                let kept = labels.start_listing();
                tracing::info!(labels = ?kept, "listing nodes");
                let config = watcher::Config::default().any_semantic();
                initial_list::watch(Api::<Node>::all(client.clone()), config).modify(move |n| kept.prune(n))
            }
        },
        relist,
    );
    let (store, mut writer) = node_store();
    let events = events.modify(prune_node).inspect({
        let labels = labels.clone();
        move |event| {
            if let Ok(event) = event {
                writer.apply(event);
                // After the store has taken the list's end: it holds what the list kept.
                if let watcher::Event::InitDone = event {
                    labels.listed();
                }
            }
        }
    });
    let waker = Waker::new(wake, {
        let changes = changes.clone();
        move |key: Option<String>| match key {
            Some(name) => changes.note(|c| {
                c.nodes.insert(name);
            }),
            None => changes.note(|c| {
                c.anything = true;
                c.nodes_listed = true;
            }),
        }
    });
    tokio::spawn(wake_on_change(
        events,
        node_fingerprint,
        waker,
        Some(written.clone()),
    ));
    store
}

/// [`spawn_reflector`] for a kind of ours: the watch reads untyped objects and decodes each one, so
/// one that does not decode is reported and left out instead of failing the whole list.
pub(super) fn spawn_decoding_reflector<K, M, F>(
    client: &Client,
    undecodable: &Undecodable,
    config: watcher::Config,
    prune: M,
    fingerprint: F,
    wake: Waker,
    written: Option<Overlay<K>>,
) -> Store<K>
where
    K: Cached,
    M: FnMut(&mut K) + Send + 'static,
    F: Fn(&K) -> u64 + Send + 'static,
{
    let api = Api::<DynamicObject>::all_with(client.clone(), &ApiResource::erase::<K>(&()));
    let mut decoder = undecodable::Decoder::<K>::new(undecodable.clone());
    let events = watcher(api, config).default_backoff().filter_map(move |event| {
        std::future::ready(match event {
            Ok(event) => decoder.event(event).map(Ok),
            Err(error) => Some(Err(error)),
        })
    });
    spawn_reflector(events, prune, fingerprint, wake, written)
}

/// Wakes the loop and says what changed: the key (`namespace/name`) of an object that changed,
/// or `None` after a (re)list.
pub(super) struct Waker {
    wake: Arc<Notify>,
    note: Box<dyn Fn(Option<String>) + Send>,
}

impl Waker {
    pub(super) fn new(wake: Arc<Notify>, note: impl Fn(Option<String>) + Send + 'static) -> Self {
        Self {
            wake,
            note: Box::new(note),
        }
    }

    fn changed(&self, key: Option<String>) {
        (self.note)(key);
        self.wake.notify_one();
    }
}

/// Drives a reflected watch, waking the loop when an object appears, goes, or changes what its
/// fingerprint covers, and when a (re)list completes.
pub(super) async fn wake_on_change<K, S, F, W>(
    events: S,
    fingerprint: F,
    wake: Waker,
    written: Option<Overlay<W>>,
) where
    K: Resource<DynamicType = ()>,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    F: Fn(&K) -> u64,
{
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let changed = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                let print = fingerprint(&object);
                (seen.insert(object.name_any(), print) != Some(print)).then(|| Some(key_of(&object)))
            }
            Ok(watcher::Event::Delete(object)) => {
                seen.remove(&object.name_any());
                if let Some(written) = &written {
                    written.forget(&object.name_any());
                }
                Some(Some(key_of(&object)))
            }
            Ok(watcher::Event::InitDone) => Some(None),
            Ok(watcher::Event::Init) => None,
            Err(error) => {
                tracing::warn!(%error, kind = %K::kind(&()), "watch failed; retrying with backoff");
                None
            }
        };
        if let Some(key) = changed {
            wake.changed(key);
        }
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
pub(super) fn key_of<K: Resource>(object: &K) -> String {
    match object.meta().namespace.as_deref() {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    }
}
