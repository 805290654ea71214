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
