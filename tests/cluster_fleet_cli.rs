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
