//! Vendor-shaped ResourceSlices from `fixtures/dra/` (provenance in its `PROVENANCE.md`), read
//! the way `hwaccel plan --resource-slices` reads them, for tests that must not name the CLI
//! themselves (the placement core's architecture test forbids it).

use std::path::PathBuf;

use k8s_openapi::api::resource::v1::ResourceSlice;

/// Every slice in the named files of `fixtures/dra/`.
///
/// # Panics
/// When a fixture is missing or malformed: a broken fixture is a broken test.
pub fn fixture_slices(files: &[&str]) -> Vec<ResourceSlice> {
    let paths: Vec<PathBuf> = files
        .iter()
        .map(|file| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/dra")
                .join(file)
        })
        .collect();
    crate::cli::plan_dra::load_resource_slices(&paths).expect("fixtures/dra slices")
}

/// `gpus` MI300X on one node, each published only as `parts` partitions of `profile`
/// (`gpu<g>-<profile>-<i>`, 196,592 MiB divided among them), as ROCm's DRA driver publishes
/// a GPU partitioned on its node (`fixtures/dra/amd-mi300x-partitioned.yaml`), for planner
/// tests that need no slice.
///
/// # Panics
/// Never for a valid count: the shorthand is fixed.
pub fn partitioned_mi300x(gpus: u32, parts: u64, profile: &str) -> Vec<crate::plan::NodeSpec> {
    let mut nodes = crate::plan::shorthand::parse_hardware(&format!("1x{gpus}xMI300X"))
        .expect("MI300X shorthand");
    for (g, device) in nodes[0].devices.iter_mut().enumerate() {
        device.partitions_only = true;
        device.partitions = (0..parts)
            .map(|i| crate::plan::share::Partition {
                id: format!("gpu{g}-{profile}-{i}"),
                profile: profile.to_string(),
                memory: crate::plan::units::Bytes((196_592 << 20) / parts.max(1)),
            })
            .collect();
    }
    nodes
}
