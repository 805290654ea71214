//! Parsers for AMD's tools: `amd-smi static --json` and, on older ROCm installs,
//! `rocm-smi --showproductname --showmeminfo vram --showbus --json`.
//!
//! The tools add what sysfs does not say: the marketing name (`AMD Instinct MI300X`), the tool's
//! own GPU index, and the driver version of in-box drivers. Their JSON is not stable across
//! releases, so the parsers look fields up by name and accept every shape seen in the field:
//! `amd-smi` prints a list of GPUs up to ROCm 6.x and a `{"gpu_data": [...]}` object later,
//! writes `"N/A"` for what it cannot read, gives sizes as `{"value": 196592, "unit": "MB"}`,
//! and prints warnings (missing `render` group) on stdout before the JSON.

use serde_json::{Map, Value};

use crate::detect::parse_u64;
use crate::detect::pci::canonical_bus_id;
use crate::hardware::{GIB, MIB};

use super::gfx_catalog::normalize_gfx;

/// What a tool says about one GPU; every field optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmiGpu {
    /// The tool's index of the GPU.
    pub index: Option<u32>,
    /// Canonical PCI bus id.
    pub bus_id: Option<String>,
    /// Marketing name.
    pub market_name: Option<String>,
    /// gfx target (`gfx942`).
    pub gfx: Option<String>,
    /// Compute units.
    pub compute_units: Option<u32>,
    /// VBIOS version or part number.
    pub vbios: Option<String>,
    /// Kernel driver version.
    pub driver_version: Option<String>,
    /// VRAM in bytes.
    pub vram_bytes: Option<u64>,
    /// Compute partition mode (`SPX`).
    pub compute_partition: Option<String>,
    /// Memory partition mode (`NPS1`).
    pub memory_partition: Option<String>,
    /// ASIC serial.
    pub serial: Option<String>,
    /// Board serial from the FRU (`board.product_serial`).
    pub board_serial: Option<String>,
}

/// Parses `amd-smi static --json`.
pub fn parse_amd_smi_static(text: &str) -> Result<Vec<SmiGpu>, String> {
    let json = json_after_preamble(text).ok_or("no JSON in the output")?;
    let value: Value = serde_json::from_str(json).map_err(|err| format!("bad JSON: {err}"))?;
    let entries = match &value {
        Value::Array(entries) => entries,
        Value::Object(object) => match object.get("gpu_data") {
            Some(Value::Array(entries)) => entries,
            _ => return Err("JSON object without a gpu_data list".to_string()),
        },
        _ => return Err("JSON is neither a list nor an object".to_string()),
    };
    Ok(entries
        .iter()
        .filter_map(Value::as_object)
        .map(amd_smi_gpu)
        .collect())
}

fn amd_smi_gpu(entry: &Map<String, Value>) -> SmiGpu {
    let at = |path: &[&str]| lookup(entry, path);
    SmiGpu {
        index: at(&["gpu"])
            .and_then(number)
            .and_then(|n| u32::try_from(n).ok()),
        bus_id: at(&["bus", "bdf"])
            .and_then(text)
            .and_then(|bdf| canonical_bus_id(&bdf)),
        market_name: at(&["asic", "market_name"]).and_then(text),
        gfx: at(&["asic", "target_graphics_version"])
            .and_then(text)
            .and_then(|gfx| normalize_gfx(&gfx)),
        compute_units: at(&["asic", "num_compute_units"])
            .and_then(number)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0),
        vbios: at(&["vbios", "part_number"])
            .and_then(text)
            .or_else(|| at(&["vbios", "version"]).and_then(text)),
        driver_version: at(&["driver", "version"])
            .and_then(text)
            .map(|version| kernel_release(&version)),
        vram_bytes: at(&["vram", "size"]).and_then(size_bytes),
        compute_partition: at(&["partition", "compute_partition"]).and_then(text),
        memory_partition: at(&["partition", "memory_partition"]).and_then(text),
        serial: at(&["asic", "asic_serial"]).and_then(text),
        board_serial: at(&["board", "product_serial"])
            .and_then(text)
            .filter(|s| super::amdgpu_sysfs::is_known(s)),
    }
}

/// Parses `rocm-smi ... --json`: an object of `cardN` entries (plus `system`) whose keys are
/// the text report's labels (`Card series`, `VRAM Total Memory (B)`, `PCI Bus`), spelled with
/// varying capitals across releases.
pub fn parse_rocm_smi(text: &str) -> Result<Vec<SmiGpu>, String> {
    let json = json_after_preamble(text).ok_or("no JSON in the output")?;
    let value: Value = serde_json::from_str(json).map_err(|err| format!("bad JSON: {err}"))?;
    let object = value.as_object().ok_or("JSON is not an object")?;
    let mut gpus: Vec<SmiGpu> = object
        .iter()
        .filter_map(|(key, entry)| {
            let index = key.strip_prefix("card")?.parse::<u32>().ok()?;
            Some(rocm_smi_gpu(index, entry.as_object()?))
        })
        .collect();
    gpus.sort_by_key(|gpu| gpu.index);
    Ok(gpus)
}

fn rocm_smi_gpu(index: u32, entry: &Map<String, Value>) -> SmiGpu {
    let field = |label: &str| {
        entry
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(label))
            .and_then(|(_, value)| text(value))
    };
    SmiGpu {
        index: Some(index),
        bus_id: field("PCI Bus").and_then(|bdf| canonical_bus_id(&bdf)),
        market_name: field("Card series"),
        gfx: field("GFX Version").and_then(|gfx| normalize_gfx(&gfx)),
        vram_bytes: field("VRAM Total Memory (B)")
            .and_then(|b| parse_u64(&b))
            .filter(|&b| b > 0),
        vbios: field("VBIOS version"),
        board_serial: field("Serial Number").filter(|s| super::amdgpu_sysfs::is_known(s)),
        ..SmiGpu::default()
    }
}

/// The JSON part of a tool's output: from the first line that opens a list or an object.
/// Tools print warnings first, and nothing after the JSON.
fn json_after_preamble(text: &str) -> Option<&str> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') || trimmed.starts_with('{') {
            return Some(&text[offset..]);
        }
        offset += line.len();
    }
    None
}

/// The driver version as a release string. For the in-box driver amd-smi reports the kernel,
/// and some releases print `/proc/version` with its spaces removed
/// (`Linuxversion6.14.0-24-generic(buildd@lcy02-amd64-010)(x86_64-linux-gnu-gcc-13...`, in the
/// `amd-smi static --json` output kept in ROCm/device-metrics-exporter's tests); that is cut
/// down to the release (`6.14.0-24-generic`), the form other releases print. Anything else is
/// kept as it is.
fn kernel_release(version: &str) -> String {
    match version.strip_prefix("Linuxversion") {
        Some(rest) => {
            let release = rest.split('(').next().unwrap_or_default();
            if release.is_empty() {
                version.to_string()
            } else {
                release.to_string()
            }
        }
        None => version.to_string(),
    }
}

fn lookup<'a>(entry: &'a Map<String, Value>, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    rest.iter().try_fold(entry.get(*first)?, |value, key| {
        value.as_object()?.get(*key)
    })
}

/// A field's text, `None` for the tools' placeholders (`N/A`, empty, `Unknown`).
fn text(value: &Value) -> Option<String> {
    let text = match value {
        Value::String(s) => s.trim().to_string(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    let placeholder = text.is_empty()
        || text.eq_ignore_ascii_case("n/a")
        || text.eq_ignore_ascii_case("unknown")
        || text.eq_ignore_ascii_case("unsupported");
    (!placeholder).then_some(text)
}

/// A field's unsigned integer, whether written as a number or as a (hex) string.
fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => parse_u64(s),
        _ => None,
    }
}

/// A size in bytes from `{"value": 196592, "unit": "MB"}` or `"196592 MB"`. amd-smi's `MB` and
/// `GB` are binary: 196592 MB is exactly the 206141652992 bytes of `mem_info_vram_total`.
fn size_bytes(value: &Value) -> Option<u64> {
    let (amount, unit) = match value {
        Value::Object(object) => (
            object.get("value").and_then(number)?,
            object.get("unit").and_then(text).unwrap_or_default(),
        ),
        Value::String(s) => {
            let mut words = s.split_whitespace();
            let amount = parse_u64(words.next()?)?;
            (amount, words.next().unwrap_or_default().to_string())
        }
        Value::Number(n) => (n.as_u64()?, String::new()),
        _ => return None,
    };
    let scale = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" | "KIB" => 1 << 10,
        "MB" | "MIB" => MIB,
        "GB" | "GIB" => GIB,
        _ => return None,
    };
    amount.checked_mul(scale).filter(|&bytes| bytes > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AMD_SMI: &str = include_str!(
        "../../../../../fixtures/hosts/mi300x-8x/commands/outputs/amd-smi-static.json"
    );
    const ROCM_SMI: &str =
        include_str!("../../../../../fixtures/hosts/mi300x-8x/commands/outputs/rocm-smi.json");

    #[test]
    fn a_proc_version_driver_string_is_cut_to_the_release() {
        assert_eq!(
            kernel_release("Linuxversion6.14.0-24-generic(buildd@lcy02-amd64-010)(gcc)#24"),
            "6.14.0-24-generic"
        );
        assert_eq!(kernel_release("6.10.5"), "6.10.5");
        assert_eq!(kernel_release("Linuxversion(odd)"), "Linuxversion(odd)");
    }

    #[test]
    fn amd_smi_static_after_its_warning_line() {
        assert!(AMD_SMI.starts_with("WARNING"));
        let gpus = parse_amd_smi_static(AMD_SMI).unwrap();
        assert_eq!(gpus.len(), 8);
        let first = &gpus[0];
        assert_eq!(first.index, Some(0));
        assert_eq!(first.bus_id.as_deref(), Some("0000:05:00.0"));
        assert_eq!(first.market_name.as_deref(), Some("AMD Instinct MI300X"));
        assert_eq!(first.gfx.as_deref(), Some("gfx942"));
        assert_eq!(first.compute_units, Some(304));
        assert_eq!(first.vram_bytes, Some(206_141_652_992));
        assert_eq!(first.compute_partition.as_deref(), Some("SPX"));
        assert_eq!(first.memory_partition.as_deref(), Some("NPS1"));
        assert_eq!(first.driver_version.as_deref(), Some("6.10.5"));
        assert!(first.vbios.as_deref().unwrap().starts_with("113-"));
    }

    #[test]
    fn amd_smi_gpu_data_shape_and_placeholders() {
        let text = r#"{"gpu_data": [{"gpu": 3, "asic": {"market_name": "N/A",
            "target_graphics_version": "GFX950", "num_compute_units": "N/A"},
            "bus": {"bdf": "0000:C1:00.0"}, "vram": {"size": "262128 MB"}}]}"#;
        let gpus = parse_amd_smi_static(text).unwrap();
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].index, Some(3));
        assert_eq!(gpus[0].bus_id.as_deref(), Some("0000:c1:00.0"));
        assert_eq!(gpus[0].market_name, None);
        assert_eq!(gpus[0].gfx.as_deref(), Some("gfx950"));
        assert_eq!(gpus[0].compute_units, None);
        assert_eq!(gpus[0].vram_bytes, Some(262_128 * MIB));
    }

    #[test]
    fn amd_smi_garbage_is_an_error() {
        assert!(parse_amd_smi_static("").is_err());
        assert!(parse_amd_smi_static("Segmentation fault\n").is_err());
        assert!(parse_amd_smi_static("[{\"gpu\": 0,").is_err());
        assert!(parse_amd_smi_static("{\"error\": 1}").is_err());
        assert_eq!(parse_amd_smi_static("[]"), Ok(Vec::new()));
    }

    #[test]
    fn rocm_smi_cards() {
        let gpus = parse_rocm_smi(ROCM_SMI).unwrap();
        assert_eq!(gpus.len(), 8);
        assert_eq!(gpus[1].index, Some(1));
        assert_eq!(gpus[1].bus_id.as_deref(), Some("0000:26:00.0"));
        assert_eq!(gpus[1].market_name.as_deref(), Some("AMD Instinct MI300X"));
        assert_eq!(gpus[1].vram_bytes, Some(206_141_652_992));
        assert!(parse_rocm_smi("[1, 2]").is_err());
    }

    #[test]
    fn sizes_in_every_spelling() {
        let size = |json: &str| size_bytes(&serde_json::from_str(json).unwrap());
        assert_eq!(size(r#"{"value": 192, "unit": "GB"}"#), Some(192 * GIB));
        assert_eq!(size(r#""4096 KB""#), Some(4 * MIB));
        assert_eq!(size(r#"{"value": 1, "unit": "parsecs"}"#), None);
        assert_eq!(size(r#""N/A""#), None);
    }
}
