//! Link settings for the static release binary, the one the default image ships.
//!
//! For release builds of a `*-linux-musl` target, the `hwaccel` binary is linked with
//! `scripts/link/detect-layout.ld`, which gathers the functions `hwaccel detect` runs at the
//! start of the code, and with packed relative relocations (`-z pack-relative-relocs`), which
//! shrink the static PIE's relocation table from about 600 KiB to 8 KiB while keeping ASLR.
//! Together they take the peak RSS of `hwaccel detect` from 6.5 MiB to 2.6 MiB
//! (docs/benchmarks.md, "Issue 16"; docs/decisions/0008-detect-code-layout.md). Other targets
//! and profiles link as cargo does by default: the script only orders code, so it is left off
//! where no one measures a short-lived `detect` process.

use std::env;
use std::path::Path;

/// An error ends the build with its message (a build script's `main` may return one).
fn main() -> Result<(), String> {
    let layout = Path::new("scripts/link/detect-layout.ld");
    println!("cargo:rerun-if-changed={}", layout.display());
    println!("cargo:rerun-if-changed=build.rs");
    let target = env::var("TARGET").unwrap_or_default();
    let profile = env::var("PROFILE").unwrap_or_default();
    if !(target.ends_with("-linux-musl") && profile == "release") {
        return Ok(());
    }
    // The linker reads the script from OUT_DIR, inside the target directory, never from the
    // checkout: cargo keeps a build script's output while its inputs' mtimes are older than
    // its last run, so a target directory shared by two checkouts (the project's scripts
    // share one under ~/.cache) kept the other checkout's absolute path, and linking failed
    // once that checkout was gone.
    let manifest = env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let out_dir = env::var("OUT_DIR").map_err(|err| format!("OUT_DIR: {err}"))?;
    let script = Path::new(&out_dir).join("detect-layout.ld");
    std::fs::copy(Path::new(&manifest).join(layout), &script).map_err(|err| {
        format!(
            "copying {} to {}: {err}",
            layout.display(),
            script.display()
        )
    })?;
    println!(
        "cargo:rustc-link-arg-bin=hwaccel=-Wl,-T,{}",
        script.display()
    );
    println!("cargo:rustc-link-arg-bin=hwaccel=-Wl,-z,pack-relative-relocs");
    Ok(())
}
