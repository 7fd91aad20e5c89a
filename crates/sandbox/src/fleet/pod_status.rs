//! The container statuses the simulated kubelet reports (simulated: no container runs), shared by
//! its running pods (`kubelet`) and the validation pods it finishes (`validation_pod`).

use serde_json::{Value, json};

/// A container's status as the simulated kubelet reports it: ready and started when `running`,
/// in `state`.
pub fn container_status(c: &k8s_openapi::api::core::v1::Container, running: bool, state: &Value) -> Value {
    json!({
        "name": c.name,
        "image": c.image.clone().unwrap_or_default(),
        "imageID": "",
        "containerID": format!("sim://{}", c.name),
        "ready": running,
        "started": running,
        "restartCount": 0,
        "state": state,
    })
}
