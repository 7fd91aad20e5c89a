//! How the node watch takes its initial list: streamed where the API server serves streaming
//! lists (`sendInitialEvents`, its `WatchList` feature: asked, not assumed), paginated otherwise.
//!
//! A paginated list of 50,000 nodes is 100 requests one after the other, and the controller
//! decodes each page while the server waits for the next request: the server's time and ours add
//! up (13.5 s of the controller's 13.8 s start at 50,000 nodes, 8.0 s of it the server's). A
//! streamed list is one watch whose initial events the server writes while the controller decodes
//! the ones before, so the two overlap.
//!
//! Whether the server serves it is asked once, at start, with a watch that selects nothing: a
//! server that serves it answers with the bookmark that ends the (empty) initial events; one that
//! does not refuses the request or never sends that bookmark. Either way the answer is logged, and
//! the watches use what the server serves.

use std::{pin::Pin, time::Duration};

use futures::{Stream, StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, Resource,
    api::WatchParams,
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;

/// A label no object carries: the probe's watch selects nothing, so its initial events are only
/// the bookmark that ends them.
const PROBE_SELECTOR: &str = "gpuremediation.dev/streaming-list-probe=never-set";

/// The annotation of the bookmark that ends a watch's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How long the probe waits for the server's answer (the server answers an empty selection at
/// once; a server that ignores `sendInitialEvents` sends nothing until the timeout).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How the watches take their initial lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitialList {
    /// One watch with `sendInitialEvents=true`.
    Streamed,
    /// Pages of a list, then a watch.
    Paginated,
}

impl InitialList {
    /// Asks the server whether it serves streaming lists (one watch of nodes that selects none).
    pub async fn probe(client: &Client) -> Self {
        let api = Api::<Node>::all(client.clone());
        let params = WatchParams::streaming_lists()
            .labels(PROBE_SELECTOR)
            .timeout(u32::try_from(PROBE_TIMEOUT.as_secs()).unwrap_or(5));
        let answer = tokio::time::timeout(PROBE_TIMEOUT + Duration::from_secs(1), async {
            let mut events = std::pin::pin!(api.watch(&params, "0").await?);
            while let Some(event) = events.next().await {
                if let kube::api::WatchEvent::Bookmark(bookmark) = event? {
                    return Ok::<bool, kube::Error>(ends_initial_events(&bookmark.metadata.annotations));
                }
            }
            Ok(false)
        })
        .await;
        let streamed = match answer {
            Ok(Ok(true)) => true,
            Ok(Ok(false)) => {
                tracing::info!(
                    "the API server does not end initial events with a bookmark: the node list is paginated"
                );
                false
            }
            Ok(Err(error)) => {
                tracing::info!(%error, "the API server refuses streaming lists: the node list is paginated");
                false
            }
            Err(_) => {
                tracing::info!(
                    timeout = ?PROBE_TIMEOUT,
                    "the API server did not answer the streaming-list probe: the node list is paginated"
                );
                false
            }
        };
        let chosen = if streamed { Self::Streamed } else { Self::Paginated };
        tracing::info!(node_initial_list = ?chosen, "initial list of nodes chosen");
        chosen
    }

    /// The watch of `api` under `config`, its initial lists taken this way. A streamed watch whose
    /// initial list fails falls back to pages for good (see [`falling_back`]).
    #[must_use]
    pub fn watch<K>(self, api: Api<K>, config: watcher::Config) -> BoxStream<'static, WatchEvent<K>>
    where
        K: Resource + Clone + std::fmt::Debug + DeserializeOwned + Send + 'static,
    {
        let paginated = watcher(api.clone(), config.clone()).default_backoff();
        match self {
            Self::Paginated => paginated.boxed(),
            Self::Streamed => falling_back(
                watcher(api, config.streaming_lists()).default_backoff(),
                paginated,
            )
            .boxed(),
        }
    }
}

/// One item of a watch.
type WatchEvent<K> = Result<watcher::Event<K>, watcher::Error>;

/// The events of `streamed` until its initial list fails, then, for good, those of `paginated`
/// (which starts with an initial list of its own, so the store is rebuilt from it).
///
/// A streamed list fails when the watch answers an error, or when a new initial list starts before
/// the one under way has ended: the server closes a streamed watch that reads its initial events
/// more slowly than the objects change (its `unresponsive watcher` rule), and at 50,000 nodes a
/// fleet whose nodes update themselves can make every new attempt fail the same way. A paginated
/// list has no such limit.
pub fn falling_back<K, E, S, P>(streamed: S, paginated: P) -> impl Stream<Item = Result<watcher::Event<K>, E>>
where
    E: std::fmt::Display,
    S: Stream<Item = Result<watcher::Event<K>, E>>,
    P: Stream<Item = Result<watcher::Event<K>, E>>,
{
    enum Source<S, P> {
        /// The streamed watch, and whether an initial list is under way.
        Streamed(Pin<Box<S>>, Pin<Box<P>>, bool),
        /// The paginated watch.
        Paginated(Pin<Box<P>>),
    }
    let start = Source::Streamed(Box::pin(streamed), Box::pin(paginated), false);
    futures::stream::unfold(start, |mut source| async move {
        loop {
            match source {
                Source::Streamed(mut streamed, paginated, listing) => {
                    let why = match streamed.next().await {
                        None => return None,
                        Some(Ok(watcher::Event::Init)) if listing => {
                            "it started again before ending (the server closed it)".to_owned()
                        }
                        Some(Err(error)) => format!("the watch failed: {error}"),
                        Some(Ok(event)) => {
                            let listing = match event {
                                watcher::Event::Init => true,
                                watcher::Event::InitDone => false,
                                _ => listing,
                            };
                            return Some((Ok(event), Source::Streamed(streamed, paginated, listing)));
                        }
                    };
                    tracing::warn!(%why, "a streamed initial list failed: lists are paginated from now on");
                    source = Source::Paginated(paginated);
                }
                Source::Paginated(mut paginated) => {
                    let event = paginated.next().await?;
                    return Some((event, Source::Paginated(paginated)));
                }
            }
        }
    })
}

/// Whether a bookmark's annotations mark the end of the initial events.
fn ends_initial_events(annotations: &std::collections::BTreeMap<String, String>) -> bool {
    annotations.get(INITIAL_EVENTS_END).is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_bookmark_marked_as_the_end_of_initial_events_proves_streaming_lists() {
        let marked = [(INITIAL_EVENTS_END.to_owned(), "true".to_owned())].into();
        assert!(ends_initial_events(&marked));
        assert!(!ends_initial_events(&std::collections::BTreeMap::new()));
        let other = [(INITIAL_EVENTS_END.to_owned(), "false".to_owned())].into();
        assert!(!ends_initial_events(&other));
    }

    type Event = Result<watcher::Event<&'static str>, String>;

    fn collect(streamed: Vec<Event>, paginated: Vec<Event>) -> Vec<Event> {
        futures::executor::block_on(
            falling_back(futures::stream::iter(streamed), futures::stream::iter(paginated)).collect(),
        )
    }

    fn list(objects: &[&'static str]) -> Vec<Event> {
        std::iter::once(Ok(watcher::Event::Init))
            .chain(objects.iter().map(|o| Ok(watcher::Event::InitApply(*o))))
            .chain(std::iter::once(Ok(watcher::Event::InitDone)))
            .collect()
    }

    #[test]
    fn a_streamed_list_that_completes_is_kept_and_the_pages_are_never_read() {
        let mut streamed = list(&["a", "b"]);
        streamed.push(Ok(watcher::Event::Apply("a")));
        let events = collect(streamed.clone(), vec![Err("never read".to_owned())]);
        assert_eq!(format!("{events:?}"), format!("{streamed:?}"));
    }

    #[test]
    fn a_streamed_list_the_server_closes_halfway_gives_way_to_pages_for_good() {
        let mut streamed = vec![Ok(watcher::Event::Init), Ok(watcher::Event::InitApply("a"))];
        streamed.extend(list(&["a", "b"]));
        let paginated = list(&["a", "b", "c"]);
        let events = collect(streamed, paginated.clone());
        // The half list is passed on (the store only takes a list whole), then the pages' list.
        let mut expected = vec![Ok(watcher::Event::Init), Ok(watcher::Event::InitApply("a"))];
        expected.extend(paginated);
        assert_eq!(format!("{events:?}"), format!("{expected:?}"));
    }

    #[test]
    fn a_streamed_watch_that_fails_gives_way_to_pages_even_after_its_list() {
        let mut streamed = list(&["a"]);
        streamed.push(Err("the watch failed".to_owned()));
        streamed.extend(list(&["a"]));
        let events = collect(streamed, list(&["b"]));
        let mut expected = list(&["a"]);
        expected.extend(list(&["b"]));
        assert_eq!(format!("{events:?}"), format!("{expected:?}"));
    }
}
