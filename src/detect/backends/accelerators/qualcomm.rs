//! Qualcomm Cloud AI 100/080 cards: PCI functions 0x17cb:0xa100/0xa080 (driver `qaic`), their
//! `/dev/accel/accelN` nodes, and `qaic-util -q` for memory, NSP count, firmware and status.
//!
//! `qaic-util -q` prints one `QID <n>` block per SoC of tab-indented `Key:Value` lines
//! (`Status:Ready`, `PCI Address:0000:01:00.0`, `Dram Total:32692 MB`, `Nsp Total:16`,
//! `FW Version:1.12.2`, `Board serial:...`) after `LRT ...` header lines.
//!
//! The platform SDK installs the tool as `/opt/qti-aic/tools/qaic-util`, outside the usual
//! PATH. Detection runs tools from the search path only (the runner refuses paths), so that
//! directory must be on the agent's PATH for these details; without it the cards are still
//! reported from sysfs, with memory unknown (the 16 GB and 32 GB SKUs share one device id).
//! Free memory and free NSPs change with every workload and are left out of the report.

use std::collections::BTreeMap;

use crate::detect::backends::shared::tool_output::{Tool, Wording};
use crate::detect::pci::canonical_bus_id;
use crate::detect::{Backend, Context, Findings, HostRoot, PciFunction, pci};
use crate::hardware::{Device, Family, HealthStatus, MIB, Precision, Vendor};

use crate::detect::backends::shared::accel_node;

/// Qualcomm's PCI vendor id (also on its Wi-Fi and modem functions).
const QUALCOMM_VENDOR_ID: u16 = 0x17cb;
/// The kernel driver's name.
const DRIVER: &str = "qaic";

/// The `qualcomm` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Qualcomm;

impl Backend for Qualcomm {
    fn name(&self) -> &'static str {
        "qualcomm"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let cards: Vec<(&PciFunction, Option<u16>)> = ctx
            .pci_by_vendor(QUALCOMM_VENDOR_ID)
            // Qualcomm Wi-Fi and modem functions are network class.
            .filter(|f| !pci::is_plumbing(f.class_code()))
            .filter_map(|f| {
                let device_id = f.device_id(host);
                let known = device_id.is_some_and(|id| model_for(id).is_some());
                let bound = pci::driver(host, &f.address).as_deref() == Some(DRIVER);
                (known || bound).then_some((f, device_id))
            })
            .collect();
        if cards.is_empty() {
            return Findings::default();
        }
        let mut findings = Findings::default();
        let warnings = &mut findings.warnings;
        let report = QAIC_UTIL.run_parsed(ctx, &["-q"], parse_qaic_util, warnings);
        let nodes = accel_node::nodes_by_bus_id(host);
        findings.devices = cards
            .iter()
            .map(|(function, device_id)| {
                let soc = report.as_ref().and_then(|r| r.soc(&function.address));
                let node = nodes.get(&function.address).map(String::as_str);
                let lrt = report.as_ref().and_then(|r| r.lrt_version.as_deref());
                card_device(host, function, *device_id, soc, node, lrt)
            })
            .collect();
        findings
    }
}

/// The Cloud AI platform SDK's device tool.
const QAIC_UTIL: Tool = Tool::new("qaic-util", Wording::PrintedUnparsable);

/// The product behind a Qualcomm device id, for the accelerators `qaic` drives.
fn model_for(device_id: u16) -> Option<&'static str> {
    match device_id {
        0xa100 => Some("Qualcomm Cloud AI 100"),
        0xa080 => Some("Qualcomm Cloud AI 080"),
        _ => None,
    }
}

/// One `QID` block of `qaic-util -q`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QaicSoc {
    /// The QID (the tool's device index).
    pub qid: u32,
    /// `Key:Value` pairs as printed.
    pub fields: BTreeMap<String, String>,
}

impl QaicSoc {
    fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// Canonical bus id from `PCI Address`.
    pub fn bus_id(&self) -> Option<String> {
        self.field("PCI Address").and_then(canonical_bus_id)
    }

    /// `Dram Total` in bytes (the tool's MB are MiB).
    pub fn dram_bytes(&self) -> Option<u64> {
        let text = self.field("Dram Total")?;
        let mut parts = text.split_whitespace();
        let amount: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("MB") | None => amount.checked_mul(MIB),
            Some("GB") => amount.checked_mul(1024 * MIB),
            Some(_) => None,
        }
    }

    /// `Nsp Total`: the SoC's neural signal processors.
    pub fn nsp_total(&self) -> Option<u32> {
        self.field("Nsp Total")?.parse().ok()
    }
}

/// Everything `qaic-util -q` printed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QaicReport {
    /// The runtime version from the `LRT QC_IMAGE_VERSION:` header.
    pub lrt_version: Option<String>,
    /// The SoCs, by QID order.
    pub socs: Vec<QaicSoc>,
}

impl QaicReport {
    fn soc(&self, bus_id: &str) -> Option<&QaicSoc> {
        self.socs
            .iter()
            .find(|s| s.bus_id().as_deref() == Some(bus_id))
    }
}

/// Parses `qaic-util -q`. An output with neither QID blocks nor the `Number of devices:`
/// line is not a query report and is an error.
pub fn parse_qaic_util(text: &str) -> Result<QaicReport, String> {
    let mut report = QaicReport::default();
    let mut recognised = false;
    for raw in text.lines() {
        let line = raw.trim_end_matches('\r');
        let trimmed = line.trim();
        if let Some(version) = trimmed.strip_prefix("LRT QC_IMAGE_VERSION:") {
            report.lrt_version = Some(version.trim().to_string()).filter(|v| !v.is_empty());
            continue;
        }
        if trimmed.starts_with("Number of devices:") {
            recognised = true;
            continue;
        }
        if let Some(qid) = trimmed
            .strip_prefix("QID ")
            .and_then(|n| n.trim().parse().ok())
        {
            report.socs.push(QaicSoc {
                qid,
                fields: BTreeMap::new(),
            });
            continue;
        }
        // Fields are indented under their QID; unindented lines are headers or noise.
        let indented = line.starts_with('\t') || line.starts_with(' ');
        if let (true, Some(soc), Some((key, value))) =
            (indented, report.socs.last_mut(), trimmed.split_once(':'))
        {
            soc.fields
                .insert(key.trim().to_string(), value.trim().to_string());
        }
    }
    if !recognised && report.socs.is_empty() {
        return Err("no QID blocks and no device count".into());
    }
    Ok(report)
}

fn card_device(
    host: &HostRoot,
    function: &PciFunction,
    device_id: Option<u16>,
    soc: Option<&QaicSoc>,
    node: Option<&str>,
    lrt_version: Option<&str>,
) -> Device {
    let model = device_id.and_then(model_for).unwrap_or("Qualcomm Cloud AI");
    let mut device = Device::new(
        function.address.clone(),
        Vendor::Qualcomm,
        Family::Asic,
        model,
        "qualcomm",
    );
    device.architecture = Some(
        match device_id {
            Some(0xa080) => "aic080",
            _ => "aic100",
        }
        .to_string(),
    );
    // Cloud AI 100 product brief: FP16 and INT8 inference, FP32 accepted and converted.
    device.precisions = [Precision::Fp32, Precision::Fp16, Precision::Int8].into();
    if let Some(path) = node.and_then(|n| accel_node::dev_path(host, n)) {
        device.attributes.insert("device-node".into(), path);
    }
    if let Some(driver) = pci::driver(host, &function.address) {
        device.attributes.insert("driver".into(), driver);
    }
    if let Some(soc) = soc {
        apply_soc(&mut device, soc, lrt_version);
    }
    device
}

fn apply_soc(device: &mut Device, soc: &QaicSoc, lrt_version: Option<&str>) {
    device.index = Some(soc.qid);
    device.memory_bytes = soc.dram_bytes();
    device.compute_units = soc.nsp_total();
    device.firmware_version = soc.field("FW Version").map(str::to_string);
    device.uuid = soc.field("HW Serial").map(str::to_string);
    let attributes = &mut device.attributes;
    if let Some(serial) = soc.field("Board serial") {
        attributes.insert("board-serial".into(), serial.to_string());
    }
    if let Some(version) = lrt_version {
        attributes.insert("lrt-version".into(), version.to_string());
    }
    match soc.field("Status") {
        Some("Ready") => device.health.status = HealthStatus::Healthy,
        Some(status) => {
            device.health.status = HealthStatus::Unhealthy;
            device
                .health
                .reasons
                .push(format!("qaic-util status: {status}"));
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::{detect_on, fixture_sysfs_with_tool};
    use crate::hardware::GIB;
    use proptest::prelude::*;

    const QUERY: &str =
        include_str!("../../../../fixtures/hosts/cloud-ai100/commands/outputs/qaic-util-q.txt");

    #[test]
    fn parses_query_output() {
        let report = parse_qaic_util(QUERY).unwrap();
        assert_eq!(report.lrt_version.as_deref(), Some("LRT.AIC.REL.1.12.2"));
        assert_eq!(report.socs.len(), 2);
        let second = &report.socs[1];
        assert_eq!(second.qid, 1);
        assert_eq!(second.bus_id().as_deref(), Some("0000:81:00.0"));
        assert_eq!(second.dram_bytes(), Some(16210 * MIB));
        assert_eq!(second.nsp_total(), Some(14));
        assert_eq!(second.field("NSP Defective PG Mask"), Some("0x0"));
        assert_eq!(second.field("FW OEM_IMAGE_VERSION"), None);
    }

    #[test]
    fn parses_an_edge_device_report_and_rejects_noise() {
        let text = "LRT QC_IMAGE_VERSION: LRT.AIC.6.7.1.6.52\r\nNumber of devices: 1\r\nQID 0\r\n\
                    \tStatus:Error\r\n\tPCI Address:0002:01:00.0\r\n\tDram Total:8116 MB\r\n";
        let report = parse_qaic_util(text).unwrap();
        assert_eq!(report.socs[0].bus_id().as_deref(), Some("0002:01:00.0"));
        assert_eq!(report.socs[0].field("Status"), Some("Error"));
        assert!(
            parse_qaic_util("Number of devices: 0\n")
                .unwrap()
                .socs
                .is_empty()
        );
        assert!(parse_qaic_util("qaic-util: cannot open /dev/qaic_aic100_ctrl\n").is_err());
    }

    #[test]
    fn cloud_ai100_fixture() {
        let findings = detect_on(&Qualcomm, "cloud-ai100");
        assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
        assert_eq!(findings.devices.len(), 2, "the Matrox BMC VGA is no card");
        let pro = &findings.devices[0];
        assert_eq!(pro.id, "0000:01:00.0");
        assert_eq!(pro.model, "Qualcomm Cloud AI 100");
        assert_eq!(pro.memory_bytes, Some(32692 * MIB));
        assert_eq!(pro.compute_units, Some(16));
        assert_eq!(pro.firmware_version.as_deref(), Some("1.12.2"));
        assert_eq!(pro.health.status, HealthStatus::Healthy);
        assert_eq!(
            pro.attributes.get("device-node").map(String::as_str),
            Some("/dev/accel/accel0")
        );
        let standard = &findings.devices[1];
        assert_eq!(standard.index, Some(1));
        assert_eq!(standard.compute_units, Some(14));
        assert!(standard.memory_bytes.unwrap() < 16 * GIB);
        assert!(!standard.attributes.contains_key("nsp-free"));
    }

    fn cards_with_tool(body: Option<&str>) -> (tempfile::TempDir, Context) {
        fixture_sysfs_with_tool("cloud-ai100", "qaic-util", body)
    }

    #[test]
    fn failing_or_garbage_qaic_util_is_a_warning() {
        let (_dir, ctx) = cards_with_tool(Some(
            "echo 'Failed to open /dev/accel/accel0: Permission denied' >&2; exit 255",
        ));
        let findings = Qualcomm.detect(&ctx);
        assert_eq!(findings.devices.len(), 2);
        assert!(findings.warnings[0].contains("Permission denied"));
        assert_eq!(findings.devices[0].memory_bytes, None);
        let (_dir, ctx) = cards_with_tool(Some("printf '\\033[31mkilled\\033[0m\\n'"));
        let findings = Qualcomm.detect(&ctx);
        assert!(findings.warnings[0].contains("unparsable"));
    }

    #[test]
    fn tool_outside_path_is_silent() {
        let (_dir, ctx) = cards_with_tool(None);
        let findings = Qualcomm.detect(&ctx);
        assert!(findings.warnings.is_empty());
        assert_eq!(findings.devices.len(), 2);
        assert_eq!(findings.devices[1].health.status, HealthStatus::Unknown);
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in ".*") {
            if let Ok(report) = parse_qaic_util(&s) {
                for soc in &report.socs {
                    let _ = (soc.bus_id(), soc.dram_bytes(), soc.nsp_total());
                }
            }
        }

        #[test]
        fn parser_survives_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let _ = parse_qaic_util(&String::from_utf8_lossy(&bytes));
        }

        #[test]
        fn parser_survives_block_shaped_noise(
            lines in proptest::collection::vec("(QID [0-9]{0,4}|\t[A-Za-z ]{0,10}:[0-9A-Za-z .:]{0,14})", 0..30)
        ) {
            if let Ok(report) = parse_qaic_util(&lines.join("\n")) {
                for soc in &report.socs {
                    let _ = (soc.bus_id(), soc.dram_bytes(), soc.nsp_total());
                }
            }
        }
    }
}
