//! What drivers and kubelets say about the devices a placement holds, once they are in use:
//! a ResourceClaim's `status.devices` (per-device conditions a DRA driver writes, GA in
//! Kubernetes 1.37) and a pod's `status.containerStatuses[].allocatedResourcesStatus` (the
//! device health a kubelet reports from the driver, beta and on by default since 1.36), read
//! only from the pods the claims are reserved for ([`consumers`]). A device either names as
//! unhealthy becomes one line for the placement's `Degraded` condition, naming the device,
//! where it was reported and the message. Pure: the driver (`placement/pod_health.rs`) reads
//! the pods.
//!
//! The detector's and the slices' verdicts on a device are [`super::decide`]'s (a device
//! that is no longer usable); these are the verdicts of the software holding the device,
//! which may know first (an Xid error in a running job) and which no slice carries.

use std::collections::{BTreeMap, BTreeSet};

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

/// Most pods read for one placement on one reconcile: a serving replica is one pod per
/// claim, so this covers 16 replicas' pods and bounds the reads a placement with many
/// consumers (a claim may be reserved for 256) costs.
pub const MAX_PODS: usize = 16;

/// A pod a claim is reserved for (`status.reservedFor`, written by kube-scheduler when it
/// binds the pod; the kubelet runs only pods listed there): the only pods whose
/// `allocatedResourcesStatus` can be about the claim's devices.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Consumer {
    /// The claim's (and so the pod's) namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid: a pod re-created under the same name is another consumer.
    pub uid: String,
}

/// The pods `claims` are reserved for, sorted, at most [`MAX_PODS`], and how many more
/// there are. Consumers that are not core/v1 pods (a `reservedFor` may name any resource)
/// carry no `allocatedResourcesStatus` and are left out.
pub fn consumers<'a>(
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
) -> (Vec<Consumer>, usize) {
    let mut found: Vec<Consumer> = claims
        .into_iter()
        .flat_map(|claim| {
            let namespace = claim.metadata.namespace.clone().unwrap_or_default();
            let reserved = claim.status.as_ref().and_then(|s| s.reserved_for.as_ref());
            reserved
                .into_iter()
                .flatten()
                .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
                .map(move |r| Consumer {
                    namespace: namespace.clone(),
                    name: r.name.clone(),
                    uid: r.uid.clone(),
                })
        })
        .collect();
    found.sort();
    found.dedup();
    let more = found.len().saturating_sub(MAX_PODS);
    found.truncate(MAX_PODS);
    (found, more)
}

/// The problems `pods` report in their containers' `allocatedResourcesStatus` about the
/// devices of `claims`: every resource whose health is `Unhealthy`, in an entry for one of
/// the claims, of a pod one of the claims is reserved for (same uid). Anything else a pod
/// says (another claim's devices, a device plugin's) is not the placement's.
///
/// An entry is named `claim:<pod claim name>[/<request>]`, the pod claim name being an
/// entry of the pod's `spec.resourceClaims` that names the ResourceClaim directly
/// (`resourceClaimName`) or, for a template's claim, one `status.resourceClaimStatuses`
/// maps to it. The kubelet names each device by its CDI id when the driver gives one, else
/// `driver/pool/device`; the line keeps that id and names the claim.
pub fn from_consumer_pods<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    claims: &[&ResourceClaim],
) -> Vec<DeviceProblem> {
    let reserved: BTreeSet<Consumer> = consumers(claims.iter().copied()).0.into_iter().collect();
    let ours: BTreeSet<&str> = claims
        .iter()
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    let mut problems = Vec::new();
    for pod in pods {
        let consumer = Consumer {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        };
        if !reserved.contains(&consumer) {
            continue;
        }
        let claim_names = pod_claim_names(pod);
        let pod_name = format!("{}/{}", consumer.namespace, consumer.name);
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
            for entry in container.allocated_resources_status.iter().flatten() {
                let Some(claim) =
                    entry_claim(&entry.name, &claim_names).filter(|c| ours.contains(c))
                else {
                    continue;
                };
                for resource in entry.resources.iter().flatten() {
                    if resource.health.as_deref() != Some(UNHEALTHY) {
                        continue;
                    }
                    let message = match resource.message.as_deref().map(str::trim) {
                        Some(message) if !message.is_empty() => format!("{UNHEALTHY}: {message}"),
                        _ => UNHEALTHY.to_string(),
                    };
                    problems.push(DeviceProblem {
                        device: bounded(&resource.resource_id),
                        source: bounded(&format!(
                            "pod {pod_name} container {}, ResourceClaim {claim}",
                            container.name
                        )),
                        message: bounded(&message),
                    });
                }
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

/// The ResourceClaim each of `pod`'s claim names stands for: `spec.resourceClaims` naming
/// one directly, then `status.resourceClaimStatuses` for the ones made from a template.
fn pod_claim_names(pod: &Pod) -> BTreeMap<&str, &str> {
    let mut names = BTreeMap::new();
    let direct = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    for claim in direct.into_iter().flatten() {
        if let Some(object) = claim.resource_claim_name.as_deref() {
            names.insert(claim.name.as_str(), object);
        }
    }
    let generated = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    for claim in generated.into_iter().flatten() {
        if let Some(object) = claim.resource_claim_name.as_deref() {
            names.entry(claim.name.as_str()).or_insert(object);
        }
    }
    names
}

/// The ResourceClaim an `allocatedResourcesStatus` entry named `claim:<name>[/<request>]`
/// is about, or `None` for an entry of something else (a device plugin's resource).
fn entry_claim<'a>(entry: &str, claim_names: &BTreeMap<&str, &'a str>) -> Option<&'a str> {
    let rest = entry.strip_prefix("claim:")?;
    let name = rest.split_once('/').map_or(rest, |(name, _)| name);
    claim_names.get(name).copied()
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

    /// A claim `name` in `ml`, reserved for `pods` (`(name, uid)`).
    fn reserved_claim(name: &str, pods: &[(&str, &str)]) -> ResourceClaim {
        let reserved: Vec<serde_json::Value> = pods
            .iter()
            .map(|(pod, uid)| json!({"resource": "pods", "name": pod, "uid": uid}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {},
            "status": {"reservedFor": reserved},
        }))
        .expect("test claim")
    }

    /// Pod `name` (uid `uid-<name>`) in `ml` with `claims` (pod claim name, ResourceClaim
    /// name), template claims in `generated`, and one container's `allocatedResourcesStatus`.
    fn pod(
        name: &str,
        claims: &[(&str, &str)],
        generated: &[(&str, &str)],
        statuses: serde_json::Value,
    ) -> Pod {
        let claims: Vec<serde_json::Value> = claims
            .iter()
            .map(|(name, claim)| json!({"name": name, "resourceClaimName": claim}))
            .collect();
        let generated: Vec<serde_json::Value> = generated
            .iter()
            .map(|(name, claim)| json!({"name": name, "resourceClaimName": claim}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "vllm"}], "resourceClaims": claims},
            "status": {
                "resourceClaimStatuses": generated,
                "containerStatuses": [{
                    "name": "vllm", "image": "x", "imageID": "", "ready": true,
                    "restartCount": 0, "allocatedResourcesStatus": statuses,
                }],
            },
        }))
        .expect("test pod")
    }

    fn resource(id: &str, health: &str, message: Option<&str>) -> serde_json::Value {
        json!({"resourceID": id, "health": health, "message": message})
    }

    #[test]
    fn a_pod_reports_only_unhealthy_devices_of_our_claims_with_their_message() {
        let ours = reserved_claim("llama-r0", &[("llama-0", "uid-llama-0")]);
        let theirs = pod(
            "llama-0",
            &[("gpu", "llama-r0"), ("nic", "someone-elses")],
            &[],
            json!([
                {"name": "claim:gpu/accelerators", "resources": [
                    resource("gpu.nvidia.com/node-a/gpu-0", "Healthy", None),
                    resource(
                        "gpu.nvidia.com/node-a/gpu-1",
                        "Unhealthy",
                        Some(" ECC error count exceeded threshold "),
                    ),
                    resource("gpu.nvidia.com/node-a/gpu-2", "Unknown", None),
                    resource("k8s.gpu.nvidia.com/device=gpu-3", "Unhealthy", None),
                ]},
                // Another claim of the pod, and a device plugin's resource: not ours.
                {"name": "claim:nic", "resources": [resource("nic-0", "Unhealthy", None)]},
                {"name": "nvidia.com/gpu", "resources": [resource("plugin-0", "Unhealthy", None)]},
            ]),
        );
        let lines: Vec<String> = from_consumer_pods([&theirs], &[&ours])
            .iter()
            .map(DeviceProblem::line)
            .collect();
        assert_eq!(
            lines,
            [
                "gpu.nvidia.com/node-a/gpu-1 (pod ml/llama-0 container vllm, ResourceClaim \
                 llama-r0): Unhealthy: ECC error count exceeded threshold",
                "k8s.gpu.nvidia.com/device=gpu-3 (pod ml/llama-0 container vllm, \
                 ResourceClaim llama-r0): Unhealthy",
            ]
        );
    }

    #[test]
    fn only_pods_the_claim_is_reserved_for_count_and_template_claims_map_through_the_status() {
        let sick = json!([{"name": "claim:gpu", "resources": [
            resource("gpu.nvidia.com/node-a/gpu-0", "Unhealthy", Some("Xid 79")),
        ]}]);
        let claim = reserved_claim("llama-r0", &[("reserved", "uid-reserved")]);
        // Reserved, the claim made from a template: named in the status only.
        let generated = pod("reserved", &[], &[("gpu", "llama-r0")], sick.clone());
        // Names the claim but the scheduler never reserved it for this pod (a tenant's
        // pod, or one re-created under a reserved name: another uid).
        let stranger = pod("stranger", &[("gpu", "llama-r0")], &[], sick.clone());
        let mut renamed = pod("reserved", &[("gpu", "llama-r0")], &[], sick);
        renamed.metadata.uid = Some("another-uid".into());
        let problems = from_consumer_pods([&generated, &stranger, &renamed], &[&claim]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].device, "gpu.nvidia.com/node-a/gpu-0");
        assert!(
            problems[0].source.starts_with("pod ml/reserved "),
            "{problems:?}"
        );
        assert_eq!(problems[0].message, "Unhealthy: Xid 79");
    }

    #[test]
    fn consumers_are_pods_only_sorted_and_bounded() {
        let pods: Vec<(String, String)> = (0..MAX_PODS + 4)
            .map(|i| (format!("p-{i:02}"), format!("u-{i:02}")))
            .collect();
        let refs: Vec<(&str, &str)> = pods.iter().map(|(n, u)| (n.as_str(), u.as_str())).collect();
        let mut claim = reserved_claim("big", &refs);
        let status = claim.status.as_mut().expect("status");
        let reserved = status.reserved_for.as_mut().expect("reserved");
        reserved.push(
            serde_json::from_value(json!({
                "apiGroup": "apps", "resource": "deployments", "name": "d", "uid": "u-d",
            }))
            .expect("consumer"),
        );
        // The same pod through two claims is one consumer.
        let again = reserved_claim("small", &[("p-00", "u-00")]);
        let (found, more) = consumers([&claim, &again]);
        assert_eq!(found.len(), MAX_PODS);
        assert_eq!(more, 4);
        assert_eq!(found[0].name, "p-00");
        assert!(
            found
                .iter()
                .all(|c| c.namespace == "ml" && c.name.starts_with("p-"))
        );
        assert_eq!(consumers([&self::claim(json!(null))]), (Vec::new(), 0));
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
