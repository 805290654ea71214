//! `hwaccel lint-slices` against the real apiserver: for every vendor-shaped fixture slice and
//! for crafted slices at the edges of the apiserver's rules, the linter says "refused"
//! exactly when a server-side dry-run create of the slice is refused. The dry run validates
//! and admits the object as a create would and persists nothing, so the test leaves nothing
//! behind and may reuse names.
//!
//! `tests/cluster/up.sh && cargo test --test cluster_tier -- --ignored cluster_dra_lint::`

// Test helpers panic on setup failures by design; clippy only exempts `#[test]` bodies.
#![allow(clippy::expect_used)]

use crate::support;

use anyhow::{Context as _, Result};
use hwaccel::cli::plan_dra::load_resource_slices;
use hwaccel::dra::lint::{Class, lint};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::TestCluster;

/// An AMD whole GPU in the driver's 2026 layout, with `attributes` merged in (`null` removes).
fn amd_slice(name: &str, attributes: Value, spec: Value) -> ResourceSlice {
    let mut attrs = json!({
        "type": {"string": "amdgpu"},
        "productName": {"string": "AMD_Instinct_MI300X"},
        "driverVersion": {"version": "6.10.5"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:11:00.0"},
    });
    for (key, value) in attributes.as_object().into_iter().flatten() {
        attrs[key] = value.clone();
    }
    let mut slice = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.amd.com",
            "nodeName": "lint-node",
            "pool": {"name": "lint-node", "generation": 1, "resourceSliceCount": 1},
            "devices": [{
                "name": "gpu-1-128",
                "attributes": attrs,
                "capacity": {"memory": {"value": "196592Mi"}},
            }],
        }
    });
    for (key, value) in spec.as_object().into_iter().flatten() {
        if key == "devices" {
            slice["spec"]["devices"] = value.clone();
        } else {
            slice["spec"][key] = value.clone();
        }
    }
    serde_json::from_value(slice).expect("a ResourceSlice")
}

/// Whether a server-side dry-run create of `slice` is refused, and the apiserver's words.
async fn apiserver_refuses(
    api: &Api<ResourceSlice>,
    slice: &ResourceSlice,
) -> Result<Option<String>> {
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api.create(&params, slice).await {
        Ok(_) => Ok(None),
        // 422 for a failed validation, 400 for a value that does not decode (a quantity).
        Err(kube::Error::Api(status)) if matches!(status.code, 400 | 422) => {
            Ok(Some(status.message))
        }
        Err(e) => Err(e).context("dry-run create"),
    }
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn the_linter_refuses_exactly_what_the_apiserver_refuses() -> Result<()> {
    let tc = TestCluster::new().await?;
    let api: Api<ResourceSlice> = Api::all(tc.client());

    let mut cases: Vec<(String, ResourceSlice)> = Vec::new();
    let mut fixture_files: Vec<_> = std::fs::read_dir("fixtures/dra")?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    fixture_files.retain(|p| p.extension().is_some_and(|x| x == "yaml" || x == "json"));
    fixture_files.sort();
    fixture_files.push("fixtures/dra-lint/refused-driver-version.yaml".into());
    fixture_files.push("fixtures/dra-lint/empty-slice.yaml".into());
    fixture_files.push("fixtures/dra-lint/attribute-anomalies.yaml".into());
    for file in &fixture_files {
        for mut slice in load_resource_slices(std::slice::from_ref(file))? {
            // Only what a driver sends: no owner (the fixtures name Nodes of other clusters).
            slice.metadata.owner_references = None;
            slice.metadata.resource_version = None;
            slice.metadata.uid = None;
            cases.push((format!("{}", file.display()), slice));
        }
    }
    let name = tc.unique_name("lint");
    let long = "x".repeat(65);
    let mut many = serde_json::Map::new();
    for i in 0..33 {
        many.insert(format!("a{i}"), json!({"int": i}));
    }
    let crafted: Vec<(&str, ResourceSlice)> = vec![
        ("valid", amd_slice(&name, json!({}), json!({}))),
        (
            "four-part version",
            amd_slice(
                &name,
                json!({"driverVersion": {"version": "6.10.5.60205"}}),
                json!({}),
            ),
        ),
        (
            "leading zero",
            amd_slice(
                &name,
                json!({"driverVersion": {"version": "580.65.06"}}),
                json!({}),
            ),
        ),
        (
            "pre-release and build",
            amd_slice(
                &name,
                json!({"driverVersion": {"version": "6.10.5-rc.1+b2"}}),
                json!({}),
            ),
        ),
        (
            "65-byte string",
            amd_slice(&name, json!({"productName": {"string": long}}), json!({})),
        ),
        (
            "64-byte string",
            amd_slice(
                &name,
                json!({"productName": {"string": "x".repeat(64)}}),
                json!({}),
            ),
        ),
        (
            "name not a C identifier",
            amd_slice(&name, json!({"a-b": {"int": 1}}), json!({})),
        ),
        (
            "33-character name",
            amd_slice(
                &name,
                json!({"a23456789012345678901234567890123": {"int": 1}}),
                json!({}),
            ),
        ),
        (
            "two values",
            amd_slice(&name, json!({"x": {"int": 1, "string": "a"}}), json!({})),
        ),
        (
            "nodeName and allNodes",
            amd_slice(&name, json!({}), json!({"allNodes": true})),
        ),
        (
            "uppercase device name",
            amd_slice(&name, json!({}), json!({"devices": [{"name": "GPU-1"}]})),
        ),
        (
            "duplicate device",
            amd_slice(
                &name,
                json!({}),
                json!({"devices": [{"name": "gpu-1"}, {"name": "gpu-1"}]}),
            ),
        ),
        (
            "33 attributes",
            amd_slice(
                &name,
                json!({}),
                json!({"devices": [{"name": "gpu-1", "attributes": many}]}),
            ),
        ),
        (
            "exponent capacity",
            amd_slice(
                &name,
                json!({}),
                json!({"devices": [{"name": "gpu-1", "capacity": {"memory": {"value": "1e3"}}}]}),
            ),
        ),
        (
            "bad taint effect",
            amd_slice(
                &name,
                json!({}),
                json!({"devices": [{"name": "gpu-1", "taints": [{"key": "k", "effect": "Sometimes"}]}]}),
            ),
        ),
        (
            "pool count 0",
            amd_slice(
                &name,
                json!({}),
                json!({"pool": {"name": "lint-node", "generation": 1, "resourceSliceCount": 0}}),
            ),
        ),
        (
            "pool name with a slash",
            amd_slice(
                &name,
                json!({}),
                json!({"pool": {"name": "a/b", "generation": 1, "resourceSliceCount": 1}}),
            ),
        ),
    ];
    for (what, slice) in crafted {
        cases.push((what.to_string(), slice));
    }

    let mut disagreements = Vec::new();
    let mut refused_count = 0;
    for (what, mut slice) in cases {
        slice.metadata.name = Some(name.clone());
        let linted = lint(std::slice::from_ref(&slice));
        let says_refused = linted.iter().any(|f| f.class == Class::Refused);
        let server = apiserver_refuses(&api, &slice).await?;
        refused_count += usize::from(server.is_some());
        if says_refused != server.is_some() {
            disagreements.push(format!(
                "{what}: linter {says_refused} ({linted:?}), apiserver {server:?}"
            ));
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
    // The crafted cases really exercise both answers.
    assert!(refused_count >= 10, "only {refused_count} refusals");
    Ok(())
}
