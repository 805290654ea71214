//! Publishes the agent's own `hwaccel.io` ResourceSlice for opted-in driverless devices.
//!
//! Off unless families are given (`--own-slice-families`). Each cycle, after the inventory,
//! the agent reads its node's slices and allocatable, computes the slice with
//! [`crate::dra::own_slices`] and writes it by server-side apply only when its devices
//! changed (bumping the pool generation, as DRA asks of a driver). With no family, or no
//! device that qualifies, an existing slice is deleted. Nothing here is fatal: a failure is
//! logged and retried next cycle, the inventory and labels go out regardless.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

use crate::api::InventoryDevice;
use crate::dra::own_slices::{
    Exposed, OWN_DRIVER, OwnFamily, own_slice_name, own_slice_with_notes, same_content,
};

/// Slices listed at most per cycle (one page; a node has a few).
const PAGE: u32 = 500;

/// Writes and removes one node's own slice.
#[derive(Clone)]
pub struct OwnSlicePublisher {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    node: String,
    families: BTreeSet<OwnFamily>,
    /// Set once the slice is known absent with the feature off, so a disabled agent deletes
    /// (at most) once per process instead of every cycle.
    cleaned: bool,
    field_manager: &'static str,
}

impl std::fmt::Debug for OwnSlicePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnSlicePublisher")
            .field("node", &self.node)
            .field("families", &self.families)
            .finish_non_exhaustive()
    }
}

impl OwnSlicePublisher {
    /// A publisher for `node`; empty `families` means off (an old slice is removed).
    pub fn new(
        client: kube::Client,
        node: &str,
        families: BTreeSet<OwnFamily>,
        field_manager: &'static str,
    ) -> Self {
        Self {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            node: node.to_string(),
            families,
            cleaned: false,
            field_manager,
        }
    }

    /// Replaces the opted-in families (empty turns the feature off).
    pub fn set_families(&mut self, families: BTreeSet<OwnFamily>) {
        self.families = families;
        self.cleaned = false;
    }

    /// Brings the node's own slice in line with `devices`; never fails the cycle.
    pub async fn sync(&mut self, devices: &[InventoryDevice]) {
        if self.families.is_empty() {
            if !self.cleaned {
                self.cleaned = self.delete().await;
            }
            return;
        }
        if let Err(err) = self.publish(devices).await {
            tracing::warn!(error = %err, "own ResourceSlice not published this cycle");
        }
    }

    async fn publish(&self, devices: &[InventoryDevice]) -> Result<(), kube::Error> {
        let params = ListParams::default()
            .fields(&format!("spec.nodeName={}", self.node))
            .limit(PAGE);
        let slices = self.slices.list(&params).await?.items;
        let allocatable: BTreeMap<_, _> = self
            .nodes
            .get(&self.node)
            .await?
            .status
            .and_then(|s| s.allocatable)
            .unwrap_or_default();
        let exposed = Exposed::on_node(&self.node, &slices, &allocatable);
        let name = own_slice_name(&self.node);
        let existing = slices.iter().find(|s| {
            s.metadata.name.as_deref() == Some(name.as_str()) && s.spec.driver == OWN_DRIVER
        });
        let generation = existing.map_or(1, |s| s.spec.pool.generation.saturating_add(1));
        let wanted =
            own_slice_with_notes(&self.node, devices, &self.families, &exposed, generation);
        for note in &wanted.skipped {
            tracing::debug!(note, "device left out of the own ResourceSlice");
        }
        match (wanted.slice, existing) {
            (None, None) => {}
            (None, Some(_)) => {
                self.delete().await;
            }
            (Some(slice), Some(current)) if same_content(&slice, current) => {}
            (Some(slice), _) => {
                let params = PatchParams::apply(self.field_manager).force();
                self.slices
                    .patch(&name, &params, &Patch::Apply(&slice))
                    .await?;
                tracing::info!(slice = name, generation, "own ResourceSlice written");
            }
        }
        Ok(())
    }

    /// Deletes the own slice; true when it is gone (or cannot be ours to manage: no DRA API,
    /// no RBAC because the feature is off in the chart).
    async fn delete(&self) -> bool {
        match self
            .slices
            .delete(&own_slice_name(&self.node), &DeleteParams::default())
            .await
        {
            Ok(_) => {
                tracing::info!(node = self.node, "own ResourceSlice deleted");
                true
            }
            Err(kube::Error::Api(status)) if matches!(status.code, 403 | 404) => true,
            Err(err) => {
                tracing::warn!(error = %err, "own ResourceSlice not deleted this cycle");
                false
            }
        }
    }
}
