use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::json;

use super::*;
use crate::dra::wire::{ConsumerReference, DeviceAttribute};

#[derive(Deserialize)]
struct Fixture {
    slices: Vec<ResourceSlice>,
    claims: Vec<ResourceClaim>,
    pods: Vec<Pod>,
}

fn four_gpus() -> Fixture {
    serde_yaml::from_str(include_str!("fixtures/four-gpus.yaml")).expect("the fixture parses")
}

fn holders(fixture: &Fixture, uuids: &[&str]) -> Holders {
    holders_with(fixture, uuids, true, None)
}

fn holders_with(fixture: &Fixture, uuids: &[&str], dra_served: bool, gpu_pods: Option<&str>) -> Holders {
    let uuids: Vec<String> = uuids.iter().map(|u| (*u).to_owned()).collect();
    let sources = Sources {
        claims: &fixture.claims,
        slices: &fixture.slices,
        dra_served,
        gpu_pods,
        named_elsewhere: &[],
        now: jiff::Timestamp::from_second(1_800_000_000).unwrap(),
    };
    pods_holding("gpu-a", &uuids, &sources, &fixture.pods)
}

/// The fixture's `web` pod asking for one GPU through the device plugin.
fn web_on_the_device_plugin(fixture: &mut Fixture) {
    let web = pod_named(fixture, "web");
    web.spec.as_mut().unwrap().containers[0] =
        serde_json::from_value(json!({"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}))
            .unwrap();
}

fn names(holders: &Holders) -> Vec<String> {
    match holders {
        Holders::Known(pods) => pods.iter().map(ToString::to_string).collect(),
        Holders::Unknown(why) => panic!("expected known holders, got unknown: {why}"),
    }
}

fn unknown(holders: &Holders) -> String {
    match holders {
        Holders::Unknown(why) => why.clone(),
        Holders::Known(pods) => panic!("expected an unknown mapping, got {pods:?}"),
    }
}

fn pod_named<'a>(fixture: &'a mut Fixture, name: &str) -> &'a mut Pod {
    fixture
        .pods
        .iter_mut()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .unwrap()
}

fn claim_of<'a>(fixture: &'a mut Fixture, pod: &str) -> &'a mut ResourceClaim {
    fixture
        .claims
        .iter_mut()
        .find(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&format!("{pod}-")))
        })
        .unwrap()
}

#[test]
fn a_failed_gpu_maps_to_the_one_pod_whose_claim_was_allocated_its_device() {
    let fixture = four_gpus();
    let found = holders(&fixture, &["GPU-aaaa-1"]);
    assert_eq!(names(&found), ["ml/train-1"]);
    let Holders::Known(pods) = found else {
        unreachable!()
    };
    assert_eq!(pods[0].uid.as_deref(), Some("uid-train-1"));
}

#[test]
fn an_idle_failed_gpu_is_held_by_no_pod_and_a_stale_slice_does_not_count() {
    // The pool's generation-1 slice says GPU-aaaa-3 is device gpu-1 (train-1's); generation 2
    // says gpu-3, which no claim holds.
    assert_eq!(
        names(&holders(&four_gpus(), &["GPU-aaaa-3"])),
        Vec::<String>::new()
    );
}

#[test]
fn several_failed_gpus_map_to_all_their_holders_sorted() {
    let found = holders(&four_gpus(), &["GPU-aaaa-2", "GPU-aaaa-0"]);
    assert_eq!(names(&found), ["ml/train-0", "ml/train-2"]);
}

#[test]
fn uuids_match_whatever_their_letter_case() {
    assert_eq!(names(&holders(&four_gpus(), &["gpu-AAAA-1"])), ["ml/train-1"]);
}

#[test]
fn a_pod_of_another_node_holding_the_same_device_name_is_not_a_holder() {
    let mut fixture = four_gpus();
    // Both pools name their first device gpu-0; only node gpu-a's pool counts.
    fixture
        .claims
        .retain(|c| c.metadata.name.as_deref() != Some("train-0-gpu-abcde"));
    assert_eq!(names(&holders(&fixture, &["GPU-aaaa-0"])), Vec::<String>::new());
}

#[test]
fn a_device_plugin_pod_on_a_node_without_an_assignment_makes_the_mapping_unknown() {
    let mut fixture = four_gpus();
    web_on_the_device_plugin(&mut fixture);
    let why = unknown(&holders(&fixture, &["GPU-aaaa-1"]));
    assert!(
        why.contains("apps/web") && why.contains("nvidia.com/gpu") && why.contains("carries no"),
        "{why}"
    );
}

#[test]
fn dra_and_device_plugin_holders_of_the_failed_gpus_are_evicted_together() {
    let mut fixture = four_gpus();
    web_on_the_device_plugin(&mut fixture);
    // GPU-aaaa-1 is train-1's through DRA; the agent says web holds GPU-dddd-9 through the plugin.
    let assignment = r#"{"readAt":"2027-01-15T07:59:00Z","pods":[{"namespace":"apps","name":"web","gpus":["GPU-dddd-9"]}]}"#;
    assert_eq!(
        names(&holders_with(&fixture, &["GPU-aaaa-1"], true, Some(assignment))),
        ["ml/train-1"]
    );
}

#[test]
fn a_node_whose_pods_use_no_claims_needs_neither_slices_nor_a_dra_server() {
    let mut fixture = four_gpus();
    fixture.pods.retain(|p| p.metadata.name.as_deref() == Some("web"));
    web_on_the_device_plugin(&mut fixture);
    let assignment = r#"{"readAt":"2027-01-15T07:59:00Z","pods":[{"namespace":"apps","name":"web","gpus":["GPU-dddd-9"]}]}"#;
    assert_eq!(
        names(&holders_with(&fixture, &["GPU-dddd-9"], false, Some(assignment))),
        ["apps/web"]
    );
}

#[test]
fn a_pod_using_claims_on_a_server_without_dra_makes_the_mapping_unknown() {
    let why = unknown(&holders_with(&four_gpus(), &["GPU-aaaa-1"], false, None));
    assert!(why.contains("does not serve resource.k8s.io/v1"), "{why}");
}

#[test]
fn an_init_container_asking_for_a_mig_slice_through_the_device_plugin_makes_the_mapping_unknown() {
    let mut fixture = four_gpus();
    let web = pod_named(&mut fixture, "web");
    web.spec.as_mut().unwrap().init_containers = Some(vec![
        serde_json::from_value(
            json!({"name": "warm", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}),
        )
        .unwrap(),
    ]);
    assert!(unknown(&holders(&fixture, &["GPU-aaaa-1"])).contains("nvidia.com/mig-1g.10gb"));
}

#[test]
fn a_finished_device_plugin_pod_holds_nothing_and_leaves_the_mapping_known() {
    let mut fixture = four_gpus();
    web_on_the_device_plugin(&mut fixture);
    let web = pod_named(&mut fixture, "web");
    web.status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert_eq!(names(&holders(&fixture, &["GPU-aaaa-1"])), ["ml/train-1"]);
}

#[test]
fn a_gpu_no_slice_of_the_node_publishes_makes_the_mapping_unknown() {
    let why = unknown(&holders(&four_gpus(), &["GPU-bbbb-0"]));
    assert!(
        why.contains("no ResourceSlice of node gpu-a publishes GPU GPU-bbbb-0"),
        "{why}"
    );
}

#[test]
fn a_fault_naming_no_gpu_makes_the_mapping_unknown() {
    assert_eq!(unknown(&holders(&four_gpus(), &[])), "the fault names no GPU");
}

#[test]
fn a_shared_claim_maps_to_every_pod_reserved_for_it() {
    let mut fixture = four_gpus();
    let mut second = pod_named(&mut fixture, "train-1").clone();
    second.metadata.name = Some("train-1-sidecar".into());
    second.metadata.uid = Some("uid-sidecar".into());
    second.status = None;
    fixture.pods.push(second);
    claim_of(&mut fixture, "train-1")
        .status
        .as_mut()
        .unwrap()
        .reserved_for
        .push(ConsumerReference {
            api_group: String::new(),
            resource: "pods".into(),
            name: "train-1-sidecar".into(),
            uid: "uid-sidecar".into(),
        });
    assert_eq!(
        names(&holders(&fixture, &["GPU-aaaa-1"])),
        ["ml/train-1", "ml/train-1-sidecar"]
    );
}

#[test]
fn a_pod_naming_its_claim_holds_it_before_the_reservation_is_written() {
    let mut fixture = four_gpus();
    claim_of(&mut fixture, "train-1")
        .status
        .as_mut()
        .unwrap()
        .reserved_for
        .clear();
    assert_eq!(names(&holders(&fixture, &["GPU-aaaa-1"])), ["ml/train-1"]);
}

#[test]
fn a_claim_reserved_for_a_pod_of_the_same_name_but_another_uid_is_not_held_by_the_new_pod() {
    let mut fixture = four_gpus();
    let pod = pod_named(&mut fixture, "train-1");
    pod.metadata.uid = Some("uid-train-1-recreated".into());
    pod.status.as_mut().unwrap().resource_claim_statuses = None;
    pod.spec.as_mut().unwrap().resource_claims = None;
    assert_eq!(names(&holders(&fixture, &["GPU-aaaa-1"])), Vec::<String>::new());
}

#[test]
fn a_mig_partition_maps_through_its_domain_qualified_parent_uuid() {
    let mut fixture = four_gpus();
    let slice = &mut fixture.slices[0].spec;
    slice.devices[1].attributes.clear();
    slice.devices[1].attributes.insert(
        "gpu.nvidia.com/parentUUID".into(),
        DeviceAttribute {
            string: Some("GPU-aaaa-1".into()),
            ..DeviceAttribute::default()
        },
    );
    assert_eq!(names(&holders(&fixture, &["GPU-aaaa-1"])), ["ml/train-1"]);
}

#[test]
fn a_fault_on_one_mig_device_reaches_only_that_device_and_its_pod_and_one_on_the_gpu_reaches_all() {
    let mut fixture = four_gpus();
    // Devices gpu-1 and gpu-2 become two MIG devices of one GPU, GPU-aaaa-1.
    for (device, mig) in [(1, "MIG-aaaa-1-a"), (2, "MIG-aaaa-1-b")] {
        let attributes = &mut fixture.slices[0].spec.devices[device].attributes;
        attributes.clear();
        for (name, value) in [("uuid", mig), ("parentUUID", "GPU-aaaa-1")] {
            attributes.insert(
                name.into(),
                DeviceAttribute {
                    string: Some(value.into()),
                    ..DeviceAttribute::default()
                },
            );
        }
    }
    let devices = |uuid: &str| -> Vec<String> {
        devices_of_gpu("gpu-a", uuid, &fixture.slices)
            .into_iter()
            .map(|d| d.device)
            .collect()
    };
    assert_eq!(
        devices("MIG-aaaa-1-a"),
        ["gpu-1"],
        "a device quarantine takes only this MIG device"
    );
    assert_eq!(
        devices("GPU-aaaa-1"),
        ["gpu-1", "gpu-2"],
        "the GPU's: every MIG device of it"
    );
    assert_eq!(names(&holders(&fixture, &["MIG-aaaa-1-a"])), ["ml/train-1"]);
    assert_eq!(
        names(&holders(&fixture, &["GPU-aaaa-1"])),
        ["ml/train-1", "ml/train-2"]
    );
}

#[test]
fn an_attribute_that_merely_holds_the_uuid_text_is_not_the_gpus_identity() {
    let mut fixture = four_gpus();
    let device = &mut fixture.slices[0].spec.devices[1];
    let uuid = device.attributes.remove("uuid").unwrap();
    device.attributes.insert("peerUUIDs".into(), uuid);
    assert!(unknown(&holders(&fixture, &["GPU-aaaa-1"])).contains("no ResourceSlice"));
}

#[test]
fn a_claim_on_a_failed_gpu_reserved_for_something_other_than_a_pod_makes_the_mapping_unknown() {
    let mut fixture = four_gpus();
    claim_of(&mut fixture, "train-1")
        .status
        .as_mut()
        .unwrap()
        .reserved_for
        .push(ConsumerReference {
            api_group: "example.com".into(),
            resource: "trainers".into(),
            name: "big-run".into(),
            uid: "uid-run".into(),
        });
    let why = unknown(&holders(&fixture, &["GPU-aaaa-1"]));
    assert!(why.contains("reserved for trainers big-run"), "{why}");
}
