//! The `--hardware` shorthand: `2x8xH100-80GB+nvswitch+ib` is two nodes of eight H100s each,
//! all eight on one NVSwitch, both nodes on one InfiniBand fabric. Groups separated by commas
//! describe a mixed fleet (`1x8xH100,4x1xL4`).
//!
//! Grammar: `[NODES x] DEVICES x PRODUCT[-MEMORY(GB|GiB)] (+LINK)*`, LINK one of `nvswitch`,
//! `nvlink`, `xgmi`, `pcie`, `ib`, or `nvlN` for multi-node NVLink domains of N devices:
//! `18x4xGB200+nvl72` is one GB200 NVL72 rack, 18 trays of 4 GPUs in one NVLink domain. The
//! nodes of each domain share an `nvidia.com/gpu.clique` label, as NVIDIA's GPU operator
//! labels real racks ([`crate::plan::inventory::NVLINK_CLIQUE_LABEL`]); N must be a multiple
//! of the devices per node, and the node count of a whole number of domains. A known product gets its precisions, bandwidth, exact
//! memory and usual link from the product table; an unknown one needs its memory and is
//! assumed to compute in fp32/fp16/bf16 with int8/int4 weight-only kernels.

use std::collections::BTreeMap;

use crate::hardware::{Family, GIB, InterconnectKind, Vendor};

use super::error::{PlanError, Result};
use super::inventory::{DeviceSpec, NVLINK_CLIQUE_LABEL, NodeSpec};
use super::products;
use super::units::Bytes;

/// Upper bounds that keep a typo from allocating millions of devices.
const MAX_NODES: u64 = 100_000;
const MAX_DEVICES_PER_NODE: u64 = 1024;
const MAX_DEVICES: u64 = 1_000_000;

/// Parses the shorthand into nodes.
pub fn parse_hardware(spec: &str) -> Result<Vec<NodeSpec>> {
    let mut nodes = Vec::new();
    for (group, text) in spec.split(',').enumerate() {
        nodes.extend(parse_group(spec, text.trim(), group)?);
    }
    if nodes.is_empty() {
        return Err(invalid(spec, "no hardware given"));
    }
    Ok(nodes)
}

fn invalid(spec: &str, reason: impl Into<String>) -> PlanError {
    PlanError::InvalidHardware {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

/// The scale-up fabrics a shorthand can name after `+`, by their own names.
const FABRICS: [InterconnectKind; 3] = [
    InterconnectKind::Nvswitch,
    InterconnectKind::Nvlink,
    InterconnectKind::Xgmi,
];

/// The link options after `+`.
#[derive(Debug, Default)]
struct Links {
    domain: Option<Option<InterconnectKind>>,
    infiniband: bool,
    /// Devices per multi-node NVLink domain (`+nvl72`).
    multi_node_domain: Option<u64>,
}

fn parse_group(spec: &str, text: &str, group: usize) -> Result<Vec<NodeSpec>> {
    let mut parts = text.split('+');
    let body = parts.next().unwrap_or_default().trim();
    let mut links = Links::default();
    for link in parts {
        let link = link.trim().to_ascii_lowercase();
        if let Some(kind) = FABRICS.into_iter().find(|kind| kind.as_str() == link) {
            links.domain = Some(Some(kind));
            continue;
        }
        if let Some(size) = link.strip_prefix("nvl").and_then(|n| n.parse::<u64>().ok()) {
            links.multi_node_domain = Some(size);
            continue;
        }
        match link.as_str() {
            "pcie" => links.domain = Some(None),
            "ib" | "infiniband" => links.infiniband = true,
            other => {
                return Err(invalid(
                    spec,
                    format!("unknown link {other:?} (nvswitch, nvlink, xgmi, pcie, ib, nvl72)"),
                ));
            }
        }
    }
    let (counts, product_text) = leading_counts(body);
    let (nodes, devices) = match counts.as_slice() {
        [] => (1, 1),
        [devices] => (1, *devices),
        [nodes, devices] => (*nodes, *devices),
        _ => {
            return Err(invalid(
                spec,
                format!("{body:?}: at most NODESxDEVICESxPRODUCT"),
            ));
        }
    };
    if nodes == 0 || devices == 0 {
        return Err(PlanError::NoDevices(format!(
            "--hardware {spec:?} describes zero devices"
        )));
    }
    if nodes > MAX_NODES || devices > MAX_DEVICES_PER_NODE || nodes * devices > MAX_DEVICES {
        return Err(invalid(
            spec,
            format!(
                "at most {MAX_NODES} nodes, {MAX_DEVICES_PER_NODE} devices per node and \
                 {MAX_DEVICES} devices in a group"
            ),
        ));
    }
    let nodes_per_domain = match links.multi_node_domain {
        Some(size) if size == 0 || size % devices != 0 || nodes % (size / devices) != 0 => {
            return Err(invalid(
                spec,
                format!(
                    "+nvl{size}: a domain of {size} devices must be whole nodes of {devices} and \
                     the {nodes} nodes whole domains"
                ),
            ));
        }
        Some(size) => Some(size / devices),
        None => None,
    };
    let (product_name, memory) = split_memory(spec, product_text)?;
    if product_name.is_empty() {
        return Err(invalid(spec, format!("{body:?} names no product")));
    }
    let template = device_template(spec, product_name, memory)?;
    let known_link = products::lookup(product_name, memory.map(Bytes::as_gib)).and_then(|p| p.link);
    let domain_kind = links.domain.unwrap_or(known_link);
    let prefix = slug(product_name);
    Ok((0..nodes)
        .map(|index| {
            let name = format!("{prefix}-{group}-{index}");
            let devices = (0..devices)
                .map(|d| DeviceSpec {
                    id: format!("gpu{d}"),
                    domain: domain_kind.map(|kind| format!("{}:0", kind.as_str())),
                    ..template.clone()
                })
                .collect();
            let labels = nodes_per_domain
                .map(|per| {
                    let clique = format!("nvl-{group}.{}", index / per);
                    BTreeMap::from([(NVLINK_CLIQUE_LABEL.to_string(), clique)])
                })
                .unwrap_or_default();
            NodeSpec {
                name,
                devices,
                fabric: links.infiniband.then(|| format!("ib-{group}")),
                labels,
            }
        })
        .collect())
}

/// Splits `2x8xMI300X` into `[2, 8]` and `MI300X`: leading runs of digits followed by `x`.
fn leading_counts(body: &str) -> (Vec<u64>, &str) {
    let mut counts = Vec::new();
    let mut rest = body;
    loop {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        let after = &rest[digits..];
        let Some(stripped) = after.strip_prefix(['x', 'X']).filter(|_| digits > 0) else {
            return (counts, rest);
        };
        counts.push(rest[..digits].parse().unwrap_or(u64::MAX));
        rest = stripped;
    }
}

/// Splits `H100-80GB` into `H100` and 80 GiB. A trailing segment that is not a size stays
/// part of the name (`TPU-v5e`).
fn split_memory<'a>(spec: &str, text: &'a str) -> Result<(&'a str, Option<Bytes>)> {
    let Some((name, last)) = text.rsplit_once('-') else {
        return Ok((text, None));
    };
    let lower = last.to_ascii_lowercase();
    let Some(number) = ["gib", "gb", "g"]
        .iter()
        .find_map(|unit| lower.strip_suffix(unit))
    else {
        return Ok((text, None));
    };
    let Ok(gb) = number.parse::<f64>() else {
        return Ok((text, None));
    };
    if !(gb.is_finite() && gb > 0.0 && gb <= 16_384.0) {
        return Err(invalid(spec, format!("memory {last:?} out of range")));
    }
    // Device memory "GB" means GiB in vendor tools (80 GB H100 = 79.6 GiB usable).
    Ok((name, Some(Bytes::from_f64(gb * GIB as f64))))
}

fn device_template(spec: &str, name: &str, memory: Option<Bytes>) -> Result<DeviceSpec> {
    if let Some(product) = products::lookup_sized(name, memory) {
        // The table's exact size when the given one is the nominal size of this product.
        let exact = memory.filter(|m| {
            (m.as_gib() - product.nominal_gb as f64).abs() > product.nominal_gb as f64 * 0.1
        });
        return Ok(DeviceSpec::of_product(product, String::new(), exact));
    }
    let memory = memory.ok_or_else(|| {
        invalid(
            spec,
            format!("unknown product {name:?}: give its memory, e.g. {name}-48GB"),
        )
    })?;
    Ok(DeviceSpec::of_unknown_product(
        String::new(),
        name,
        Vendor::Other,
        Family::Gpu,
        memory,
    ))
}

fn slug(name: &str) -> String {
    let slug: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    slug.trim_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Precision;

    #[test]
    fn nodes_devices_product_and_links() {
        let nodes = parse_hardware("2x8xH100-80GB+nvswitch+ib").unwrap();
        assert_eq!(nodes.len(), 2);
        assert!(
            nodes
                .iter()
                .all(|n| n.devices.len() == 8 && n.fabric.as_deref() == Some("ib-0"))
        );
        let device = &nodes[0].devices[0];
        assert_eq!(device.memory, Bytes(81_559 * crate::hardware::MIB));
        assert_eq!(device.domain.as_deref(), Some("nvswitch:0"));
        assert!(device.precisions.contains(&Precision::Fp8));
        assert_eq!(nodes[1].name, "h100-0-1");
    }

    #[test]
    fn defaults_and_mixed_fleets() {
        let nodes = parse_hardware("8xMI300X, 4x1xL4").unwrap();
        assert_eq!(nodes.len(), 5);
        assert_eq!(nodes[0].devices.len(), 8);
        assert_eq!(nodes[0].devices[0].domain.as_deref(), Some("xgmi:0"));
        assert_eq!(nodes[1].devices[0].domain, None, "L4s are PCIe cards");
        assert_eq!(
            parse_hardware("A100-40GB").unwrap()[0].devices[0]
                .memory
                .as_gib(),
            40.0
        );
        let pcie = parse_hardware("8xH100+pcie").unwrap();
        assert_eq!(pcie[0].devices[0].domain, None);
    }

    #[test]
    fn nvl72_racks_share_one_clique_per_72_devices() {
        let nodes = parse_hardware("36x4xGB200+nvl72").unwrap();
        assert_eq!(nodes.len(), 36);
        // The GB200 has its own row (186 GB, where the B200 has 180 GB).
        assert_eq!(nodes[0].devices[0].product, "NVIDIA GB200");
        assert_eq!(nodes[0].devices[0].memory.0, 189_471 * 1024 * 1024);
        assert_eq!(nodes[0].nvlink_clique(), Some("nvl-0.0"));
        assert_eq!(nodes[17].nvlink_clique(), Some("nvl-0.0"));
        assert_eq!(nodes[18].nvlink_clique(), Some("nvl-0.1"));
        assert_eq!(parse_hardware("2x8xH100").unwrap()[0].nvlink_clique(), None);
        for bad in ["18x5xGB200+nvl72", "10x4xGB200+nvl72", "18x4xGB200+nvl0"] {
            assert!(parse_hardware(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_products_need_memory() {
        let nodes = parse_hardware("4xFooAccel-48GB").unwrap();
        assert_eq!(nodes[0].devices[0].memory, Bytes::gib(48));
        assert!(nodes[0].devices[0].precisions.contains(&Precision::Bf16));
        let err = parse_hardware("4xFooAccel").unwrap_err().to_string();
        assert!(err.contains("give its memory"), "{err}");
    }

    #[test]
    fn bad_shorthand_is_an_error() {
        for bad in [
            "",
            "0x8xH100",
            "2x0xH100",
            "8xH100+warp",
            "1x2x3xH100",
            "8x",
            "8xH100-0GB",
            "999999x8xH100",
            "100000x1024xH100",
        ] {
            assert!(parse_hardware(bad).is_err(), "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in ".*") {
            let _ = parse_hardware(&s);
        }

        #[test]
        fn never_panics_on_shaped_input(n in 0u64..5, d in 0u64..20, name in "[A-Za-z0-9-]{0,12}", gb in "[0-9.]{0,6}") {
            let _ = parse_hardware(&format!("{n}x{d}x{name}-{gb}GB+ib"));
        }
    }
}
