//! The workloads' objects and pod placement, without a cluster.

use super::*;

#[test]
fn a_gpu_workload_requests_gpus_and_is_pinned_to_its_nodes() {
    let w = Workload::new("ns", "train").gpus(2).on_nodes(&["n1", "n2"]);
    let spec = w.deployment().spec.unwrap().template.spec.unwrap();
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap();
    assert_eq!(limits[GPU_RESOURCE].0, "2");
    let terms = spec
        .affinity
        .unwrap()
        .node_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap()
        .node_selector_terms;
    assert_eq!(
        terms[0].match_expressions.as_ref().unwrap()[0].values,
        Some(vec!["n1".to_owned(), "n2".to_owned()])
    );
}

#[test]
fn a_pdb_carries_exactly_the_one_rule_it_was_given() {
    let w = Workload::new("ns", "web");
    let spec = w.pdb(&Budget::max_unavailable_percent(25)).spec.unwrap();
    assert_eq!(spec.max_unavailable, Some(IntOrString::String("25%".to_owned())));
    assert_eq!(spec.min_available, None);
    let spec = w.pdb(&Budget::min_available(2)).spec.unwrap();
    assert_eq!(spec.min_available, Some(IntOrString::Int(2)));
    assert_eq!(spec.max_unavailable, None);
}

#[test]
fn the_termination_annotation_reaches_every_pod() {
    let w = Workload::new("ns", "slow").termination("stall");
    let annotations = w.pod_template().metadata.unwrap().annotations.unwrap();
    assert_eq!(annotations[SIM_TERMINATION_ANNOTATION], "stall");
    let pod = w.bare_pod("p", "n1");
    assert_eq!(
        pod.metadata.annotations.unwrap()[SIM_TERMINATION_ANNOTATION],
        "stall"
    );
}

#[test]
fn a_mirror_pod_is_bound_to_its_node_and_marked_as_a_mirror() {
    let pod = Workload::new("ns", "static").mirror_pod("static-n1", "n1");
    assert!(pod.metadata.annotations.unwrap().contains_key(MIRROR_ANNOTATION));
    let spec = pod.spec.unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("n1"));
    assert!(spec.affinity.is_none());
}

#[test]
fn an_empty_dir_pod_mounts_an_empty_dir() {
    let pod = Workload::new("ns", "cache").empty_dir_pod("cache-0", "n1");
    let volumes = pod.spec.unwrap().volumes.unwrap();
    assert!(volumes[0].empty_dir.is_some());
}

#[test]
fn a_daemon_set_tolerates_every_taint() {
    let ds = Workload::new("ns", "agent").daemon_set();
    let tolerations = ds.spec.unwrap().template.spec.unwrap().tolerations.unwrap();
    assert_eq!(tolerations[0].operator.as_deref(), Some("Exists"));
}
