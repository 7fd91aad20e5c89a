//! Gang recognition (each key, policy keys, namespaces, non-members) and the gang plan under
//! `Members` and `Together`.

use k8s_openapi::{
    api::core::v1::{PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time},
};

use super::*;
use crate::{drain, test_fixtures::at};

fn pod(ns: &str, name: &str, node: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
    let map = |kv: &[(&str, &str)]| {
        Some(
            kv.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            uid: Some(format!("uid-{ns}-{name}")),
            labels: map(labels),
            annotations: map(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()).filter(|n: &String| !n.is_empty()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..PodStatus::default()
        }),
    }
}

/// Label or annotation pairs.
type Pairs<'a> = &'a [(&'a str, &'a str)];

fn gang(kind: Kind, name: &str) -> Gang {
    Gang {
        namespace: "work".into(),
        kind,
        name: name.into(),
    }
}

#[test]
fn each_well_known_key_names_its_gang() {
    let cases: [(Pairs, Pairs, Kind, &str); 7] = [
        (&[(JOBSET, "llm")], &[], Kind::JobSet, "llm"),
        (&[(TRAINING, "pt")], &[], Kind::TrainingJob, "pt"),
        (
            &[(LWS_NAME, "serve"), (LWS_GROUP, "2")],
            &[],
            Kind::LeaderWorkerSet,
            "serve/2",
        ),
        (&[(POD_GROUP, "pg")], &[], Kind::PodGroup, "pg"),
        (&[], &[(VOLCANO_GROUP, "vc")], Kind::VolcanoPodGroup, "vc"),
        (&[(KUEUE_GROUP, "kq")], &[], Kind::KueuePodGroup, "kq"),
        (
            &[(JOB_NAME, "idx")],
            &[(COMPLETION_INDEX, "3")],
            Kind::IndexedJob,
            "idx",
        ),
    ];
    for (labels, annotations, kind, name) in cases {
        let p = pod("work", "p", "n1", labels, annotations);
        assert_eq!(gang_of(&p, &[]), Some(gang(kind.clone(), name)), "{kind}");
    }
}

#[test]
fn pods_of_no_gang_are_not_members() {
    let none: [(Pairs, Pairs); 5] = [
        (&[("app", "web")], &[]),
        // a non-indexed Job's pods run independently
        (&[(JOB_NAME, "batch")], &[]),
        // a LeaderWorkerSet pod without its group index names no group
        (&[(LWS_NAME, "serve")], &[]),
        // Volcano's key is an annotation; as a label it is someone else's
        (&[(VOLCANO_GROUP, "vc")], &[]),
        (&[(JOBSET, "")], &[]),
    ];
    for (labels, annotations) in none {
        assert_eq!(
            gang_of(&pod("work", "p", "n1", labels, annotations), &[]),
            None,
            "{labels:?}"
        );
    }
}

#[test]
fn a_jobset_pod_is_of_its_jobset_not_of_its_indexed_job() {
    let p = pod(
        "work",
        "p",
        "n1",
        &[(JOBSET, "llm"), (JOB_NAME, "llm-workers-0"), (KUEUE_GROUP, "kq")],
        &[(COMPLETION_INDEX, "0")],
    );
    assert_eq!(gang_of(&p, &[]), Some(gang(Kind::JobSet, "llm")));
}

#[test]
fn a_policy_label_key_names_a_gang_and_comes_before_an_indexed_job() {
    let extra = vec!["example.com/run".to_owned()];
    let p = pod(
        "work",
        "p",
        "n1",
        &[("example.com/run", "r7"), (JOB_NAME, "j")],
        &[(COMPLETION_INDEX, "0")],
    );
    assert_eq!(
        gang_of(&p, &extra),
        Some(gang(Kind::Label("example.com/run".into()), "r7"))
    );
    assert_eq!(gang_of(&p, &[]), Some(gang(Kind::IndexedJob, "j")));
}

#[test]
fn an_overlong_value_names_no_gang() {
    let long = "a".repeat(NAME_MAX + 1);
    let p = pod("work", "p", "n1", &[], &[(VOLCANO_GROUP, &long)]);
    assert_eq!(gang_of(&p, &[]), None);
    let fits = "a".repeat(NAME_MAX);
    let p = pod("work", "p", "n1", &[], &[(VOLCANO_GROUP, &fits)]);
    assert!(gang_of(&p, &[]).is_some());
}

#[test]
fn finished_mirror_and_daemon_set_pods_are_never_members() {
    let labels = [(JOBSET, "llm")];
    let mut done = pod("work", "done", "n1", &labels, &[]);
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let mirror = pod(
        "work",
        "m",
        "n1",
        &labels,
        &[("kubernetes.io/config.mirror", "x")],
    );
    let mut ds = pod("work", "ds", "n1", &labels, &[]);
    ds.metadata.owner_references = Some(vec![OwnerReference {
        kind: "DaemonSet".into(),
        name: "agent".into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    for p in [done, mirror, ds] {
        assert_eq!(gang_of(&p, &[]), None, "{}", p.name_any());
    }
}

/// A 4-node `JobSet` `llm` in `work` (pod `llm-i` on `gpu-i`), a same-named `JobSet` in `other`
/// on `gpu-1`, and a plain pod on `gpu-0`.
fn fleet() -> Vec<Pod> {
    let mut pods: Vec<Pod> = (0..4)
        .map(|i| {
            pod(
                "work",
                &format!("llm-{i}"),
                &format!("gpu-{i}"),
                &[(JOBSET, "llm")],
                &[],
            )
        })
        .collect();
    pods.push(pod("other", "llm-0", "gpu-1", &[(JOBSET, "llm")], &[]));
    pods.push(pod("work", "web", "gpu-0", &[("app", "web")], &[]));
    pods
}

fn node_plan(pods: &[Pod], node: &str) -> drain::Plan {
    let on: Vec<Pod> = pods
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .cloned()
        .collect();
    drain::plan(&on)
}

#[test]
fn with_members_the_touched_gang_is_named_with_its_nodes_and_nothing_else_leaves() {
    let pods = fleet();
    let plan = plan(
        "gpu-0",
        &node_plan(&pods, "gpu-0").leaving,
        &pods,
        &[],
        GangDrain::Members,
    );
    assert_eq!(plan.touched.len(), 1, "the namespace `other` is another gang");
    assert_eq!(plan.touched[0].gang, gang(Kind::JobSet, "llm"));
    assert_eq!(
        plan.touched[0].nodes().into_iter().collect::<Vec<_>>(),
        ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    );
    assert!(plan.elsewhere.is_empty());
}

#[test]
fn with_together_the_members_on_other_nodes_leave_too_and_other_namespaces_do_not() {
    let mut pods = fleet();
    pods[3].metadata.deletion_timestamp = Some(Time(at(0)));
    let plan = plan(
        "gpu-0",
        &node_plan(&pods, "gpu-0").leaving,
        &pods,
        &[],
        GangDrain::Together,
    );
    let elsewhere: Vec<(String, String, String)> = plan
        .elsewhere
        .iter()
        .map(|(m, g)| (m.node.clone(), m.pod.key(), g.to_string()))
        .collect();
    assert_eq!(
        elsewhere,
        [
            ("gpu-1".into(), "work/llm-1".into(), "JobSet work/llm".into()),
            ("gpu-2".into(), "work/llm-2".into(), "JobSet work/llm".into()),
            ("gpu-3".into(), "work/llm-3".into(), "JobSet work/llm".into()),
        ]
    );
    assert_eq!(
        plan.to_evict().map(|(m, _)| m.pod.key()).collect::<Vec<_>>(),
        ["work/llm-1", "work/llm-2"],
        "a member already terminating is not evicted again"
    );
}

#[test]
fn a_gang_whose_member_on_the_node_stays_is_not_touched() {
    let pods = fleet();
    // a GPU-scoped drain that evicts only `web` touches no gang
    let scoped = drain::scoped_to(node_plan(&pods, "gpu-0"), &["work/web".to_owned()].into());
    let plan = plan("gpu-0", &scoped.leaving, &pods, &[], GangDrain::Together);
    assert_eq!(plan, GangPlan::default());
}

#[test]
fn unscheduled_members_are_named_but_not_evicted_elsewhere() {
    let mut pods = fleet();
    pods.push(pod("work", "llm-4", "", &[(JOBSET, "llm")], &[]));
    let plan = plan(
        "gpu-0",
        &node_plan(&pods, "gpu-0").leaving,
        &pods,
        &[],
        GangDrain::Together,
    );
    assert_eq!(plan.touched[0].members.len(), 5);
    assert_eq!(plan.elsewhere.len(), 3);
}

#[test]
fn each_gang_kind_is_listed_by_its_own_label_selector_and_volcano_by_reading_the_namespace() {
    let cases = [
        (
            gang(Kind::JobSet, "llm"),
            Some("jobset.sigs.k8s.io/jobset-name=llm"),
        ),
        (
            gang(Kind::TrainingJob, "pt"),
            Some("training.kubeflow.org/job-name=pt"),
        ),
        (
            gang(Kind::LeaderWorkerSet, "serve/2"),
            Some("leaderworkerset.sigs.k8s.io/name=serve,leaderworkerset.sigs.k8s.io/group-index=2"),
        ),
        (
            gang(Kind::PodGroup, "pg"),
            Some("scheduling.x-k8s.io/pod-group=pg"),
        ),
        (gang(Kind::VolcanoPodGroup, "vg"), None),
        (
            gang(Kind::KueuePodGroup, "kg"),
            Some("kueue.x-k8s.io/pod-group-name=kg"),
        ),
        (
            gang(Kind::Label("example.com/gang".into()), "g"),
            Some("example.com/gang=g"),
        ),
        (
            gang(Kind::IndexedJob, "train"),
            Some("batch.kubernetes.io/job-name=train"),
        ),
    ];
    for (gang, expected) in cases {
        assert_eq!(selector(&gang).as_deref(), expected, "{gang}");
    }
}

#[test]
fn the_record_names_each_gang_its_nodes_and_under_together_the_members_elsewhere_by_uid() {
    let pods = fleet();
    let leaving = node_plan(&pods, "gpu-0").leaving;
    let members = records(&plan("gpu-0", &leaving, &pods, &[], GangDrain::Members));
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].gang, "JobSet work/llm");
    assert_eq!(members[0].namespace, "work");
    assert_eq!(
        members[0].selector.as_deref(),
        Some("jobset.sigs.k8s.io/jobset-name=llm")
    );
    assert_eq!(members[0].nodes, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    assert!(members[0].evicted.is_empty(), "Members evicts nobody elsewhere");

    let together = records(&plan("gpu-0", &leaving, &pods, &[], GangDrain::Together));
    let evicted: Vec<(&str, &str, &str)> = together[0]
        .evicted
        .iter()
        .map(|m| (m.pod.as_str(), m.uid.as_str(), m.node.as_str()))
        .collect();
    assert_eq!(
        evicted,
        [
            ("work/llm-1", "uid-work-llm-1", "gpu-1"),
            ("work/llm-2", "uid-work-llm-2", "gpu-2"),
            ("work/llm-3", "uid-work-llm-3", "gpu-3"),
        ]
    );
    assert_eq!(together[0].left_out, 0);
}

#[test]
fn the_record_keeps_at_most_64_members_in_all_and_counts_the_rest() {
    let mut pods = vec![pod("work", "big-0", "gpu-0", &[(JOBSET, "big")], &[])];
    for i in 1..=70 {
        pods.push(pod(
            "work",
            &format!("big-{i}"),
            &format!("gpu-{i}"),
            &[(JOBSET, "big")],
            &[],
        ));
    }
    let leaving = node_plan(&pods, "gpu-0").leaving;
    let record = records(&plan("gpu-0", &leaving, &pods, &[], GangDrain::Together));
    assert_eq!(record[0].evicted.len(), gpu_remediation_api::gangs::MEMBERS_MAX);
    assert_eq!(record[0].left_out, 6);
    assert_eq!(record[0].nodes.len(), gpu_remediation_api::gangs::NODES_MAX);
}

#[test]
fn only_the_recorded_members_are_evicted_never_a_successor_of_the_same_name() {
    let pods = fleet();
    let leaving = node_plan(&pods, "gpu-0").leaving;
    let record = records(&plan("gpu-0", &leaving, &pods, &[], GangDrain::Together));
    // The job controller restarted llm-2 under the same name: a new UID, not ours to evict.
    let mut now = fleet();
    now[2].metadata.uid = Some("uid-successor".into());
    let evict: Vec<String> = recorded_members(&record, &now).iter().map(Leaving::key).collect();
    assert_eq!(evict, ["work/llm-1", "work/llm-3"]);
}
