//! How the node watch takes its initial list: streamed (`sendInitialEvents`, the API server's
//! `WatchList` feature), falling back to pages for good if the streamed list fails.
//!
//! A paginated list of 50,000 nodes is 100 requests one after the other, and the controller
//! decodes each page while the server waits for the next request: the server's time and ours add
//! up (13.5 s of the controller's 13.8 s start at 50,000 nodes, 8.0 s of it the server's). A
//! streamed list is one watch whose initial events the server writes while the controller decodes
//! the ones before, so the two overlap.
//!
//! Nothing is asked of the server first: every server the shipped manifests run on (they need
//! `admissionregistration.k8s.io/v1`, Kubernetes 1.30 or later) knows `sendInitialEvents`, and one
//! that does not serve it refuses the watch, which falls back at once. Which way the list went is
//! logged.

use std::pin::Pin;

use futures::{Stream, StreamExt, stream::BoxStream};
use kube::{
    Api, Resource,
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;

/// The watch of `api` under `config`, its initial list streamed, falling back to pages for good
/// (see [`falling_back`]).
#[must_use]
pub fn watch<K>(api: Api<K>, config: watcher::Config) -> BoxStream<'static, WatchEvent<K>>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned + Send + 'static,
{
    let paginated = watcher(api.clone(), config.clone()).default_backoff();
    falling_back(
        watcher(api, config.streaming_lists()).default_backoff(),
        paginated,
    )
    .boxed()
}

/// One item of a watch.
type WatchEvent<K> = Result<watcher::Event<K>, watcher::Error>;

/// The events of `streamed` until its initial list fails, then, for good, those of `paginated`
/// (which starts with an initial list of its own, so the store is rebuilt from it).
///
/// A streamed list fails when the watch answers an error, or when a new initial list starts before
/// the one under way has ended: the server closed streamed watches of nodes here, at 1,000 and at
/// 50,000 nodes, while another controller was rewriting every node, and nothing says a next
/// attempt fares better. A paginated list does not depend on keeping pace with the server.
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
                                watcher::Event::InitDone => {
                                    tracing::info!("an initial list was streamed");
                                    false
                                }
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

#[cfg(test)]
mod tests {
    use super::*;

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
