//! Where `hwaccel fleet` gets the fleet: inventory and placement files, or the cluster.
//!
//! Inventories become planner nodes through the one conversion
//! (`dra::inventory_node::planner_node`, devices named as in the inventory, the names
//! placements hold them by), read by the planner's own bounded file loader; what the
//! conversion leaves out (unhealthy or unplannable devices, the expected count) is kept beside
//! each node for the health roll-up (`dra::inventory_node::fleet_node`, the conversion the
//! controller counts through too). A placement's held devices are read the way the
//! controller rebuilds its ledger at start-up (`holding_from_status`, then `Ledger::rebuild`),
//! so two placements claiming one device count it once. From the cluster, where DRA is
//! served, allocated ResourceClaims and the devices whose DRA counters they used up are held
//! too, by the controller's own rule (`claim_holdings::held_outside`), so the counts agree
//! with the controller's and the scheduler's.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{AcceleratorInventory, Lenient, ModelPlacement};
use crate::controller::core::claim_holdings::held_outside;
use crate::controller::core::fleet_view::{FleetView, NodePart};
use crate::controller::core::ledger::rebuild::holding_from_status;
use crate::controller::core::ledger::{Ledger, Take};
use crate::dra::audit::{Audit, audit_fleet};
use crate::dra::inventory_node::fleet_node;
use crate::dra::slices::published_devices;
use crate::fleet::health::NodeInput;
use crate::plan::Reservations;
use crate::plan::error::{PlanError, Result};
use crate::plan::load::{MAX_FILE_BYTES, load_inventories, read_text};
use crate::plan::share::Shareable;

/// Objects per list request.
const PAGE_SIZE: u32 = 500;
/// Most list pages read (a million objects at the page size).
const MAX_PAGES: usize = 2000;
/// The whole cluster read must end within this.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);

/// The fleet as the command reads it.
#[derive(Debug, Default)]
pub struct FleetInput {
    /// Nodes with what the planner leaves out of them.
    pub nodes: Vec<NodeInput>,
    /// Devices placements hold.
    pub reserved: Reservations,
    /// Devices held otherwise: allocated ResourceClaims the placements do not account for,
    /// and devices whose DRA counters claims used up (none from files).
    pub claimed: Reservations,
    /// Placements counted.
    pub placements: usize,
    /// What was skipped while reading, one line each.
    pub notes: Vec<String>,
    /// Nodes whose detected, DRA-published and plugin-advertised devices disagree, with the
    /// publication audit's gaps (`dra::audit`).
    pub publication: BTreeMap<String, Audit>,
}

/// One inventory as a roll-up node: the one conversion, `dra::inventory_node::fleet_node`.
pub fn node_input(inventory: &AcceleratorInventory) -> (NodeInput, Vec<String>) {
    fleet_node(inventory)
}

/// Reads `--inventory` paths with the planner's loader; inventory objects keep their
/// unplannable devices and expected count, other files (node lists, detection reports) give
/// nodes whose every device is plannable.
pub fn from_files(inventories: &[PathBuf], placements: &[PathBuf]) -> Result<FleetInput> {
    let extras: RefCell<BTreeMap<String, NodeInput>> = RefCell::new(BTreeMap::new());
    let read_inventories: RefCell<Vec<AcceleratorInventory>> = RefCell::new(Vec::new());
    let reader = |kind: &str, object: &Value| {
        (kind == "AcceleratorInventory").then(|| {
            let inventory: AcceleratorInventory = serde_json::from_value(object.clone())
                .map_err(|err| format!("AcceleratorInventory: {err}"))?;
            let (input, notes) = node_input(&inventory);
            let node = input.node.clone();
            extras.borrow_mut().insert(node.name.clone(), input);
            read_inventories.borrow_mut().push(inventory);
            Ok((node, notes))
        })
    };
    let (nodes, mut notes) = load_inventories(inventories, &reader)?;
    let mut extras = extras.into_inner();
    let nodes: Vec<NodeInput> = nodes
        .into_iter()
        .map(|node| match extras.remove(&node.name) {
            Some(input) => input,
            None => NodeInput::plannable(node),
        })
        .collect();
    let mut read = Vec::new();
    for path in placements {
        read.extend(placements_in(path, &mut notes)?);
    }
    let (reserved, count) = held(&read);
    let reserved = resolved(reserved, &nodes, &mut notes);
    // Files carry no slices: only what the inventories themselves say (device plugins).
    let publication = audit_fleet(&read_inventories.into_inner(), &[], &BTreeMap::new());
    Ok(FleetInput {
        nodes,
        reserved,
        claimed: Reservations::none(),
        placements: count,
        notes,
        publication,
    })
}

/// The ModelPlacements in one file: a single object, a `List`, or a bare array, JSON or YAML.
/// Objects of another kind are skipped; a malformed placement is a note, not an error.
fn placements_in(path: &Path, notes: &mut Vec<String>) -> Result<Vec<ModelPlacement>> {
    let text = read_text(path, MAX_FILE_BYTES)?;
    let value: Value = match serde_json::from_str(&text) {
        Ok(value) => value,
        Err(json) => serde_saphyr::from_str(&text).map_err(|yaml| PlanError::InvalidInventory {
            path: path.to_path_buf(),
            reason: format!("neither JSON ({json}) nor YAML ({yaml})"),
        })?,
    };
    let items: Vec<Value> = match value {
        Value::Array(items) => items,
        Value::Object(mut map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
            match map.remove("items") {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            }
        }
        other => vec![other],
    };
    let mut found = Vec::new();
    for item in items {
        if item.get("kind").and_then(Value::as_str) != Some("ModelPlacement") {
            continue;
        }
        match decode::<ModelPlacement>(item) {
            Ok(mut placement) => {
                // A hand-written file may leave the namespace out; the apiserver would
                // default it the same way.
                placement
                    .metadata
                    .namespace
                    .get_or_insert_with(|| "default".to_string());
                found.push(placement);
            }
            Err(err) => notes.push(format!("{}: skipped a placement: {err}", path.display())),
        }
    }
    Ok(found)
}

fn decode<T: DeserializeOwned>(value: Value) -> std::result::Result<T, String> {
    serde_json::from_value(value).map_err(|err| err.to_string())
}

/// The devices the placements hold, as the controller's ledger counts them, and how many
/// placements hold any.
fn held(placements: &[ModelPlacement]) -> (Reservations, usize) {
    let (ledger, _dropped) = Ledger::rebuild(placements.iter().filter_map(holding_from_status));
    let mut reserved = Reservations::none();
    for (_, holding) in ledger.iter() {
        let take = holding.take();
        for (node, device) in holding.devices() {
            match take {
                Take::Whole => reserved.insert(node, device),
                Take::Share { bytes, .. } => reserved.consume(node, device, bytes),
            }
        }
    }
    (reserved, ledger.len())
}

/// The held devices named as the nodes name them: a placement file may name a device by
/// its PCI address or UUID as well as by its inventory name. A held device no inventory lists
/// (gone since, or a typo) is a note, never silently dropped.
fn resolved(held: Reservations, nodes: &[NodeInput], notes: &mut Vec<String>) -> Reservations {
    let planner: Vec<crate::plan::NodeSpec> = nodes.iter().map(|n| n.node.clone()).collect();
    let mut out = Reservations::none();
    // Shares are held by the controller's placements, which name devices as the inventory.
    for (node, device, bytes) in held.iter_consumed() {
        out.consume(node, device, bytes);
    }
    for (node, device) in held.iter() {
        if let Ok(found) = crate::plan::inventory::resolve_device(&planner, node, device) {
            out.insert(node, found.id.clone());
            continue;
        }
        // Held although not plannable now (it went unhealthy under its placement), or a
        // published partition of a device.
        let present = nodes.iter().find(|n| n.node.name == node).is_some_and(|n| {
            n.devices.iter().any(|d| d.name == device)
                || n.node
                    .devices
                    .iter()
                    .any(|d| d.partitions.iter().any(|p| p.id == device))
        });
        if present {
            out.insert(node, device);
        } else {
            notes.push(format!(
                "a placement holds {node}/{device}, which no inventory lists: not counted"
            ));
        }
    }
    out
}

/// Reads every AcceleratorInventory and ModelPlacement from the cluster of the current
/// kubeconfig (or in-cluster config), page by page, within [`CLUSTER_TIMEOUT`].
pub fn from_cluster() -> anyhow::Result<FleetInput> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        tokio::time::timeout(CLUSTER_TIMEOUT, read_cluster())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "reading the cluster took longer than {}s",
                    CLUSTER_TIMEOUT.as_secs()
                )
            })?
    })
}

async fn read_cluster() -> anyhow::Result<FleetInput> {
    let client =
        crate::kube_client::client(crate::kube_client::DEFAULT_API_TIMEOUT, "fleet").await?;
    let mut notes = Vec::new();
    let inventories: Vec<AcceleratorInventory> = list_all(client.clone(), &mut notes).await?;
    let placements: Vec<ModelPlacement> = list_all(client.clone(), &mut notes).await?;
    let mut nodes = Vec::with_capacity(inventories.len());
    for inventory in &inventories {
        let (input, skipped) = node_input(inventory);
        nodes.push(input);
        notes.extend(skipped);
    }
    nodes.sort_by(|a, b| a.node.name.cmp(&b.node.name));
    let (mut reserved, count) = held(&placements);
    let publication;
    let claimed = match read_dra(&client).await? {
        Some((slices, claims)) => {
            // Node labels are not read (a list of every whole Node): no stale-label check.
            publication = audit_fleet(&inventories, &slices, &BTreeMap::new());
            let (claimed, verdicts, through) = claimed(&inventories, &placements, &slices, &claims);
            // A placement holding partitions holds their device, as the controller counts it.
            for (node, device) in through {
                reserved.insert(node, device);
            }
            nodes = nodes
                .into_iter()
                .map(|node| match verdicts.get(&node.node.name) {
                    Some(published) => with_published(
                        node.with_published_verdicts(&published.unusable)
                            .with_published_notices(&published.notices),
                        published,
                    ),
                    None => node,
                })
                .collect();
            claimed
        }
        None => {
            notes.push(
                "resource.k8s.io/v1 not served or not readable: ResourceClaims not counted"
                    .to_string(),
            );
            publication = audit_fleet(&inventories, &[], &BTreeMap::new());
            Reservations::none()
        }
    };
    let reserved = resolved(reserved, &nodes, &mut notes);
    Ok(FleetInput {
        nodes,
        reserved,
        claimed,
        placements: count,
        notes,
        publication,
    })
}

/// Every ResourceSlice and ResourceClaim, or `None` where the cluster serves no DRA (404) or
/// this user may not read it (403).
async fn read_dra(
    client: &kube::Client,
) -> anyhow::Result<Option<(Vec<ResourceSlice>, Vec<ResourceClaim>)>> {
    let slices = match list_typed::<ResourceSlice>(client.clone()).await {
        Ok(slices) => slices,
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 403 => {
            return Ok(None);
        }
        Err(err) => return Err(err.into()),
    };
    let claims = match list_typed::<ResourceClaim>(client.clone()).await {
        Ok(claims) => claims,
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 403 => {
            return Ok(None);
        }
        Err(err) => return Err(err.into()),
    };
    Ok(Some((slices, claims)))
}

/// Per node, the devices the planner leaves out for what their DRA driver publishes (shared,
/// published only in parts...), with why.
/// Per node: the devices not plannable with why, and the plannable ones flagged with an
/// informational taint.
/// What the node's DRA drivers publish that the counts and the planner take in.
#[derive(Debug, Default)]
struct Published {
    /// Devices present but not plannable, with why.
    unusable: BTreeMap<String, String>,
    /// Devices with an informational taint, with it.
    notices: BTreeMap<String, String>,
    /// Devices published shareable by memory, with their policy, by planner device id.
    shares: BTreeMap<String, Shareable>,
    /// Devices published only in partitions (an AMD GPU partitioned on its node): never
    /// planned whole.
    partitions_only: BTreeSet<String>,
    /// The partitions published of each device, by device id: the answers count replicas on
    /// them first.
    partitions: BTreeMap<String, Vec<crate::plan::share::Partition>>,
}

/// Per node, what its DRA drivers publish.
type Verdicts = BTreeMap<String, Published>;

/// The devices placements hold through partitions of them, as `(node, device)`: the GPU of a
/// MIG device or an AMD partition a placement holds, counted as the placement's, as the
/// controller counts it (`Ledger::held_through_counters`).
type HeldThrough = Vec<(String, String)>;

/// `node` with what its drivers publish of each device that the capacity answers count on:
/// the share policy of a device shareable by memory, the partitions of a partitioned one, and
/// whether it is published only in partitions.
fn with_published(mut node: NodeInput, published: &Published) -> NodeInput {
    for device in &mut node.node.devices {
        if let Some(share) = published.shares.get(&device.id) {
            device.share = Some(share.clone());
        }
        // A device published only in partitions is counted through them, never whole.
        device.partitions_only = published.partitions_only.contains(&device.id);
        device.partitions = published
            .partitions
            .get(&device.id)
            .cloned()
            .unwrap_or_default();
    }
    node
}

/// The devices of the inventories' nodes held outside the placements, by the controller's
/// rule: the fleet view merges each inventory with its node's published devices, and
/// `held_outside` adds allocated claims and the devices their counters block. With them, the
/// merged view's verdicts, so the counts leave out what the planner leaves out.
fn claimed(
    inventories: &[AcceleratorInventory],
    placements: &[ModelPlacement],
    slices: &[ResourceSlice],
    claims: &[ResourceClaim],
) -> (Reservations, Verdicts, HeldThrough) {
    let published = published_devices(slices);
    let parts = inventories.iter().map(|inventory| {
        let node = inventory.spec.node_name.as_str();
        std::sync::Arc::new(NodePart::with_published(
            node,
            Some(inventory),
            published.node(node),
        ))
    });
    let fleet = FleetView::from_parts(parts, &BTreeMap::new()).with_counters(slices);
    let (ledger, _dropped) = Ledger::rebuild(placements.iter().filter_map(holding_from_status));
    let claims: Vec<&ResourceClaim> = claims.iter().collect();
    let slices: Vec<&ResourceSlice> = slices.iter().collect();
    let verdicts = inventories
        .iter()
        .filter_map(|inventory| {
            let node = &inventory.spec.node_name;
            let unusable = fleet.unplannable_on(node)?.clone();
            let notices = fleet.notices_on(node).cloned().unwrap_or_default();
            let shares = fleet
                .shareable_on(node)
                .iter()
                .filter_map(|device| Some((device.id.clone(), device.share.clone()?)))
                .collect();
            let partitions_only = crate::plan::inventory::find_node(fleet.nodes(), node)
                .map(|spec| {
                    spec.devices
                        .iter()
                        .filter(|d| d.partitions_only)
                        .map(|d| d.id.clone())
                        .collect()
                })
                .unwrap_or_default();
            let partitions = fleet.partitions_on(node).cloned().unwrap_or_default();
            Some((
                node.clone(),
                Published {
                    unusable,
                    notices,
                    shares,
                    partitions_only,
                    partitions,
                },
            ))
        })
        .collect();
    let outside = held_outside(&claims, &slices, &ledger, &fleet);
    let claimed = outside.devices.clone();
    let mut ledger = ledger;
    ledger.set_external(outside);
    let through: HeldThrough = ledger
        .held_through_counters()
        .map(|(node, device)| (node.to_string(), device.to_string()))
        .collect();
    (claimed, verdicts, through)
}

/// Every object of `K` in all namespaces, page by page (DRA objects: typed, one malformed
/// object fails the list).
async fn list_typed<K>(client: kube::Client) -> std::result::Result<Vec<K>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client);
    let mut found = Vec::new();
    let mut params = ListParams::default().limit(PAGE_SIZE);
    for _ in 0..MAX_PAGES {
        let page = api.list(&params).await?;
        found.extend(page.items);
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    Ok(found)
}

/// Lists every object of `K` in all namespaces. Objects are decoded one by one the way the
/// controller decodes them ([`Lenient`]: raw JSON first, so even an object nested past
/// serde_json's recursion limit fails alone), so one malformed object is a note instead of a
/// failed list.
async fn list_all<K>(client: kube::Client, notes: &mut Vec<String>) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource<DynamicType = ()>
        + DeserializeOwned
        + crate::api::projection::Projection
        + Clone
        + std::fmt::Debug,
{
    let api: Api<Lenient<K>> = Api::all(client);
    let kind = K::kind(&());
    let mut found = Vec::new();
    let mut params = ListParams::default().limit(PAGE_SIZE);
    for _ in 0..MAX_PAGES {
        let page = api.list(&params).await?;
        for object in page.items {
            match object {
                Lenient::Decoded(typed) => found.push(typed),
                Lenient::Undecodable { metadata, error } => notes.push(format!(
                    "{kind} {}: skipped: {error}",
                    metadata.name.unwrap_or_default()
                )),
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(found),
        }
    }
    notes.push(format!(
        "{kind}: stopped after {MAX_PAGES} pages of {PAGE_SIZE}"
    ));
    Ok(found)
}
