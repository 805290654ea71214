//! The agent's own node's DRA ResourceSlices, as a second source for its node labels.
//!
//! On a DRA-only cluster (the NVIDIA GPU Operator's DRA mode deploys no feature-discovery
//! labeler) nothing else writes product labels, and the agent's own detection may lack the
//! vendor tools. So the agent reads the slices of its node and fills in, for the labels only,
//! what its detection lacks: a device's product or memory, or a device it did not see at all.
//! The inventory stays pure detection; the controller merges slices itself.
//!
//! The slices come from the agent's watch of its node's slices ([`super::own_objects`]) when
//! that is current, and from a list otherwise. Reading slices is optional: a cluster without
//! the DRA API (404) or an agent without the RBAC (403) skips it quietly, and any other
//! failure costs only this cycle's fill.

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};

use super::watched::Cached;
use crate::detect::pci::canonical_bus_id;
use crate::dra::PublishedDevice;
use crate::dra::slices::published_devices;
use crate::hardware::Device;
use crate::hardware::Report;

/// Slices asked for per page; a node has a few.
const PAGE: u32 = 100;

/// Pages read at most (a node with more slices than this is not a real node).
const MAX_PAGES: usize = 10;

/// Lists one node's ResourceSlices.
#[derive(Clone)]
pub struct SliceReader {
    api: Api<ResourceSlice>,
    node: String,
    timeout: Duration,
}

impl std::fmt::Debug for SliceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceReader")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl SliceReader {
    /// A reader of `node`'s slices, each list call bounded by `timeout`.
    pub fn new(client: kube::Client, node: &str, timeout: Duration) -> Self {
        Self {
            api: Api::all(client),
            node: node.to_string(),
            timeout,
        }
    }

    /// The devices known drivers publish for this node, from `cached` (the watch's view) when
    /// it is current or refused, from a list otherwise; empty when DRA is absent, not
    /// allowed, or failing (never an error: labels from detection still go out).
    pub async fn published(&self, cached: Cached<ResourceSlice>) -> Vec<PublishedDevice> {
        let slices = match cached {
            Cached::Current(slices) => slices.into_values().collect(),
            Cached::Refused(code) => {
                tracing::debug!(
                    code,
                    "ResourceSlices not readable (no DRA API or no RBAC); labels from detection only"
                );
                return Vec::new();
            }
            Cached::Unknown => self.listed().await,
        };
        let fleet = published_devices(&slices);
        for note in &fleet.notes {
            tracing::debug!(note, "ResourceSlices");
        }
        fleet.node(&self.node).to_vec()
    }

    /// This node's slices from a list; empty when it fails.
    async fn listed(&self) -> Vec<ResourceSlice> {
        match tokio::time::timeout(self.timeout, self.list()).await {
            Ok(Ok(slices)) => slices,
            Ok(Err(kube::Error::Api(status))) if matches!(status.code, 403 | 404) => {
                tracing::debug!(
                    code = status.code,
                    "ResourceSlices not readable (no DRA API or no RBAC); labels from detection only"
                );
                Vec::new()
            }
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "listing this node's ResourceSlices failed");
                Vec::new()
            }
            Err(_) => {
                tracing::debug!("listing this node's ResourceSlices timed out");
                Vec::new()
            }
        }
    }

    async fn list(&self) -> Result<Vec<ResourceSlice>, kube::Error> {
        // The bound is the caller's `tokio::time::timeout` (list requests ignore
        // `timeoutSeconds`) on top of the client's own API timeout.
        let mut params = ListParams::default()
            .fields(&format!("spec.nodeName={}", self.node))
            .limit(PAGE);
        let mut slices = Vec::new();
        for _ in 0..MAX_PAGES {
            let page = self.api.list(&params).await?;
            slices.extend(page.items);
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => break,
            }
        }
        Ok(slices)
    }
}

/// `report` with what `published` adds for labels: a matched device (same PCI bus id, else
/// UUID) gets the product, memory and NUMA node its detection lacks; a usable published device that
/// detection did not see is added. Partitions and unusable devices add nothing.
pub fn fill_from_published(report: &Report, published: &[PublishedDevice]) -> Report {
    let mut filled = report.clone();
    for device in published.iter().filter(|d| d.unusable.is_none()) {
        let found = filled
            .devices
            .iter_mut()
            .find(|seen| same_device(seen, device));
        match found {
            Some(seen) => {
                if seen.model.trim().is_empty()
                    && let Some(product) = &device.product
                {
                    seen.model = product.clone();
                }
                if seen.memory_bytes.is_none() {
                    seen.memory_bytes = device.memory_bytes;
                }
                if seen.numa_node.is_none() {
                    seen.numa_node = device.numa_node;
                }
            }
            None => {
                let Some(product) = &device.product else {
                    continue;
                };
                let id = device
                    .pci_bus_id
                    .clone()
                    .unwrap_or_else(|| format!("dra:{}", device.reference));
                let mut added = Device::new(id, device.vendor, device.family, product, "dra");
                added.memory_bytes = device.memory_bytes;
                added.numa_node = device.numa_node;
                added.uuid = device.uuid.clone();
                filled.devices.push(added);
            }
        }
    }
    filled
}

fn same_device(seen: &Device, published: &PublishedDevice) -> bool {
    let bus = canonical_bus_id(&seen.id);
    if let (Some(bus), Some(theirs)) = (bus.as_ref(), published.pci_bus_id.as_ref()) {
        return bus == theirs;
    }
    matches!(
        (seen.uuid.as_deref(), published.uuid.as_deref()),
        (Some(a), Some(b)) if a.eq_ignore_ascii_case(b)
    )
}

#[cfg(test)]
mod tests;
