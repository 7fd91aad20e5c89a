//! e2e: DCGM as a second opinion. The real `gpu-health-agent` scrapes a stand-in DCGM exporter
//! (a tiny HTTP server in this test serving Prometheus text) next to its probe, under both probes
//! (`name::file`, `name::nvml` with the stand-in NVML library): an XID only DCGM reports sets the
//! condition once, naming the GPU; an exporter that does not answer reads `Unknown`, never a GPU
//! fault.

#[macro_use]
mod agent_support;
mod common;

use std::{
    fmt::Write as _,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use agent_support::{
    AgentGround, Probe, assert_condition_stays, healthy_gpus, wait_for_condition, wait_for_fault_set_once,
    wait_until_healthy,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

for_both_probes!(
    an_xid_only_dcgm_reports_sets_the_condition_once,
    an_unreachable_dcgm_exporter_reads_unknown_never_a_gpu_fault,
);

/// A stand-in DCGM exporter: answers every request with the current body, as `text/plain`.
struct StandinExporter {
    address: SocketAddr,
    body: Arc<Mutex<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl StandinExporter {
    async fn start(body: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let body = Arc::new(Mutex::new(body));
        let served = Arc::clone(&body);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let text = served.lock().unwrap().clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0_u8; 1024];
                    while !request.windows(4).any(|window| window == b"\r\n\r\n") {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(read) => request.extend_from_slice(&buffer[..read]),
                        }
                    }
                    let response =
                        format!("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\r\n{text}");
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        });
        Self { address, body, task }
    }

    fn url(&self) -> String {
        format!("http://{}/metrics", self.address)
    }

    fn serve(&self, body: String) {
        *self.body.lock().unwrap() = body;
    }
}

impl Drop for StandinExporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What dcgm-exporter serves for `node`'s four GPUs, with `xids[i]` the last XID of GPU `i`.
fn metrics(node: &str, xids: [u64; 4]) -> String {
    let mut text = String::from(
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n",
    );
    for (index, xid) in xids.iter().enumerate() {
        writeln!(
            text,
            "DCGM_FI_DEV_XID_ERRORS{{gpu=\"{index}\",UUID=\"GPU-{node}-{index:04}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{index}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"{node}\"}} {xid}",
            0x18 + index * 0x10
        )
        .unwrap();
    }
    text.push_str("# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n");
    for index in 0..4 {
        writeln!(
            text,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{gpu=\"{index}\",UUID=\"GPU-{node}-{index:04}\"}} 0"
        )
        .unwrap();
    }
    text
}

async fn an_xid_only_dcgm_reports_sets_the_condition_once(probe: Probe) {
    let ground = AgentGround::new(&format!("dcgm-xid-{probe:?}"), 1).await;
    let client = ground.client.clone();
    let node = ground.fleet.node_names().remove(0);
    // An XID 13 from before the agent started: the baseline, not a new XID.
    let exporter = StandinExporter::start(metrics(&node, [0, 13, 0, 0])).await;
    let flag = format!("--dcgm-metrics-url={}", exporter.url());
    let agent = ground
        .start_agent(probe, &node, &healthy_gpus(&node), &[&flag])
        .await;
    wait_until_healthy(&client, &node, &agent).await;

    // DCGM sees XID 79 on GPU 1; NVML's event API stays silent.
    exporter.serve(metrics(&node, [0, 79, 0, 0]));
    // Once, though DCGM keeps serving 79 on every scrape.
    let uuid = format!("GPU-{node}-0001");
    wait_for_fault_set_once(
        &client,
        &node,
        "XID79",
        &[&uuid, "00000000:28:00.0", "DCGM exporter"],
        &agent,
    )
    .await;
    drop(agent);
    ground.stop().await;
}

async fn an_unreachable_dcgm_exporter_reads_unknown_never_a_gpu_fault(probe: Probe) {
    let ground = AgentGround::new(&format!("dcgm-down-{probe:?}"), 1).await;
    let client = ground.client.clone();
    let node = ground.fleet.node_names().remove(0);
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let flag = format!("--dcgm-metrics-url=http://{closed}/metrics");
    let agent = ground
        .start_agent(probe, &node, &healthy_gpus(&node), &[&flag])
        .await;
    let condition = wait_for_condition(
        &client,
        &node,
        "Unknown",
        "DcgmUnavailable",
        Duration::from_secs(60),
        &agent,
    )
    .await;
    let message = condition.message.unwrap_or_default();
    assert!(
        message.contains(&closed.to_string()),
        "names the exporter: {message}"
    );
    assert_condition_stays(&client, &node, "Unknown").await;
    drop(agent);
    ground.stop().await;
}
