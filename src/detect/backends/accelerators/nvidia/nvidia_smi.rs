//! `nvidia-smi`: the per-GPU CSV query, row remapping, `-L` for MIG instances, and `topo -m`
//! plus `nvlink -s` for the NVLink domain.
//!
//! The CSV is read by column name because the field list shrinks on older drivers: a driver
//! that does not know a field (`compute_cap` before R510) rejects the whole query naming that
//! field, and the query is retried without it. The query asks for the header line
//! (`--format=csv,nounits`) and maps columns by the header's names (`memory.total [MiB]` is
//! `memory.total`), because that is the form public captures take (exporters and bug reports
//! run `--format=csv`): any field list, any column order, extra columns ignored, and values with
//! unit suffixes (`81559 MiB`, `700.00 W`) read. Output without a header is read in the order
//! asked for. Values in brackets (`[N/A]`, `[Not Supported]`,
//! `[Unknown Error]`) are unknowns, except `[GPU is lost]`, which is itself a health finding.
//! Lines before the CSV (`WARNING: infoROM is corrupted at gpu ...`) are recognised, CRLF line
//! endings and padding after commas are tolerated, and anything else that does not parse is
//! reported once as a warning.

use std::collections::{BTreeMap, BTreeSet};

use crate::detect::pci::canonical_bus_id;
use crate::detect::{CommandError, Context};
use crate::hardware::{MIB, Partition, PcieLink};

use super::nvlink::{self, TopoRow};
use super::{GpuRecord, HealthFacts, Inventory};

/// The tool.
const TOOL: &str = "nvidia-smi";

/// Per-GPU fields, in the order asked for.
pub(super) const QUERY_FIELDS: [&str; 19] = [
    "index",
    "pci.bus_id",
    "name",
    "uuid",
    "memory.total",
    "driver_version",
    "vbios_version",
    "compute_cap",
    "mig.mode.current",
    "ecc.mode.current",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
    "retired_pages.pending",
    "pcie.link.gen.max",
    "pcie.link.width.max",
    "pcie.link.gen.current",
    "pcie.link.width.current",
];

/// Fields a row is useless without; never dropped when retrying.
const REQUIRED_FIELDS: [&str; 2] = ["index", "pci.bus_id"];

/// Row remapping counters (Ampere and later), in the order asked for.
const REMAP_FIELDS: &str = "gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure";

/// The GPU query's format: a header line naming the columns, no unit suffixes.
const QUERY_FORMAT: &str = "--format=csv,nounits";

/// Machine-readable CSV for the remapped-rows query: no header line, no unit suffixes.
const CSV_FORMAT: &str = "--format=csv,noheader,nounits";

/// How many times a query is retried with a refused field removed.
const MAX_QUERY_RETRIES: usize = 6;

/// Asks `nvidia-smi` about every GPU. `None` when the tool is missing, has no GPU to talk
/// about, or fails (the failure goes into `warnings`).
pub(super) fn collect(ctx: &Context, warnings: &mut Vec<String>) -> Option<Inventory> {
    let (csv, fields) = run_query(ctx, warnings)?;
    let parsed = parse_query(&csv, &fields);
    if let Some(first) = parsed.unparsed.first() {
        warnings.push(format!(
            "nvidia-smi --query-gpu printed {} line(s) that could not be parsed, the first: {:?}",
            parsed.unparsed.len(),
            shorten(first),
        ));
    }
    let mut gpus = parsed.gpus;
    if gpus.is_empty() {
        return None;
    }
    if let Some(text) = run_aux(
        ctx,
        &[&format!("--query-remapped-rows={REMAP_FIELDS}"), CSV_FORMAT],
        warnings,
    ) {
        apply_remapped_rows(&mut gpus, &parse_remapped_rows(&text));
    }
    if gpus.iter().any(|gpu| gpu.mig_enabled == Some(true))
        && let Some(text) = run_aux(ctx, &["-L"], warnings)
    {
        apply_listing(&mut gpus, &parse_gpu_list(&text));
    }
    let bus_of: BTreeMap<u32, String> = gpus
        .iter()
        .filter_map(|gpu| Some((gpu.index?, gpu.bus_id.clone())))
        .collect();
    let matrix = run_aux(ctx, &["topo", "-m"], warnings)
        .map(|text| nvlink::parse_topo_matrix(&text))
        .unwrap_or_default();
    let status = if matrix.iter().any(|row| !row.nvlinks.is_empty()) {
        run_aux(ctx, &["nvlink", "-s"], warnings)
            .map(|text| nvlink::parse_nvlink_status(&text))
            .unwrap_or_default()
    } else {
        BTreeMap::new()
    };
    Some(Inventory {
        gpus,
        links: nvlink::graph_from_matrix(&matrix, &status, &bus_of),
        numa_hints: numa_hints(&matrix, &bus_of),
    })
}

/// Runs the CSV query, dropping fields the driver refuses. Returns the output and the fields
/// it holds.
fn run_query(ctx: &Context, warnings: &mut Vec<String>) -> Option<(String, Vec<&'static str>)> {
    let mut fields = QUERY_FIELDS.to_vec();
    for _ in 0..=MAX_QUERY_RETRIES {
        let query = format!("--query-gpu={}", fields.join(","));
        let (text, failure) = match ctx.run_tool(TOOL, &[&query, QUERY_FORMAT]) {
            Ok(None) => return None,
            Ok(Some(output)) => (output.stdout, None),
            Err(err) => (err.to_string(), Some(err)),
        };
        if let Some(refused) = refused_field(&text)
            && !REQUIRED_FIELDS.contains(&refused.as_str())
            && fields.iter().any(|field| *field == refused)
        {
            fields.retain(|field| *field != refused);
            continue;
        }
        return match failure {
            None => Some((text, fields)),
            Some(err) if reports_no_devices(&err) => None,
            Some(err) => {
                warnings.push(err.to_string());
                None
            }
        };
    }
    warnings.push("nvidia-smi refused too many query fields".to_string());
    None
}

/// Runs a supplementary query. Older drivers and GPUs without a feature make these exit
/// non-zero, which is not trouble; a hang or a flood is, and becomes a warning.
fn run_aux(ctx: &Context, args: &[&str], warnings: &mut Vec<String>) -> Option<String> {
    match ctx.run_tool(TOOL, args) {
        Ok(output) => output.map(|output| output.stdout),
        Err(err @ (CommandError::TimedOut { .. } | CommandError::OutputTooLarge { .. })) => {
            warnings.push(err.to_string());
            None
        }
        Err(_) => None,
    }
}

/// True when nvidia-smi failed only because the machine has no NVIDIA GPU.
fn reports_no_devices(err: &CommandError) -> bool {
    err.to_string().contains("No devices were found")
}

/// The field named in `Field "compute_cap" is not a valid field to query.`
fn refused_field(text: &str) -> Option<String> {
    let start = text.find("Field \"")? + "Field \"".len();
    let rest = &text[start..];
    let end = rest.find('"')?;
    rest[end..]
        .contains("is not a valid field")
        .then(|| rest[..end].to_string())
}

/// What the CSV query said.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct ParsedQuery {
    /// One record per GPU row.
    pub gpus: Vec<GpuRecord>,
    /// Lines that were neither a GPU row nor a known notice.
    pub unparsed: Vec<String>,
}

/// Parses `--query-gpu` CSV. A header line, when there is one, names the columns; without
/// one the columns are `fields`, the order asked for.
pub(super) fn parse_query(text: &str, fields: &[&str]) -> ParsedQuery {
    let mut parsed = ParsedQuery::default();
    let mut corrupted_inforom = BTreeSet::new();
    let mut columns: Vec<&str> = fields.to_vec();
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
        if let Some(notice) = line.strip_prefix("WARNING:") {
            if let Some(bus) = corrupted_inforom_bus(notice) {
                corrupted_inforom.insert(bus);
            }
            continue;
        }
        if let Some(header) = header_columns(line) {
            columns = header;
            continue;
        }
        match parse_row(line, &columns) {
            Some(record) => parsed.gpus.push(record),
            None => parsed.unparsed.push(line.to_string()),
        }
    }
    for gpu in &mut parsed.gpus {
        if corrupted_inforom.contains(&gpu.bus_id) {
            gpu.health
                .concerns
                .push("infoROM is corrupted (error counters may be unreliable)".into());
        }
    }
    parsed.gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    parsed.gpus.dedup_by(|a, b| a.bus_id == b.bus_id);
    parsed
}

/// One GPU row of the `--query-gpu` CSV, as the parser read it: the public view the
/// real-capture corpus test (`tests/detect_captures.rs`) checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueriedGpu {
    /// The driver's index.
    pub index: Option<u32>,
    /// Canonical PCI bus id (`0000:83:00.0`).
    pub bus_id: String,
    /// Product name.
    pub name: Option<String>,
    /// `GPU-...` UUID.
    pub uuid: Option<String>,
    /// Device memory in bytes.
    pub memory_bytes: Option<u64>,
    /// Driver version.
    pub driver_version: Option<String>,
    /// VBIOS version.
    pub vbios: Option<String>,
    /// CUDA compute capability.
    pub compute_capability: Option<(u32, u32)>,
    /// MIG mode.
    pub mig_enabled: Option<bool>,
    /// ECC mode.
    pub ecc_enabled: Option<bool>,
    /// The PCIe link.
    pub pcie: Option<PcieLink>,
}

/// Parses `--query-gpu` CSV as the backend does (with the backend's field list for
/// header-less output). Returns the GPU rows and how many lines could not be read.
pub fn parse_query_gpus(text: &str) -> (Vec<QueriedGpu>, usize) {
    let parsed = parse_query(text, &QUERY_FIELDS);
    let gpus = parsed
        .gpus
        .into_iter()
        .map(|gpu| QueriedGpu {
            index: gpu.index,
            bus_id: gpu.bus_id,
            name: gpu.name,
            uuid: gpu.uuid,
            memory_bytes: gpu.memory_bytes,
            driver_version: gpu.driver_version,
            vbios: gpu.vbios,
            compute_capability: gpu.compute_capability,
            mig_enabled: gpu.mig_enabled,
            ecc_enabled: gpu.health.ecc_enabled,
            pcie: gpu.pcie,
        })
        .collect();
    (gpus, parsed.unparsed.len())
}

/// The column names of a header line (`index, pci.bus_id, memory.total [MiB]`), without the
/// bracketed units. A line is a header when one of its cells is the `pci.bus_id` field name,
/// which no data row can hold (that cell is a bus id there).
fn header_columns(line: &str) -> Option<Vec<&str>> {
    let names: Vec<&str> = line
        .split(',')
        .map(|cell| {
            let cell = cell.trim();
            cell.split_once(" [")
                .map_or(cell, |(name, _unit)| name.trim_end())
        })
        .collect();
    names.contains(&"pci.bus_id").then_some(names)
}

/// The bus id in `infoROM is corrupted at gpu 0000:4E:00.0`.
fn corrupted_inforom_bus(notice: &str) -> Option<String> {
    let (_, bus) = notice.split_once("infoROM is corrupted at gpu")?;
    canonical_bus_id(bus.split_whitespace().next()?)
}

/// One CSV row; `None` when it has the wrong shape or no usable bus id.
fn parse_row(line: &str, fields: &[&str]) -> Option<GpuRecord> {
    let values: Vec<&str> = line.split(',').map(str::trim).collect();
    if values.len() != fields.len() {
        return None;
    }
    let mut record = GpuRecord {
        source: "nvidia-smi",
        ..GpuRecord::default()
    };
    let mut pcie = PcieLink::default();
    let mut retired = [None, None];
    for (field, raw) in fields.iter().zip(&values) {
        if raw.eq_ignore_ascii_case("[GPU is lost]") {
            push_once(&mut record.health.fatal, "GPU is lost (fallen off the bus)");
        }
        let Some(value) = known(raw) else { continue };
        match *field {
            "index" => record.index = Some(value.parse().ok()?),
            "pci.bus_id" => record.bus_id = canonical_bus_id(value)?,
            "name" => record.name = Some(value.to_string()),
            "uuid" => record.uuid = Some(value.to_string()),
            "memory.total" => {
                record.memory_bytes = first_number(value).and_then(|mib| mib.checked_mul(MIB));
            }
            "driver_version" => record.driver_version = Some(value.to_string()),
            "vbios_version" => record.vbios = Some(value.to_string()),
            "compute_cap" => record.compute_capability = parse_compute_capability(value),
            "mig.mode.current" => record.mig_enabled = enabled(value),
            "ecc.mode.current" => record.health.ecc_enabled = enabled(value),
            "ecc.errors.corrected.volatile.total" => {
                record.health.ecc_corrected = first_number(value);
            }
            "ecc.errors.uncorrected.volatile.total" => {
                record.health.ecc_uncorrected = first_number(value);
            }
            "retired_pages.single_bit_ecc.count" => retired[0] = first_number(value),
            "retired_pages.double_bit.count" => retired[1] = first_number(value),
            "retired_pages.pending" => record.health.retirement_pending = yes(value),
            "pcie.link.gen.max" => pcie.max_generation = small_number(value),
            "pcie.link.width.max" => pcie.max_width = small_number(value),
            "pcie.link.gen.current" => pcie.generation = small_number(value),
            "pcie.link.width.current" => pcie.width = small_number(value),
            _ => {}
        }
    }
    if record.bus_id.is_empty() {
        return None;
    }
    record.health.retired_pages = match retired {
        [None, None] => None,
        [sbe, dbe] => Some(sbe.unwrap_or(0).saturating_add(dbe.unwrap_or(0))),
    };
    record.pcie = (pcie != PcieLink::default()).then_some(pcie);
    Some(record)
}

/// The value, or `None` for the bracketed unknowns nvidia-smi prints (`[N/A]`,
/// `[Not Supported]`, `[Unknown Error]`...) and for bare `N/A` or nothing at all.
fn known(raw: &str) -> Option<&str> {
    let value = raw.trim();
    let unknown = value.is_empty()
        || value.eq_ignore_ascii_case("N/A")
        || (value.starts_with('[') && value.ends_with(']'));
    (!unknown).then_some(value)
}

/// The leading number of a value (`81559`, or `81559 MiB` without `nounits`).
fn first_number(value: &str) -> Option<u64> {
    value.split_whitespace().next()?.parse().ok()
}

fn small_number(value: &str) -> Option<u8> {
    first_number(value).and_then(|n| u8::try_from(n).ok())
}

/// `Enabled`/`Disabled` (and the `Enable`/`Disable` some drivers print for pending modes).
fn enabled(value: &str) -> Option<bool> {
    let lower = value.to_ascii_lowercase();
    if lower.starts_with("enable") {
        Some(true)
    } else if lower.starts_with("disable") {
        Some(false)
    } else {
        None
    }
}

/// `Yes`/`No`, or `1`/`0` as the remapped-rows query prints them.
fn yes(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "yes" | "1" | "true" => Some(true),
        "no" | "0" | "false" => Some(false),
        _ => None,
    }
}

/// `9.0` → (9, 0); `12.0` → (12, 0).
pub(super) fn parse_compute_capability(value: &str) -> Option<(u32, u32)> {
    let (major, minor) = value.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn push_once(list: &mut Vec<String>, message: &str) {
    if !list.iter().any(|m| m == message) {
        list.push(message.to_string());
    }
}

fn shorten(line: &str) -> String {
    line.chars().take(120).collect()
}

/// Row remapping counters of one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct RemapFacts {
    /// Rows remapped, correctable and uncorrectable causes together.
    pub rows: Option<u64>,
    /// Remaps waiting for a reset.
    pub pending: Option<bool>,
    /// A remap failed.
    pub failed: Option<bool>,
}

/// Parses `--query-remapped-rows` CSV in [`REMAP_FIELDS`] order, by bus id.
pub(super) fn parse_remapped_rows(text: &str) -> BTreeMap<String, RemapFacts> {
    let mut facts = BTreeMap::new();
    for line in text.lines() {
        let values: Vec<&str> = line.split(',').map(str::trim).collect();
        let [bus, correctable, uncorrectable, pending, failed] = values.as_slice() else {
            continue;
        };
        let Some(bus) = canonical_bus_id(bus) else {
            continue;
        };
        let counts = [correctable, uncorrectable].map(|v| known(v).and_then(first_number));
        let rows = match counts {
            [None, None] => None,
            [a, b] => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        facts.insert(
            bus,
            RemapFacts {
                rows,
                pending: known(pending).and_then(yes),
                failed: known(failed).and_then(yes),
            },
        );
    }
    facts
}

fn apply_remapped_rows(gpus: &mut [GpuRecord], remaps: &BTreeMap<String, RemapFacts>) {
    for gpu in gpus {
        if let Some(remap) = remaps.get(&gpu.bus_id) {
            let health: &mut HealthFacts = &mut gpu.health;
            health.remapped_rows = remap.rows;
            health.remap_pending = remap.pending;
            health.remap_failed = remap.failed;
        }
    }
}

/// One `GPU n:` entry of `nvidia-smi -L` with the MIG devices listed under it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedGpu {
    /// The GPU index.
    pub index: u32,
    /// Product name.
    pub name: String,
    /// `GPU-...` UUID.
    pub uuid: Option<String>,
    /// MIG devices (`MIG 3g.40gb Device 0: (UUID: MIG-...)`).
    pub partitions: Vec<Partition>,
}

/// Parses `nvidia-smi -L`: `GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-...)` lines, each followed
/// by its `MIG 1g.10gb     Device  0: (UUID: MIG-...)` lines.
///
/// Anything else is skipped: error text the driver prints on stdout (`Unable to determine the
/// device handle for GPU 0000:3B:00.0: Unknown Error`), lines that merely start like a GPU line
/// (`GPU 2:` without a UUID), and MIG lines without a device number or UUID. A GPU line must carry a `GPU-` UUID and a MIG line a `MIG-` one (or the older
/// `MIG-GPU-<uuid>/<gi>/<ci>` form, which also starts with `MIG-`).
pub fn parse_gpu_list(text: &str) -> Vec<ListedGpu> {
    let mut gpus: Vec<ListedGpu> = Vec::new();
    let mut last_was_gpu = false;
    for line in text.lines().map(str::trim) {
        if let Some(gpu) = listed_gpu(line) {
            gpus.push(gpu);
            last_was_gpu = true;
        } else if let Some(partition) = listed_mig(line)
            && last_was_gpu
            && let Some(gpu) = gpus.last_mut()
        {
            gpu.partitions.push(partition);
        } else {
            // A MIG line belongs to the GPU line above it, not to one before a foreign line.
            last_was_gpu = last_was_gpu && line.is_empty();
        }
    }
    gpus
}

/// `GPU 0: NVIDIA A100 80GB PCIe (UUID: GPU-41255406-...)`.
fn listed_gpu(line: &str) -> Option<ListedGpu> {
    let (index, description) = line.strip_prefix("GPU ")?.split_once(':')?;
    let index = index.trim().parse().ok()?;
    let (name, uuid) = split_uuid(description);
    let uuid = uuid.filter(|uuid| uuid.starts_with("GPU-"))?;
    (!name.is_empty()).then_some(ListedGpu {
        index,
        name,
        uuid: Some(uuid),
        partitions: Vec::new(),
    })
}

/// `MIG 3g.40gb     Device  0: (UUID: MIG-0929581a-...)`.
fn listed_mig(line: &str) -> Option<Partition> {
    let rest = line.strip_prefix("MIG ")?;
    let mut words = rest.split_whitespace();
    let profile = words.next()?;
    let device = words.next()? == "Device";
    let number = words.next()?.trim_end_matches(':').parse::<u32>().is_ok();
    let uuid = split_uuid(rest).1.filter(|uuid| uuid.starts_with("MIG-"))?;
    (device && number).then(|| Partition {
        kind: "mig".into(),
        profile: profile.to_string(),
        id: Some(uuid),
        memory_bytes: None,
    })
}

/// Splits `NVIDIA H100 80GB HBM3 (UUID: GPU-...)` into the text before and the UUID.
fn split_uuid(text: &str) -> (String, Option<String>) {
    match text.split_once("(UUID:") {
        Some((before, after)) => {
            let uuid = after.split(')').next().unwrap_or_default().trim();
            (
                before.trim().to_string(),
                (!uuid.is_empty()).then(|| uuid.to_string()),
            )
        }
        None => (text.trim().to_string(), None),
    }
}

/// Attaches MIG partitions from `-L` to the query's GPUs (by index, else UUID) and completes
/// names the query truncated.
fn apply_listing(gpus: &mut [GpuRecord], listing: &[ListedGpu]) {
    for gpu in gpus {
        let listed = listing
            .iter()
            .find(|l| Some(l.index) == gpu.index)
            .or_else(|| {
                listing
                    .iter()
                    .find(|l| l.uuid.is_some() && l.uuid == gpu.uuid)
            });
        let Some(listed) = listed else { continue };
        gpu.partitions.clone_from(&listed.partitions);
        gpu.name = fuller_name(gpu.name.take(), &listed.name);
    }
}

/// The longer of two spellings of a name when one is a (possibly `...`-truncated) prefix of
/// the other.
pub(super) fn fuller_name(current: Option<String>, other: &str) -> Option<String> {
    let other = other.trim();
    let Some(current) = current else {
        return (!other.is_empty()).then(|| other.to_string());
    };
    let stem = current.trim_end_matches("...").trim_end();
    if other.len() > current.len() && other.starts_with(stem) {
        Some(other.to_string())
    } else {
        Some(current)
    }
}

/// NUMA nodes from the `NUMA Affinity` column of `topo -m`, by bus id.
fn numa_hints(matrix: &[TopoRow], bus_of: &BTreeMap<u32, String>) -> BTreeMap<String, u32> {
    matrix
        .iter()
        .filter_map(|row| Some((bus_of.get(&row.index)?.clone(), row.numa?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const H100_QUERY: &str = include_str!(
        "../../../../../fixtures/hosts/h100-8x-nvswitch/commands/outputs/query-gpu.csv"
    );
    const A100_QUERY: &str =
        include_str!("../../../../../fixtures/hosts/a100-mig/commands/outputs/query-gpu.csv");
    const A100_LIST: &str =
        include_str!("../../../../../fixtures/hosts/a100-mig/commands/outputs/list-gpus.txt");
    const H100_REMAP: &str = include_str!(
        "../../../../../fixtures/hosts/h100-8x-nvswitch/commands/outputs/query-remapped-rows.csv"
    );

    #[test]
    fn parses_the_h100_query() {
        let parsed = parse_query(H100_QUERY, &QUERY_FIELDS);
        assert!(parsed.unparsed.is_empty(), "{:?}", parsed.unparsed);
        assert_eq!(parsed.gpus.len(), 8);
        let first = &parsed.gpus[0];
        assert_eq!(first.bus_id, "0000:1b:00.0");
        assert_eq!(first.index, Some(0));
        assert_eq!(first.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(first.memory_bytes, Some(81559 * MIB));
        assert_eq!(first.compute_capability, Some((9, 0)));
        assert_eq!(first.driver_version.as_deref(), Some("550.90.07"));
        assert_eq!(first.vbios.as_deref(), Some("96.00.99.00.01"));
        assert_eq!(first.mig_enabled, Some(false));
        assert_eq!(first.health.ecc_enabled, Some(true));
        // The retired-page columns are [N/A] on Hopper: unknown, not zero.
        assert_eq!(first.health.retired_pages, None);
        assert_eq!(first.health.retirement_pending, None);
        let link = first.pcie.unwrap();
        assert_eq!((link.generation, link.width), (Some(5), Some(16)));
        assert_eq!(parsed.gpus[5].health.ecc_corrected, Some(12));
    }

    #[test]
    fn crlf_and_a_warning_line_before_the_csv() {
        let parsed = parse_query(A100_QUERY, &QUERY_FIELDS);
        assert!(parsed.unparsed.is_empty(), "{:?}", parsed.unparsed);
        assert_eq!(parsed.gpus.len(), 2);
        assert_eq!(parsed.gpus[1].bus_id, "0000:00:06.0");
        assert_eq!(parsed.gpus[1].vbios.as_deref(), Some("92.00.36.00.02"));
        assert!(parsed.gpus[0].health.concerns.is_empty());
        assert_eq!(parsed.gpus[1].health.concerns.len(), 1);
        assert!(parsed.gpus[1].health.concerns[0].contains("infoROM"));
    }

    #[test]
    fn bracketed_values_are_unknown_and_a_lost_gpu_is_fatal() {
        let fields = [
            "index",
            "pci.bus_id",
            "memory.total",
            "compute_cap",
            "ecc.errors.uncorrected.volatile.total",
        ];
        let text = "0,00000000:18:00.0,  [Not Supported] , [Unknown Error],[GPU is lost]\n\
                    1, 0000:AF:00.0, 40960 MiB, 8.0, 3\n";
        let parsed = parse_query(text, &fields);
        assert_eq!(parsed.gpus.len(), 2);
        let lost = &parsed.gpus[0];
        assert_eq!((lost.memory_bytes, lost.compute_capability), (None, None));
        assert_eq!(lost.health.fatal.len(), 1);
        let other = &parsed.gpus[1];
        assert_eq!(other.bus_id, "0000:af:00.0");
        assert_eq!(other.memory_bytes, Some(40960 * MIB));
        assert_eq!(other.health.ecc_uncorrected, Some(3));
    }

    #[test]
    fn a_header_line_names_the_columns_and_units_are_read() {
        // Columns in another order than asked, an extra column, units in the header and
        // values: the form `--format=csv` prints.
        let text = "pci.bus_id, timestamp, memory.total [MiB], index, pcie.link.width.max\r\n\
                    00000000:83:00.0, 2026/09/01 20:41:56.941, 143771 MiB, 3, 16\r\n";
        let parsed = parse_query(text, &QUERY_FIELDS);
        assert!(parsed.unparsed.is_empty(), "{:?}", parsed.unparsed);
        assert_eq!(parsed.gpus.len(), 1);
        let gpu = &parsed.gpus[0];
        assert_eq!(gpu.index, Some(3));
        assert_eq!(gpu.bus_id, "0000:83:00.0");
        assert_eq!(gpu.memory_bytes, Some(143_771 * MIB));
        assert_eq!(gpu.pcie.and_then(|link| link.max_width), Some(16));
        // A row whose shape does not match the header is not read in the asked order.
        let parsed = parse_query("index, pci.bus_id\n0, 00000000:18:00.0, extra\n", &["x"]);
        assert!(parsed.gpus.is_empty());
        assert_eq!(parsed.unparsed.len(), 1);
    }

    #[test]
    fn rows_of_the_wrong_shape_are_reported_not_guessed() {
        let parsed = parse_query(
            "0, 00000000:18:00.0\nnot,a,gpu\n",
            &["index", "pci.bus_id", "name"],
        );
        assert!(parsed.gpus.is_empty());
        assert_eq!(parsed.unparsed.len(), 2);
        let parsed = parse_query("x, 00000000:18:00.0\n", &["index", "pci.bus_id"]);
        assert!(parsed.gpus.is_empty(), "a non-numeric index is garbage");
    }

    #[test]
    fn finds_the_refused_field() {
        let message =
            "nvidia-smi failed (exit code 2): Field \"compute_cap\" is not a valid field to query.";
        assert_eq!(refused_field(message).as_deref(), Some("compute_cap"));
        assert_eq!(refused_field("Field \"x\" is fine"), None);
        assert_eq!(refused_field("no field here"), None);
    }

    #[test]
    fn parses_remapped_rows() {
        let facts = parse_remapped_rows(H100_REMAP);
        assert_eq!(facts.len(), 8);
        assert_eq!(facts["0000:d1:00.0"].rows, Some(1));
        assert_eq!(facts["0000:1b:00.0"].pending, Some(false));
        let facts =
            parse_remapped_rows("00000000:00:05.0, [N/A], [N/A], [N/A], [N/A]\r\nGPU 1, 2\n");
        assert_eq!(facts.len(), 1);
        assert_eq!(facts["0000:00:05.0"], RemapFacts::default());
        let facts = parse_remapped_rows("0000:01:00.0, 0, 2, Yes, No\n");
        assert_eq!(facts["0000:01:00.0"].rows, Some(2));
        assert_eq!(facts["0000:01:00.0"].pending, Some(true));
        assert_eq!(facts["0000:01:00.0"].failed, Some(false));
    }

    #[test]
    fn parses_mig_devices_from_the_listing() {
        let listing = parse_gpu_list(A100_LIST);
        assert_eq!(listing.len(), 2);
        let profiles: Vec<&str> = listing[0]
            .partitions
            .iter()
            .map(|p| p.profile.as_str())
            .collect();
        assert_eq!(profiles, ["3g.40gb", "2g.20gb", "2g.20gb"]);
        assert_eq!(listing[1].partitions.len(), 7);
        assert!(listing[1].partitions.iter().all(|p| p.profile == "1g.10gb"));
        assert!(
            listing[0].partitions[0]
                .id
                .as_deref()
                .is_some_and(|id| id.starts_with("MIG-"))
        );
        assert_eq!(listing[0].name, "NVIDIA A100-SXM4-80GB");
        // The R470-era form carries the parent UUID inside the MIG id.
        let old = parse_gpu_list(
            "GPU 0: A100-SXM4-40GB (UUID: GPU-1)\n  MIG 1g.5gb Device 0: (UUID: MIG-GPU-1/7/0)\n",
        );
        assert_eq!(old[0].partitions[0].id.as_deref(), Some("MIG-GPU-1/7/0"));
    }

    #[test]
    fn the_listing_skips_lines_that_are_not_gpu_or_mig_lines() {
        // Error texts nvidia-smi prints on stdout, quoted from NVIDIA/open-gpu-kernel-modules#387
        // and NVIDIA/nvidia-container-toolkit#69; the GPU line without a UUID and the `MIG mode`
        // line are made up, to show that looking like a GPU or MIG line is not enough.
        let text = "GPU 0: NVIDIA GeForce RTX 2080 Ti (UUID: GPU-67a571b1-79ee-1016-8ea3-c1fff3f1c1d2)\n\
Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error\n\
  MIG 1g.5gb Device 0: (UUID: MIG-GPU-1/7/0)\n\
GPU 2: the driver said nothing useful\n\
Unable to determine the device handle for GPU0000:65:00.0: Unknown Error\n\
MIG mode: Enabled\n";
        let listing = parse_gpu_list(text);
        assert_eq!(listing.len(), 1, "{listing:?}");
        assert_eq!(listing[0].index, 0);
        assert!(
            listing[0].partitions.is_empty(),
            "a MIG line after an error line belongs to no GPU"
        );
    }

    #[test]
    fn completes_truncated_names() {
        let full = "NVIDIA RTX PRO 6000 Blackwell Server Edition";
        assert_eq!(
            fuller_name(Some("NVIDIA RTX PRO 6000 Blackwell Serv...".into()), full).as_deref(),
            Some(full)
        );
        assert_eq!(
            fuller_name(Some("NVIDIA L4".into()), "NVIDIA H100").as_deref(),
            Some("NVIDIA L4")
        );
        assert_eq!(fuller_name(None, "NVIDIA L4").as_deref(), Some("NVIDIA L4"));
    }

    proptest! {
        #[test]
        fn query_parser_never_panics(s in ".*") {
            let _ = parse_query(&s, &QUERY_FIELDS);
            let _ = parse_remapped_rows(&s);
            let _ = parse_gpu_list(&s);
            let _ = refused_field(&s);
        }

        #[test]
        fn query_parser_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let s = String::from_utf8_lossy(&bytes);
            let _ = parse_query(&s, &QUERY_FIELDS);
            let _ = parse_remapped_rows(&s);
            let _ = parse_gpu_list(&s);
        }

        #[test]
        fn csv_like_rows_never_panic(rows in proptest::collection::vec(
            proptest::collection::vec(proptest::sample::select(
                vec!["0", "7", "x", "", " ", "00000000:18:00.0", "0000:GG:00.0", "[N/A]", "N/A",
                     "[GPU is lost]", "9.0", "12.", "Enabled", "Yes", "81559 MiB", "99999999999999999999"]),
                19), 0..8)) {
            let text: String = rows.iter().map(|r| r.join(",") + "\r\n").collect();
            let _ = parse_query(&text, &QUERY_FIELDS);
        }
    }
}
