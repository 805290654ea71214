//! Who made an accelerator and what kind of part it is.
//!
//! `Vendor` and `Family` are closed enums so labels and the planner can match on them; anything
//! not listed still gets reported as [`Vendor::Other`] with its PCI vendor id in the device's
//! attributes, so nothing with a PCI function goes unseen.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The company behind a device.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// NVIDIA (PCI 0x10de).
    Nvidia,
    /// AMD (PCI 0x1002 for GPUs, 0x1022 for XDNA NPUs and CPUs).
    Amd,
    /// Intel (PCI 0x8086), including Habana Gaudi (PCI 0x1da3).
    Intel,
    /// Google (TPU, PCI 0x1ae0).
    Google,
    /// Amazon Web Services (Inferentia, Trainium; PCI 0x1d0f).
    Aws,
    /// Qualcomm (Cloud AI 100, PCI 0x17cb).
    Qualcomm,
    /// Apple silicon (no PCI; device tree).
    Apple,
    /// Cerebras (PCI 0x1f75 is not public; matched by name where a driver exposes one).
    Cerebras,
    /// Graphcore (PCI 0x1e91).
    Graphcore,
    /// Groq (PCI 0x1e6b).
    Groq,
    /// Tenstorrent (PCI 0x1e52).
    Tenstorrent,
    /// Samsung.
    Samsung,
    /// MediaTek.
    Mediatek,
    /// Huawei (Ascend, PCI 0x19e5).
    Huawei,
    /// Any other maker; the raw PCI vendor id is kept in the device's attributes.
    Other,
}

impl Vendor {
    /// The lowercase name used in labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nvidia => "nvidia",
            Self::Amd => "amd",
            Self::Intel => "intel",
            Self::Google => "google",
            Self::Aws => "aws",
            Self::Qualcomm => "qualcomm",
            Self::Apple => "apple",
            Self::Cerebras => "cerebras",
            Self::Graphcore => "graphcore",
            Self::Groq => "groq",
            Self::Tenstorrent => "tenstorrent",
            Self::Samsung => "samsung",
            Self::Mediatek => "mediatek",
            Self::Huawei => "huawei",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of accelerator, independent of who made it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// A general-purpose GPU (NVIDIA, AMD Instinct/Radeon, Intel Data Center/Arc, Apple GPU).
    Gpu,
    /// A Google Tensor Processing Unit.
    Tpu,
    /// A neural processing unit in a client SoC (Intel NPU, AMD XDNA, Apple Neural Engine).
    Npu,
    /// A dedicated AI ASIC card (Trainium, Inferentia, Gaudi, Cloud AI 100, Groq, Graphcore...).
    Asic,
    /// The host CPU, reported so CPU-only nodes are described too.
    Cpu,
}

impl Family {
    /// The lowercase name used in labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::Tpu => "tpu",
            Self::Npu => "npu",
            Self::Asic => "asic",
            Self::Cpu => "cpu",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Maps a PCI vendor id to the vendor, for the ids of accelerator makers.
pub fn vendor_from_pci_id(id: u16) -> Vendor {
    match id {
        0x10de => Vendor::Nvidia,
        0x1002 | 0x1022 => Vendor::Amd,
        0x8086 | 0x1da3 => Vendor::Intel,
        0x1ae0 => Vendor::Google,
        0x1d0f => Vendor::Aws,
        0x17cb => Vendor::Qualcomm,
        0x1e91 => Vendor::Graphcore,
        0x1e6b => Vendor::Groq,
        0x1e52 => Vendor::Tenstorrent,
        0x144d => Vendor::Samsung,
        0x14c3 => Vendor::Mediatek,
        0x19e5 => Vendor::Huawei,
        _ => Vendor::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_serde() {
        for v in [Vendor::Nvidia, Vendor::Aws, Vendor::Other] {
            assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{v}\""));
        }
        for f in [
            Family::Gpu,
            Family::Tpu,
            Family::Npu,
            Family::Asic,
            Family::Cpu,
        ] {
            assert_eq!(serde_json::to_string(&f).unwrap(), format!("\"{f}\""));
        }
    }

    #[test]
    fn pci_vendor_ids() {
        assert_eq!(vendor_from_pci_id(0x10de), Vendor::Nvidia);
        assert_eq!(vendor_from_pci_id(0x1da3), Vendor::Intel);
        assert_eq!(vendor_from_pci_id(0x1234), Vendor::Other);
    }
}
