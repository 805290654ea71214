//! Parsers for Intel's `xpu-smi`.
//!
//! `xpu-smi discovery -j` lists devices without their memory, and the per-device `-d N -j`
//! costs one slow run per GPU, so the backend asks for the CSV dump instead, which has every
//! device in one run: `xpu-smi discovery --dump 1,2,4,8,9,11,16,19`. Its quirks: string values
//! are quoted (JSON-escaped), missing values are `"N/A"`, sizes carry their unit inside the
//! quotes (`"131072.00 MiB"`), and the UUID column is `UUID` in older releases and `SOC UUID` in
//! newer ones, so columns are found by their header.
//!
//! `xpu-smi topology -m` prints the tile-to-tile matrix; `XL<lanes>` marks tiles joined directly
//! by Xe Link, `XL*` tiles that reach each other only through another tile.

use std::collections::BTreeSet;

use crate::detect::pci::canonical_bus_id;
use crate::hardware::{GIB, MIB};

/// The dump fields the backend asks for: device id, name, UUID, driver version, GFX firmware
/// version, PCI BDF address, memory physical size, number of EUs.
pub const DUMP_FIELDS: &str = "1,2,4,8,9,11,16,19";

/// One device of the dump.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XpuDevice {
    /// xpu-smi's device id.
    pub index: Option<u32>,
    /// Device name.
    pub name: Option<String>,
    /// UUID.
    pub uuid: Option<String>,
    /// Driver version.
    pub driver_version: Option<String>,
    /// GFX firmware version.
    pub firmware_version: Option<String>,
    /// Canonical PCI bus id.
    pub bus_id: Option<String>,
    /// Physical memory in bytes.
    pub memory_bytes: Option<u64>,
    /// Execution units.
    pub eu_count: Option<u32>,
}

/// Parses `xpu-smi discovery --dump ...` output. Lines before the header are skipped.
pub fn parse_discovery_dump(text: &str) -> Result<Vec<XpuDevice>, String> {
    let mut lines = text.lines().map(|line| line.trim_end_matches('\r'));
    let header = lines
        .by_ref()
        .map(split_csv_line)
        .find(|fields| {
            fields
                .first()
                .is_some_and(|f| f.eq_ignore_ascii_case("Device ID"))
        })
        .ok_or("no header line")?;
    let column = |wanted: &str| {
        header.iter().position(|h| {
            h.to_ascii_lowercase()
                .ends_with(&wanted.to_ascii_lowercase())
        })
    };
    let columns = Columns {
        index: column("Device ID"),
        name: column("Device Name"),
        uuid: column("UUID"),
        driver: column("Driver Version"),
        firmware: column("GFX Firmware Version"),
        bus: column("PCI BDF Address"),
        memory: column("Memory Physical Size"),
        eus: column("Number of EUs"),
    };
    if columns.bus.is_none() {
        return Err("no PCI BDF Address column".to_string());
    }
    Ok(lines
        .filter(|line| !line.trim().is_empty())
        .map(split_csv_line)
        .filter(|fields| fields.len() == header.len())
        .map(|fields| columns.device(&fields))
        .filter(|device| device.bus_id.is_some())
        .collect())
}

struct Columns {
    index: Option<usize>,
    name: Option<usize>,
    uuid: Option<usize>,
    driver: Option<usize>,
    firmware: Option<usize>,
    bus: Option<usize>,
    memory: Option<usize>,
    eus: Option<usize>,
}

impl Columns {
    fn device(&self, fields: &[String]) -> XpuDevice {
        let get = |column: Option<usize>| {
            column
                .and_then(|c| fields.get(c))
                .map(|v| v.trim())
                .filter(|v| !v.is_empty() && !v.eq_ignore_ascii_case("N/A"))
                .map(str::to_string)
        };
        XpuDevice {
            index: get(self.index).and_then(|v| v.parse().ok()),
            name: get(self.name),
            uuid: get(self.uuid),
            driver_version: get(self.driver),
            firmware_version: get(self.firmware),
            bus_id: get(self.bus).and_then(|v| canonical_bus_id(&v)),
            memory_bytes: get(self.memory).and_then(|v| parse_size(&v)),
            eu_count: get(self.eus)
                .and_then(|v| v.parse().ok())
                .filter(|&n| n > 0),
        }
    }
}

/// Splits one CSV line; quoted fields may hold commas and backslash escapes.
fn split_csv_line(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' if quoted => field.extend(chars.next()),
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    fields.push(field);
    fields.iter().map(|f| f.trim().to_string()).collect()
}

/// A size like `131072.00 MiB` in bytes.
fn parse_size(text: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    let amount: f64 = words.next()?.parse().ok()?;
    let scale = match words.next().unwrap_or("B").to_ascii_lowercase().as_str() {
        "b" => 1,
        "kib" | "kb" => 1 << 10,
        "mib" | "mb" => MIB,
        "gib" | "gb" => GIB,
        _ => return None,
    };
    let bytes = amount * scale as f64;
    // Sizes past 2^63 bytes are not memory sizes; refuse them rather than saturate.
    (1.0..9.2e18).contains(&bytes).then(|| bytes.round() as u64)
}

/// Pairs of xpu-smi device ids whose tiles are joined directly by Xe Link, from
/// `xpu-smi topology -m`; each pair once, smaller id first.
pub fn parse_topology_matrix(text: &str) -> Result<BTreeSet<(u32, u32)>, String> {
    let mut lines = text.lines().map(|line| line.trim_end_matches('\r'));
    // Every row has its "S" (self) cell; the header is the first bordered line without one.
    let header: Vec<Option<u32>> = lines
        .by_ref()
        .find(|line| line.contains('|') && !line.split('|').any(|cell| cell.trim() == "S"))
        .ok_or("no header line")?
        .split('|')
        .map(card_of)
        .collect();
    if header.iter().all(Option::is_none) {
        return Err("header names no GPU".to_string());
    }
    let mut pairs = BTreeSet::new();
    for line in lines {
        let mut cells = line.split('|');
        let Some(row) = cells.next().and_then(card_of) else {
            continue;
        };
        // The header's first cell names the first column; rows start with their own name.
        for (cell, column) in cells.zip(&header) {
            let Some(column) = *column else {
                continue;
            };
            if column != row && is_direct_xe_link(cell) {
                pairs.insert((row.min(column), row.max(column)));
            }
        }
    }
    Ok(pairs)
}

/// The card of a `GPU 1/0` (card/tile) label.
fn card_of(label: &str) -> Option<u32> {
    let rest = label.trim().strip_prefix("GPU")?.trim();
    let card = rest.split('/').next()?;
    card.trim().parse().ok()
}

/// `XL16` is a direct link; `XL*` is a path through another tile.
fn is_direct_xe_link(cell: &str) -> bool {
    cell.trim()
        .strip_prefix("XL")
        .is_some_and(|lanes| lanes.starts_with(|c: char| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str =
        include_str!("../../../../../fixtures/hosts/intel-gpu/commands/outputs/xpu-smi-dump.csv");
    const MATRIX: &str = include_str!(
        "../../../../../fixtures/hosts/intel-gpu/commands/outputs/xpu-smi-topology.txt"
    );

    #[test]
    fn the_dump_gives_every_device() {
        let devices = parse_discovery_dump(DUMP).unwrap();
        assert_eq!(devices.len(), 4);
        let first = &devices[0];
        assert_eq!(first.index, Some(0));
        assert_eq!(
            first.name.as_deref(),
            Some("Intel(R) Data Center GPU Max 1550")
        );
        assert_eq!(first.bus_id.as_deref(), Some("0000:4b:00.0"));
        assert_eq!(first.memory_bytes, Some(128 * GIB));
        assert_eq!(first.eu_count, Some(1024));
        assert_eq!(
            first.driver_version.as_deref(),
            Some("I915_23.10.32_PSB_231129.32")
        );
        // The capture has one device whose firmware version xpu-smi could not read.
        assert_eq!(
            devices
                .iter()
                .filter(|d| d.firmware_version.is_none())
                .count(),
            1
        );
    }

    #[test]
    fn older_headers_warning_lines_and_crlf() {
        let text = "Warning: something the tool wanted to say\r\n\
                    Device ID,Device Name,UUID,PCI BDF Address,Memory Physical Size\r\n\
                    0,\"Intel(R) Data Center GPU Flex 170\",\"00000000-0000-0000-0000-56c000008086\",\"0000:3A:00.0\",\"14248.00 MiB\"\r\n";
        let devices = parse_discovery_dump(text).unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].bus_id.as_deref(), Some("0000:3a:00.0"));
        assert_eq!(devices[0].memory_bytes, Some(14248 * MIB));
        assert!(devices[0].uuid.as_deref().unwrap().ends_with("8086"));
        assert_eq!(devices[0].eu_count, None);
    }

    #[test]
    fn dump_garbage() {
        assert!(parse_discovery_dump("").is_err());
        assert!(parse_discovery_dump("Error: Level Zero initialization failed\n").is_err());
        assert!(parse_discovery_dump("Device ID,Device Name\n0,\"x\"\n").is_err());
    }

    #[test]
    fn csv_lines_with_quotes_and_escapes() {
        assert_eq!(
            split_csv_line(r#"0,"a, b","c \"d\"",N/A"#),
            ["0", "a, b", "c \"d\"", "N/A"]
        );
        assert_eq!(parse_size("131072.00 MiB"), Some(128 * GIB));
        assert_eq!(parse_size("-1 MiB"), None);
        assert_eq!(parse_size("1e300 GiB"), None);
    }

    #[test]
    fn the_matrix_gives_direct_links_between_cards() {
        let pairs = parse_topology_matrix(MATRIX).unwrap();
        let expected: BTreeSet<(u32, u32)> =
            [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)].into();
        assert_eq!(pairs, expected);
    }

    #[test]
    fn the_documented_two_card_matrix() {
        // The example in xpu-smi's user guide: tiles 0/0 and 1/1 are joined directly.
        let text = "\n         GPU 0/0|GPU 0/1|GPU 1/0|GPU 1/1|CPU Affinity\n\
                    GPU 0/0 |S      |MDF    |XL*    |XL16   |0-23,48-71\n\
                    GPU 0/1 |MDF    |S      |XL16   |XL*    |0-23,48-71\n\
                    GPU 1/0 |XL*    |XL16   |S      |MDF    |24-47,72-95\n\
                    GPU 1/1 |XL16   |XL*    |MDF    |S      |24-47,72-95\n";
        assert_eq!(parse_topology_matrix(text).unwrap(), [(0, 1)].into());
        assert!(parse_topology_matrix("no matrix here").is_err());
    }
}
