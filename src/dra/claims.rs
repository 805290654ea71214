//! ResourceClaims that hold a placement's devices: one claim per replica and pipeline stage,
//! allocated by the controller itself to exactly the `(driver, pool, device)` the planner
//! chose, so the scheduler and every other DRA consumer see those devices as taken.
//!
//! Pure: this module builds the objects and reads allocations back; the controller's
//! `claims.rs` driver writes them. A claim is named after its placement, replica and stage and
//! a hash of its devices, so the same plan always gives the same names (a restarted controller
//! finds its claims instead of making new ones) and a changed plan gives new ones (an
//! allocation is immutable, so a claim is never re-pointed).
//!
//! On a device its driver publishes shareable by memory (`allowMultipleAllocations`), a claim
//! takes a share ([`ClaimShare`]): it requests that much of the driver's memory capacity
//! (`capacity.requests`), and its allocation records it in `consumedCapacity` with a
//! `shareID`, as the scheduler writes a share it allocates, so the scheduler counts it when it
//! places other claims' shares beside it. A replica holding such a device whole takes all of
//! its memory, so no share lands beside it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequirements, DeviceAllocationResult, DeviceClaim, DeviceRequest,
    DeviceRequestAllocationResult, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

use crate::names::{hash_hex, shorten_with_hash};

use super::DeviceRef;
use super::drivers::known;

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
    /// On devices shared by memory: what the claim takes of each.
    pub share: Option<ClaimShare>,
    /// The devices are partitions (MIG devices): the request names the driver's partition
    /// DeviceClass (`mig.nvidia.com`), not its whole-device one.
    pub partition: bool,
}

/// What a claim takes of each of its devices when their driver publishes them shareable by
/// memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimShare {
    /// Bytes of each device's memory capacity the claim requests and consumes (the device's
    /// whole capacity for a replica that holds it whole).
    pub bytes: u64,
    /// Each device's memory capacity.
    pub capacity: u64,
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
            name: claim_name(placement, replica, stage, &refs, None),
            namespace: namespace.to_string(),
            placement: placement.to_string(),
            replica,
            stage,
            node: node.to_string(),
            devices: refs,
            share: None,
            partition: false,
        })
    }

    /// The same claim taking `share` of each device (a share's size is part of the name: an
    /// allocation is immutable, so a new size is a new claim).
    #[must_use]
    pub fn with_share(mut self, share: Option<ClaimShare>) -> Self {
        self.share = share;
        self.name = claim_name(
            &self.placement,
            self.replica,
            self.stage,
            &self.devices,
            share,
        );
        self
    }

    /// The same claim on partitions of its devices (each device a partition the driver
    /// publishes, such as a MIG device): its request names the partition DeviceClass.
    #[must_use]
    pub fn on_partitions(mut self) -> Self {
        self.partition = true;
        self
    }

    /// The DeviceClass the request names: the driver's own (each vendor chart installs one
    /// named after its driver), or its partition class for partitions.
    pub fn device_class(&self) -> &str {
        let partition_class = known(self.driver())
            .and_then(|driver| driver.partition)
            .map(|source| source.class);
        match partition_class {
            Some(class) if self.partition => class,
            _ => self.driver(),
        }
    }

    /// The driver's memory capacity and the quantity the claim takes of it, for a share.
    fn memory_taken(&self) -> Option<BTreeMap<String, Quantity>> {
        let share = self.share?;
        let key = known(self.driver()).and_then(|driver| driver.memory)?;
        Some(BTreeMap::from([(
            key.to_string(),
            crate::api::quantity::bytes(share.bytes),
        )]))
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
                            device_class_name: self.device_class().to_string(),
                            allocation_mode: Some("ExactCount".to_string()),
                            count: Some(i64::try_from(self.devices.len()).unwrap_or(1)),
                            capacity: self.memory_taken().map(|requests| CapacityRequirements {
                                requests: Some(requests),
                            }),
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
        let consumed = self.memory_taken();
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
                            share_id: consumed.as_ref().map(|_| share_id(&self.name, d)),
                            consumed_capacity: consumed.clone(),
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

/// `<placement>-r<replica>-s<stage>-<hash of the devices and share>`, shortened with a hash of
/// the whole when the placement name is long.
fn claim_name(
    placement: &str,
    replica: u32,
    stage: u32,
    devices: &[DeviceRef],
    share: Option<ClaimShare>,
) -> String {
    let mut identity: Vec<String> = devices.iter().map(DeviceRef::to_string).collect();
    // Claims without a share keep the names they always had.
    if let Some(share) = share {
        identity.push(format!("share={}", share.bytes));
    }
    let suffix = format!("-r{replica}-s{stage}-{}", hash_hex(&identity.join(",")));
    let room = MAX_NAME_LENGTH - suffix.len();
    let head = if placement.len() > room {
        shorten_with_hash(placement, placement, room)
    } else {
        placement.to_string()
    };
    format!("{head}{suffix}")
}

/// The share id of one device's allocation in the claim `claim`: a UUID made from the claim's
/// name and the device, so the same claim always writes the same one. The apiserver keys
/// concurrent shares of a device by it; a claim holds one share of each of its devices.
fn share_id(claim: &str, device: &DeviceRef) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{claim}/{device}").as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    // The version nibble says 8 (custom, RFC 9562) and the variant bits say RFC 4122.
    format!(
        "{}-{}-8{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// The results of a claim's allocation (none when it is not allocated).
fn allocation_results(claim: &ResourceClaim) -> &[DeviceRequestAllocationResult] {
    claim
        .status
        .as_ref()
        .and_then(|status| status.allocation.as_ref())
        .and_then(|allocation| allocation.devices.as_ref())
        .and_then(|devices| devices.results.as_deref())
        .unwrap_or_default()
}

/// The device one allocation result names.
fn result_device(result: &DeviceRequestAllocationResult) -> DeviceRef {
    DeviceRef {
        driver: result.driver.clone(),
        pool: result.pool.clone(),
        device: result.device.clone(),
    }
}

/// What each device of an allocated claim consumes of its driver's memory capacity, as the
/// allocation records it (`consumedCapacity`, written for shared devices only): the device
/// and the whole amount (`None` when it records none).
pub fn consumed_capacity(claim: &ResourceClaim) -> Vec<(DeviceRef, Option<u64>)> {
    allocation_results(claim)
        .iter()
        .map(|r| {
            let key = known(&r.driver).and_then(|driver| driver.memory);
            let consumed = r
                .consumed_capacity
                .as_ref()
                .and_then(|consumed| crate::api::quantity::parse_whole(consumed.get(key?)?));
            (result_device(r), consumed)
        })
        .collect()
}

/// The devices a claim's allocation holds (empty when it is not allocated).
pub fn allocated_devices(claim: &ResourceClaim) -> Vec<DeviceRef> {
    allocation_results(claim)
        .iter()
        .map(result_device)
        .collect()
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

    /// Issue 39: a claim on a MIG device names the driver's MIG class (the whole-device class
    /// selects `type == 'gpu'` and would not match it); AMD's partitions are claimed through
    /// the driver's own class.
    #[test]
    fn a_claim_on_partitions_names_the_partition_class() {
        let exactly = |plan: ClaimPlan| {
            plan.claim(None).spec.devices.unwrap().requests.unwrap()[0]
                .exactly
                .clone()
                .unwrap()
        };
        let mig = exactly(plan(&["gpu0"]).unwrap().on_partitions());
        assert_eq!(mig.device_class_name, "mig.nvidia.com");
        assert_eq!(mig.count, Some(1));
        assert_eq!(
            exactly(plan(&["gpu0"]).unwrap()).device_class_name,
            "gpu.nvidia.com"
        );
        // AMD's driver class selects its partitions too (its chart's class is by driver).
        let amd = plan(&["amd0"]).unwrap().on_partitions();
        assert_eq!(exactly(amd).device_class_name, "gpu.amd.com");
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

    #[test]
    fn a_share_claim_requests_its_memory_and_its_allocation_records_it_with_a_share_id() {
        const GIB: u64 = 1 << 30;
        let whole = plan(&["gpu0"]).unwrap();
        let share = Some(ClaimShare {
            bytes: 24 * GIB,
            capacity: 80 * GIB,
        });
        let shared = whole.clone().with_share(share);
        assert_ne!(shared.name, whole.name, "a share is another claim");
        assert_ne!(
            shared.name,
            whole
                .clone()
                .with_share(Some(ClaimShare {
                    bytes: 32 * GIB,
                    capacity: 80 * GIB
                }))
                .name,
            "and so is another size"
        );
        assert_eq!(whole.clone().with_share(None).name, whole.name);

        let request = shared.claim(None).spec.devices.unwrap().requests.unwrap();
        let requests = request[0].exactly.as_ref().unwrap().capacity.clone();
        assert_eq!(
            requests.unwrap().requests.unwrap()["memory"].0,
            "24Gi",
            "the NVIDIA driver's memory capacity"
        );
        assert!(
            whole.claim(None).spec.devices.unwrap().requests.unwrap()[0]
                .exactly
                .as_ref()
                .unwrap()
                .capacity
                .is_none()
        );

        let mut claim = shared.claim(None);
        claim.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
            allocation: Some(shared.allocation(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))),
            ..Default::default()
        });
        let result = &claim
            .status
            .as_ref()
            .unwrap()
            .allocation
            .as_ref()
            .unwrap()
            .devices
            .as_ref()
            .unwrap()
            .results
            .as_ref()
            .unwrap()[0];
        let id = result.share_id.clone().unwrap();
        // A UUID as the apiserver parses one: 8-4-4-4-12 lowercase hex digits.
        let groups: Vec<usize> = id.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{id}");
        assert!(
            id.chars()
                .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(
            id,
            shared
                .allocation(Time(k8s_openapi::jiff::Timestamp::now()))
                .devices
                .unwrap()
                .results
                .unwrap()[0]
                .share_id
                .clone()
                .unwrap(),
            "the same claim writes the same id"
        );
        assert_eq!(
            consumed_capacity(&claim),
            [(nvidia("gpu-0"), Some(24 * GIB))]
        );
        // A whole-device allocation consumes nothing it records.
        let mut plain = whole.claim(None);
        plain.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
            allocation: Some(whole.allocation(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))),
            ..Default::default()
        });
        assert_eq!(consumed_capacity(&plain), [(nvidia("gpu-0"), None)]);
    }
}
