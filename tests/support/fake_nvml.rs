//! Builds the fake `libnvidia-ml.so.1` (`fixtures/nvml/fake_libnvidia-ml.c`: two A100s, MIG
//! on the first, NVSwitch) with the system C compiler. One helper for the NVML unit tests
//! (`src/detect/backends/accelerators/nvidia/nvml.rs` includes this file) and the glibc
//! integration test (`tests/nvml_glibc.rs`), so both load the same library built the same way.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles the fake into `dir`, under the file name the dynamic loader looks for, with
/// `defines` (`-DFAKE_NVML_NO_DRIVER`...) and returns its path. A test helper: it panics when
/// no C compiler can build it.
pub fn build_fake_nvml(dir: &Path, defines: &[&str]) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/nvml/fake_libnvidia-ml.c");
    let library = dir.join("libnvidia-ml.so.1");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&library)
        .arg(&source)
        .args(defines)
        .status()
        .expect("a C compiler (cc) to build the fake NVML");
    assert!(status.success(), "cc failed to build the fake NVML");
    library
}
