//! e2e: the real `gpu-health-agent` binary, one per simulated node, authenticated as the agent's
//! own service account under `manifests/agent/rbac.yaml`, each scenario run through both probes
//! (`name::file`, `name::nvml`): the `file` probe, and the real NVML probe loading the stand-in
//! library (`crates/nvml-standin`) that answers from the same scenario file. A GPU falling off the
//! bus, lost to the bus (`GPU_IS_LOST`), NVML failing at init and later, a hung NVML call, XID
//! events (through the event-set thread under `nvml`), warnings and the XID catalog override.

#[macro_use]
mod agent_support;
mod common;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use agent_support::{
    AgentGround, AgentProcess, Probe, current_condition, gpu_condition, healthy_gpus, http_status,
    one_healthy_agent, wait_for_condition, wait_for_event, wait_until_gpu_missing, wait_until_healthy,
    wait_until_nvml_unavailable, write_probe_file,
};
use gpu_remediation_api::constants::{CLEAR_ANNOTATION, gpu_reasons};
use k8s_openapi::{
    api::{core::v1::Node, events::v1::Event},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;

for_both_probes!(
    a_gpu_falling_off_one_of_three_nodes_sets_gpu_missing_within_five_seconds_and_latches,
    a_gpu_lost_to_the_bus_sets_gpu_missing,
    a_failing_or_hung_nvml_reads_unknown_never_false,
    a_repeating_warning_becomes_one_warning_event_on_the_node,
    a_latched_fault_survives_an_agent_restart,
    a_cluster_override_makes_an_application_xid_fatal,
);

async fn a_gpu_falling_off_one_of_three_nodes_sets_gpu_missing_within_five_seconds_and_latches(probe: Probe) {
    let ground = AgentGround::new(&format!("missing-{probe:?}"), 3).await;
    let client = ground.client.clone();
    let names = ground.fleet.node_names();
    let mut agents = Vec::new();
    for name in &names {
        agents.push((
            ground.probe_file(name),
            ground.start_agent(probe, name, &healthy_gpus(name), &[]).await,
        ));
    }
    for (name, (_, agent)) in names.iter().zip(&agents) {
        let condition = wait_until_healthy(&client, name, agent).await;
        assert_eq!(
            condition.message.as_deref(),
            Some("4 of 4 expected GPUs present and healthy")
        );
    }

    // GPU 2 of the second node falls off the bus: it vanishes from the driver's list, no XID.
    let (broken, (probe_file, agent)) = (&names[1], &agents[1]);
    let mut fallen = healthy_gpus(broken);
    fallen["gpus"].as_array_mut().unwrap().remove(2);
    let started = Instant::now();
    write_probe_file(probe_file, &fallen);
    let condition = wait_until_gpu_missing(&client, broken, agent).await;
    let detected_after = started.elapsed();
    println!("GpuMissing published {detected_after:?} after the GPU disappeared");
    let message = condition.message.unwrap_or_default();
    assert!(
        message.contains(&format!("GPU-{broken}-0002")),
        "names the UUID: {message}"
    );
    assert!(
        message.contains("00000000:38:00.0"),
        "names the PCI address: {message}"
    );

    // Only the broken node changed, and the agent wrote only its own condition.
    let nodes: Api<Node> = Api::all(client.clone());
    for healthy in [&names[0], &names[2]] {
        let condition = gpu_condition(&nodes.get(healthy).await.unwrap()).unwrap();
        assert_eq!(condition.status, "True", "{healthy}");
    }
    let node = nodes.get(broken).await.unwrap();
    let ready = node
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Ready")
        .cloned();
    assert_eq!(
        ready.map(|ready| ready.status).as_deref(),
        Some("True"),
        "Ready is the kubelet's, untouched"
    );
    let managers: Vec<String> = node
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|entry| entry.subresource.as_deref() == Some("status"))
        .filter(|entry| {
            entry
                .fields_v1
                .as_ref()
                .is_some_and(|fields| fields.0.to_string().contains(r#"{\"type\":\"GpuHealthy\"}"#))
        })
        .filter_map(|entry| entry.manager)
        .collect();
    assert_eq!(
        managers,
        vec!["gpu-health-agent".to_owned()],
        "only the agent's field manager owns GpuHealthy"
    );
    let event = wait_for_event(&client, broken, gpu_reasons::GPU_MISSING, agent).await;
    assert_eq!(
        event.type_.as_deref(),
        Some("Warning"),
        "the failure is on record in the node's events"
    );

    assert_latched_until_cleared(&client, broken, probe_file, agent).await;
    drop(agents);
    ground.stop().await;
}

/// The GPU comes back, yet the fault stays latched; a clear written before the fault does
/// nothing; one written after it releases the latch.
async fn assert_latched_until_cleared(
    client: &Client,
    broken: &str,
    probe_file: &Path,
    agent: &AgentProcess,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    write_probe_file(probe_file, &healthy_gpus(broken));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let condition = gpu_condition(&nodes.get(broken).await.unwrap()).unwrap();
    assert_eq!(
        condition.status, "False",
        "a fatal fault latches until recycled or cleared"
    );
    let since = condition.last_transition_time.unwrap().0;

    // A clear written before the fault does nothing; one written after it releases the latch.
    let annotate = |at: Timestamp| {
        Patch::Merge(json!({"metadata": {"annotations": {CLEAR_ANNOTATION: at.to_string()}}}))
    };
    let before = since.checked_sub(jiff_seconds(60)).unwrap();
    nodes
        .patch(broken, &PatchParams::default(), &annotate(before))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        gpu_condition(&nodes.get(broken).await.unwrap()).unwrap().status,
        "False"
    );
    nodes
        .patch(broken, &PatchParams::default(), &annotate(Timestamp::now()))
        .await
        .unwrap();
    wait_for_condition(
        client,
        broken,
        "True",
        gpu_reasons::HEALTHY,
        Duration::from_secs(10),
        agent,
    )
    .await;
}

fn jiff_seconds(seconds: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(seconds)
}

/// NVML failing after a good start, failing from the start (`nvmlInit`), and a call that hangs
/// past `--read-timeout`: each `Unknown`, and it stays so; never a `False` that would replace the
/// node.
async fn a_failing_or_hung_nvml_reads_unknown_never_false(probe: Probe) {
    let ground = AgentGround::new(&format!("nvml-{probe:?}"), 3).await;
    let client = ground.client.clone();
    let names = ground.fleet.node_names();
    let (failing, hung, blind) = (&names[0], &names[1], &names[2]);
    let file_of = |name: &str| ground.probe_file(name);
    let mut agents = Vec::new();
    for (name, content) in [
        (failing, healthy_gpus(failing)),
        (hung, healthy_gpus(hung)),
        (blind, json!({"nvmlError": "Driver Not Loaded"})),
    ] {
        agents.push(ground.start_agent(probe, name, &content, &[]).await);
    }
    for (name, agent) in [failing, hung].into_iter().zip(&agents) {
        wait_until_healthy(&client, name, agent).await;
    }
    // Blind from the start: NVML never initialises.
    let condition = wait_until_nvml_unavailable(&client, blind, Duration::from_secs(60), &agents[2]).await;
    let message = condition.message.unwrap_or_default();
    assert!(message.contains(probe.driver_not_loaded()), "{message}");

    write_probe_file(&file_of(failing), &json!({"nvmlError": "Driver Not Loaded"}));
    let mut hanging = healthy_gpus(hung);
    hanging["hangSeconds"] = json!(30);
    let started = Instant::now();
    write_probe_file(&file_of(hung), &hanging);

    let condition = wait_until_nvml_unavailable(&client, failing, Duration::from_secs(5), &agents[0]).await;
    let message = condition.message.unwrap_or_default();
    assert!(message.contains(probe.driver_not_loaded()), "{message}");
    // `--read-timeout 2s`, one read a second: Unknown within a few seconds, not after the hang.
    let condition = wait_until_nvml_unavailable(&client, hung, Duration::from_secs(8), &agents[1]).await;
    println!(
        "{probe:?}: a hung NVML read Unknown after {:?}",
        started.elapsed()
    );
    assert!(condition.message.unwrap_or_default().contains("hung"));

    // It stays Unknown: a broken detector never turns into a False that would replace the node.
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for name in [failing, hung, blind] {
            let status = gpu_condition(&nodes.get(name).await.unwrap()).unwrap().status;
            assert_eq!(status, "Unknown", "{name}");
        }
    }
    drop(agents);
    ground.stop().await;
}

/// A GPU the driver still counts but that answers `GPU_IS_LOST` (fallen off the bus): `False`,
/// `GpuMissing`, naming it.
async fn a_gpu_lost_to_the_bus_sets_gpu_missing(probe: Probe) {
    let (ground, node, agent) = one_healthy_agent(&format!("lost-{probe:?}"), probe).await;
    let client = ground.client.clone();
    let probe_file = ground.probe_file(&node);

    let mut lost = healthy_gpus(&node);
    lost["gpus"].as_array_mut().unwrap().remove(1);
    lost["lostIndices"] = json!([1]);
    write_probe_file(&probe_file, &lost);
    let condition = wait_until_gpu_missing(&client, &node, &agent).await;
    let message = condition.message.unwrap_or_default();
    assert!(
        message.contains(&format!("GPU-{node}-0001")) && message.contains("GPU_IS_LOST"),
        "names the lost GPU: {message}"
    );
    drop(agent);
    ground.stop().await;
}

async fn a_repeating_warning_becomes_one_warning_event_on_the_node(probe: Probe) {
    let ground = AgentGround::new(&format!("warning-{probe:?}"), 1).await;
    let client = ground.client.clone();
    let node = ground.fleet.node_names().remove(0);
    let health = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap()
    };
    let mut hot = healthy_gpus(&node);
    hot["gpus"][1]["temperatureC"] = json!(91);
    let agent = ground
        .start_agent(
            probe,
            &node,
            &hot,
            &[
                "--warning-threshold",
                "3",
                "--warning-window",
                "1m",
                "--health-listen",
                &health.to_string(),
            ],
        )
        .await;
    wait_until_healthy(&client, &node, &agent).await;
    let warning = wait_for_event(&client, &node, "GpuTemperatureHigh", &agent).await;
    assert_eq!(
        http_status(health, "/healthz").await,
        200,
        "the liveness endpoint answers"
    );
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert_eq!(warning.reporting_controller.as_deref(), Some("gpu-health-agent"));
    assert!(
        warning
            .note
            .unwrap_or_default()
            .contains(&format!("GPU-{node}-0001"))
    );
    // Once per window: a few more hot reads add no second event.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let params = ListParams::default().fields(&format!("regarding.name={node}"));
    let count = events
        .list(&params)
        .await
        .unwrap()
        .items
        .iter()
        .filter(|event| event.reason.as_deref() == Some("GpuTemperatureHigh"))
        .count();
    assert_eq!(count, 1);
    let condition = current_condition(&client, &node).await;
    assert_eq!(condition.status, "True", "warnings never change the condition");
    drop(agent);
    ground.stop().await;
}

async fn a_latched_fault_survives_an_agent_restart(probe: Probe) {
    let ground = AgentGround::new(&format!("restart-{probe:?}"), 1).await;
    let client = ground.client.clone();
    let node = ground.fleet.node_names().remove(0);
    let mut faulty = healthy_gpus(&node);
    faulty["xidEvents"] = json!([{"id": 1, "xid": 79, "gpuUuid": format!("GPU-{node}-0001")}]);
    let agent = ground.start_agent(probe, &node, &faulty, &[]).await;
    let latched = wait_for_condition(&client, &node, "False", "XID79", Duration::from_secs(60), &agent).await;
    assert!(
        latched
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("RESTART_BM"),
        "{latched:?}"
    );
    drop(agent);

    // A new agent finds no XID (events are not replayed) and healthy GPUs, yet keeps the latch.
    let agent = ground.start_agent(probe, &node, &healthy_gpus(&node), &[]).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = current_condition(&client, &node).await;
    assert_eq!(after.status, "False", "agent log:\n{}", agent.log_tail());
    assert_eq!(after.reason, latched.reason);
    assert_eq!(after.message, latched.message);
    assert_eq!(
        after.last_transition_time, latched.last_transition_time,
        "still dated from the fault"
    );
    assert!(
        agent.log_tail().contains("restoring latched fault"),
        "{}",
        agent.log_tail()
    );
    drop(agent);
    ground.stop().await;
}

async fn a_cluster_override_makes_an_application_xid_fatal(probe: Probe) {
    let ground = AgentGround::new(&format!("override-{probe:?}"), 2).await;
    let client = ground.client.clone();
    let names = ground.fleet.node_names();
    let override_file = ground.dir.join("xid-override.yaml");
    std::fs::write(
        &override_file,
        "xids:\n  - {xid: 13, severity: fatal, action: RESET_GPU}\n",
    )
    .unwrap();
    let mut agents = Vec::new();
    for (name, extra) in names.iter().zip([
        vec!["--xid-catalog-override", override_file.to_str().unwrap()],
        vec![],
    ]) {
        let mut gpus = healthy_gpus(name);
        gpus["xidEvents"] = json!([{"id": 1, "xid": 13, "gpuUuid": format!("GPU-{name}-0000")}]);
        agents.push(ground.start_agent(probe, name, &gpus, &extra).await);
    }
    let fatal = wait_for_condition(
        &client,
        &names[0],
        "False",
        "XID13",
        Duration::from_secs(60),
        &agents[0],
    )
    .await;
    assert!(fatal.message.unwrap_or_default().contains("RESET_GPU"));
    // The same XID under the shipped catalog is an application fault: a warning, the node stays healthy.
    wait_until_healthy(&client, &names[1], &agents[1]).await;
    drop(agents);
    ground.stop().await;
}
