//! ResourceClaims that hold a placement's devices: one claim per replica and pipeline stage,
//! allocated by the controller itself to exactly the `(driver, pool, device)` the planner
//! chose, so the scheduler and every other DRA consumer see those devices as taken.
//!
//! Pure: this module builds the objects and reads allocations back; the controller's
//! `claims.rs` driver writes them. A claim is named after its placement, replica and stage and
//! a hash of its devices, so the same plan always gives the same names (a restarted controller
//! finds its claims instead of making new ones) and a changed plan gives new ones (an
//! allocation is immutable, so a claim is never re-pointed).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceClaim, DeviceRequest,
    DeviceRequestAllocationResult, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

use crate::names::{hash_hex, shorten_with_hash};

use super::DeviceRef;

/// The one device request in every claim the controller writes; pods name the claim, not
/// the request, so the name only has to be stable.
pub const CLAIM_REQUEST: &str = "accelerators";
/// Annotation carrying the node the claim's devices are on.
pub use crate::names::keys::NODE_ANNOTATION;
/// Label on every claim the controller owns; its value is the placement's name (the claim
/// lives in the placement's namespace).
pub use crate::names::keys::PLACEMENT_LABEL;
/// Label carrying the replica index.
pub use crate::names::keys::REPLICA_LABEL;
/// Label carrying the pipeline stage index.
pub use crate::names::keys::STAGE_LABEL;
/// DRA's limit on devices in one allocation result.
pub const MAX_DEVICES_PER_CLAIM: usize = 32;
/// The longest object name Kubernetes accepts.
const MAX_NAME_LENGTH: usize = 253;

/// One claim a placement should have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPlan {
    /// Object name.
    pub name: String,
    /// The placement's namespace.
    pub namespace: String,
    /// The placement's name.
    pub placement: String,
    /// Replica index.
    pub replica: u32,
    /// Pipeline stage index.
    pub stage: u32,
    /// The node all its devices are on.
    pub node: String,
    /// The devices, all of one driver, in the planner's order.
    pub devices: Vec<DeviceRef>,
}

/// Why a planned group of devices cannot become a claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimPlanError {
    /// A device no DRA driver publishes.
    #[error("{node}/{device} is not published by a DRA driver")]
    Unpublished {
        /// Node.
        node: String,
        /// Planner device id.
        device: String,
    },
    /// Devices of two drivers in one group.
    #[error("replica {replica} stage {stage} mixes DRA drivers {first} and {second}")]
    MixedDrivers {
        /// Replica.
        replica: u32,
        /// Stage.
        stage: u32,
        /// One driver.
        first: String,
        /// Another.
        second: String,
    },
    /// More devices than one allocation may hold.
    #[error(
        "replica {replica} stage {stage} holds {count} devices; one ResourceClaim holds at most {MAX_DEVICES_PER_CLAIM}"
    )]
    TooManyDevices {
        /// Replica.
        replica: u32,
        /// Stage.
        stage: u32,
        /// Devices in the group.
        count: usize,
    },
}

impl ClaimPlan {
    /// The plan for one group of devices (one replica's stage on one node); `dra` names the
    /// DRA device behind a planner device id on that node.
    pub fn new(
        namespace: &str,
        placement: &str,
        group: (u32, u32, &str),
        devices: &[String],
        dra: impl Fn(&str, &str) -> Option<DeviceRef>,
    ) -> Result<Self, ClaimPlanError> {
        let (replica, stage, node) = group;
        if devices.len() > MAX_DEVICES_PER_CLAIM {
            return Err(ClaimPlanError::TooManyDevices {
                replica,
                stage,
                count: devices.len(),
            });
        }
        let mut refs: Vec<DeviceRef> = Vec::with_capacity(devices.len());
        for device in devices {
            let reference = dra(node, device).ok_or_else(|| ClaimPlanError::Unpublished {
                node: node.to_string(),
                device: device.clone(),
            })?;
            if let Some(first) = refs
                .first()
                .filter(|first| first.driver != reference.driver)
            {
                return Err(ClaimPlanError::MixedDrivers {
                    replica,
                    stage,
                    first: first.driver.clone(),
                    second: reference.driver,
                });
            }
            refs.push(reference);
        }
        Ok(Self {
            name: claim_name(placement, replica, stage, &refs),
            namespace: namespace.to_string(),
            placement: placement.to_string(),
            replica,
            stage,
            node: node.to_string(),
            devices: refs,
        })
    }

    /// The driver of its devices (empty for a claim without devices, which is never built).
    pub fn driver(&self) -> &str {
        self.devices.first().map_or("", |d| d.driver.as_str())
    }

    /// The claim object, without status. The request names the vendor driver's own
    /// DeviceClass (each vendor chart installs one named after its driver), so the claim
    /// means the same thing to the scheduler should it ever need allocating again.
    pub fn claim(&self, owner: Option<OwnerReference>) -> ResourceClaim {
        let labels = BTreeMap::from([
            (PLACEMENT_LABEL.to_string(), self.placement.clone()),
            (REPLICA_LABEL.to_string(), self.replica.to_string()),
            (STAGE_LABEL.to_string(), self.stage.to_string()),
        ]);
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([(
                    NODE_ANNOTATION.to_string(),
                    self.node.clone(),
                )])),
                owner_references: owner.map(|owner| vec![owner]),
                ..ObjectMeta::default()
            },
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: CLAIM_REQUEST.to_string(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: self.driver().to_string(),
                            allocation_mode: Some("ExactCount".to_string()),
                            count: Some(i64::try_from(self.devices.len()).unwrap_or(1)),
                            ..ExactDeviceRequest::default()
                        }),
                        ..DeviceRequest::default()
                    }]),
                    ..DeviceClaim::default()
                }),
            },
            status: None,
        }
    }

    /// The allocation that pins the claim to exactly its devices on its node. The timestamp
    /// is required: the scheduler refuses to use an allocation written without one.
    pub fn allocation(&self, now: Time) -> AllocationResult {
        AllocationResult {
            allocation_timestamp: Some(now),
            devices: Some(DeviceAllocationResult {
                results: Some(
                    self.devices
                        .iter()
                        .map(|d| DeviceRequestAllocationResult {
                            request: CLAIM_REQUEST.to_string(),
                            driver: d.driver.clone(),
                            pool: d.pool.clone(),
                            device: d.device.clone(),
                            ..DeviceRequestAllocationResult::default()
                        })
                        .collect(),
                ),
                config: None,
            }),
            node_selector: Some(node_selector(&self.node)),
        }
    }
}

/// A node selector that matches exactly `node`, by name (a field, so no label can fake it).
fn node_selector(node: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".to_string(),
                operator: "In".to_string(),
                values: Some(vec![node.to_string()]),
            }]),
            match_expressions: None,
        }],
    }
}

/// `<placement>-r<replica>-s<stage>-<hash of the devices>`, shortened with a hash of the
/// whole when the placement name is long.
fn claim_name(placement: &str, replica: u32, stage: u32, devices: &[DeviceRef]) -> String {
    let identity: Vec<String> = devices.iter().map(DeviceRef::to_string).collect();
    let suffix = format!("-r{replica}-s{stage}-{}", hash_hex(&identity.join(",")));
    let room = MAX_NAME_LENGTH - suffix.len();
    let head = if placement.len() > room {
        shorten_with_hash(placement, placement, room)
    } else {
        placement.to_string()
    };
    format!("{head}{suffix}")
}

/// The devices a claim's allocation holds (empty when it is not allocated).
pub fn allocated_devices(claim: &ResourceClaim) -> Vec<DeviceRef> {
    claim
        .status
        .as_ref()
        .and_then(|status| status.allocation.as_ref())
        .and_then(|allocation| allocation.devices.as_ref())
        .and_then(|devices| devices.results.as_ref())
        .map(|results| {
            results
                .iter()
                .map(|r| DeviceRef {
                    driver: r.driver.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// True when the claim's allocation exists.
pub fn is_allocated(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|status| status.allocation.is_some())
}

/// The placement a claim belongs to (by its label), if it is one of ours.
pub fn owning_placement(claim: &ResourceClaim) -> Option<(&str, &str)> {
    let namespace = claim.metadata.namespace.as_deref()?;
    let placement = claim.metadata.labels.as_ref()?.get(PLACEMENT_LABEL)?;
    Some((namespace, placement.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nvidia(device: &str) -> DeviceRef {
        DeviceRef {
            driver: "gpu.nvidia.com".into(),
            pool: "gpu-a".into(),
            device: device.into(),
        }
    }

    fn lookup(node: &str, device: &str) -> Option<DeviceRef> {
        match (node, device) {
            ("gpu-a", "gpu0") => Some(nvidia("gpu-0")),
            ("gpu-a", "gpu1") => Some(nvidia("gpu-1")),
            ("gpu-a", "amd0") => Some(DeviceRef {
                driver: "gpu.amd.com".into(),
                pool: "gpu-a".into(),
                device: "gpu-0".into(),
            }),
            _ => None,
        }
    }

    fn plan(devices: &[&str]) -> Result<ClaimPlan, ClaimPlanError> {
        let devices: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
        ClaimPlan::new("team", "llama", (1, 0, "gpu-a"), &devices, lookup)
    }

    #[test]
    fn a_claim_is_allocated_to_exactly_the_planned_devices_on_the_planned_node() {
        let plan = plan(&["gpu1", "gpu0"]).unwrap();
        let allocation = plan.allocation(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let results = allocation.devices.unwrap().results.unwrap();
        let devices: Vec<(&str, &str, &str)> = results
            .iter()
            .map(|r| (r.driver.as_str(), r.pool.as_str(), r.device.as_str()))
            .collect();
        assert_eq!(
            devices,
            [
                ("gpu.nvidia.com", "gpu-a", "gpu-1"),
                ("gpu.nvidia.com", "gpu-a", "gpu-0")
            ]
        );
        assert!(results.iter().all(|r| r.request == CLAIM_REQUEST));
        let term = &allocation.node_selector.unwrap().node_selector_terms[0];
        let field = &term.match_fields.as_ref().unwrap()[0];
        assert_eq!(
            (field.key.as_str(), field.values.as_deref()),
            ("metadata.name", Some(&["gpu-a".to_string()][..]))
        );
        assert!(allocation.allocation_timestamp.is_some());
    }

    #[test]
    fn the_claim_asks_the_driver_class_for_as_many_devices_as_it_holds() {
        let claim = plan(&["gpu0", "gpu1"]).unwrap().claim(None);
        let request = &claim.spec.devices.unwrap().requests.unwrap()[0];
        let exactly = request.exactly.as_ref().unwrap();
        assert_eq!(exactly.device_class_name, "gpu.nvidia.com");
        assert_eq!(exactly.count, Some(2));
        let labels = claim.metadata.labels.unwrap();
        assert_eq!(labels[PLACEMENT_LABEL], "llama");
        assert_eq!(labels[REPLICA_LABEL], "1");
    }

    #[test]
    fn names_are_stable_for_a_plan_and_change_with_its_devices() {
        let first = plan(&["gpu0"]).unwrap().name;
        assert_eq!(first, plan(&["gpu0"]).unwrap().name);
        assert_ne!(first, plan(&["gpu1"]).unwrap().name);
        assert!(first.starts_with("llama-r1-s0-"), "{first}");
    }

    #[test]
    fn long_placement_names_still_give_valid_claim_names() {
        let long = "a".repeat(253);
        let devices = vec!["gpu0".to_string()];
        let plan = ClaimPlan::new("team", &long, (0, 0, "gpu-a"), &devices, lookup).unwrap();
        assert!(plan.name.len() <= 253, "{}", plan.name.len());
        let other = ClaimPlan::new(
            "team",
            &format!("{}b", "a".repeat(252)),
            (0, 0, "gpu-a"),
            &devices,
            lookup,
        )
        .unwrap();
        assert_ne!(plan.name, other.name);
    }

    #[test]
    fn unpublished_mixed_and_oversized_groups_are_refused() {
        assert!(matches!(
            plan(&["gpu0", "cpu"]),
            Err(ClaimPlanError::Unpublished { .. })
        ));
        assert!(matches!(
            plan(&["gpu0", "amd0"]),
            Err(ClaimPlanError::MixedDrivers { .. })
        ));
        let many: Vec<String> = (0..33).map(|_| "gpu0".to_string()).collect();
        assert!(matches!(
            ClaimPlan::new("team", "llama", (0, 0, "gpu-a"), &many, lookup),
            Err(ClaimPlanError::TooManyDevices { count: 33, .. })
        ));
    }

    #[test]
    fn allocated_devices_reads_back_what_allocation_wrote() {
        let plan = plan(&["gpu0", "gpu1"]).unwrap();
        let mut claim = plan.claim(None);
        assert!(!is_allocated(&claim));
        assert!(allocated_devices(&claim).is_empty());
        claim.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
            allocation: Some(plan.allocation(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))),
            ..Default::default()
        });
        assert!(is_allocated(&claim));
        assert_eq!(allocated_devices(&claim), plan.devices);
        assert_eq!(owning_placement(&claim), Some(("team", "llama")));
    }
}
