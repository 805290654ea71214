//! Multi-node NVLink domains: TP groups wider than a node.
//!
//! A GB200 NVL72 rack is 18 compute trays (nodes) of 4 GPUs in one NVLink domain, so a TP
//! group of 16 spans 4 nodes at NVLink speed (TensorRT-LLM's sharding guide: NVL36/NVL72
//! "allow TP across nodes"). Nodes of one domain share an `nvidia.com/gpu.clique` label
//! ([`crate::plan::inventory::NVLINK_CLIQUE_LABEL`]). Such groups are placed here, apart from the per-node index of
//! `fleet.rs`: a rack holds at most 72 devices, so a plain scan of the racks per group is
//! cheap.
//!
//! Rules: each TP group lies inside one domain — the domain with the fewest free devices that
//! still holds it (best fit, ties by clique name) — and takes its devices from that domain's
//! nodes with the most free devices first (fewest nodes per group, ties by node name). A group
//! is reported as one assignment per node it uses, all with the same replica and stage.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::{Assignment, DeviceClass, FreeDevices, Placement, Shape};
use crate::plan::inventory::NodeSpec;

/// Sets `class.largest_rack` (and widens `largest_fast_domain` to it) from the nodes' clique
/// labels.
pub(super) fn measure(nodes: &[NodeSpec], class: &mut DeviceClass<'_>) {
    let mut racks: BTreeMap<&str, u32> = BTreeMap::new();
    for bin in &class.bins {
        if let Some(clique) = nodes[bin.node as usize].nvlink_clique() {
            let free = racks.entry(clique).or_default();
            *free = free.saturating_add(bin.free);
        }
    }
    class.largest_rack = racks.values().copied().max().unwrap_or(0);
    class.racks = racks.into_values().collect();
    class.largest_fast_domain = class.largest_fast_domain.max(class.largest_rack);
}

/// Places `shape` with TP groups spanning nodes of one multi-node NVLink domain; `None` when
/// the class has no domain that holds a group, too few free devices, or it would take more
/// than `max_nodes` nodes.
pub(super) fn place(
    fleet: &FreeDevices<'_>,
    class: &DeviceClass<'_>,
    shape: Shape,
    max_nodes: Option<u32>,
) -> Option<Placement> {
    let tp = shape.tp.max(1);
    if class.largest_rack < tp || shape.pp == 0 || shape.replicas == 0 {
        return None;
    }
    // Bins by clique, in name order; each bin's devices in the index's order (fast domains
    // first), taken from the front.
    let mut racks: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (index, bin) in class.bins.iter().enumerate() {
        if let Some(clique) = fleet.node(bin.node).nvlink_clique() {
            racks.entry(clique).or_default().push(index);
        }
    }
    let devices: Vec<Vec<u16>> = class
        .bins
        .iter()
        .map(|bin| {
            bin.domains
                .iter()
                .flat_map(|(_, list)| list.iter().copied())
                .collect()
        })
        .collect();
    let mut used = vec![0usize; class.bins.len()];
    let free_in = |used: &[usize], bins: &[usize]| -> u64 {
        bins.iter()
            .map(|&b| (devices[b].len() - used[b]) as u64)
            .sum()
    };
    let mut assignments = Vec::new();
    let mut on_fabric = true;
    for replica in 0..shape.replicas {
        let mut replica_racks = BTreeSet::new();
        let mut replica_nodes = Vec::new();
        for stage in 0..shape.pp {
            let (clique, bins) = racks
                .iter()
                .filter(|(_, bins)| free_in(&used, bins) >= u64::from(tp))
                .min_by_key(|(name, bins)| (free_in(&used, bins), **name))?;
            replica_racks.insert(*clique);
            let mut order = bins.clone();
            order.sort_by_key(|&b| (Reverse(devices[b].len() - used[b]), b));
            let mut left = tp as usize;
            for bin in order {
                if left == 0 {
                    break;
                }
                let take = left.min(devices[bin].len() - used[bin]);
                if take == 0 {
                    continue;
                }
                let node = fleet.node(class.bins[bin].node);
                let start = used[bin];
                assignments.push(Assignment {
                    replica,
                    stage,
                    node: node.name.clone(),
                    devices: devices[bin][start..start + take]
                        .iter()
                        .map(|&d| node.devices[usize::from(d)].id.clone())
                        .collect(),
                });
                used[bin] += take;
                left -= take;
                replica_nodes.push(node);
            }
        }
        // Stages in different domains talk over the scale-out network.
        if replica_racks.len() > 1 {
            let fabrics: BTreeSet<Option<&str>> =
                replica_nodes.iter().map(|n| n.fabric.as_deref()).collect();
            on_fabric &= fabrics.len() == 1 && fabrics.first().is_some_and(Option::is_some);
        }
    }
    Placement::capped(assignments, max_nodes, true, on_fabric)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::inventory::Reservations;
    use crate::plan::shorthand::parse_hardware;

    #[test]
    fn a_tp_group_of_16_spans_four_trays_of_one_rack() {
        let nodes = parse_hardware("36x4xGB200+nvl72").unwrap();
        let fleet = FreeDevices::new(&nodes, &Reservations::none());
        let class = &fleet.classes[0];
        assert_eq!((class.largest_node, class.largest_rack), (4, 72));
        assert_eq!(class.largest_tp_group(), 72);
        assert_eq!(class.group_capacity(16), 8, "4 groups of 16 per rack of 72");
        assert_eq!(class.group_capacity(4), 36, "one per tray");
        let placement = fleet
            .place(
                0,
                Shape {
                    tp: 16,
                    pp: 1,
                    replicas: 5,
                },
                None,
            )
            .unwrap();
        assert!(placement.tp_in_fast_domain);
        assert_eq!(placement.nodes, 20);
        let mut seen = BTreeSet::new();
        for replica in 0..5 {
            let parts: Vec<&Assignment> = placement
                .assignments
                .iter()
                .filter(|a| a.replica == replica)
                .collect();
            assert_eq!(parts.len(), 4, "4 trays of 4");
            let cliques: BTreeSet<&str> = parts
                .iter()
                .map(|a| {
                    nodes
                        .iter()
                        .find(|n| n.name == a.node)
                        .and_then(NodeSpec::nvlink_clique)
                        .unwrap()
                })
                .collect();
            assert_eq!(cliques.len(), 1, "one NVLink domain per group");
            for a in parts {
                for d in &a.devices {
                    assert!(seen.insert((a.node.clone(), d.clone())));
                }
            }
        }
        // 4 groups of 16 fill one rack to 64; the fifth must use the other rack.
        let too_wide = Shape {
            tp: 80,
            pp: 1,
            replicas: 1,
        };
        assert!(fleet.place(0, too_wide, None).is_none());
        let limited = Shape {
            tp: 16,
            pp: 1,
            replicas: 1,
        };
        assert!(fleet.place(0, limited, Some(3)).is_none());
        assert!(fleet.place(0, limited, Some(4)).is_some());
    }

    #[test]
    fn nodes_without_a_clique_never_form_wide_groups() {
        let nodes = parse_hardware("18x4xGB200").unwrap();
        let fleet = FreeDevices::new(&nodes, &Reservations::none());
        assert_eq!(fleet.classes[0].largest_rack, 0);
        let shape = Shape {
            tp: 8,
            pp: 1,
            replicas: 1,
        };
        assert!(fleet.place(0, shape, None).is_none());
    }
}
