//! The PCI bus as sysfs shows it: one cheap scan shared by all backends, plus per-device
//! details (link, NUMA node, driver) read only for the devices a backend cares about.
//!
//! The scan reads two attributes per function (`vendor`, `class`) because a bare VM has dozens
//! of functions and detection on a host without accelerators must stay within a couple of
//! milliseconds.

use crate::hardware::PcieLink;

use super::HostRoot;

/// Where sysfs lists PCI functions.
pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// One PCI function: enough to decide whether a backend cares about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciFunction {
    /// Canonical bus id, `dddd:bb:dd.f`, lowercase.
    pub address: String,
    /// PCI vendor id.
    pub vendor: u16,
    /// PCI class code, 24 bits (`0x030200` is a 3D controller).
    pub class: u32,
}

impl PciFunction {
    /// The class without the programming interface (`0x0302`).
    pub fn class_code(&self) -> u16 {
        // The low byte is the programming interface; the upper 16 bits are class and subclass.
        u16::try_from(self.class >> 8).unwrap_or(u16::MAX)
    }

    /// True for display controllers (0x03xx), processing accelerators (0x1200) and
    /// co-processors (0x0b40): the classes accelerators use.
    pub fn is_accelerator_class(&self) -> bool {
        let code = self.class_code();
        code >> 8 == 0x03 || code == 0x1200 || code == 0x0b40
    }

    /// The sysfs directory of this function (host-absolute).
    pub fn sysfs_dir(&self) -> String {
        format!("{PCI_DEVICES}/{}", self.address)
    }

    /// Reads the PCI device id.
    pub fn device_id(&self, host: &HostRoot) -> Option<u16> {
        let id = host.read_u64(format!("{}/device", self.sysfs_dir()))?;
        u16::try_from(id).ok()
    }
}

/// Bridges, NICs, storage, audio and serial-bus functions (by 16-bit class code) are never
/// the accelerator, whoever made them; vendor backends skip them before reading device ids.
pub(crate) fn is_plumbing(class_code: u16) -> bool {
    matches!(class_code >> 8, 0x01 | 0x02 | 0x04 | 0x06 | 0x0c)
}

/// Lists the PCI functions, sorted by address. Empty when sysfs has no PCI bus.
pub fn scan(host: &HostRoot) -> Vec<PciFunction> {
    host.list(PCI_DEVICES)
        .into_iter()
        .filter_map(|name| {
            let address = canonical_bus_id(&name)?;
            let dir = format!("{PCI_DEVICES}/{name}");
            let vendor = u16::try_from(host.read_u64(format!("{dir}/vendor"))?).ok()?;
            let class = u32::try_from(host.read_u64(format!("{dir}/class"))?).ok()?;
            Some(PciFunction {
                address,
                vendor,
                class,
            })
        })
        .collect()
}

/// Normalises a PCI bus id to `dddd:bb:dd.f` lowercase. `nvidia-smi` prints an 8-digit domain
/// (`00000000:18:00.0`), others omit the domain (`18:00.0`). `None` when it is not a bus id.
pub fn canonical_bus_id(text: &str) -> Option<String> {
    let text = text.trim();
    let (rest, function) = text.rsplit_once('.')?;
    let mut parts: Vec<&str> = rest.split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0");
    }
    let [domain, bus, device] = parts.as_slice() else {
        return None;
    };
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let device = u8::from_str_radix(device, 16).ok()?;
    let function = u8::from_str_radix(function, 16).ok()?;
    if domain > 0xffff || device > 0x1f || function > 7 {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// The PCIe link of a function, from `current_link_speed`/`width` and their `max_` twins.
pub fn link(host: &HostRoot, address: &str) -> Option<PcieLink> {
    let dir = format!("{PCI_DEVICES}/{address}");
    let speed = |name: &str| {
        host.read_trimmed(format!("{dir}/{name}"))
            .and_then(|s| PcieLink::generation_from_speed(&s))
    };
    let width = |name: &str| {
        host.read_u64(format!("{dir}/{name}"))
            .and_then(|w| u8::try_from(w).ok())
            .filter(|&w| w > 0)
    };
    let link = PcieLink {
        generation: speed("current_link_speed"),
        width: width("current_link_width"),
        max_generation: speed("max_link_speed"),
        max_width: width("max_link_width"),
    };
    (link != PcieLink::default()).then_some(link)
}

/// The NUMA node of a function. The kernel writes -1 when the firmware names none, which is
/// what virtual machines and many single-socket boards do; where the host has one NUMA node
/// that node is still the answer, and it is the one `nvidia-smi topo -m` prints, so every
/// source describes the same device the same way (seen on a real H100/H200 VM: sysfs -1,
/// nvidia-smi `NUMA Affinity 0`; `fixtures/hosts/h200-1x-vm`). With several nodes, -1 stays
/// unknown.
pub fn numa_node(host: &HostRoot, address: &str) -> Option<u32> {
    let text = host.read_trimmed(format!("{PCI_DEVICES}/{address}/numa_node"))?;
    match text.parse::<i64>().ok()? {
        -1 => only_numa_node(host),
        node => u32::try_from(node).ok(),
    }
}

/// The host's NUMA node when it has exactly one online (`online` reads `0`, not `0-1`).
fn only_numa_node(host: &HostRoot) -> Option<u32> {
    host.read_trimmed("/sys/devices/system/node/online")?
        .parse()
        .ok()
}

/// The kernel driver bound to a function (`nvidia`, `amdgpu`, `neuron`).
pub fn driver(host: &HostRoot, address: &str) -> Option<String> {
    host.link_name(format!("{PCI_DEVICES}/{address}/driver"))
}

/// Fills a device's PCIe link and NUMA node from sysfs when it has a PCI bus id and the
/// backend did not learn them elsewhere.
pub fn fill_bus_facts(host: &HostRoot, device: &mut crate::hardware::Device) {
    if canonical_bus_id(&device.id).as_deref() != Some(device.id.as_str()) {
        return;
    }
    if device.pcie.is_none() {
        device.pcie = link(host, &device.id);
    }
    if device.numa_node.is_none() {
        device.numa_node = numa_node(host, &device.id);
    }
}

/// A `KEY=value` entry of a sysfs `uevent` file (`DRIVER`, `PCI_SLOT_NAME`).
pub fn uevent(host: &HostRoot, dir: &str, key: &str) -> Option<String> {
    let text = host.read(format!("{dir}/uevent"))?;
    text.lines().find_map(|line| {
        let (name, value) = line.split_once('=')?;
        (name == key && !value.trim().is_empty()).then(|| value.trim().to_string())
    })
}

/// The PCI bus id of the device behind a class device's `device` entry
/// (`/sys/class/drm/card0/device`): the symlink's target, or `PCI_SLOT_NAME` from its `uevent`
/// where the entry is a plain directory (copied sysfs trees, fixtures).
pub fn bus_id_of(host: &HostRoot, device_dir: &str) -> Option<String> {
    host.link_name(device_dir)
        .and_then(|name| canonical_bus_id(&name))
        .or_else(|| uevent(host, device_dir, "PCI_SLOT_NAME").and_then(|s| canonical_bus_id(&s)))
}

/// The driver bound to a function: the `driver` link, or `DRIVER` from its `uevent`.
pub fn bound_driver(host: &HostRoot, address: &str) -> Option<String> {
    driver(host, address).or_else(|| uevent(host, &format!("{PCI_DEVICES}/{address}"), "DRIVER"))
}

/// DRM cards (`card0`, not connectors like `card0-DP-1`) by the bus id of their PCI device.
pub fn drm_cards(host: &HostRoot) -> std::collections::BTreeMap<String, String> {
    host.list("/sys/class/drm")
        .into_iter()
        .filter(|name| {
            name.strip_prefix("card")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|card| {
            let bus = bus_id_of(host, &format!("/sys/class/drm/{card}/device"))?;
            Some((bus, card))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonicalises_bus_ids() {
        assert_eq!(
            canonical_bus_id("00000000:18:00.0").as_deref(),
            Some("0000:18:00.0")
        );
        assert_eq!(
            canonical_bus_id("0000:C1:00.0").as_deref(),
            Some("0000:c1:00.0")
        );
        assert_eq!(canonical_bus_id("18:00.0").as_deref(), Some("0000:18:00.0"));
        assert_eq!(canonical_bus_id("GPU-1234"), None);
        assert_eq!(canonical_bus_id("0000:18:40.0"), None);
    }

    #[test]
    fn accelerator_classes() {
        let f = |class| PciFunction {
            address: "0000:00:00.0".into(),
            vendor: 0x10de,
            class,
        };
        assert!(f(0x030200).is_accelerator_class());
        assert!(f(0x120000).is_accelerator_class());
        assert!(!f(0x020000).is_accelerator_class());
    }

    /// Writes `text` at `path` under `root`, making the folders on the way.
    fn write(root: &std::path::Path, path: &str, text: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn unknown_numa_node_is_the_only_node_of_a_single_node_host() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let fs = |p: &str, text: &str| write(root, p, text);
        fs("sys/bus/pci/devices/0000:00:06.0/numa_node", "-1\n");
        fs("sys/bus/pci/devices/0000:81:00.0/numa_node", "1\n");
        let host = HostRoot::new(root);
        // No node list at all: nothing to go on.
        assert_eq!(numa_node(&host, "0000:00:06.0"), None);
        fs("sys/devices/system/node/online", "0\n");
        assert_eq!(numa_node(&host, "0000:00:06.0"), Some(0));
        fs("sys/devices/system/node/online", "0-1\n");
        assert_eq!(numa_node(&host, "0000:00:06.0"), None);
        assert_eq!(numa_node(&host, "0000:81:00.0"), Some(1));
    }

    #[test]
    fn bus_ids_and_drivers_from_links_or_uevent() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let fs = |p: &str, text: &str| write(root, p, text);
        // card0's device is a link; card1's is a plain copy with only its uevent.
        fs("sys/bus/pci/devices/0000:05:00.0/vendor", "0x1002\n");
        std::fs::create_dir_all(root.join("sys/class/drm/card0")).unwrap();
        std::os::unix::fs::symlink(
            "../../../bus/pci/devices/0000:05:00.0",
            root.join("sys/class/drm/card0/device"),
        )
        .unwrap();
        fs(
            "sys/class/drm/card1/device/uevent",
            "DRIVER=xe\nPCI_SLOT_NAME=0000:0A:00.0\n",
        );
        fs("sys/bus/pci/devices/0000:0a:00.0/uevent", "DRIVER=xe\n");
        let host = HostRoot::new(root);
        assert_eq!(
            bus_id_of(&host, "/sys/class/drm/card0/device").as_deref(),
            Some("0000:05:00.0")
        );
        assert_eq!(
            bus_id_of(&host, "/sys/class/drm/card1/device").as_deref(),
            Some("0000:0a:00.0")
        );
        assert_eq!(bound_driver(&host, "0000:0a:00.0").as_deref(), Some("xe"));
        assert_eq!(bound_driver(&host, "0000:05:00.0"), None);
        std::fs::create_dir_all(root.join("sys/class/drm/card0-DP-1")).unwrap();
        let cards = drm_cards(&host);
        assert_eq!(cards.len(), 2);
        assert_eq!(cards["0000:0a:00.0"], "card1");
    }
}
