//! `hwaccel plan --resource-slices FILE`: DRA ResourceSlices as a hardware source for the
//! planner, alone or merged with the `--inventory` files, and the DRA name of every chosen
//! device in the output.
//!
//! A file holds what `kubectl get resourceslices -o yaml|json` prints (a `List`), a
//! `ResourceSliceList`, several YAML documents, or a single slice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::AcceleratorInventory;
use crate::detect::pci::canonical_bus_id;
use crate::dra::inventory_node::{PlannerDeviceIds, planner_node};
use crate::dra::merge::merge_node;
use crate::dra::slices::{PublishedFleet, published_devices};
use crate::dra::{DeviceRef, PublishedDevice};
use crate::plan::error::{PlanError, Result};
use crate::plan::inventory::NodeSpec;
use crate::plan::load::read_text;
use crate::plan::report::Plan;

/// A slices file larger than this is refused (a 1,000-node cluster's slices are a few MiB).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// At most this many slices are read over all files.
const MAX_SLICES: usize = 100_000;

/// The API version of the slices read (`resource.k8s.io/v1`).
const SLICE_API_VERSION: &str = <ResourceSlice as k8s_openapi::Resource>::API_VERSION;

/// DRA name by (node, planner device id).
pub type DraNames = BTreeMap<(String, String), DeviceRef>;

/// Reads every slice in `paths`.
///
/// Each document is decoded straight into slices, with no generic JSON or YAML tree in
/// between and no copy of a list's items (issue 35: a 30 MB file took 2.2 GB that way); a
/// file over `MAX_FILE_BYTES` or more than `MAX_SLICES` slices are refused with the
/// reason before they are decoded whole.
pub fn load_resource_slices(paths: &[PathBuf]) -> Result<Vec<ResourceSlice>> {
    let mut slices = Vec::new();
    for path in paths {
        let text = read_text(path, MAX_FILE_BYTES)?;
        let room = MAX_SLICES.saturating_sub(slices.len());
        for document in documents(path, &text, room)? {
            collect(path, document, &mut slices)?;
            if slices.len() > MAX_SLICES {
                return Err(too_many(path));
            }
        }
    }
    Ok(slices)
}

fn invalid(path: &Path, reason: String) -> PlanError {
    PlanError::InvalidInventory {
        path: path.to_path_buf(),
        reason,
    }
}

fn too_many(path: &Path) -> PlanError {
    invalid(path, format!("more than {MAX_SLICES} ResourceSlices"))
}

/// One document of a slices file, decoded as a slice and as a list at once (its `kind`, which
/// may come last, says which it is): the fields of both, the list's items as slices.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    items: Option<Items>,
    #[serde(default)]
    metadata: Option<ObjectMeta>,
    #[serde(default)]
    spec: Option<ResourceSliceSpec>,
}

/// A list's items, each decoded as a ResourceSlice (an item of another kind is an error), at
/// most [`MAX_SLICES`] of them.
#[derive(Debug, Default)]
struct Items(Vec<ResourceSlice>);

impl<'de> Deserialize<'de> for Items {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Bounded;
        impl<'de> Visitor<'de> for Bounded {
            type Value = Items;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of ResourceSlices")
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Items, A::Error> {
                let mut items = Vec::new();
                while let Some(slice) = seq.next_element::<ResourceSlice>()? {
                    if items.len() == MAX_SLICES {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_SLICES} ResourceSlices"
                        )));
                    }
                    items.push(slice);
                }
                Ok(Items(items))
            }
        }
        deserializer.deserialize_seq(Bounded)
    }
}

/// The file's documents: one JSON value, or each YAML document; at most `room` of them (an
/// empty YAML document is skipped, each other one holds at least a slice or is refused).
fn documents(path: &Path, text: &str, room: usize) -> Result<Vec<Document>> {
    let json_err = match serde_json::from_str::<Option<Document>>(text) {
        Ok(document) => return Ok(document.into_iter().collect()),
        Err(err) => err,
    };
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_documents: room.saturating_add(1),
            max_nodes: usize::MAX,
            max_events: usize::MAX,
            max_total_scalar_bytes: usize::MAX,
        },
    };
    serde_saphyr::from_multiple_with_options::<Document>(text, options).map_err(|yaml_err| {
        invalid(
            path,
            format!("neither JSON ({json_err}) nor YAML ({yaml_err})"),
        )
    })
}

/// Adds the slices of one document: a slice, a list of them, or nothing (an empty document).
fn collect(path: &Path, document: Document, slices: &mut Vec<ResourceSlice>) -> Result<()> {
    match document.kind.as_deref().unwrap_or("") {
        "List" | "ResourceSliceList" => {
            slices.extend(document.items.map(|items| items.0).unwrap_or_default());
            Ok(())
        }
        "ResourceSlice" => {
            if let Some(version) = document.api_version.filter(|v| v != SLICE_API_VERSION) {
                return Err(invalid(
                    path,
                    format!("ResourceSlice: apiVersion {version:?}, expected {SLICE_API_VERSION}"),
                ));
            }
            slices.push(ResourceSlice {
                metadata: document.metadata.unwrap_or_default(),
                spec: document.spec.unwrap_or_default(),
            });
            Ok(())
        }
        "" if document.items.is_none()
            && document.spec.is_none()
            && document.metadata.is_none() =>
        {
            Ok(())
        }
        other => Err(invalid(
            path,
            format!("expected ResourceSlices, found kind {other:?}"),
        )),
    }
}

/// The planner nodes with the published devices merged in, the DRA name of each device a
/// driver publishes, and notes. Nodes from AcceleratorInventories are merged as the
/// controller merges them (devices then carry the inventory's names); nodes from detection
/// reports are matched by PCI bus id; nodes only the slices know are added.
pub fn merge_slices(
    nodes: Vec<NodeSpec>,
    inventories: &[AcceleratorInventory],
    slices: &[ResourceSlice],
) -> (Vec<NodeSpec>, DraNames, Vec<String>) {
    let fleet: PublishedFleet = published_devices(slices);
    let mut notes = fleet.notes.clone();
    let mut names = DraNames::new();
    let mut out = Vec::with_capacity(nodes.len());
    let mut seen = std::collections::BTreeSet::new();
    for node in nodes {
        seen.insert(node.name.clone());
        let published = fleet.node(&node.name);
        let inventory = inventories.iter().find(|i| i.spec.node_name == node.name);
        let merged = match inventory {
            Some(inventory) if !published.is_empty() => {
                let merged = merge_node(&node.name, Some(inventory), published);
                notes.extend(merged.notes);
                record(&mut names, &node.name, merged.dra);
                NodeSpec {
                    labels: node.labels,
                    ..merged.node
                }
            }
            _ if published.is_empty() => node,
            _ => merge_by_bus_id(node, published, &mut names, &mut notes),
        };
        out.push(merged);
    }
    for (name, published) in &fleet.nodes {
        if seen.contains(name) {
            continue;
        }
        let merged = merge_node(name, None, published);
        notes.extend(merged.notes);
        record(&mut names, name, merged.dra);
        out.push(merged.node);
    }
    (out, names, notes)
}

fn record(names: &mut DraNames, node: &str, dra: BTreeMap<String, DeviceRef>) {
    for (device, reference) in dra {
        names.insert((node.to_string(), device), reference);
    }
}

/// A node from a detection report (device ids are PCI bus ids) and its published devices.
fn merge_by_bus_id(
    mut node: NodeSpec,
    published: &[PublishedDevice],
    names: &mut DraNames,
    notes: &mut Vec<String>,
) -> NodeSpec {
    let mut unmatched = Vec::new();
    for device in published {
        let found = device.pci_bus_id.as_ref().and_then(|bus| {
            node.devices
                .iter()
                .find(|d| canonical_bus_id(&d.id).as_ref() == Some(bus))
                .map(|d| d.id.clone())
        });
        let Some(id) = found else {
            unmatched.push(device.clone());
            continue;
        };
        if let Some(why) = &device.unusable {
            node.devices.retain(|d| d.id != id);
            notes.push(format!(
                "{id} not planned: {} publishes it as {why}",
                device.reference
            ));
        } else if let Some(spec) = node.devices.iter_mut().find(|d| d.id == id) {
            spec.share = device.shareable();
        }
        names.insert((node.name.clone(), id), device.reference.clone());
    }
    if !unmatched.is_empty() {
        let extra = merge_node(&node.name, None, &unmatched);
        notes.extend(extra.notes);
        record(names, &node.name, extra.dra);
        node.devices.extend(extra.node.devices);
    }
    node
}

/// Reads `AcceleratorInventory` objects for the planner's file loader, keeping each one so
/// its node can be merged with slices later.
pub fn keep_inventory(
    kept: &std::cell::RefCell<Vec<AcceleratorInventory>>,
    kind: &str,
    object: &Value,
) -> Option<std::result::Result<(NodeSpec, Vec<String>), String>> {
    (kind == "AcceleratorInventory").then(|| {
        let inventory: AcceleratorInventory = serde_json::from_value(object.clone())
            .map_err(|err| format!("AcceleratorInventory: {err}"))?;
        let node = planner_node(&inventory, PlannerDeviceIds::Detection);
        kept.borrow_mut().push(inventory);
        Ok(node)
    })
}

/// One chosen device and its DRA name.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChosenDevice {
    /// Replica index.
    pub replica: u32,
    /// Pipeline stage.
    pub stage: u32,
    /// Node name.
    pub node: String,
    /// Planner device id.
    pub device: String,
    /// The device's DRA name.
    pub dra: DeviceRef,
}

/// The chosen devices that a DRA driver publishes, in assignment order.
pub fn chosen_devices(plan: &Plan, names: &DraNames) -> Vec<ChosenDevice> {
    plan.assignments
        .iter()
        .flat_map(|a| {
            a.devices.iter().filter_map(move |device| {
                let dra = names.get(&(a.node.clone(), device.clone()))?;
                Some(ChosenDevice {
                    replica: a.replica,
                    stage: a.stage,
                    node: a.node.clone(),
                    device: device.clone(),
                    dra: dra.clone(),
                })
            })
        })
        .collect()
}

/// The table section naming each chosen device's DRA name.
pub fn table_section(chosen: &[ChosenDevice]) -> String {
    if chosen.is_empty() {
        return "\nDRA devices: none of the chosen devices is published by a DRA driver\n".into();
    }
    let mut table = crate::output::Table::new(["REPLICA", "STAGE", "NODE", "DEVICE", "DRA DEVICE"]);
    for c in chosen {
        table.row([
            c.replica.to_string(),
            c.stage.to_string(),
            c.node.clone(),
            c.device.clone(),
            c.dra.to_string(),
        ]);
    }
    format!("\nDRA devices:\n{}", table.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` slices of one device each with a few attributes, as `kubectl get -o yaml`
    /// prints a `List`.
    fn yaml_list(count: usize) -> String {
        let mut text = String::from("apiVersion: v1\nkind: List\nitems:\n");
        for n in 0..count {
            text.push_str(&format!(
                "- apiVersion: resource.k8s.io/v1\n  kind: ResourceSlice\n  metadata:\n    \
                 name: node-{n}-slice\n  spec:\n    driver: gpu.nvidia.com\n    nodeName: node-{n}\n    \
                 pool:\n      name: node-{n}\n      generation: 1\n      resourceSliceCount: 1\n    \
                 devices:\n    - name: gpu-0\n      attributes:\n        productName:\n          \
                 string: NVIDIA H100 80GB HBM3\n        uuid:\n          string: GPU-{n}\n      \
                 capacity:\n        memory:\n          value: 80Gi\n"
            ));
        }
        text
    }

    /// Issue 35: a large slices file went through a generic tree and copies (2.2 GB for
    /// 30 MB), and a YAML one past 250,000 nodes was refused by the parser's default budget.
    /// Slices are decoded directly now, however many YAML nodes the file has.
    #[test]
    fn a_large_yaml_list_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slices.yaml");
        std::fs::write(&path, yaml_list(15_000)).unwrap();
        let slices = load_resource_slices(std::slice::from_ref(&path)).unwrap();
        assert_eq!(slices.len(), 15_000);
        assert_eq!(slices[14_999].spec.node_name.as_deref(), Some("node-14999"));
        let devices = slices[0].spec.devices.as_ref().unwrap();
        assert_eq!(devices[0].name, "gpu-0");
    }

    #[test]
    fn too_many_slices_or_other_kinds_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("many.json");
        let items = vec!["{}"; MAX_SLICES + 1].join(",");
        std::fs::write(&path, format!(r#"{{"kind":"List","items":[{items}]}}"#)).unwrap();
        let err = load_resource_slices(std::slice::from_ref(&path)).unwrap_err();
        assert!(
            err.to_string().contains("more than 100000 ResourceSlices"),
            "{err}"
        );

        let path = dir.path().join("pods.json");
        std::fs::write(
            &path,
            r#"{"kind":"List","items":[{"apiVersion":"v1","kind":"Pod"}]}"#,
        )
        .unwrap();
        let err = load_resource_slices(std::slice::from_ref(&path)).unwrap_err();
        assert!(
            err.to_string().contains("expected resource.k8s.io/v1"),
            "{err}"
        );
        let path = dir.path().join("old.yaml");
        std::fs::write(
            &path,
            "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceSlice\n",
        )
        .unwrap();
        let err = load_resource_slices(std::slice::from_ref(&path)).unwrap_err();
        assert!(
            err.to_string().contains("expected resource.k8s.io/v1"),
            "{err}"
        );
    }
}
