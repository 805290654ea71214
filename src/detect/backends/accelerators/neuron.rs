//! AWS Inferentia and Trainium ("Neuron devices"): PCI functions of vendor 0x1d0f named by
//! device id, enriched by `neuron-ls --json-output` (or its plain table where the installed
//! `neuron-ls` predates JSON), and the NeuronLink group the devices form.
//!
//! Device ids follow the Neuron kernel driver's table (`neuron_device.h`): Inf1 0x7064-0x7067,
//! Trn1 0x7164, Inf2 0x7264, Trn2 0x7364, Trn3 0x7564/0x7565. Chip facts (NeuronCores,
//! device memory, data types) come from the Neuron SDK's architecture pages.
//!
//! `neuron-ls` numbers devices in its own order (on a trn2 device 0 is at `cc:00.0`, not the
//! lowest bus id), so its `connected_to` lists are mapped through its `bdf` column. Without the
//! tool the driver's sysfs (`/sys/devices/virtual/neuron_device/neuronN`) still tells whether
//! the devices are linked, but not which PCI function is which index.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::detect::backends::shared::tool_output::{Tool, ToolFailure, Wording};
use crate::detect::pci::canonical_bus_id;
use crate::detect::{Backend, Context, Findings, HostRoot, PciFunction, pci};
use crate::hardware::{
    Device, Family, GIB, HealthStatus, InterconnectGroup, InterconnectKind, MIB, Precision, Vendor,
};

/// Amazon's PCI vendor id.
pub const AMAZON_VENDOR_ID: u16 = 0x1d0f;

/// The Neuron driver's per-device sysfs directories.
const NEURON_SYSFS: &str = "/sys/devices/virtual/neuron_device";

/// The `neuron` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Neuron;

impl Backend for Neuron {
    fn name(&self) -> &'static str {
        "neuron"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let chips: Vec<(&PciFunction, NeuronChip)> = ctx
            .pci_by_vendor(AMAZON_VENDOR_ID)
            // ENA, EFA and every EBS volume's NVMe function need no device-id read.
            .filter(|f| !pci::is_plumbing(f.class_code()))
            .filter_map(|f| Some((f, NeuronChip::from_device_id(f.device_id(host)?)?)))
            .collect();
        if chips.is_empty() {
            return Findings::default();
        }
        let mut findings = Findings::default();
        let listing = match run_neuron_ls(ctx) {
            Ok(listing) => listing,
            Err(message) => {
                findings.warnings.push(message);
                None
            }
        };
        let driver_version = host.read_trimmed("/sys/module/neuron/version");
        findings.devices = chips
            .iter()
            .map(|(function, chip)| {
                let entry = listing.as_ref().and_then(|l| l.entry(&function.address));
                neuron_device(host, function, *chip, entry, driver_version.as_deref())
            })
            .collect();
        if let Some(instance) = listing.as_ref().and_then(|l| l.instance_type.as_deref()) {
            for device in &mut findings.devices {
                device
                    .attributes
                    .insert("instance-type".into(), instance.to_string());
            }
        }
        findings.interconnects = neuronlink_group(host, &findings.devices, listing.as_ref())
            .into_iter()
            .collect();
        findings
    }
}

/// A Neuron device generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeuronChip {
    /// Inferentia (Inf1), NeuronCore-v1.
    Inf1,
    /// Trainium (Trn1/Trn1n), NeuronCore-v2.
    Trn1,
    /// Inferentia2 (Inf2), NeuronCore-v2.
    Inf2,
    /// Trainium2 (Trn2), NeuronCore-v3.
    Trn2,
    /// Trainium3 (Trn3), NeuronCore-v4.
    Trn3,
}

impl NeuronChip {
    /// The generation behind an Amazon PCI device id; `None` for ENA, EFA, NVMe and the rest.
    pub fn from_device_id(device: u16) -> Option<Self> {
        match device {
            0x7064..=0x7067 => Some(Self::Inf1),
            0x7164 => Some(Self::Trn1),
            0x7264 => Some(Self::Inf2),
            0x7364 => Some(Self::Trn2),
            0x7564 | 0x7565 => Some(Self::Trn3),
            _ => None,
        }
    }

    fn model(self) -> &'static str {
        match self {
            Self::Inf1 => "AWS Inferentia",
            Self::Trn1 => "AWS Trainium",
            Self::Inf2 => "AWS Inferentia2",
            Self::Trn2 => "AWS Trainium2",
            Self::Trn3 => "AWS Trainium3",
        }
    }

    fn architecture(self) -> &'static str {
        match self {
            Self::Inf1 => "inf1",
            Self::Trn1 => "trn1",
            Self::Inf2 => "inf2",
            Self::Trn2 => "trn2",
            Self::Trn3 => "trn3",
        }
    }

    fn neuroncore_version(self) -> &'static str {
        match self {
            Self::Inf1 => "v1",
            Self::Trn1 | Self::Inf2 => "v2",
            Self::Trn2 => "v3",
            Self::Trn3 => "v4",
        }
    }

    /// Physical NeuronCores per device.
    fn neuroncores(self) -> u32 {
        match self {
            Self::Inf1 => 4,
            Self::Trn1 | Self::Inf2 => 2,
            Self::Trn2 | Self::Trn3 => 8,
        }
    }

    /// Device memory: Inf1 8 GiB, Trn1/Inf2 32 GiB, Trn2 96 GiB, Trn3 144 GiB.
    pub fn memory_bytes(self) -> u64 {
        let gib = match self {
            Self::Inf1 => 8,
            Self::Trn1 | Self::Inf2 => 32,
            Self::Trn2 => 96,
            Self::Trn3 => 144,
        };
        gib * GIB
    }

    /// Tensor-engine input types per the Neuron architecture pages: NeuronCore-v1 takes
    /// FP16/BF16/INT8 (FP32 on the vector engines); v2 adds TF32 and configurable FP8
    /// (cFP8); v3 lists cFP8/FP16/BF16/TF32/FP32 (no INT8 tensor path); v4 takes MXFP8/MXFP4.
    pub fn precisions(self) -> BTreeSet<Precision> {
        use Precision::{Bf16, Fp8, Fp16, Fp32, Int8, Mxfp4, Tf32};
        let list: &[Precision] = match self {
            Self::Inf1 => &[Fp32, Bf16, Fp16, Int8],
            Self::Trn1 | Self::Inf2 => &[Fp32, Tf32, Bf16, Fp16, Fp8, Int8],
            Self::Trn2 => &[Fp32, Tf32, Bf16, Fp16, Fp8],
            Self::Trn3 => &[Fp32, Tf32, Bf16, Fp16, Fp8, Mxfp4],
        };
        list.iter().copied().collect()
    }
}

/// One device as `neuron-ls` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NeuronLsDevice {
    /// The tool's logical device id (`/dev/neuronN`).
    pub index: u32,
    /// Canonical PCI bus id.
    pub bus_id: Option<String>,
    /// NeuronCores as the runtime sees them (logical cores on trn2 with LNC=2).
    pub neuroncores: Option<u32>,
    /// Device memory in bytes.
    pub memory_bytes: Option<u64>,
    /// Logical ids of the devices this one links to.
    pub connected_to: Vec<u32>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// CPUs the runtime pins this device's threads to.
    pub cpu_affinity: Option<String>,
}

/// What `neuron-ls` printed, in either format.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NeuronLsListing {
    /// The devices, in the tool's order.
    pub devices: Vec<NeuronLsDevice>,
    /// The EC2 instance type, when the table header names it.
    pub instance_type: Option<String>,
}

impl NeuronLsListing {
    fn entry(&self, bus_id: &str) -> Option<&NeuronLsDevice> {
        self.devices
            .iter()
            .find(|d| d.bus_id.as_deref() == Some(bus_id))
    }
}

/// The Neuron SDK's device listing tool.
const NEURON_LS: Tool = Tool::new("neuron-ls", Wording::PrintedUnparsable);

/// Runs `neuron-ls --json-output`, falling back to the plain table (older releases have no
/// JSON, and the JSON flag is being replaced). `Ok(None)` when the tool is not installed;
/// `Err` with a warning when neither form gave a listing.
fn run_neuron_ls(ctx: &Context) -> Result<Option<NeuronLsListing>, String> {
    let json = ["--json-output"];
    let json_error = match NEURON_LS.try_parsed(ctx, &json, parse_neuron_ls_json) {
        Ok(listing) => return Ok(listing),
        Err(failure) => NEURON_LS.warning(&failure, &json),
    };
    match NEURON_LS.try_parsed(ctx, &[], parse_neuron_ls_table) {
        Ok(listing) => Ok(listing),
        Err(ToolFailure::Output(err)) => Err(format!(
            "{json_error}; plain neuron-ls printed no device table: {err}"
        )),
        Err(ToolFailure::Run(err)) => Err(format!("{json_error}; plain neuron-ls: {err}")),
    }
}

/// Parses `neuron-ls --json-output`: an array of objects with `neuron_device`, `bdf`,
/// `nc_count`, `memory_size` (bytes), `connected_to`, `numa_node` (a string), ... Anything
/// printed before the array is skipped; entries without a device id are dropped.
pub fn parse_neuron_ls_json(text: &str) -> Result<NeuronLsListing, String> {
    let start = text
        .find('[')
        .ok_or_else(|| "no JSON array in the output".to_string())?;
    let value: Value = serde_json::from_str(text[start..].trim_end())
        .map_err(|err| format!("invalid JSON: {err}"))?;
    let entries = value
        .as_array()
        .ok_or_else(|| "the JSON is not an array".to_string())?;
    let devices = entries.iter().filter_map(json_device).collect();
    Ok(NeuronLsListing {
        devices,
        instance_type: None,
    })
}

fn json_device(entry: &Value) -> Option<NeuronLsDevice> {
    let number = |key: &str| -> Option<u64> {
        match entry.get(key)? {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    };
    let small = |key: &str| number(key).and_then(|n| u32::try_from(n).ok());
    let connected_to = entry
        .get("connected_to")
        .and_then(Value::as_array)
        .map(|ids| {
            ids.iter()
                .filter_map(|id| id.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect()
        })
        .unwrap_or_default();
    Some(NeuronLsDevice {
        index: small("neuron_device")?,
        bus_id: entry
            .get("bdf")
            .and_then(Value::as_str)
            .and_then(canonical_bus_id),
        neuroncores: small("nc_count"),
        memory_bytes: number("memory_size"),
        connected_to,
        numa_node: small("numa_node"),
        cpu_affinity: entry
            .get("cpu_affinity")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// Parses the plain `neuron-ls` table: optional `instance-type:` lines, a `+---+` framed
/// table whose column names span two header rows (`NEURON`/`DEVICE`), and one row per device
/// (process continuation rows, with an empty device cell, are skipped).
pub fn parse_neuron_ls_table(text: &str) -> Result<NeuronLsListing, String> {
    let instance_type = text.lines().find_map(|line| {
        line.trim()
            .strip_prefix("instance-type:")
            .map(|t| t.trim().to_string())
    });
    let mut rows = text
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with('|') || line.starts_with('+'));
    let mut headers: Vec<String> = Vec::new();
    // The header spans the `|` rows between the first and second separator.
    let mut seen_separator = false;
    for line in rows.by_ref() {
        if line.starts_with('+') {
            if seen_separator && !headers.is_empty() {
                break;
            }
            seen_separator = true;
            continue;
        }
        let cells = split_row(line);
        if headers.is_empty() {
            headers = vec![String::new(); cells.len()];
        }
        for (header, cell) in headers.iter_mut().zip(cells) {
            if !cell.is_empty() {
                if !header.is_empty() {
                    header.push(' ');
                }
                header.push_str(cell);
            }
        }
    }
    let column = |name: &str| headers.iter().position(|h| h == name);
    // The first tools (Neuron 1.0, inf1, 2020) named the device `LOGICAL ID` and split its
    // memory into `MEMORY CHANNEL 0` and `MEMORY CHANNEL 1` (aws-neuron-sdk
    // `docs/neuron-tools/Readme.md`); the device's memory is their sum.
    let index_column = column("NEURON DEVICE")
        .or_else(|| column("LOGICAL ID"))
        .ok_or_else(|| "no NEURON DEVICE column".to_string())?;
    let cores = column("NEURON CORES");
    let memory = column("NEURON MEMORY");
    let channels: Vec<usize> = headers
        .iter()
        .enumerate()
        .filter(|(_, h)| h.starts_with("MEMORY CHANNEL"))
        .map(|(i, _)| i)
        .collect();
    let connected = column("CONNECTED DEVICES");
    let bdf = column("PCI BDF");
    let numa = column("NUMA NODE");
    let affinity = column("CPU AFFINITY");
    let devices = rows
        .filter(|line| line.starts_with('|'))
        .filter_map(|line| {
            let cells = split_row(line);
            let cell = |i: Option<usize>| i.and_then(|i| cells.get(i)).copied();
            Some(NeuronLsDevice {
                index: cell(Some(index_column))?.parse().ok()?,
                bus_id: cell(bdf).and_then(canonical_bus_id),
                neuroncores: cell(cores).and_then(|c| c.parse().ok()),
                memory_bytes: cell(memory)
                    .and_then(parse_memory)
                    .or_else(|| channel_sum(channels.iter().map(|&i| cells.get(i).copied()))),
                connected_to: cell(connected)
                    .map(|list| {
                        list.split(',')
                            .filter_map(|n| n.trim().parse().ok())
                            .collect()
                    })
                    .unwrap_or_default(),
                numa_node: cell(numa).and_then(|n| n.parse().ok()),
                cpu_affinity: cell(affinity).filter(|a| !a.is_empty()).map(str::to_string),
            })
        })
        .collect::<Vec<_>>();
    if devices.is_empty() {
        return Err("the table has no device rows".into());
    }
    Ok(NeuronLsListing {
        devices,
        instance_type,
    })
}

fn split_row(line: &str) -> Vec<&str> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(str::trim).collect()
}

/// The sum of the memory channel cells, `None` when there are none or one does not parse.
fn channel_sum<'a>(cells: impl Iterator<Item = Option<&'a str>>) -> Option<u64> {
    let mut total: Option<u64> = None;
    for cell in cells {
        let bytes = parse_memory(cell?)?;
        total = Some(total.unwrap_or(0).checked_add(bytes)?);
    }
    total
}

/// `32 GB` (neuron-ls means GiB) or `512 MB` to bytes.
fn parse_memory(text: &str) -> Option<u64> {
    let mut parts = text.split_whitespace();
    let amount: u64 = parts.next()?.parse().ok()?;
    let unit = match parts.next()?.to_ascii_uppercase().as_str() {
        "GB" | "GIB" => GIB,
        "MB" | "MIB" => MIB,
        _ => return None,
    };
    amount.checked_mul(unit)
}

fn neuron_device(
    host: &HostRoot,
    function: &PciFunction,
    chip: NeuronChip,
    entry: Option<&NeuronLsDevice>,
    driver_version: Option<&str>,
) -> Device {
    let mut device = Device::new(
        function.address.clone(),
        Vendor::Aws,
        Family::Asic,
        chip.model(),
        "neuron",
    );
    device.architecture = Some(chip.architecture().to_string());
    device.precisions = chip.precisions();
    device.driver_version = driver_version.map(str::to_string);
    device.memory_bytes = entry
        .and_then(|e| e.memory_bytes)
        .or(Some(chip.memory_bytes()));
    device.compute_units = entry
        .and_then(|e| e.neuroncores)
        .or(Some(chip.neuroncores()));
    device.attributes.insert(
        "neuroncore-version".into(),
        chip.neuroncore_version().into(),
    );
    let Some(entry) = entry else {
        return device;
    };
    device.index = Some(entry.index);
    device.numa_node = entry.numa_node;
    device
        .attributes
        .insert("device-node".into(), format!("/dev/neuron{}", entry.index));
    if let Some(affinity) = &entry.cpu_affinity {
        device
            .attributes
            .insert("cpu-affinity".into(), affinity.clone());
    }
    apply_ecc_counters(host, entry.index, &mut device);
    device
}

/// Reads the driver's uncorrectable-ECC counters for logical device `index`.
fn apply_ecc_counters(host: &HostRoot, index: u32, device: &mut Device) {
    let dir = format!("{NEURON_SYSFS}/neuron{index}/stats/hardware");
    let counter = |name: &str| host.read_u64(format!("{dir}/{name}/total"));
    let counters = [
        counter("mem_ecc_uncorrected"),
        counter("mem_ecc_repairable_uncorrected"),
        counter("sram_ecc_uncorrected"),
    ];
    if counters.iter().all(Option::is_none) {
        return;
    }
    let total: u64 = counters.iter().flatten().sum();
    device.health.ecc_uncorrected = Some(total);
    if total == 0 {
        device.health.status = HealthStatus::Healthy;
    } else {
        device.health.status = HealthStatus::Unhealthy;
        device
            .health
            .reasons
            .push(format!("{total} uncorrectable ECC errors"));
    }
}

/// The NeuronLink group: from `neuron-ls`'s `connected_to` when it ran, otherwise from the
/// driver's sysfs `connected_devices`, which can only say that all devices are linked.
fn neuronlink_group(
    host: &HostRoot,
    devices: &[Device],
    listing: Option<&NeuronLsListing>,
) -> Option<InterconnectGroup> {
    let degrees: Vec<usize> = match listing {
        Some(listing) => listing
            .devices
            .iter()
            .map(|d| d.connected_to.len())
            .collect(),
        None => sysfs_degrees(host),
    };
    let max_degree = degrees.iter().copied().max().unwrap_or(0);
    if devices.len() < 2 || max_degree == 0 {
        return None;
    }
    let mut members: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    members.sort();
    let topology = neuronlink_topology(&degrees);
    Some(InterconnectGroup {
        kind: InterconnectKind::Neuronlink,
        id: InterconnectGroup::local_id(InterconnectKind::Neuronlink, &members),
        devices: members,
        links_per_device: u32::try_from(max_degree).ok(),
        bandwidth_gbps: None,
        topology,
    })
}

fn sysfs_degrees(host: &HostRoot) -> Vec<usize> {
    host.list(NEURON_SYSFS)
        .iter()
        .filter(|name| name.starts_with("neuron"))
        .map(|name| {
            host.read(format!("{NEURON_SYSFS}/{name}/connected_devices"))
                .map(|text| parse_connected_devices(&text).len())
                .unwrap_or(0)
        })
        .collect()
}

/// Parses the driver's `connected_devices` attribute (`12, 3, 4, 1`).
pub fn parse_connected_devices(text: &str) -> Vec<u32> {
    text.split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

/// Names the link pattern: four neighbours each on a square count is the 2D torus of
/// trn1/trn2 (`4x4`), two each a ring (inf2.48xlarge), fewer at the ends a line.
fn neuronlink_topology(degrees: &[usize]) -> Option<String> {
    let count = degrees.len();
    if degrees.iter().all(|&d| d == 4) {
        let side = (1..=count).find(|s| s * s >= count)?;
        return Some(if side * side == count {
            format!("{side}x{side}")
        } else {
            "2d-torus".to_string()
        });
    }
    if degrees.iter().all(|&d| d == 2) {
        return Some("ring".into());
    }
    if degrees.iter().all(|&d| d == 1 || d == 2) {
        return Some("line".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::{detect_on, fixture_sysfs_with_tool};
    use proptest::prelude::*;

    const JSON: &str =
        include_str!("../../../../fixtures/hosts/trn1-32xl/commands/outputs/neuron-ls.json");
    const TABLE: &str =
        include_str!("../../../../fixtures/hosts/trn1-32xl/commands/outputs/neuron-ls.txt");

    #[test]
    fn device_ids_follow_the_driver_table() {
        assert_eq!(NeuronChip::from_device_id(0x7164), Some(NeuronChip::Trn1));
        assert_eq!(NeuronChip::from_device_id(0x7066), Some(NeuronChip::Inf1));
        assert_eq!(NeuronChip::from_device_id(0x7565), Some(NeuronChip::Trn3));
        assert_eq!(NeuronChip::from_device_id(0xefa1), None);
        assert!(NeuronChip::Trn1.precisions().contains(&Precision::Fp8));
        assert!(!NeuronChip::Trn2.precisions().contains(&Precision::Int8));
    }

    #[test]
    fn parses_json_listing() {
        let listing = parse_neuron_ls_json(JSON).unwrap();
        assert_eq!(listing.devices.len(), 16);
        let first = &listing.devices[0];
        assert_eq!(first.bus_id.as_deref(), Some("0000:00:04.0"));
        assert_eq!(first.connected_to, [12, 3, 4, 1]);
        assert_eq!(first.memory_bytes, Some(32 * GIB));
        assert_eq!(first.neuroncores, Some(2));
        assert_eq!(listing.devices[9].numa_node, Some(1));
    }

    #[test]
    fn parses_the_trn2_json_the_docs_show() {
        let text = "[\n  {\"neuron_device\": 0, \"bdf\": \"cc:00.0\", \"numa_node\": \"1\",\n   \
             \"connected_to\": [12, 3, 4, 1], \"nc_count\": 4, \"logical_neuroncore_config\": 2,\n   \
             \"memory_size\": 103079215104, \"neuron_processes\": []},\n  {\"bdf\": \"x\"}\n]\n";
        let listing = parse_neuron_ls_json(text).unwrap();
        assert_eq!(listing.devices.len(), 1);
        assert_eq!(listing.devices[0].bus_id.as_deref(), Some("0000:cc:00.0"));
        assert_eq!(listing.devices[0].memory_bytes, Some(96 * GIB));
        assert!(parse_neuron_ls_json("neuron-ls: error\n").is_err());
        assert!(parse_neuron_ls_json("[{\"neuron_device\": 0,").is_err());
    }

    #[test]
    fn parses_plain_table() {
        let listing = parse_neuron_ls_table(TABLE).unwrap();
        assert_eq!(listing.instance_type.as_deref(), Some("trn1.32xlarge"));
        assert_eq!(listing.devices.len(), 16);
        let last = &listing.devices[15];
        assert_eq!(last.index, 15);
        assert_eq!(last.bus_id.as_deref(), Some("0000:00:13.0"));
        assert_eq!(last.connected_to, [11, 14, 3, 12]);
        assert_eq!(last.memory_bytes, Some(32 * GIB));
        assert_eq!(last.cpu_affinity.as_deref(), Some("32-63,96-127"));
    }

    #[test]
    fn parses_old_table_with_process_rows() {
        let text = "\
+--------+--------+--------+-----------+--------------+-------+----------+---------+
| NEURON | NEURON | NEURON | CONNECTED |     PCI      |  PID  | COMMAND  | RUNTIME |
| DEVICE | CORES  | MEMORY |  DEVICES  |     BDF      |       |          | VERSION |
+--------+--------+--------+-----------+--------------+-------+----------+---------+
| 0      | 4      | 8 GB   | 1         | 0000:00:1c.0 | 23518 | app01... | 2.0.0   |
|        |        |        |           |              | 23531 | app02... | 2.0.0   |
+--------+--------+--------+-----------+--------------+-------+----------+---------+
| 1      | 4      | 8 GB   | 2, 0      | 0000:00:1d.0 | NA    | NA       | NA      |
+--------+--------+--------+-----------+--------------+-------+----------+---------+
";
        let listing = parse_neuron_ls_table(text).unwrap();
        assert_eq!(listing.devices.len(), 2);
        assert_eq!(listing.devices[1].connected_to, [2, 0]);
        assert_eq!(listing.devices[0].memory_bytes, Some(8 * GIB));
        assert!(parse_neuron_ls_table("no devices found\n").is_err());
    }

    #[test]
    fn trn1_fixture() {
        let findings = detect_on(&Neuron, "trn1-32xl");
        assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
        assert_eq!(findings.devices.len(), 16);
        let device = &findings.devices[0];
        assert_eq!(device.id, "0000:00:04.0");
        assert_eq!(device.model, "AWS Trainium");
        assert_eq!(device.family, Family::Asic);
        assert_eq!(device.memory_bytes, Some(32 * GIB));
        assert_eq!(device.compute_units, Some(2));
        assert_eq!(device.driver_version.as_deref(), Some("2.19.64.0"));
        assert_eq!(device.health.status, HealthStatus::Healthy);
        let sick = &findings.devices[5];
        assert_eq!(sick.health.status, HealthStatus::Unhealthy);
        assert_eq!(sick.health.ecc_uncorrected, Some(2));
        assert_eq!(findings.devices[12].numa_node, Some(1));
        let [group] = findings.interconnects.as_slice() else {
            panic!("one NeuronLink group expected")
        };
        assert_eq!(group.kind, InterconnectKind::Neuronlink);
        assert_eq!(group.devices.len(), 16);
        assert_eq!(group.links_per_device, Some(4));
        assert_eq!(group.topology.as_deref(), Some("4x4"));
    }

    /// A copy of the trn1 fixture's sysfs with a different `neuron-ls` script.
    fn trn1_with_tool(script: Option<&str>) -> (tempfile::TempDir, Context) {
        fixture_sysfs_with_tool("trn1-32xl", "neuron-ls", script)
    }

    #[test]
    fn broken_neuron_ls_is_a_warning_and_sysfs_still_links_devices() {
        let (_dir, ctx) = trn1_with_tool(Some(
            "echo 'Failed to open neuron device: permission denied' >&2; exit 1",
        ));
        let findings = Neuron.detect(&ctx);
        assert_eq!(findings.devices.len(), 16);
        assert_eq!(findings.warnings.len(), 1, "{:?}", findings.warnings);
        assert!(findings.warnings[0].contains("permission denied"));
        assert_eq!(findings.interconnects[0].topology.as_deref(), Some("4x4"));
        assert_eq!(findings.devices[3].index, None);
    }

    #[test]
    fn old_neuron_ls_without_json_falls_back_to_the_table() {
        let table = TABLE.replace('\'', "");
        let (_dir, ctx) = trn1_with_tool(Some(&format!(
            "if [ \"$1\" = --json-output ]; then echo \"error: unexpected argument '$1'\" >&2; exit 2; fi\ncat <<'EOF'\n{table}EOF"
        )));
        let findings = Neuron.detect(&ctx);
        assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
        assert_eq!(findings.devices[15].index, Some(15));
        assert_eq!(
            findings.devices[0]
                .attributes
                .get("instance-type")
                .map(String::as_str),
            Some("trn1.32xlarge")
        );
    }

    #[test]
    fn missing_neuron_ls_is_silent() {
        let (_dir, ctx) = trn1_with_tool(None);
        let findings = Neuron.detect(&ctx);
        assert!(findings.warnings.is_empty());
        assert_eq!(findings.devices.len(), 16);
        assert_eq!(findings.devices[0].memory_bytes, Some(32 * GIB));
    }

    #[test]
    fn topology_names() {
        assert_eq!(neuronlink_topology(&[4; 16]).as_deref(), Some("4x4"));
        assert_eq!(neuronlink_topology(&[2; 12]).as_deref(), Some("ring"));
        assert_eq!(neuronlink_topology(&[1, 2, 2, 1]).as_deref(), Some("line"));
        assert_eq!(neuronlink_topology(&[4; 8]).as_deref(), Some("2d-torus"));
        assert_eq!(parse_connected_devices("12, 3, 4, 1\n"), [12, 3, 4, 1]);
        assert!(parse_connected_devices("\n").is_empty());
    }

    proptest! {
        #[test]
        fn json_parser_never_panics(s in ".*") {
            let _ = parse_neuron_ls_json(&s);
        }

        #[test]
        fn table_parser_never_panics(s in ".*") {
            let _ = parse_neuron_ls_table(&s);
        }

        #[test]
        fn parsers_survive_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_neuron_ls_json(&text);
            let _ = parse_neuron_ls_table(&text);
            let _ = parse_connected_devices(&text);
        }

        #[test]
        fn table_parser_survives_table_shaped_noise(
            cells in proptest::collection::vec("[|+ a-zA-Z0-9,:.-]{0,12}", 0..40)
        ) {
            let text = cells.join("\n");
            let _ = parse_neuron_ls_table(&text);
        }
    }
}
