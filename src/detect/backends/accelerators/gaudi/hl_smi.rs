//! Parsers for what the habanalabs driver and `hl-smi` say about Gaudi devices.
//!
//! `hl-smi -Q <fields> -f csv,noheader` copies nvidia-smi's query syntax: one line per device,
//! fields separated by `, `, sizes with their unit (`98304 MiB`), and `N/A` where a value is
//! unavailable. Devices come in hl-smi's index order, which follows the module (OAM slot) id,
//! not the PCI bus order, so rows are matched to devices by bus id.

use crate::detect::pci::canonical_bus_id;
use crate::hardware::{GIB, HealthStatus, MIB};

/// The fields the backend asks for, in this order.
pub const QUERY_FIELDS: &str =
    "index,module_id,name,bus_id,memory.total,driver_version,serial,uuid";

/// One row of the query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HlSmiDevice {
    /// hl-smi's index.
    pub index: Option<u32>,
    /// Module (OAM slot) id.
    pub module_id: Option<u32>,
    /// Board name (`HL-225`).
    pub name: Option<String>,
    /// Canonical PCI bus id.
    pub bus_id: Option<String>,
    /// Device memory in bytes.
    pub memory_bytes: Option<u64>,
    /// Driver version.
    pub driver_version: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// UUID.
    pub uuid: Option<String>,
}

/// Parses the output of `hl-smi -Q` with [`QUERY_FIELDS`]. Blank lines are skipped; any other
/// line that is not a row is an error, since it means hl-smi printed something else.
pub fn parse_query(text: &str) -> Result<Vec<HlSmiDevice>, String> {
    let mut devices = Vec::new();
    for line in text.lines().map(|l| l.trim_end_matches('\r')) {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<Option<String>> = line.split(',').map(value).collect();
        let [index, module_id, name, bus, memory, driver, serial, uuid] = fields.as_slice() else {
            return Err(format!("unexpected line {:?}", truncate(line)));
        };
        let bus_id = bus.as_deref().and_then(canonical_bus_id);
        if bus_id.is_none() {
            return Err(format!("no bus id in line {:?}", truncate(line)));
        }
        devices.push(HlSmiDevice {
            index: index.as_deref().and_then(|v| v.parse().ok()),
            module_id: module_id.as_deref().and_then(|v| v.parse().ok()),
            name: name.clone(),
            bus_id,
            memory_bytes: memory.as_deref().and_then(parse_size),
            driver_version: driver.clone(),
            serial: serial.clone(),
            uuid: uuid.clone(),
        });
    }
    Ok(devices)
}

fn truncate(line: &str) -> String {
    line.chars().take(80).collect()
}

/// A trimmed field; `None` for `N/A` and empty fields.
fn value(field: &str) -> Option<String> {
    let field = field.trim();
    (!field.is_empty() && !field.eq_ignore_ascii_case("N/A")).then(|| field.to_string())
}

/// `98304 MiB` (hl-smi's unit) in bytes.
fn parse_size(text: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    let amount: u64 = words.next()?.parse().ok()?;
    let scale = match words.next().unwrap_or("MiB").to_ascii_lowercase().as_str() {
        "mib" | "mb" => MIB,
        "gib" | "gb" => GIB,
        _ => return None,
    };
    amount.checked_mul(scale).filter(|&b| b > 0)
}

/// The firmware version in a `cpucp_ver`/`armcp_ver` attribute: `armcpd version
/// hl-gaudi-1.2.3-fw-32.6.6-sec-4 (Jan 04 2023 - 20:47:16)` gives `hl-gaudi-1.2.3-fw-32.6.6-sec-4`.
pub fn parse_firmware_version(text: &str) -> Option<String> {
    let text = text.trim();
    let after = match text.find("version ") {
        Some(at) => &text[at + "version ".len()..],
        None => text,
    };
    after
        .split_whitespace()
        .next()
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// The health verdict of the driver's `status` attribute.
pub fn status_health(status: &str) -> (HealthStatus, Option<String>) {
    let status = status.trim();
    match status.to_ascii_lowercase().as_str() {
        "operational" => (HealthStatus::Healthy, None),
        // Passing states: the device is resetting or starting and will be back.
        "in reset" | "in device creation" | "in reset after device release" => (
            HealthStatus::Degraded,
            Some(format!("driver status: {status}")),
        ),
        "disabled" | "needs reset" | "malfunction" => (
            HealthStatus::Unhealthy,
            Some(format!("driver status: {status}")),
        ),
        _ => (HealthStatus::Unknown, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUERY: &str =
        include_str!("../../../../../fixtures/hosts/gaudi2-8x/commands/outputs/hl-smi-query.csv");
    const CPUCP: &str = include_str!(
        "../../../../../fixtures/hosts/gaudi2-8x/sys/bus/pci/devices/0000:33:00.0/cpucp_ver"
    );

    #[test]
    fn the_query_capture() {
        let devices = parse_query(QUERY).unwrap();
        assert_eq!(devices.len(), 8);
        let last = &devices[7];
        assert_eq!(last.index, Some(7));
        assert_eq!(last.bus_id.as_deref(), Some("0000:4d:00.0"));
        assert_eq!(last.name.as_deref(), Some("HL-225"));
        assert_eq!(last.memory_bytes, Some(96 * GIB));
        assert_eq!(last.driver_version.as_deref(), Some("1.21.1-bfcec49"));
        // hl-smi could not read one device's serial.
        assert_eq!(devices.iter().filter(|d| d.serial.is_none()).count(), 1);
    }

    #[test]
    fn crlf_and_garbage() {
        let crlf = "0, 0, HL-325L, 0000:19:00.0, 131072 MiB, 1.22.0-abc, N/A, N/A\r\n";
        let devices = parse_query(crlf).unwrap();
        assert_eq!(devices[0].memory_bytes, Some(128 * GIB));
        assert_eq!(devices[0].uuid, None);
        assert!(parse_query("hl-smi: failed to open device\n").is_err());
        assert!(parse_query("0, 0, HL-225, nowhere, 1 MiB, x, y, z\n").is_err());
        assert_eq!(parse_query("\n"), Ok(Vec::new()));
    }

    #[test]
    fn firmware_versions() {
        assert_eq!(
            parse_firmware_version(CPUCP).as_deref(),
            Some("hl-gaudi2-1.21.1-fw-59.2.3-sec-9")
        );
        assert_eq!(parse_firmware_version("   "), None);
        assert_eq!(parse_firmware_version("59.2.3").as_deref(), Some("59.2.3"));
    }

    #[test]
    fn statuses() {
        assert_eq!(status_health("operational\n").0, HealthStatus::Healthy);
        assert_eq!(status_health("in reset").0, HealthStatus::Degraded);
        assert_eq!(status_health("needs reset").0, HealthStatus::Unhealthy);
        assert_eq!(status_health("???").0, HealthStatus::Unknown);
    }
}
