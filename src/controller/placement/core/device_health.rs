//! What drivers and kubelets say about the devices a placement holds, once they are in use:
//! a ResourceClaim's `status.devices` (per-device conditions a DRA driver writes, GA in
//! Kubernetes 1.37) and a pod's `status.containerStatuses[].allocatedResourcesStatus` (the
//! device health a kubelet reports from the driver, beta and on by default since 1.36). A
//! device either names as unhealthy becomes one line for the placement's `Degraded`
//! condition, naming the device, where it was reported and the message. Pure.
//!
//! The detector's and the slices' verdicts on a device are [`super::decide`]'s (a device
//! that is no longer usable); these are the verdicts of the software holding the device,
//! which may know first (an Xid error in a running job) and which no slice carries.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::names::truncate_at_char_boundary;

/// Condition types that mean "usable" when `True`: `False` is a problem. `Ready` is the one
/// the DRA API names (the device is configured and usable); the others are what drivers use
/// for health.
const GOOD_WHEN_TRUE: &[&str] = &["Ready", "Healthy", "Available"];
/// Condition types that mean a problem when `True`.
const BAD_WHEN_TRUE: &[&str] = &["Unhealthy", "Degraded", "Failed", "Error"];
/// A pod's `ResourceHealth.health` that is a problem (`Unknown` is not: a restarting plugin
/// reports it, and the device may be fine).
const UNHEALTHY: &str = "Unhealthy";
/// At most this many problems are listed; the rest are counted.
pub const MAX_LISTED: usize = 8;
/// Texts copied from a claim or pod (written by other parties) are cut to this many bytes.
const MAX_TEXT: usize = 200;

/// One device reported unhealthy: which, by whom, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceProblem {
    /// The device as DRA names it (`gpu.nvidia.com/node-a/gpu-0`).
    pub device: String,
    /// Where it was reported (`ResourceClaim ml/llama-r0`, `pod ml/llama-0 container vllm`).
    pub source: String,
    /// What was reported (`Ready=False XidError: Xid 79, GPU has fallen off the bus`).
    pub message: String,
}

impl DeviceProblem {
    /// `device (source): message`, as the condition lists it.
    pub fn line(&self) -> String {
        format!("{} ({}): {}", self.device, self.source, self.message)
    }
}

/// The problems `claims` report in `status.devices`: every device with a condition that says
/// it is not usable.
pub fn from_claims<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> Vec<DeviceProblem> {
    let mut problems = Vec::new();
    for claim in claims {
        let source = format!(
            "ResourceClaim {}/{}",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default()
        );
        let devices = claim.status.as_ref().and_then(|s| s.devices.as_ref());
        for device in devices.into_iter().flatten() {
            let bad: Vec<String> = device
                .conditions
                .iter()
                .flatten()
                .filter(|c| is_bad(c))
                .map(condition_text)
                .collect();
            if !bad.is_empty() {
                problems.push(DeviceProblem {
                    device: device_name(device),
                    source: bounded(&source),
                    message: bad.join("; "),
                });
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

/// The problems `pods` report in their containers' `allocatedResourcesStatus`: every
/// resource a container was allocated whose health is `Unhealthy`.
pub fn from_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Vec<DeviceProblem> {
    let mut problems = Vec::new();
    for pod in pods {
        let pod_name = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        let status = pod.status.as_ref();
        let containers = status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .chain(
                status
                    .and_then(|s| s.init_container_statuses.as_ref())
                    .into_iter()
                    .flatten(),
            );
        for container in containers {
            let resources = container.allocated_resources_status.iter().flatten();
            for entry in resources.flat_map(|r| r.resources.iter().flatten()) {
                if entry.health.as_deref() != Some(UNHEALTHY) {
                    continue;
                }
                let message = match entry.message.as_deref().map(str::trim) {
                    Some(message) if !message.is_empty() => format!("{UNHEALTHY}: {message}"),
                    _ => UNHEALTHY.to_string(),
                };
                problems.push(DeviceProblem {
                    device: bounded(&entry.resource_id),
                    source: bounded(&format!("pod {pod_name} container {}", container.name)),
                    message: bounded(&message),
                });
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

/// The lines for a condition message: at most [`MAX_LISTED`], then how many more.
pub fn lines(problems: &[DeviceProblem]) -> Vec<String> {
    let mut lines: Vec<String> = problems
        .iter()
        .take(MAX_LISTED)
        .map(DeviceProblem::line)
        .collect();
    if problems.len() > MAX_LISTED {
        lines.push(format!("and {} more", problems.len() - MAX_LISTED));
    }
    lines
}

/// Whether a condition says the device is not usable.
fn is_bad(condition: &Condition) -> bool {
    let kind = condition.type_.as_str();
    (GOOD_WHEN_TRUE.contains(&kind) && condition.status == "False")
        || (BAD_WHEN_TRUE.contains(&kind) && condition.status == "True")
}

/// `Type=Status Reason: message`, bounded.
fn condition_text(condition: &Condition) -> String {
    let mut text = format!("{}={}", condition.type_, condition.status);
    if !condition.reason.is_empty() {
        text.push(' ');
        text.push_str(&condition.reason);
    }
    if !condition.message.trim().is_empty() {
        text.push_str(": ");
        text.push_str(condition.message.trim());
    }
    bounded(&text)
}

/// `driver/pool/device`, bounded.
fn device_name(device: &AllocatedDeviceStatus) -> String {
    bounded(&format!(
        "{}/{}/{}",
        device.driver, device.pool, device.device
    ))
}

fn bounded(text: &str) -> String {
    truncate_at_char_boundary(text, MAX_TEXT).to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(devices: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "llama-r0", "namespace": "ml"},
            "spec": {},
            "status": {"devices": devices},
        }))
        .expect("test claim")
    }

    fn device(name: &str, conditions: serde_json::Value) -> serde_json::Value {
        json!({
            "driver": "gpu.nvidia.com", "pool": "node-a", "device": name,
            "conditions": conditions,
        })
    }

    fn condition(kind: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
        json!({
            "type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        })
    }

    #[test]
    fn a_claim_device_is_unhealthy_when_a_condition_says_it_is_not_usable() {
        let claim = claim(json!([
            device("gpu-0", json!([condition("Ready", "True", "Prepared", "")])),
            device(
                "gpu-1",
                json!([condition(
                    "Ready",
                    "False",
                    "XidError",
                    "Xid 79, fallen off the bus"
                )])
            ),
            device(
                "gpu-2",
                json!([condition(
                    "Unhealthy",
                    "True",
                    "EccErrors",
                    " 12 uncorrected "
                )])
            ),
            device(
                "gpu-3",
                json!([condition("Unhealthy", "False", "Fine", "")])
            ),
            device(
                "gpu-4",
                json!([condition("Vendor.Custom", "False", "Whatever", "")])
            ),
            device("gpu-5", json!(null)),
        ]));
        let problems = from_claims([&claim]);
        let lines: Vec<String> = problems.iter().map(DeviceProblem::line).collect();
        assert_eq!(
            lines,
            [
                "gpu.nvidia.com/node-a/gpu-1 (ResourceClaim ml/llama-r0): Ready=False XidError: \
                 Xid 79, fallen off the bus",
                "gpu.nvidia.com/node-a/gpu-2 (ResourceClaim ml/llama-r0): Unhealthy=True \
                 EccErrors: 12 uncorrected",
            ]
        );
        assert!(from_claims([&self::claim(json!(null))]).is_empty());
    }

    #[test]
    fn a_pod_reports_only_unhealthy_resources_with_their_message() {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "llama-0", "namespace": "ml"},
            "status": {"containerStatuses": [{
                "name": "vllm", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                "allocatedResourcesStatus": [{
                    "name": "claim:llama-r0/gpu",
                    "resources": [
                        {"resourceID": "gpu.nvidia.com/node-a/gpu-0", "health": "Healthy"},
                        {"resourceID": "gpu.nvidia.com/node-a/gpu-1", "health": "Unhealthy",
                         "message": "ECC error count exceeded threshold"},
                        {"resourceID": "gpu.nvidia.com/node-a/gpu-2", "health": "Unknown"},
                        {"resourceID": "gpu.nvidia.com/node-a/gpu-3", "health": "Unhealthy"},
                    ],
                }],
            }]},
        }))
        .expect("test pod");
        let lines: Vec<String> = from_pods([&pod]).iter().map(DeviceProblem::line).collect();
        assert_eq!(
            lines,
            [
                "gpu.nvidia.com/node-a/gpu-1 (pod ml/llama-0 container vllm): Unhealthy: ECC \
                 error count exceeded threshold",
                "gpu.nvidia.com/node-a/gpu-3 (pod ml/llama-0 container vllm): Unhealthy",
            ]
        );
    }

    #[test]
    fn long_lists_and_texts_are_bounded() {
        let devices: Vec<serde_json::Value> = (0..20)
            .map(|i| {
                device(
                    &format!("gpu-{i:02}"),
                    json!([condition("Ready", "False", "R", &"x".repeat(1000))]),
                )
            })
            .collect();
        let problems = from_claims([&claim(json!(devices))]);
        assert_eq!(problems.len(), 20);
        assert!(problems.iter().all(|p| p.message.len() <= MAX_TEXT));
        let listed = lines(&problems);
        assert_eq!(listed.len(), MAX_LISTED + 1);
        assert_eq!(listed[MAX_LISTED], "and 12 more");
    }
}
