//! The kernel's compute-accelerator device class, `/sys/class/accel`: which `accelN` node
//! belongs to which PCI function.
//!
//! Several backends (Intel NPU, AMD XDNA, Qualcomm Cloud AI, older Google TPU drivers) expose
//! their devices there. Each entry's `device` link points at the PCI function; in fixture
//! trees (and some container mounts) the link may be a plain directory, so the bus id is also
//! taken from `device/uevent`'s `PCI_SLOT_NAME`.

use std::collections::BTreeMap;

use crate::detect::HostRoot;
use crate::detect::pci::canonical_bus_id;

/// Where sysfs lists accel-class devices.
pub(crate) const ACCEL_CLASS: &str = "/sys/class/accel";

/// Maps canonical PCI bus ids to accel node names (`accel0`), for every accel-class device
/// whose PCI function can be told. Empty when the class does not exist.
pub(crate) fn nodes_by_bus_id(host: &HostRoot) -> BTreeMap<String, String> {
    host.list(ACCEL_CLASS)
        .into_iter()
        .filter(|name| name.starts_with("accel"))
        .filter_map(|name| Some((bus_id_of(host, &name)?, name)))
        .collect()
}

/// The PCI bus id behind one accel node, from its `device` link or its uevent.
fn bus_id_of(host: &HostRoot, node: &str) -> Option<String> {
    let device = format!("{ACCEL_CLASS}/{node}/device");
    host.link_name(&device)
        .and_then(|name| canonical_bus_id(&name))
        .or_else(|| {
            let uevent = host.read(format!("{device}/uevent"))?;
            slot_name_from_uevent(&uevent)
        })
}

/// Builds one device per matched PCI function, handing each its `/dev/accel` node name (when
/// the driver created one) and its index among the matches, and wraps them as findings.
pub(crate) fn devices_with_nodes<T: Copy>(
    host: &HostRoot,
    matched: &[(&crate::detect::PciFunction, T)],
    build: impl Fn(&crate::detect::PciFunction, T, usize, Option<&str>) -> crate::hardware::Device,
) -> crate::detect::Findings {
    if matched.is_empty() {
        return crate::detect::Findings::default();
    }
    let nodes = nodes_by_bus_id(host);
    let devices = matched
        .iter()
        .enumerate()
        .map(|(index, (function, extra))| {
            build(
                function,
                *extra,
                index,
                nodes.get(&function.address).map(String::as_str),
            )
        })
        .collect();
    crate::detect::Findings {
        devices,
        ..crate::detect::Findings::default()
    }
}

/// The canonical bus id in a uevent's `PCI_SLOT_NAME=` line.
pub(crate) fn slot_name_from_uevent(uevent: &str) -> Option<String> {
    uevent
        .lines()
        .find_map(|line| line.trim().strip_prefix("PCI_SLOT_NAME="))
        .and_then(canonical_bus_id)
}

/// The device node path of an accel node: the DRM accel framework puts it under
/// `/dev/accel/`, older out-of-tree drivers directly under `/dev`. `None` when neither exists.
pub(crate) fn dev_path(host: &HostRoot, node: &str) -> Option<String> {
    [format!("/dev/accel/{node}"), format!("/dev/{node}")]
        .into_iter()
        .find(|path| host.exists(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn maps_nodes_through_links_and_uevents() {
        let dir = tempfile::tempdir().unwrap();
        let class = dir.path().join("sys/class/accel");
        fs::create_dir_all(class.join("accel0")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:0b.0",
            class.join("accel0/device"),
        )
        .unwrap();
        fs::create_dir_all(class.join("accel1/device")).unwrap();
        fs::write(
            class.join("accel1/device/uevent"),
            "DRIVER=amdxdna\nPCI_SLOT_NAME=0000:C5:00.1\n",
        )
        .unwrap();
        fs::create_dir_all(class.join("accel2/device")).unwrap();
        fs::create_dir_all(dir.path().join("dev/accel")).unwrap();
        fs::write(dir.path().join("dev/accel/accel1"), "").unwrap();

        let host = HostRoot::new(dir.path());
        let nodes = nodes_by_bus_id(&host);
        assert_eq!(
            nodes.get("0000:00:0b.0").map(String::as_str),
            Some("accel0")
        );
        assert_eq!(
            nodes.get("0000:c5:00.1").map(String::as_str),
            Some("accel1")
        );
        assert_eq!(nodes.len(), 2);
        assert_eq!(
            dev_path(&host, "accel1").as_deref(),
            Some("/dev/accel/accel1")
        );
        assert_eq!(dev_path(&host, "accel0"), None);
    }

    #[test]
    fn uevent_without_slot_is_none() {
        assert_eq!(
            slot_name_from_uevent("DRIVER=x\nMODALIAS=pci:v8086\n"),
            None
        );
        assert_eq!(
            slot_name_from_uevent("PCI_SLOT_NAME=0000:00:0b.0").as_deref(),
            Some("0000:00:0b.0")
        );
    }
}
