//! The fleet's gauges (`hwaccel_fleet_*`, `hwaccel_placement_*`; names in
//! `docs/observability.md`): devices, healthy, reserved and free per product, nodes missing
//! devices, claims that outlived their placement, per placement the devices it holds and its
//! state, and per counted model the replicas the free devices hold (`--capacity-model`).
//!
//! Each publish sets every current series and removes the ones that are gone (a deleted
//! placement, a product no node has any more), so a scrape never shows a stale series and
//! never misses a live one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::controller::core::fleet_figures::{FleetTotals, ModelCount};
use crate::controller::core::placement_key::PlacementKey;

/// The states `hwaccel_placement_state` has a series for, per placement.
pub const PLACEMENT_STATES: [&str; 3] = ["Planned", "Pending", "Invalid"];

/// Label set of a product.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ProductLabel {
    /// The product slug (`nvidia-h100-80gb-hbm3`), `unknown`, or `other` past the bound.
    pub product: String,
    /// The vendor (`nvidia`).
    pub vendor: String,
}

/// Label set of a placement.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PlacementLabel {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub placement: String,
}

/// Label set of a placement's state.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PlacementStateLabel {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub placement: String,
    /// One of [`PLACEMENT_STATES`].
    pub state: String,
}

/// Label set of a counted model.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ModelLabel {
    /// The preset key (`llama-3.1-70b`).
    pub model: String,
    /// Tokens per request.
    pub context: String,
    /// The precision asked for (`auto`, `bf16`...).
    pub precision: String,
}

/// Label set of a node's unpublished devices.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct UnpublishedLabel {
    /// The node.
    pub node: String,
    /// The DRA driver, or the device plugin resource or vendor a gap no driver owns names.
    pub driver: String,
    /// The audit's reason (`DriverSliceMissing`...).
    pub reason: String,
}

/// What one placement shows: devices held and its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementFigures {
    /// Devices it holds.
    pub devices: u64,
    /// Its state as last reconciled (`Planned`, `Pending`, `Invalid`); `None` when not yet.
    pub state: Option<&'static str>,
    /// Devices its pods hold and do not use (plan conformance).
    pub idle_devices: u64,
}

/// The label sets published last, to remove those that are gone.
#[derive(Debug, Default)]
struct Published {
    products: BTreeSet<ProductLabel>,
    share_products: BTreeSet<ProductLabel>,
    placements: BTreeSet<PlacementLabel>,
    models: BTreeSet<ModelLabel>,
    unpublished: BTreeSet<UnpublishedLabel>,
}

/// The fleet gauges.
#[derive(Debug, Clone)]
pub struct FleetMetrics {
    devices: Family<ProductLabel, Gauge>,
    healthy: Family<ProductLabel, Gauge>,
    degraded: Family<ProductLabel, Gauge>,
    reserved: Family<ProductLabel, Gauge>,
    free: Family<ProductLabel, Gauge>,
    share_memory_free: Family<ProductLabel, Gauge>,
    nodes_missing_devices: Gauge,
    outlived_claims: Gauge,
    placement_devices: Family<PlacementLabel, Gauge>,
    placement_idle_devices: Family<PlacementLabel, Gauge>,
    placement_state: Family<PlacementStateLabel, Gauge>,
    model_replicas: Family<ModelLabel, Gauge>,
    model_stranded: Family<ModelLabel, Gauge>,
    unpublished: Family<UnpublishedLabel, Gauge>,
    published: Arc<Mutex<Published>>,
}

impl FleetMetrics {
    /// Creates the gauges and registers them at the registry's top level (no prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            devices: Family::default(),
            healthy: Family::default(),
            degraded: Family::default(),
            reserved: Family::default(),
            free: Family::default(),
            share_memory_free: Family::default(),
            nodes_missing_devices: Gauge::default(),
            outlived_claims: Gauge::default(),
            placement_devices: Family::default(),
            placement_idle_devices: Family::default(),
            placement_state: Family::default(),
            model_replicas: Family::default(),
            model_stranded: Family::default(),
            unpublished: Family::default(),
            published: Arc::default(),
        };
        registry.register(
            "hwaccel_dra_unpublished_devices",
            "Devices that fall between what a node's agent detected, what DRA drivers publish \
             and what its device plugins advertise, by node, driver and audit reason (only \
             nodes with a gap have series)",
            metrics.unpublished.clone(),
        );
        registry.register(
            "hwaccel_fleet_devices",
            "Accelerators in the inventories the controller sees, by product",
            metrics.devices.clone(),
        );
        registry.register(
            "hwaccel_fleet_devices_healthy",
            "Accelerators whose health is healthy, by product",
            metrics.healthy.clone(),
        );
        registry.register(
            "hwaccel_fleet_devices_degraded",
            "Accelerators whose health is degraded: still plannable, worth a person's look, by product",
            metrics.degraded.clone(),
        );
        registry.register(
            "hwaccel_fleet_devices_reserved",
            "Accelerators held by a ModelPlacement (labels or claims) or by any allocated ResourceClaim, by product",
            metrics.reserved.clone(),
        );
        registry.register(
            "hwaccel_fleet_devices_free",
            "Plannable accelerators (every health but unhealthy) neither a ModelPlacement nor an allocated ResourceClaim holds: the planner's free set, by product",
            metrics.free.clone(),
        );
        registry.register(
            "hwaccel_fleet_share_memory_free_bytes",
            "Memory left for shares on accelerators their DRA driver publishes shareable by memory (capacity less what placements' shares and claims' consumedCapacity take; 0 for one held whole), by product",
            metrics.share_memory_free.clone(),
        );
        registry.register(
            "hwaccel_fleet_nodes_missing_devices",
            "Nodes whose AcceleratorInventory says DevicesMissing=True",
            metrics.nodes_missing_devices.clone(),
        );
        registry.register(
            "hwaccel_fleet_outlived_claims",
            "Allocated ResourceClaims labelled for a ModelPlacement that no longer exists (their devices count as reserved)",
            metrics.outlived_claims.clone(),
        );
        registry.register(
            "hwaccel_placement_devices",
            "Accelerators a ModelPlacement holds",
            metrics.placement_devices.clone(),
        );
        registry.register(
            "hwaccel_placement_idle_devices",
            "Accelerators a ModelPlacement's pods hold and their engine does not use (more \
             devices than tensor x pipeline x data-parallel ranks; the Conformant condition)",
            metrics.placement_idle_devices.clone(),
        );
        registry.register(
            "hwaccel_placement_state",
            "1 for a ModelPlacement's current state, 0 for the others",
            metrics.placement_state.clone(),
        );
        registry.register(
            "hwaccel_fleet_model_replicas",
            "Replicas of a counted model (one full-context request each) the free accelerators hold now",
            metrics.model_replicas.clone(),
        );
        registry.register(
            "hwaccel_fleet_model_stranded_devices",
            "Free accelerators no further replica of a counted model can use",
            metrics.model_stranded.clone(),
        );
        metrics
    }

    /// Publishes the memory left for shares per product; products no longer seen are removed.
    pub fn publish_share_headroom(&self, left: &BTreeMap<(String, String), u64>) {
        let Ok(mut published) = self.published.lock() else {
            return;
        };
        let current: BTreeSet<ProductLabel> = left
            .iter()
            .map(|((product, vendor), bytes)| {
                let label = ProductLabel {
                    product: product.clone(),
                    vendor: vendor.clone(),
                };
                self.share_memory_free
                    .get_or_create(&label)
                    .set(i64::try_from(*bytes).unwrap_or(i64::MAX));
                label
            })
            .collect();
        for gone in published.share_products.difference(&current) {
            self.share_memory_free.remove(gone);
        }
        published.share_products = current;
    }

    /// Publishes the publication audit's gaps: devices per (node, driver, reason); series of
    /// gaps that closed are removed.
    pub fn publish_unpublished(&self, gaps: &BTreeMap<UnpublishedLabel, u32>) {
        let Ok(mut published) = self.published.lock() else {
            return;
        };
        for (label, devices) in gaps {
            self.unpublished
                .get_or_create(label)
                .set(i64::from(*devices));
        }
        let current: BTreeSet<UnpublishedLabel> = gaps.keys().cloned().collect();
        for gone in published.unpublished.difference(&current) {
            self.unpublished.remove(gone);
        }
        published.unpublished = current;
    }

    /// Publishes how many allocated claims outlived their placement.
    pub fn publish_outlived(&self, claims: usize) {
        self.outlived_claims
            .set(i64::try_from(claims).unwrap_or(i64::MAX));
    }

    /// Publishes the counted models' capacity; a model missing from `counts` (its count
    /// failed) loses its series rather than keeping a stale one.
    pub fn publish_models(&self, counts: &[ModelCount]) {
        let Ok(mut published) = self.published.lock() else {
            return;
        };
        let current: BTreeSet<ModelLabel> = counts
            .iter()
            .map(|count| {
                let label = ModelLabel {
                    model: count.model.clone(),
                    context: count.context.to_string(),
                    precision: count.precision.clone(),
                };
                self.model_replicas
                    .get_or_create(&label)
                    .set(i64::from(count.replicas));
                self.model_stranded
                    .get_or_create(&label)
                    .set(i64::from(count.stranded_devices));
                label
            })
            .collect();
        for gone in published.models.difference(&current) {
            self.model_replicas.remove(gone);
            self.model_stranded.remove(gone);
        }
        published.models = current;
    }

    /// Publishes the fleet's sums and every placement's figures.
    pub fn publish(
        &self,
        totals: &FleetTotals,
        placements: &BTreeMap<PlacementKey, PlacementFigures>,
    ) {
        let Ok(mut published) = self.published.lock() else {
            return;
        };
        let products: BTreeSet<ProductLabel> = totals
            .by_product
            .iter()
            .map(|((product, vendor), counts)| {
                let label = ProductLabel {
                    product: product.clone(),
                    vendor: vendor.clone(),
                };
                self.devices
                    .get_or_create(&label)
                    .set(gauge(counts.devices));
                self.healthy
                    .get_or_create(&label)
                    .set(gauge(counts.healthy));
                self.degraded
                    .get_or_create(&label)
                    .set(gauge(counts.degraded));
                self.reserved
                    .get_or_create(&label)
                    .set(gauge(counts.reserved));
                self.free.get_or_create(&label).set(gauge(counts.free));
                label
            })
            .collect();
        for gone in published.products.difference(&products) {
            for family in [
                &self.devices,
                &self.healthy,
                &self.degraded,
                &self.reserved,
                &self.free,
            ] {
                family.remove(gone);
            }
        }
        self.nodes_missing_devices
            .set(gauge(totals.nodes_missing_devices));
        let current: BTreeSet<PlacementLabel> = placements
            .iter()
            .map(|(key, figures)| {
                let label = PlacementLabel {
                    namespace: key.namespace.clone(),
                    placement: key.name.clone(),
                };
                self.placement_devices
                    .get_or_create(&label)
                    .set(gauge(figures.devices));
                self.placement_idle_devices
                    .get_or_create(&label)
                    .set(gauge(figures.idle_devices));
                for state in PLACEMENT_STATES {
                    self.placement_state
                        .get_or_create(&state_label(&label, state))
                        .set(i64::from(figures.state == Some(state)));
                }
                label
            })
            .collect();
        for gone in published.placements.difference(&current) {
            self.placement_devices.remove(gone);
            self.placement_idle_devices.remove(gone);
            for state in PLACEMENT_STATES {
                self.placement_state.remove(&state_label(gone, state));
            }
        }
        published.products = products;
        published.placements = current;
    }
}

fn state_label(placement: &PlacementLabel, state: &str) -> PlacementStateLabel {
    PlacementStateLabel {
        namespace: placement.namespace.clone(),
        placement: placement.placement.clone(),
        state: state.to_string(),
    }
}

fn gauge(value: impl Into<u64>) -> i64 {
    i64::try_from(value.into()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::device_state::Counts;

    fn exposition(registry: &Registry) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, registry);
        text
    }

    #[test]
    fn series_of_gone_products_and_placements_disappear() {
        let mut registry = Registry::default();
        let metrics = FleetMetrics::register(&mut registry);
        let mut totals = FleetTotals::default();
        totals.by_product.insert(
            ("h100".to_string(), "nvidia".to_string()),
            Counts {
                devices: 8,
                healthy: 6,
                degraded: 1,
                unhealthy: 1,
                reserved: 4,
                free: 3,
                unusable: 1,
                ..Counts::default()
            },
        );
        totals.nodes_missing_devices = 1;
        let key = PlacementKey::new("ns", "llama");
        let placements = BTreeMap::from([(
            key.clone(),
            PlacementFigures {
                devices: 4,
                state: Some("Planned"),
                idle_devices: 0,
            },
        )]);
        metrics.publish(&totals, &placements);
        let text = exposition(&registry);
        for line in [
            "hwaccel_fleet_devices{product=\"h100\",vendor=\"nvidia\"} 8",
            "hwaccel_fleet_devices_healthy{product=\"h100\",vendor=\"nvidia\"} 6",
            "hwaccel_fleet_devices_degraded{product=\"h100\",vendor=\"nvidia\"} 1",
            "hwaccel_fleet_devices_reserved{product=\"h100\",vendor=\"nvidia\"} 4",
            "hwaccel_fleet_devices_free{product=\"h100\",vendor=\"nvidia\"} 3",
            "hwaccel_fleet_nodes_missing_devices 1",
            "hwaccel_placement_devices{namespace=\"ns\",placement=\"llama\"} 4",
            "hwaccel_placement_state{namespace=\"ns\",placement=\"llama\",state=\"Planned\"} 1",
            "hwaccel_placement_state{namespace=\"ns\",placement=\"llama\",state=\"Pending\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        metrics.publish(&FleetTotals::default(), &BTreeMap::new());
        let text = exposition(&registry);
        assert!(!text.contains("h100"), "{text}");
        assert!(!text.contains("llama"), "{text}");
        assert!(
            text.contains("hwaccel_fleet_nodes_missing_devices 0"),
            "{text}"
        );
    }

    #[test]
    fn a_model_whose_count_failed_loses_its_series() {
        let mut registry = Registry::default();
        let metrics = FleetMetrics::register(&mut registry);
        let count = |model: &str, replicas| ModelCount {
            model: model.to_string(),
            context: 8192,
            precision: "bf16".to_string(),
            replicas,
            stranded_devices: 1,
        };
        metrics.publish_models(&[count("llama-3.1-8b", 7), count("llama-3.1-70b", 1)]);
        let text = exposition(&registry);
        for line in [
            "hwaccel_fleet_model_replicas{model=\"llama-3.1-8b\",context=\"8192\",precision=\"bf16\"} 7",
            "hwaccel_fleet_model_replicas{model=\"llama-3.1-70b\",context=\"8192\",precision=\"bf16\"} 1",
            "hwaccel_fleet_model_stranded_devices{model=\"llama-3.1-70b\",context=\"8192\",precision=\"bf16\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        metrics.publish_models(&[count("llama-3.1-8b", 6)]);
        let text = exposition(&registry);
        assert!(!text.contains("llama-3.1-70b"), "{text}");
        assert!(
            text.contains("hwaccel_fleet_model_replicas{model=\"llama-3.1-8b\",context=\"8192\",precision=\"bf16\"} 6"),
            "{text}"
        );
    }
}
