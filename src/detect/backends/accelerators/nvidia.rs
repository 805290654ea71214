//! NVIDIA GPUs: NVML when `libnvidia-ml` loads, `nvidia-smi` otherwise, and sysfs when neither
//! answers; MIG partitions, health from ECC and retired memory, and the NVLink/NVSwitch domain.
//!
//! Every source fills the same `GpuRecord`s, which become [`Device`]s in one place, so a GPU
//! looks the same whichever source described it. NVML is only tried when the host root is `/`:
//! in the agent's pod (`/host`) or on a fixture tree, loading a library would put code from
//! another filesystem (or the build machine's own driver) into our process and describe the
//! wrong host. The one exception is a pod that says, with `HWACCEL_NVML=container`
//! ([`NVML_ENV`]), that the NVIDIA container runtime put the host driver's own library on this
//! container's library path (the chart's NVML agents, `agent.nvml`): that library talks to
//! the host's kernel driver, so it describes the right host. A GPU that the bus shows but the tools do not list (excluded by the driver,
//! fallen off the bus, or no tool installed) is still reported, from what sysfs knows.

mod bus_and_driver;
// The text parsers are public so the real-capture corpus test (`tests/detect_captures.rs`)
// can feed them; everything else in these modules stays private to the backend.
pub mod nvidia_smi;
pub mod nvlink;
mod nvml;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use crate::detect::{Backend, Context, Findings, HostRoot, PciFunction, pci};
use crate::hardware::{
    Device, Family, Health, HealthStatus, Partition, PcieLink, Precision, Vendor,
};

use nvlink::LinkGraph;

/// Every text parser of this backend run on one input, for the crate's fuzz harness
/// (`src/fuzz_tests`): the parsers are private to this module. Returns their debug output.
#[cfg(test)]
pub(crate) fn fuzz_parsers(text: &str) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        nvidia_smi::parse_query(text, &nvidia_smi::QUERY_FIELDS),
        nvidia_smi::parse_compute_capability(text),
        nvidia_smi::parse_remapped_rows(text),
        nvidia_smi::parse_gpu_list(text),
        bus_and_driver::parse_information(text),
        bus_and_driver::parse_driver_version(text),
        nvlink::parse_topo_matrix(text),
        nvlink::parse_nvlink_status(text),
    )
}

/// The `nvidia` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nvidia;

impl Backend for Nvidia {
    fn name(&self) -> &'static str {
        "nvidia"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        // Only the host we run on may lend us its library (see the module docs).
        let trusted = may_load_nvml(ctx.host().root(), std::env::var_os(NVML_ENV).as_deref());
        let load_nvml = move || trusted.then(nvml::Nvml::load).and_then(Result::ok);
        detect_with(ctx, load_nvml, &NVML_HUNG)
    }
}

/// The environment variable by which a pod vouches for the `libnvidia-ml.so.1` on its own
/// library path: `container` means the NVIDIA container runtime injected the host driver's
/// library (`runtimeClassName: nvidia`, `NVIDIA_DRIVER_CAPABILITIES` with `utility`), so NVML
/// may be loaded although the host root is not `/`. Any other value changes nothing.
pub const NVML_ENV: &str = "HWACCEL_NVML";

/// Whether NVML may be loaded: on the host's own root, or where the pod vouches for it.
fn may_load_nvml(root: &Path, vouched: Option<&std::ffi::OsStr>) -> bool {
    root == Path::new("/") || vouched.is_some_and(|value| value == "container")
}

/// Set once NVML has failed to answer in time; this process does not try it again, so a
/// wedged driver costs one stuck thread rather than one per detection run.
static NVML_HUNG: AtomicBool = AtomicBool::new(false);

/// Detection with the NVML loader as a parameter, so tests can hand in a fake library.
fn detect_with(
    ctx: &Context,
    load_nvml: impl FnOnce() -> Option<nvml::Nvml> + Send + 'static,
    nvml_hung: &AtomicBool,
) -> Findings {
    let on_bus = bus_and_driver::gpu_functions(ctx);
    // A readable PCI bus without an NVIDIA GPU means there is nothing to ask the tools about;
    // this also keeps a stray `nvidia-smi` on a CPU node from producing warnings.
    if on_bus.is_empty() && !ctx.pci().is_empty() {
        return Findings::default();
    }
    let mut warnings = Vec::new();
    // An NVML that fails is quiet: nvidia-smi is asked next and speaks up if it fails too.
    let inventory = nvml_inventory(load_nvml, ctx.runner().timeout(), nvml_hung, &mut warnings)
        .or_else(|| nvidia_smi::collect(ctx, &mut warnings))
        .unwrap_or_default();
    assemble(ctx.host(), inventory, &on_bus, warnings)
}

/// Loads NVML and reads it on a thread of its own, waiting at most `timeout`. NVML calls run
/// in our process and cannot be interrupted, and a wedged driver can block `nvmlInit` for
/// minutes; past the deadline the thread is abandoned and NVML is not tried again.
fn nvml_inventory(
    load_nvml: impl FnOnce() -> Option<nvml::Nvml> + Send + 'static,
    timeout: Duration,
    hung: &AtomicBool,
    warnings: &mut Vec<String>,
) -> Option<Inventory> {
    if hung.load(Ordering::Relaxed) {
        return None;
    }
    let (sender, receiver) = mpsc::channel();
    thread::Builder::new()
        .name("hwaccel-nvml".into())
        .spawn(move || {
            let inventory = load_nvml().and_then(|library| library.inventory().ok());
            let _ = sender.send(inventory);
        })
        .ok()?;
    match receiver.recv_timeout(timeout) {
        Ok(inventory) => inventory,
        Err(RecvTimeoutError::Timeout) => {
            hung.store(true, Ordering::Relaxed);
            warnings.push(format!(
                "NVML did not answer within {timeout:?}; using nvidia-smi and not trying NVML again"
            ));
            None
        }
        Err(RecvTimeoutError::Disconnected) => None,
    }
}

/// Turns what a source learned into findings, adding GPUs only the bus knows about.
fn assemble(
    host: &HostRoot,
    inventory: Inventory,
    on_bus: &[PciFunction],
    warnings: Vec<String>,
) -> Findings {
    let mut devices: Vec<Device> = inventory
        .gpus
        .iter()
        .map(|record| device_from(host, record, &inventory.numa_hints))
        .collect();
    let listed: BTreeSet<String> = devices.iter().map(|d| d.id.clone()).collect();
    // The source that answered, if one listed any GPU at all.
    let answered = inventory.gpus.first().map(|gpu| gpu.source);
    devices.extend(
        on_bus
            .iter()
            .filter(|function| !listed.contains(&function.address))
            .map(|function| {
                let mut record = bus_and_driver::record(host, function);
                let driver = pci::driver(host, &function.address);
                // The driver owns it but its own tool does not list it: the GPU has fallen
                // off the bus or failed to initialise. Bound to vfio-pci it is just passed on.
                if let Some(tool) = answered
                    && driver.as_deref() == Some("nvidia")
                {
                    record.health.fatal.push(format!(
                        "bound to the nvidia driver but not listed by {tool}"
                    ));
                }
                let mut device = device_from(host, &record, &BTreeMap::new());
                if let Some(driver) = driver {
                    device.attributes.insert("driver".into(), driver);
                }
                device
            }),
    );
    devices.sort_by(|a, b| a.id.cmp(&b.id));
    devices.dedup_by(|a, b| a.id == b.id);
    let mut warnings = warnings;
    warnings.sort();
    warnings.dedup();
    Findings {
        devices,
        interconnects: nvlink::groups(&inventory.links),
        warnings,
        ..Findings::default()
    }
}

/// What one source learned about the GPUs and their links.
#[derive(Debug, Clone, Default, PartialEq)]
struct Inventory {
    /// One record per physical GPU.
    gpus: Vec<GpuRecord>,
    /// NVLink facts per GPU bus id.
    links: LinkGraph,
    /// NUMA nodes a tool reported, by bus id, for when sysfs has none.
    numa_hints: BTreeMap<String, u32>,
}

/// One GPU as a source described it, before it becomes a [`Device`].
#[derive(Debug, Clone, Default, PartialEq)]
struct GpuRecord {
    /// Which source described it (`nvml`, `nvidia-smi`, `sysfs`).
    source: &'static str,
    /// The driver's index (`nvidia-smi -i`).
    index: Option<u32>,
    /// Canonical PCI bus id.
    bus_id: String,
    /// Product name as the driver reports it.
    name: Option<String>,
    /// `GPU-...` UUID.
    uuid: Option<String>,
    /// Device memory in bytes.
    memory_bytes: Option<u64>,
    /// Driver version.
    driver_version: Option<String>,
    /// VBIOS version.
    vbios: Option<String>,
    /// CUDA compute capability, major and minor.
    compute_capability: Option<(u32, u32)>,
    /// Whether MIG mode is on.
    mig_enabled: Option<bool>,
    /// MIG instances.
    partitions: Vec<Partition>,
    /// The PCIe link as the tool saw it (sysfs wins when it has one).
    pcie: Option<PcieLink>,
    /// Raw health counters.
    health: HealthFacts,
}

/// Health counters as read, before a verdict is drawn from them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct HealthFacts {
    ecc_enabled: Option<bool>,
    /// Corrected ECC errors since the driver loaded.
    ecc_corrected: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded.
    ecc_uncorrected: Option<u64>,
    /// Retired pages (Volta and Turing retire pages; Ampere and later remap rows instead).
    retired_pages: Option<u64>,
    /// Pages waiting for a reset to be retired.
    retirement_pending: Option<bool>,
    /// Remapped rows, correctable and uncorrectable together.
    remapped_rows: Option<u64>,
    /// Row remaps waiting for a reset.
    remap_pending: Option<bool>,
    /// A row remap failed (the GPU ran out of spare rows).
    remap_failed: Option<bool>,
    /// Problems that make the GPU unusable, in words (`GPU is lost`).
    fatal: Vec<String>,
    /// Problems worth attention, in words (`infoROM is corrupted`).
    concerns: Vec<String>,
}

/// Corrected ECC errors since the driver loaded above which a GPU counts as degraded. A few
/// corrected errors are routine; a steady stream of them points at failing memory. NVIDIA
/// publishes no cut-off, so this is a judgement: high enough that a healthy long-running GPU
/// stays below it.
const CORRECTED_ECC_DEGRADED: u64 = 1000;

/// Builds the device for one record.
fn device_from(host: &HostRoot, record: &GpuRecord, numa_hints: &BTreeMap<String, u32>) -> Device {
    let model = record
        .name
        .clone()
        .unwrap_or_else(|| "NVIDIA GPU".to_string());
    let mut device = Device::new(
        record.bus_id.clone(),
        Vendor::Nvidia,
        Family::Gpu,
        model,
        "nvidia",
    );
    device.index = record.index;
    device.memory_bytes = record.memory_bytes;
    if let Some((major, minor)) = record.compute_capability {
        device.compute_capability = Some(format!("{major}.{minor}"));
        device.architecture = architecture(major, minor).map(str::to_string);
        device.precisions = precisions(major, minor);
    }
    device.driver_version = record.driver_version.clone();
    device.firmware_version = record.vbios.clone();
    device.uuid = record.uuid.clone();
    device.numa_node =
        pci::numa_node(host, &record.bus_id).or_else(|| numa_hints.get(&record.bus_id).copied());
    device.pcie = pci::link(host, &record.bus_id).or(record.pcie);
    let mut partitions = record.partitions.clone();
    partitions.sort_by(|a, b| (&a.kind, &a.id, &a.profile).cmp(&(&b.kind, &b.id, &b.profile)));
    device.partitions = partitions;
    device.health = verdict(&record.health);
    if let Some(enabled) = record.mig_enabled {
        let mode = if enabled { "enabled" } else { "disabled" };
        device.attributes.insert("mig.mode".into(), mode.into());
    }
    device
        .attributes
        .insert("source".into(), record.source.to_string());
    device
}

/// The architecture of a CUDA compute capability (CUDA C Programming Guide, "Compute
/// Capabilities"): 10.x, 11.0 and 12.x are all Blackwell (data centre, Thor, and RTX parts).
fn architecture(major: u32, minor: u32) -> Option<&'static str> {
    Some(match (major, minor) {
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, 0 | 2) => "volta",
        (7, 5) => "turing",
        (8, 9) => "ada",
        (8, _) => "ampere",
        (9, _) => "hopper",
        (10..=12, _) => "blackwell",
        _ => return None,
    })
}

/// Precisions a compute capability computes in natively, from NVIDIA's architecture
/// whitepapers: P100 (6.0) has full-rate FP16 and other Pascal parts INT8 dot products; Volta
/// adds FP16 tensor cores, Turing INT8/INT4 tensor cores, Ampere TF32 and BF16, Ada and Hopper
/// FP8, Blackwell NVFP4 and MXFP4. INT4 stays listed from Hopper on because group-quantised
/// INT4 weights (AWQ/GPTQ) run there through dequantising kernels.
fn precisions(major: u32, minor: u32) -> BTreeSet<Precision> {
    use Precision::{Bf16, Fp8, Fp16, Fp32, Int4, Int8, Mxfp4, Nvfp4, Tf32};
    let list: &[Precision] = match (major, minor) {
        (6, 0) => &[Fp32, Fp16],
        (6, _) => &[Fp32, Int8],
        (7, 0 | 2) => &[Fp32, Fp16, Int8],
        (7, 5) => &[Fp32, Fp16, Int8, Int4],
        (8, 9) | (9, _) => &[Fp32, Tf32, Bf16, Fp16, Fp8, Int8, Int4],
        (8, _) => &[Fp32, Tf32, Bf16, Fp16, Int8, Int4],
        (10..=12, _) => &[Fp32, Tf32, Bf16, Fp16, Fp8, Int8, Nvfp4, Mxfp4, Int4],
        _ => &[Fp32],
    };
    list.iter().copied().collect()
}

/// Draws the health verdict: uncorrected errors, pending retirement or remapping, and a lost
/// GPU are unhealthy; many corrected errors, retired pages or remapped rows are degraded;
/// otherwise healthy when the ECC counters could be read, unknown when they could not.
fn verdict(facts: &HealthFacts) -> Health {
    let mut unhealthy = facts.fatal.clone();
    if let Some(count) = facts.ecc_uncorrected.filter(|&n| n > 0) {
        unhealthy.push(format!(
            "{count} uncorrected ECC errors since the driver loaded"
        ));
    }
    if facts.retirement_pending == Some(true) {
        unhealthy.push("retired pages pending a GPU reset".into());
    }
    if facts.remap_pending == Some(true) {
        unhealthy.push("row remapping pending a GPU reset".into());
    }
    if facts.remap_failed == Some(true) {
        unhealthy.push("row remapping failed: no spare rows left".into());
    }
    let mut degraded = facts.concerns.clone();
    if let Some(count) = facts.ecc_corrected.filter(|&n| n > CORRECTED_ECC_DEGRADED) {
        degraded.push(format!(
            "{count} corrected ECC errors since the driver loaded"
        ));
    }
    let retired = match (facts.retired_pages, facts.remapped_rows) {
        (None, None) => None,
        (pages, rows) => Some(pages.unwrap_or(0).saturating_add(rows.unwrap_or(0))),
    };
    if let Some(count) = retired.filter(|&n| n > 0) {
        degraded.push(format!("{count} retired pages or remapped rows"));
    }
    let readable = facts.ecc_corrected.is_some() || facts.ecc_uncorrected.is_some();
    let status = if !unhealthy.is_empty() {
        HealthStatus::Unhealthy
    } else if !degraded.is_empty() {
        HealthStatus::Degraded
    } else if readable {
        HealthStatus::Healthy
    } else {
        HealthStatus::Unknown
    };
    let mut reasons = unhealthy;
    reasons.extend(degraded);
    reasons.sort();
    Health {
        status,
        ecc_enabled: facts.ecc_enabled,
        ecc_corrected: facts.ecc_corrected,
        ecc_uncorrected: facts.ecc_uncorrected,
        retired_pages: retired,
        reasons,
    }
}

#[cfg(test)]
mod tests;
