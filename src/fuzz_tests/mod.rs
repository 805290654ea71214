//! The fuzzing harness: every parser of untrusted input, and the ModelPlacement → plan path,
//! run on arbitrary input by proptest. Each property asserts that nothing panics and, where it
//! is cheap, that the same input gives the same output twice.
//!
//! What is covered (the index `docs/testing.md` repeats):
//!
//! | input | parsers | test |
//! |---|---|---|
//! | vendor tool output | `nvidia-smi` query/list/remap/topo/nvlink, sysfs `information` and driver version (NVIDIA); `amd-smi static`, `rocm-smi`; `xpu-smi` discovery and topology; `hl-smi` query, firmware, status; `neuron-ls` JSON and table; `qaic-util`; `vulkaninfo --summary` | `detect::vendor_tool_output` |
//! | host files | `/proc/cpuinfo`, `meminfo`, `/proc/self/cgroup`, cgroup v1/v2 limits, cpulists, mountinfo, os-release, DMI, device-tree `compatible`, node meminfo, uevent, IB port attributes, KFD properties/io links/banks, amdgpu modes/RAS/bad pages/features, Neuron `connected_devices`, TPU env, XDNA versions, PCI bus ids and numbers, `--backends` lists | `detect::host_file_text` |
//! | device ids | PCI classification and names, AMD/Intel/Gaudi/TPU/Neuron/NPU/XDNA catalogs, KFD properties | `detect::device_ids` |
//! | a whole host tree | every backend through `Detector` over a fixture tree whose files were replaced by arbitrary bytes | `detect::mutated_host_tree` |
//! | planner input | Hugging Face `config.json` (text and JSON values), `--hardware` shorthand, parameter counts, byte sizes, Kubernetes quantities, inventory files | `plan::*` |
//! | a ModelPlacement | arbitrary spec (inline config JSON, numbers for the goal and constraints) through `controller::placement::core::evaluate::evaluate` (spec → request → planner → status) | `plan::model_placement_to_plan` |
//!
//! Case counts follow `PROPTEST_CASES` (proptest's default, 256); the whole-tree and
//! ModelPlacement properties run a fraction of that, as each case costs far more. The CI run is
//! part of `cargo test`; `PROPTEST_CASES=100000 cargo test --release --lib fuzz_tests::` is the
//! long run.

mod detect;
mod plan;

use proptest::prelude::*;

/// The run's case count (`PROPTEST_CASES`, else 256) divided by `divisor`, at least 4.
fn cases(divisor: u32) -> ProptestConfig {
    let base = ProptestConfig::default();
    ProptestConfig {
        cases: (base.cases / divisor).max(4),
        ..base
    }
}

/// Text the way parsers meet it: arbitrary bytes decoded lossily, arbitrary strings, or lines
/// built from the tokens tool output is made of, so fuzzing reaches past the first check.
fn text() -> impl Strategy<Value = String> {
    let token = prop::sample::select(vec![
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        ",",
        ":",
        "=",
        "|",
        "-",
        "+",
        "/",
        "[",
        "]",
        "{",
        "}",
        "\"",
        "'",
        "0",
        "1",
        "7",
        "42",
        "0x",
        "0x10de",
        "1002",
        "00000000:18:00.0",
        "0000:18:00.0",
        "GPU",
        "GPU0",
        "NV18",
        "X",
        "N/A",
        "[N/A]",
        "MiB",
        "GiB",
        "kB",
        "KB",
        "MB",
        "GB",
        "%",
        "name",
        "processor",
        "model name",
        "flags",
        "MemTotal",
        "true",
        "null",
        "avx512f",
        "amx_tile",
        "gfx942",
        "Device",
        "Card",
        "card0",
        "DRIVER",
        "PCI_SLOT_NAME",
        "max",
        "18446744073709551615",
        "99999999999999999999",
        "-1",
        "1e308",
        "é",
        "\u{0}",
    ]);
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..2048)
            .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
        ".{0,512}",
        prop::collection::vec(token, 0..256).prop_map(|tokens| tokens.concat()),
    ]
}
