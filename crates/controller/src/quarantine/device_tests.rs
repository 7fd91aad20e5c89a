use k8s_openapi::api::core::v1::Node;
use kube::api::ObjectMeta;
use serde::Deserialize;

use super::*;

const V1A3: TaintRuleVersion = TaintRuleVersion::V1alpha3;

#[derive(Deserialize)]
struct Fixture {
    slices: Vec<ResourceSlice>,
}

fn slices() -> Vec<ResourceSlice> {
    let fixture: Fixture =
        serde_yaml::from_str(include_str!("../dra/fixtures/four-gpus.yaml")).expect("the fixture parses");
    fixture.slices
}

fn uuids(list: &[&str]) -> Vec<String> {
    list.iter().map(|u| (*u).to_owned()).collect()
}

fn device(uuid: &str, index: u32) -> QuarantinedDevice {
    device_on("gpu-a", uuid, index)
}

/// A device of `node`'s pool (named after the node).
fn device_on(node: &str, uuid: &str, index: u32) -> QuarantinedDevice {
    QuarantinedDevice {
        uuid: uuid.to_owned(),
        driver: "gpu.sandbox.gpuremediation.dev".to_owned(),
        pool: node.to_owned(),
        device: format!("gpu-{index}"),
    }
}

fn node(name: &str, annotations: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

fn marked(name: &str, policy: &str, devices: &[QuarantinedDevice]) -> Arc<Node> {
    let mut n = node(name, &[]);
    mark(&mut n, policy, devices);
    Arc::new(n)
}

#[test]
fn a_failed_gpu_published_by_the_nodes_slice_is_quarantined_as_its_device_only() {
    let target = target("gpu-a", &uuids(&["GPU-aaaa-3"]), Some((V1A3, &slices())));
    assert_eq!(target, Target::Devices(V1A3, vec![device("GPU-aaaa-3", 3)]));
}

#[test]
fn without_device_taint_rules_served_the_node_is_tainted_and_the_minimum_version_is_named() {
    let Target::Node(why) = target("gpu-a", &uuids(&["GPU-aaaa-3"]), None) else {
        panic!("expected the node taint");
    };
    assert!(
        why.contains("DeviceTaintRule") && why.contains("1.33") && why.contains("DRADeviceTaints"),
        "{why}"
    );
}

#[test]
fn a_fault_naming_no_gpu_taints_the_node() {
    assert_eq!(
        target("gpu-a", &[], Some((V1A3, &slices()))),
        Target::Node("the fault names no GPU".to_owned())
    );
}

#[test]
fn a_failed_gpu_not_allocated_through_dra_taints_the_whole_node_even_if_another_is() {
    let Target::Node(why) = target(
        "gpu-a",
        &uuids(&["GPU-aaaa-1", "GPU-bbbb-0"]),
        Some((V1A3, &slices())),
    ) else {
        panic!("expected the node taint");
    };
    assert!(
        why.contains("GPU GPU-bbbb-0 is not allocated through DRA"),
        "{why}"
    );
}

#[test]
fn the_failed_gpus_are_read_from_the_agents_annotation() {
    let n = node(
        "gpu-a",
        &[(
            FAILED_GPUS_ANNOTATION,
            r#"[{"uuid":"GPU-aaaa-3","serial":"s3","index":3,"reason":"XID79"}]"#,
        )],
    );
    assert_eq!(failed_gpus(&n), ["GPU-aaaa-3"]);
    assert!(failed_gpus(&node("gpu-a", &[(FAILED_GPUS_ANNOTATION, "not json")])).is_empty());
}

#[test]
fn marking_records_the_owner_and_devices_without_a_taint_and_unmarking_forgets_the_devices() {
    let mut n = node("gpu-a", &[]);
    assert!(mark(&mut n, "gpus", &[device("GPU-aaaa-3", 3)]));
    assert!(
        !mark(&mut n, "gpus", &[device("GPU-aaaa-3", 3)]),
        "a second mark changes nothing"
    );
    assert!(is_device_level(&n));
    assert_eq!(recorded(&n), [device("GPU-aaaa-3", 3)]);
    assert_eq!(super::super::taint::owner(&n), Some("gpus"));
    assert!(!super::super::taint::has_taint(&n));
    assert!(unmark(&mut n));
    assert!(!is_device_level(&n));
}

#[test]
fn lifting_the_quarantine_forgets_its_devices_too() {
    let mut n = node("gpu-a", &[]);
    mark(&mut n, "gpus", &[device("GPU-aaaa-3", 3)]);
    assert!(super::super::taint::lift(&mut n, "gpus"));
    assert!(!is_device_level(&n));
    assert_eq!(super::super::taint::owner(&n), None);
}

#[test]
fn a_second_gpu_failing_during_the_episode_is_noticed() {
    let failed = r#"[{"uuid":"GPU-aaaa-3"},{"uuid":"GPU-aaaa-1"}]"#;
    let mut n = node("gpu-a", &[(FAILED_GPUS_ANNOTATION, failed)]);
    assert!(!misses_a_failed_gpu(&n), "a node quarantine is not device-level");
    mark(&mut n, "gpus", &[device("GPU-aaaa-3", 3)]);
    assert!(misses_a_failed_gpu(&n));
    mark(
        &mut n,
        "gpus",
        &[device("GPU-aaaa-3", 3), device("GPU-aaaa-1", 1)],
    );
    assert!(!misses_a_failed_gpu(&n));
}

#[test]
fn a_rule_selects_exactly_the_failed_device_with_a_no_schedule_taint() {
    let r = rule(V1A3, "gpus", "gpu-a", &device("GPU-aaaa-3", 3));
    let selector = r.spec.device_selector.as_ref().unwrap();
    assert_eq!(selector.driver.as_deref(), Some("gpu.sandbox.gpuremediation.dev"));
    assert_eq!(selector.pool.as_deref(), Some("gpu-a"));
    assert_eq!(selector.device.as_deref(), Some("gpu-3"));
    assert_eq!(r.spec.taint.key, QUARANTINE_TAINT_KEY);
    assert_eq!(r.spec.taint.effect, "NoSchedule");
    assert_eq!(r.spec.taint.value, "GPU-aaaa-3");
    assert_eq!(r.labels()[DEVICE_QUARANTINE_LABEL], "true");
    assert_eq!(r.annotations()[QUARANTINED_BY_ANNOTATION], "gpus");
    assert_eq!(r.annotations()[NODE_LABEL], "gpu-a");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["apiVersion"], "resource.k8s.io/v1alpha3");
    assert_eq!(json["kind"], "DeviceTaintRule");
}

#[test]
fn a_rule_is_pinned_to_the_pool_named_after_its_node_whatever_the_device_says() {
    let foreign = QuarantinedDevice {
        pool: "gpu-b".to_owned(),
        ..device("GPU-aaaa-3", 3)
    };
    let selector = rule(V1A3, "gpus", "gpu-a", &foreign)
        .spec
        .device_selector
        .unwrap();
    assert_eq!(selector.pool.as_deref(), Some("gpu-a"));
    assert_eq!(selector.driver.as_deref(), Some("gpu.sandbox.gpuremediation.dev"));
    assert!(in_own_pool("gpu-a", &device("GPU-aaaa-3", 3).pool));
    assert!(!in_own_pool("gpu-a", &foreign.pool));
}

#[test]
fn a_failed_gpu_its_nodes_driver_publishes_in_another_nodes_pool_taints_the_node_not_that_pool() {
    let mut slices = slices();
    // Node gpu-a's driver names its pool after node gpu-b, whose slice has a device gpu-0 too.
    for slice in slices
        .iter_mut()
        .filter(|s| s.spec.node_name.as_deref() == Some("gpu-a"))
    {
        slice.spec.pool.name = "gpu-b".to_owned();
    }
    let Target::Node(why) = target("gpu-a", &uuids(&["GPU-aaaa-0"]), Some((V1A3, &slices))) else {
        panic!("expected the node taint");
    };
    assert!(
        why.contains("pool gpu-b") && why.contains("named after node gpu-a"),
        "{why}"
    );
}

#[test]
fn a_forged_annotation_naming_another_nodes_pool_gets_no_rule() {
    let forged = QuarantinedDevice {
        pool: "gpu-b".to_owned(),
        ..device("GPU-aaaa-0", 0)
    };
    let nodes = [marked("gpu-a", "gpus", &[forged, device("GPU-aaaa-3", 3)])];
    let plan = reconcile(V1A3, &nodes, |p| p == "gpus", &[]);
    let pools: Vec<Option<String>> = plan
        .create
        .iter()
        .map(|r| r.spec.device_selector.as_ref().and_then(|s| s.pool.clone()))
        .collect();
    assert_eq!(pools, [Some("gpu-a".to_owned())]);
    assert_eq!(
        plan.create[0]
            .spec
            .device_selector
            .as_ref()
            .unwrap()
            .device
            .as_deref(),
        Some("gpu-3")
    );
}

#[test]
fn a_uuid_that_is_no_label_value_leaves_the_taint_value_empty() {
    let long = format!("GPU-{}", "a".repeat(70));
    assert_eq!(
        rule(V1A3, "gpus", "gpu-a", &device(&long, 3)).spec.taint.value,
        ""
    );
}

#[test]
fn rule_names_differ_by_driver_and_pool_and_stay_short() {
    let a = device("GPU-aaaa-3", 3);
    let b = QuarantinedDevice {
        driver: "gpu.nvidia.com".to_owned(),
        ..a.clone()
    };
    assert_ne!(rule_name("gpu-a", &a), rule_name("gpu-a", &b));
    assert_eq!(rule_name("gpu-a", &a), rule_name("gpu-a", &a.clone()));
    assert!(rule_name(&"n".repeat(253), &a).len() <= 253);
}

#[test]
fn reconciling_creates_the_missing_rules_of_known_policies_only() {
    let nodes = [
        marked(
            "gpu-a",
            "gpus",
            &[device("GPU-aaaa-3", 3), device("GPU-aaaa-1", 1)],
        ),
        marked("gpu-b", "other", &[device_on("gpu-b", "GPU-bbbb-0", 0)]),
        Arc::new(node("gpu-c", &[])),
    ];
    let existing = [rule(V1A3, "gpus", "gpu-a", &device("GPU-aaaa-3", 3))];
    let plan = reconcile(V1A3, &nodes, |p| p == "gpus", &existing);
    let created: Vec<String> = plan.create.iter().map(ResourceExt::name_any).collect();
    assert_eq!(created, [rule_name("gpu-a", &device("GPU-aaaa-1", 1))]);
    assert!(plan.delete.is_empty() && plan.delete_if_owner_gone.is_empty());
}

#[test]
fn reconciling_deletes_rules_no_node_names_and_leaves_unknown_owners_to_the_server_check() {
    let nodes = [marked("gpu-b", "other", &[device_on("gpu-b", "GPU-bbbb-0", 0)])];
    let stale_ours = rule(V1A3, "gpus", "gpu-a", &device("GPU-aaaa-3", 3));
    let stale_theirs = rule(V1A3, "gone", "gpu-a", &device("GPU-aaaa-1", 1));
    let held_theirs = rule(V1A3, "other", "gpu-b", &device_on("gpu-b", "GPU-bbbb-0", 0));
    let plan = reconcile(
        V1A3,
        &nodes,
        |p| p == "gpus",
        &[stale_ours.clone(), stale_theirs.clone(), held_theirs],
    );
    assert!(
        plan.create.is_empty(),
        "another policy's rules are its controller's to create"
    );
    assert_eq!(
        plan.delete.iter().map(ResourceExt::name_any).collect::<Vec<_>>(),
        [stale_ours.name_any()]
    );
    assert_eq!(
        plan.delete_if_owner_gone
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        [stale_theirs.name_any()]
    );
}

#[test]
fn the_policy_condition_says_whether_quarantines_can_be_device_level() {
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let served = condition(Some(V1A3), &[], Some(1), now);
    assert_eq!(
        (
            served.type_.as_str(),
            served.status.as_str(),
            served.reason.as_str()
        ),
        ("DeviceQuarantine", "True", "DeviceTaintRulesServed")
    );
    let not = condition(None, &[], Some(1), now);
    assert_eq!(
        (not.status.as_str(), not.reason.as_str()),
        ("False", "DeviceTaintRulesNotServed")
    );
    assert!(not.message.contains("1.33"), "{}", not.message);
}

#[test]
fn the_most_stable_served_version_is_spoken_and_none_served_means_the_node_taint() {
    use TaintRuleVersion::{V1, V1alpha3, V1beta2};
    assert_eq!(TaintRuleVersion::choose(&[V1alpha3, V1, V1beta2]), Some(V1));
    assert_eq!(TaintRuleVersion::choose(&[V1alpha3, V1beta2]), Some(V1beta2));
    assert_eq!(TaintRuleVersion::choose(&[V1alpha3]), Some(V1alpha3));
    assert_eq!(TaintRuleVersion::choose(&[]), None);
    assert_eq!(spoken(Some(V1alpha3)), "resource.k8s.io/v1alpha3");
    assert_eq!(spoken(Some(V1)), "resource.k8s.io/v1");
    assert_eq!(spoken(None), "None: node taint used");
}

#[test]
fn a_rule_has_the_same_shape_in_every_version_but_its_api_version() {
    let shapes: Vec<serde_json::Value> = TaintRuleVersion::PREFERRED
        .into_iter()
        .map(|v| {
            let mut json = serde_json::to_value(rule(v, "gpus", "gpu-a", &device("GPU-aaaa-3", 3))).unwrap();
            assert_eq!(json["apiVersion"], format!("resource.k8s.io/{}", v.version()));
            json.as_object_mut().unwrap().remove("apiVersion");
            json
        })
        .collect();
    assert_eq!(shapes[0], shapes[1]);
    assert_eq!(shapes[1], shapes[2]);
    assert_eq!(
        shapes[0]["spec"],
        serde_json::json!({
            "deviceSelector": {"driver": "gpu.sandbox.gpuremediation.dev", "pool": "gpu-a", "device": "gpu-3"},
            "taint": {"key": QUARANTINE_TAINT_KEY, "value": "GPU-aaaa-3", "effect": "NoSchedule"},
        }),
        "no timeAdded (the server sets it), the effect every version takes"
    );
}

#[test]
fn the_condition_names_the_version_spoken() {
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let served = condition(Some(TaintRuleVersion::V1beta2), &[], Some(1), now);
    assert!(
        served.message.contains("resource.k8s.io/v1beta2"),
        "{}",
        served.message
    );
    let not = condition(None, &[], Some(1), now);
    assert!(
        not.message.contains("v1beta2 from 1.36")
            && not.message.contains("resource.k8s.io/v1 from Kubernetes 1.37"),
        "{}",
        not.message
    );
}
