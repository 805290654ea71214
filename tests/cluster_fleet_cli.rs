//! `hwaccel fleet` against a real kube-apiserver: it lists the AcceleratorInventories and
//! ModelPlacements itself, counts the devices a Planned placement's status holds, and reads
//! the expected count from an inventory's status.
//!
//! Needs a cluster: `tests/cluster/up.sh && cargo test --test cluster_tier -- --ignored cluster_fleet_cli::`
//! (see docs/testing.md). Names are unique per run; other tests' objects are ignored.

// Test helpers panic on setup failures by design; clippy only exempts `#[test]` bodies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use anyhow::{Context as _, Result, ensure};
use hwaccel::api::{AcceleratorInventory, ModelPlacement};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{TestCluster, install_crds};

/// The fixture inventory `file` renamed to `name`.
fn inventory(file: &str, name: &str) -> Result<AcceleratorInventory> {
    let text = std::fs::read_to_string(file)?;
    let mut inventory: AcceleratorInventory = serde_saphyr::from_str(&text)?;
    inventory.metadata.name = Some(name.to_string());
    inventory.spec.node_name = name.to_string();
    inventory.status = None;
    Ok(inventory)
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn fleet_reads_inventories_and_placements_from_the_cluster() -> Result<()> {
    let tc = TestCluster::new().await?;
    install_crds(&tc.client()).await?;
    let inventories: Api<AcceleratorInventory> = Api::all(tc.client());
    let sick = tc.unique_name("sick");
    let short = tc.unique_name("short");
    let params = PostParams::default();
    inventories
        .create(
            &params,
            &inventory("fixtures/fleet/inventories/gpu-h100-0.yaml", &sick)?,
        )
        .await?;
    inventories
        .create(
            &params,
            &inventory("fixtures/fleet/inventories/gpu-h100-1.yaml", &short)?,
        )
        .await?;
    // The agent writes expectedDevices into the status subresource.
    inventories
        .patch_status(
            &short,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"expectedDevices": 8, "expectedSource": "seen"}})),
        )
        .await?;

    let placements: Api<ModelPlacement> = Api::namespaced(tc.client(), tc.namespace());
    let name = tc.unique_name("mp");
    let placement: ModelPlacement = serde_json::from_value(json!({
        "apiVersion": "hwaccel.io/v1alpha1",
        "kind": "ModelPlacement",
        "metadata": {"name": name},
        "spec": {"model": {"preset": "llama-3.1-8b"}, "goal": {"serve": {"context": 8192}}}
    }))?;
    placements.create(&params, &placement).await?;
    placements
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "state": "Planned",
                "assignments": [{"node": short, "devices": ["gpu-0000-18-00-0", "gpu-0000-2a-00-0"], "replica": 0, "stage": 0}]
            }})),
        )
        .await?;

    // A stored placement nested past serde_json's recursion limit (the apiserver takes it, a
    // Go client sends it) used to fail the whole list; each object is now decoded on its own,
    // the way the controller reads them.
    let depth = 130;
    let config = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    // The config is JSON text inside the placement (a string field, bounded in size).
    let config = serde_json::to_string(&config)?;
    let deep_name = tc.unique_name("deep");
    let deep = format!(
        r#"{{"apiVersion":"hwaccel.io/v1alpha1","kind":"ModelPlacement",
            "metadata":{{"name":"{deep_name}"}},
            "spec":{{"model":{{"huggingFaceConfig":{config}}},"goal":{{"serve":{{}}}}}}}}"#
    );
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), deep)?;
    let path = file.path().to_string_lossy().into_owned();
    tc.kubectl_ok(&["create", "-f", &path]).await?;

    let report = support::process::hwaccel_json(
        &tc,
        &[
            "fleet",
            "--model",
            "llama-3.1-8b",
            "--context",
            "8192",
            "-o",
            "json",
        ],
    )
    .await
    .context("hwaccel fleet")?;
    let node = |wanted: &str| -> Result<Value> {
        report["health"]["nodes"]
            .as_array()
            .context("nodes")?
            .iter()
            .find(|n| n["name"] == wanted)
            .cloned()
            .with_context(|| format!("{wanted} not in the fleet view"))
    };
    let sick_node = node(&sick)?;
    ensure!(sick_node["unhealthy"] == 1, "{sick_node}");
    ensure!(sick_node["free"] == 7, "{sick_node}");
    let short_node = node(&short)?;
    ensure!(short_node["missing"] == 1, "{short_node}");
    ensure!(short_node["reserved"] == 2, "{short_node}");
    ensure!(short_node["free"] == 5, "{short_node}");
    let answer = &report["capacity"][0];
    ensure!(answer["model"] == "llama-3.1-8b", "{answer}");
    ensure!(
        answer["moreReplicas"].as_u64().unwrap_or(0) >= 12,
        "12 free H100s of ours each hold an 8B replica: {answer}"
    );

    inventories.delete(&sick, &Default::default()).await?;
    inventories.delete(&short, &Default::default()).await?;
    Ok(())
}

/// Issue 39: `hwaccel fleet` counts a small model's replicas as shares of GPUs their driver
/// publishes shareable by memory, leaving out what claims already consume. An inventory of
/// H100s (7 of 8 present) whose first two the NVIDIA driver publishes shareable (`nvidia-h100-shareable.yaml`,
/// matched by PCI bus id), and a claim allocated 48Gi of the first: the first GPU has room
/// for one 24Gi share, the second for three; the first counts as held (a device with a share
/// on it is no free device).
#[tokio::test]
#[ignore = "needs cluster"]
async fn fleet_counts_replicas_as_shares_of_shareable_gpus_and_leaves_out_what_claims_consume()
-> Result<()> {
    use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
    let tc = TestCluster::new().await?;
    install_crds(&tc.client()).await?;
    let node = tc.unique_name("shared");
    let inventories: Api<AcceleratorInventory> = Api::all(tc.client());
    inventories
        .create(
            &PostParams::default(),
            &inventory("fixtures/fleet/inventories/gpu-h100-1.yaml", &node)?,
        )
        .await?;
    crate::cluster_dra::publish_fixture(&tc, "nvidia-h100-shareable.yaml", &node).await?;
    let slices: Api<ResourceSlice> = Api::all(tc.client());
    let shareable =
        crate::cluster_dra::serves_shares(&tc, &format!("{node}-gpu.nvidia.com-0")).await?;
    let result = if shareable {
        shares_in_fleet(&tc, &node).await
    } else {
        eprintln!("skipped: the apiserver serves no consumable capacity (1.35)");
        Ok(())
    };
    for slice in slices.list(&Default::default()).await?.items {
        if slice.spec.node_name.as_deref() == Some(node.as_str()) {
            slices
                .delete(
                    &slice.metadata.name.unwrap_or_default(),
                    &Default::default(),
                )
                .await?;
        }
    }
    inventories.delete(&node, &Default::default()).await?;
    let _ = Api::<ResourceClaim>::namespaced(tc.client(), tc.namespace())
        .delete("tenant-share", &Default::default())
        .await;
    result
}

async fn shares_in_fleet(tc: &TestCluster, node: &str) -> Result<()> {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let claims: Api<ResourceClaim> = Api::namespaced(tc.client(), tc.namespace());
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "tenant-share"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": "48Gi"}}}}]}},
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    claims
        .patch_status(
            "tenant-share",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": {
                "allocationTimestamp": "2026-11-29T00:00:00Z",
                "devices": {"results": [{
                    "request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0",
                    "consumedCapacity": {"memory": "48Gi"},
                    "shareID": "2c6f5a0e-8d1b-4e6a-9f3c-7b2d1e0a9c84"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
            }}})),
        )
        .await?;
    let report = support::process::hwaccel_json(
        tc,
        &[
            "fleet",
            "--model",
            "llama-3.1-8b",
            "--context",
            "8192",
            "--precision",
            "bf16",
            "-o",
            "json",
        ],
    )
    .await
    .context("hwaccel fleet")?;
    let answer = &report["capacity"][0];
    let shares: u64 = answer["packing"]
        .as_array()
        .context("packing")?
        .iter()
        .filter(|p| p["shareBytes"] == json!(24u64 << 30))
        .map(|p| p["replicas"].as_u64().unwrap_or(0))
        .sum();
    ensure!(
        shares == 4,
        "one 24Gi share beside the claim's 48Gi, three on the other GPU: {answer}"
    );
    let counted = report["health"]["nodes"]
        .as_array()
        .context("nodes")?
        .iter()
        .find(|n| n["name"] == node)
        .cloned()
        .context("the node")?;
    // The inventory lists 7 of its 8 GPUs (one is missing).
    ensure!(
        counted["devices"] == 7 && counted["reserved"] == 1 && counted["free"] == 6,
        "the GPU with a share on it is no free device: {counted}"
    );
    eprintln!("hwaccel fleet: {shares} replicas as 24Gi shares; {counted}");
    Ok(())
}
