//! `hwaccel plan --resource-slices FILE`: DRA ResourceSlices as a hardware source for the
//! planner, alone or merged with the `--inventory` files, and the DRA name of every chosen
//! device in the output.
//!
//! A file holds what `kubectl get resourceslices -o yaml|json` prints (a `List`), a
//! `ResourceSliceList`, several YAML documents, or a single slice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Serialize;
use serde_json::Value;

use crate::api::dra::merge::merge_node;
use crate::api::dra::slices::{PublishedFleet, published_devices};
use crate::api::dra::{DeviceRef, PublishedDevice};
use crate::api::{AcceleratorInventory, PlannerDeviceIds};
use crate::detect::pci::canonical_bus_id;
use crate::plan::error::{PlanError, Result};
use crate::plan::inventory::NodeSpec;
use crate::plan::load::read_text;
use crate::plan::report::Plan;

/// A slices file larger than this is refused (a 1,000-node cluster's slices are a few MiB).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// At most this many slices are read over all files.
const MAX_SLICES: usize = 100_000;

/// DRA name by (node, planner device id).
pub type DraNames = BTreeMap<(String, String), DeviceRef>;

/// Reads every slice in `paths`.
pub fn load_resource_slices(paths: &[PathBuf]) -> Result<Vec<ResourceSlice>> {
    let mut slices = Vec::new();
    for path in paths {
        let text = read_text(path, MAX_FILE_BYTES)?;
        for document in documents(path, &text)? {
            collect(path, document, &mut slices)?;
            if slices.len() > MAX_SLICES {
                return Err(invalid(
                    path,
                    format!("more than {MAX_SLICES} ResourceSlices"),
                ));
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

/// The file's documents: one JSON value, or each YAML document.
fn documents(path: &Path, text: &str) -> Result<Vec<Value>> {
    match serde_json::from_str::<Value>(text) {
        Ok(value) => Ok(vec![value]),
        Err(json_err) => serde_saphyr::from_multiple::<Value>(text).map_err(|yaml_err| {
            invalid(
                path,
                format!("neither JSON ({json_err}) nor YAML ({yaml_err})"),
            )
        }),
    }
}

/// Adds the slices of one document: a slice, a list of them, or nothing (an empty document).
fn collect(path: &Path, document: Value, slices: &mut Vec<ResourceSlice>) -> Result<()> {
    let kind = document.get("kind").and_then(Value::as_str).unwrap_or("");
    match kind {
        _ if document.is_null() => Ok(()),
        "List" | "ResourceSliceList" => {
            let Some(Value::Array(items)) = document.get("items").cloned() else {
                return Ok(());
            };
            for item in items {
                collect(path, item, slices)?;
            }
            Ok(())
        }
        "ResourceSlice" => {
            let slice = serde_json::from_value(document)
                .map_err(|err| invalid(path, format!("ResourceSlice: {err}")))?;
            slices.push(slice);
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
        let node = inventory.planner_node(PlannerDeviceIds::Detection);
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
