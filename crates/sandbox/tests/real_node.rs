//! One real node against the sandbox's control plane (issue 43, `docs/plans/real-node.md` S3): a
//! kubelet, containerd and runc built from pinned modules, in namespaces of their own, register a
//! Node that turns Ready and runs a pod from an image built here; an eviction through the Eviction
//! API is refused while the pod's budget allows no disruption, and once it allows one, the
//! container receives SIGTERM and exits within its grace period (exit code 0: `pause` exits on
//! SIGTERM; a SIGKILL at the end of the grace period would read 137). The agent's and the
//! controller's images, built here from their Dockerfiles, run on it.
//!
//! `#[ignore]`d: it needs root, `unshare`, `setpriv` and `nsenter`, and the built binaries the
//! environment names (`real_node::Binaries::from_env`); `make real-node-test` builds them and runs
//! it.

use std::time::{Duration, Instant};

use gpu_sandbox::real_node::{
    RealNode,
    cluster::{Cluster, eventually, exit_code_at_deletion},
    config::PAUSE_IMAGE,
    shipped,
};
use k8s_openapi::{
    api::{
        core::v1::Pod,
        policy::v1::{Eviction, PodDisruptionBudget},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};

const GRACE_SECONDS: i64 = 30;

async fn evict(pods: &Api<Pod>, name: &str) -> Result<(), kube::Error> {
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            ..ObjectMeta::default()
        },
        delete_options: None,
    };
    pods.create_subresource::<_, serde_json::Value>("eviction", name, &PostParams::default(), &eviction)
        .await
        .map(|_| ())
}

/// A bare pod on `node` running the pause image, and a budget over it allowing no disruption.
async fn run_sleeper(pods: &Api<Pod>, budgets: &Api<PodDisruptionBudget>, node: &str) {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sleeper", "labels": {"app": "sleeper"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": GRACE_SECONDS,
            "containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // A bare pod: `minAvailable`, which needs no controller's scale.
    let budget: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sleeper"},
        "spec": {"selector": {"matchLabels": {"app": "sleeper"}}, "minAvailable": 1},
    }))
    .unwrap();
    budgets.create(&PostParams::default(), &budget).await.unwrap();
}

/// Each of our images, built from its Dockerfile with the binary `make real-node-test` built (the
/// environment names it), imported into the node and run by a pod with `args` (which replace the
/// Dockerfile's `CMD`) that must succeed: the binary, its libraries, its user and its entrypoint as
/// the Dockerfile says, on a real runtime.
async fn our_images_run(node: &RealNode, pods: &Api<Pod>, dir: &std::path::Path) {
    for (index, (shipped, args)) in [(shipped::AGENT, ["--help"]), (shipped::CONTROLLER, ["--version"])]
        .into_iter()
        .enumerate()
    {
        let binary = std::env::var_os(shipped.binary_env).unwrap_or_else(|| panic!("{}", shipped.binary_env));
        let tar = shipped
            .image_tar(std::path::Path::new(&binary), dir)
            .unwrap_or_else(|error| panic!("{error}"));
        node.import(&tar).await.unwrap();
        let name = format!("shipped-{index}");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": node.name(),
                "restartPolicy": "Never",
                "containers": [{"name": "shipped", "image": shipped.reference(),
                                "imagePullPolicy": "Never", "args": args}],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let phase = eventually(
            &format!("{} to end", shipped.reference()),
            Duration::from_secs(60),
            || async {
                let phase = pods.get(&name).await.ok()?.status?.phase?;
                matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
            },
        )
        .await;
        assert_eq!(phase, "Succeeded", "{} {args:?}", shipped.reference());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and the real node's built binaries: make real-node-test"]
async fn a_real_node_runs_a_pod_whose_eviction_waits_for_its_budget_and_ends_on_sigterm() {
    let cluster = Cluster::with_a_ready_node("real-1", 1).await;
    let (control_plane, node) = (&cluster.control_plane, cluster.node());
    let client = control_plane.client();
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), "default");
    run_sleeper(&pods, &budgets, node.name()).await;
    eventually(
        "the pod Running on the real node",
        Duration::from_secs(120),
        || async {
            let pod = pods.get("sleeper").await.ok()?;
            (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(())
        },
    )
    .await;
    cluster.say("the pod Running");

    // The budget allows no disruption: the eviction is refused (429) and the pod keeps running.
    eventually(
        "the budget's status observed",
        Duration::from_secs(30),
        || async {
            let status = budgets.get("sleeper").await.ok()?.status?;
            (status.expected_pods == 1 && status.disruptions_allowed == 0).then_some(())
        },
    )
    .await;
    // kube's client retries a 429 by itself: evictions go through one that does not.
    let evictions = Api::<Pod>::namespaced(control_plane.client_without_retry(), "default");
    match evict(&evictions, "sleeper").await {
        Err(kube::Error::Api(status)) if status.code == 429 => {}
        other => panic!("an eviction the budget forbids: {other:?}"),
    }

    budgets
        .patch(
            "sleeper",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"minAvailable": 0}})),
        )
        .await
        .unwrap();
    let last_exit = exit_code_at_deletion(&pods, "sleeper");
    let asked = eventually(
        "the eviction accepted once the budget allows it",
        Duration::from_secs(30),
        || async { evict(&evictions, "sleeper").await.ok().map(|()| Instant::now()) },
    )
    .await;
    eventually(
        "the evicted pod gone",
        Duration::from_secs(GRACE_SECONDS as u64 * 2),
        || async { pods.get_opt("sleeper").await.ok()?.is_none().then_some(()) },
    )
    .await;
    let gone_after = asked.elapsed();
    cluster.say(&format!(
        "the pod evicted, gone {gone_after:?} after its eviction"
    ));
    let exit = tokio::time::timeout(Duration::from_secs(10), last_exit)
        .await
        .expect("the watch ends with the pod's deletion")
        .unwrap();
    assert_eq!(
        exit,
        Some(0),
        "the container exited on SIGTERM, not killed at the grace period's end"
    );
    assert!(
        gone_after < Duration::from_secs(GRACE_SECONDS as u64),
        "the pod went {gone_after:?} after its eviction: its container did not end on SIGTERM"
    );

    our_images_run(node, &pods, &control_plane.data_dir().join("nodes")).await;
    cluster.say("the agent's and the controller's images, built from their Dockerfiles, ran to success");

    cluster.stop().await;
}
