//! Which container image runs a plan's engine on the plan's devices, or why none does
//! (issue 23 item 4). `--emit` and a ModelPlacement's `status.engine` take the image from
//! here instead of always running the CUDA build of vLLM.
//!
//! The table, and where each row comes from:
//!
//! | engine | devices | image | source |
//! |---|---|---|---|
//! | vLLM | NVIDIA GPUs | `docker.io/vllm/vllm-openai:v<version>` (`latest`) | docs.vllm.ai "Using Docker"; vllm-project/vllm `docs/getting_started/installation/gpu.cuda.inc.md` |
//! | vLLM | AMD Instinct / Radeon | `docker.io/vllm/vllm-openai-rocm:v<version>` (`latest`) | vllm-project/vllm `docs/getting_started/installation/gpu.rocm.inc.md` @06d0369: official ROCm images since 2026-01-20; AMD's `rocm/vllm` is deprecated |
//! | vLLM | Intel Gaudi 2/3 | `vault.habana.ai/gaudi-docker/1.22.0/ubuntu22.04/habanalabs/vllm-installer-2.7.1:latest` | vLLM Hardware Plugin for Intel Gaudi, docs.vllm.ai/projects/gaudi "Quick Start" (the `vllm-installer` image of a Gaudi software release; 1.22.0 with PyTorch 2.7.1 is the pair its examples name) |
//! | vLLM | AWS Trainium2 | `public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.29.0.1.2.0-neuronx-py314-sdk2.33.0-ubuntu26.04` | AWS Neuron docs v2.33.0 "Install PyTorch via Deep Learning Container" |
//! | vLLM | Google TPU v5e, v6e, v7x | `docker.io/vllm/vllm-tpu:latest` | docs.vllm.ai/projects/tpu "Get started with vLLM TPU" (TPU versions v7x, v6e, v5e) |
//! | SGLang | NVIDIA GPUs | `docker.io/lmsysorg/sglang:v<version>` (`latest`) | sgl-project/sglang `docs/docs/get-started/install.mdx` @7760d52 |
//!
//! What each supports:
//! - vLLM on CUDA: compute capability 7.0 or higher up to the releases documented so (docs.vllm.ai
//!   v0.14.0 "GPU" requirements), 7.5 or higher from 0.21 (vllm-project/vllm v0.21.0
//!   `gpu.cuda.inc.md`: "compute capability 7.5 or higher"; vllm PR #39878 moved the default
//!   build to CUDA 13.0, which has no sm_70). Releases between 0.15 and 0.20 are taken as 7.0,
//!   the last documented value before the change.
//! - vLLM on ROCm: gfx90a (MI200), gfx942 (MI300), gfx950 (MI350), gfx1100/1101, gfx1200/1201,
//!   gfx1150/1151 (docs.vllm.ai v0.14.0 "GPU" requirements); the official image exists from
//!   0.14 (released after 2026-01-20).
//! - vLLM on TPU: v5e, v6e and v7x (not v5p or v4).
//! - vLLM's Neuron DLC for vLLM 0.21 and later runs on Trn2 and Trn3 only (Neuron docs v2.32.0,
//!   quickstart note); Trn1 and Inferentia2 need the legacy DLC, given with `--image`.
//! - SGLang's images ship CUDA 13 (install.mdx above: `v0.5.19-cu129` was the last CUDA 12
//!   tag), so they need compute capability 7.5 or higher (CUDA 13.0 dropped Volta). The planner
//!   has no SGLang image for AMD, Gaudi, Neuron or TPU: those are refused with the reason.
//!
//! - Drivers: an image runs on the host's NVIDIA kernel driver, and CUDA's minor version
//!   compatibility sets the floor per CUDA major (docs.nvidia.com/deploy/cuda-compatibility,
//!   "Minor Version Compatibility", table 1): CUDA 13.x needs driver 580 or newer, CUDA 12.x
//!   525 or newer. vLLM's images are CUDA 12 builds before 0.21 and CUDA 13 from 0.21 (the
//!   same PR as the compute-capability change above); SGLang's are CUDA 13. A driver older
//!   than the floor is refused with the reason; an unknown driver is a note.
//!
//! Compute capabilities and gfx targets by product: NVIDIA "CUDA GPUs" (developer.nvidia.com/
//! cuda-gpus) and AMD "GPU hardware specifications" (rocm.docs.amd.com, reference/gpu-arch-specs).
//! A product not in those lists is not refused: the plan notes that its support was not
//! checked.

use serde::Serialize;

use super::choice::{EngineChoice, EngineKind, EngineVersion};
use crate::hardware::{Family, Vendor};

/// The extended resource the vendor's device plugin advertises for a device, which a pod asks
/// for to get one (without DRA claims); `None` for a device no known plugin serves.
///
/// Sources: NVIDIA `nvidia.com/gpu` (NVIDIA/k8s-device-plugin), AMD `amd.com/gpu`
/// (ROCm/k8s-device-plugin), Intel GPUs `gpu.intel.com/i915` and Gaudi `habana.ai/gaudi`
/// (intel/intel-device-plugins-for-kubernetes, HabanaAI/habanalabs-k8s-device-plugin), AWS
/// `aws.amazon.com/neuron` (aws-neuron/neuron-helm-charts), Google TPUs `google.com/tpu`
/// (GKE), Qualcomm `qualcomm.com/qaic` (quic/cloud-ai-containers).
pub fn device_plugin_resource(
    vendor: Vendor,
    family: Family,
    product: &str,
) -> Option<&'static str> {
    let name = match (vendor, family) {
        (Vendor::Nvidia, Family::Gpu) => "nvidia.com/gpu",
        (Vendor::Amd, Family::Gpu) => "amd.com/gpu",
        (Vendor::Intel, Family::Gpu) => "gpu.intel.com/i915",
        (Vendor::Intel, Family::Asic | Family::Npu)
            if product.to_ascii_lowercase().contains("gaudi") =>
        {
            "habana.ai/gaudi"
        }
        (Vendor::Aws, _) => "aws.amazon.com/neuron",
        (Vendor::Google, Family::Tpu) => "google.com/tpu",
        (Vendor::Qualcomm, _) => "qualcomm.com/qaic",
        _ => return None,
    };
    Some(name)
}

/// The device a plan runs on, as far as the image is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFacts<'a> {
    /// Maker.
    pub vendor: Vendor,
    /// Kind.
    pub family: Family,
    /// Product name (`NVIDIA H100 80GB HBM3`, `AMD Instinct MI300X`).
    pub product: &'a str,
    /// The oldest kernel driver among the devices the plan uses (`580.159.04`), when known.
    pub driver_version: Option<&'a str>,
}

/// The image chosen for a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineImage {
    /// The image reference.
    pub image: String,
    /// The software platform it is built for (`cuda`, `rocm`, `gaudi`, `neuron`, `tpu`).
    pub platform: &'static str,
    /// What the choice could not check (an unknown product's compute capability).
    pub notes: Vec<String>,
}

/// First vLLM release documented as needing compute capability 7.5 (its images are CUDA 13
/// builds).
const CUDA_75_FROM: (u32, u32) = (0, 21);
/// The oldest NVIDIA driver branch CUDA 13.x runs on (minor version compatibility).
const CUDA_13_DRIVER: u32 = 580;
/// The oldest NVIDIA driver branch CUDA 12.x runs on.
const CUDA_12_DRIVER: u32 = 525;
/// First vLLM release with an official ROCm image.
const ROCM_IMAGE_FROM: (u32, u32) = (0, 14);

/// NVIDIA compute capabilities by product-name fragment (first match wins; more specific
/// fragments first).
const COMPUTE_CAPABILITY: &[(&str, (u32, u32))] = &[
    ("gb200", (10, 0)),
    ("b200", (10, 0)),
    ("gh200", (9, 0)),
    ("h100", (9, 0)),
    ("h200", (9, 0)),
    ("h800", (9, 0)),
    ("h20", (9, 0)),
    ("l40", (8, 9)),
    ("l4", (8, 9)),
    ("4090", (8, 9)),
    ("a100", (8, 0)),
    ("a30", (8, 0)),
    ("a6000", (8, 6)),
    ("a40", (8, 6)),
    ("a10", (8, 6)),
    ("3090", (8, 6)),
    ("t4", (7, 5)),
    ("v100", (7, 0)),
];

/// AMD gfx targets by product-name fragment.
const GFX_TARGET: &[(&str, &str)] = &[
    ("mi355", "gfx950"),
    ("mi350", "gfx950"),
    ("mi325", "gfx942"),
    ("mi300", "gfx942"),
    ("mi250", "gfx90a"),
    ("mi210", "gfx90a"),
    ("mi100", "gfx908"),
    ("mi50", "gfx906"),
];

/// gfx targets vLLM's ROCm build supports.
const VLLM_GFX: &[&str] = &[
    "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201", "gfx1150", "gfx1151",
];

/// TPU generations vLLM's TPU backend supports, as product-name fragments.
const VLLM_TPU: &[&str] = &["v5e", "v5 lite", "v5-lite", "v6e", "v7x"];

/// The compute capability of an NVIDIA product, when known.
pub fn compute_capability(product: &str) -> Option<(u32, u32)> {
    let lower = product.to_ascii_lowercase();
    COMPUTE_CAPABILITY
        .iter()
        .find(|(fragment, _)| lower.contains(fragment))
        .map(|(_, cc)| *cc)
}

/// The gfx target of an AMD product, when known.
pub fn gfx_target(product: &str) -> Option<&'static str> {
    let lower = product.to_ascii_lowercase();
    GFX_TARGET
        .iter()
        .find(|(fragment, _)| lower.contains(fragment))
        .map(|(_, gfx)| *gfx)
}

/// The release `choice` names, when it names one.
fn release(choice: &EngineChoice) -> Option<EngineVersion> {
    choice
        .version
        .filter(|version| matches!(version, EngineVersion::Release { .. }))
}

/// `v0.10.2` (`v0.10.1.1`, `v0.6.6.post1`: the release as the engine's tags spell it), or
/// `latest` when no release was named (a generation is not a tag either).
fn tag(choice: &EngineChoice) -> String {
    release(choice).map_or_else(|| "latest".to_string(), |version| format!("v{version}"))
}

/// Whether the named release is at least `from` (no release: the newest, so yes; a vLLM
/// generation: V0 and V1 are older than any threshold here, `current` newer).
fn at_least(choice: &EngineChoice, from: (u32, u32)) -> bool {
    match choice.version {
        None | Some(EngineVersion::Current) => true,
        Some(EngineVersion::V0 | EngineVersion::V1) => false,
        Some(EngineVersion::Release { major, minor, .. }) => (major, minor) >= from,
    }
}

/// The image for `choice` on `device`, or the reason none runs there.
pub fn image_for(choice: &EngineChoice, device: DeviceFacts<'_>) -> Result<EngineImage, String> {
    let name = device.product;
    let lower = name.to_ascii_lowercase();
    let engine = choice.describe_short();
    let mut notes = Vec::new();
    let image = |image: String, platform: &'static str, notes: Vec<String>| EngineImage {
        image,
        platform,
        notes,
    };
    match (choice.kind, device.vendor, device.family) {
        (kind, Vendor::Nvidia, Family::Gpu) => {
            let minimum = match kind {
                EngineKind::Vllm if at_least(choice, CUDA_75_FROM) => (7, 5),
                EngineKind::Vllm => (7, 0),
                EngineKind::Sglang => (7, 5),
            };
            match compute_capability(name) {
                Some(cc) if cc < minimum => {
                    return Err(format!(
                        "{engine} needs compute capability {}.{} or higher and {name} has {}.{}; \
                         plan other devices or an older engine version",
                        minimum.0, minimum.1, cc.0, cc.1
                    ));
                }
                Some(_) => {}
                None => notes.push(format!(
                    "{name}: compute capability unknown to the planner; {engine} needs {}.{} or \
                     higher (not checked)",
                    minimum.0, minimum.1
                )),
            }
            check_driver(choice, device.driver_version, &mut notes)?;
            Ok(match kind {
                EngineKind::Vllm => image(
                    format!("docker.io/vllm/vllm-openai:{}", tag(choice)),
                    "cuda",
                    notes,
                ),
                EngineKind::Sglang => image(
                    format!("docker.io/lmsysorg/sglang:{}", tag(choice)),
                    "cuda",
                    notes,
                ),
            })
        }
        (EngineKind::Vllm, Vendor::Amd, Family::Gpu) => {
            if !at_least(choice, ROCM_IMAGE_FROM) {
                return Err(format!(
                    "{engine} has no official ROCm image (vllm/vllm-openai-rocm starts with 0.14); \
                     give AMD's image with --image (rocm/vllm:<tag>)"
                ));
            }
            match gfx_target(name) {
                Some(gfx) if !VLLM_GFX.contains(&gfx) => {
                    return Err(format!(
                        "{engine} on ROCm supports {} and {name} is {gfx}",
                        VLLM_GFX.join(", ")
                    ));
                }
                Some(_) => {}
                None => notes.push(format!(
                    "{name}: gfx target unknown to the planner; vLLM's ROCm build supports {} \
                     (not checked)",
                    VLLM_GFX.join(", ")
                )),
            }
            Ok(image(
                format!("docker.io/vllm/vllm-openai-rocm:{}", tag(choice)),
                "rocm",
                notes,
            ))
        }
        (EngineKind::Vllm, Vendor::Intel, _) if lower.contains("gaudi") => {
            if lower.contains("gaudi 1") || lower.ends_with("gaudi") {
                return Err(format!(
                    "{engine} for Intel Gaudi runs on Gaudi 2 and Gaudi 3; {name} is neither"
                ));
            }
            if release(choice).is_some() {
                notes.push(
                    "the Gaudi image pins its own vLLM (the plugin's release for Gaudi software \
                     1.22.0); the version asked for is not a tag of it"
                        .to_string(),
                );
            }
            Ok(image(
                "vault.habana.ai/gaudi-docker/1.22.0/ubuntu22.04/habanalabs/vllm-installer-2.7.1:latest"
                    .to_string(),
                "gaudi",
                notes,
            ))
        }
        (EngineKind::Vllm, Vendor::Aws, _) => {
            if !(lower.contains("trainium2") || lower.contains("trainium3")) {
                return Err(format!(
                    "the Neuron vLLM container runs on Trn2 and Trn3; {name} needs the legacy \
                     vLLM 0.16 container: give it with --image"
                ));
            }
            if release(choice).is_some() {
                notes.push(
                    "the Neuron container pins its own vLLM (0.29 with Neuron SDK 2.33); the \
                     version asked for is not a tag of it"
                        .to_string(),
                );
            }
            Ok(image(
                "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.29.0.1.2.0-neuronx-py314-sdk2.33.0-ubuntu26.04"
                    .to_string(),
                "neuron",
                notes,
            ))
        }
        (EngineKind::Vllm, Vendor::Google, Family::Tpu) => {
            if !VLLM_TPU.iter().any(|fragment| lower.contains(fragment)) {
                return Err(format!(
                    "vLLM on TPU supports TPU v5e, v6e and v7x; {name} is none of them"
                ));
            }
            Ok(image(
                format!("docker.io/vllm/vllm-tpu:{}", tag(choice)),
                "tpu",
                notes,
            ))
        }
        (EngineKind::Sglang, vendor, family) => Err(format!(
            "no SGLang image for {vendor:?} {family} in the planner's table; use --engine vllm \
             or give an image with --image"
        )),
        (EngineKind::Vllm, vendor, family) => Err(format!(
            "no vLLM image for {name} ({vendor:?} {family}) in the planner's table; give one \
             with --image"
        )),
    }
}

/// Refuses a driver older than the image's CUDA needs; notes one that is not known.
fn check_driver(
    choice: &EngineChoice,
    driver: Option<&str>,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let engine = choice.describe_short();
    let (cuda, floor) = match choice.kind {
        EngineKind::Vllm if !at_least(choice, CUDA_75_FROM) => (12, CUDA_12_DRIVER),
        EngineKind::Vllm | EngineKind::Sglang => (13, CUDA_13_DRIVER),
    };
    match driver.map(|version| (version, driver_branch(version))) {
        Some((version, Some(branch))) if branch < floor => {
            let older = if cuda == 13 && choice.kind == EngineKind::Vllm {
                ", or plan vLLM 0.20 (a CUDA 12 image) with --engine-version 0.20"
            } else {
                ""
            };
            Err(format!(
                "{engine}'s image is built on CUDA {cuda}, which needs NVIDIA driver {floor} or \
                 newer, and the plan's devices run driver {version}; upgrade the driver{older}"
            ))
        }
        Some((_, Some(_))) => Ok(()),
        Some((version, None)) => {
            notes.push(format!(
                "driver version {version:?} not understood; {engine}'s image needs NVIDIA driver \
                 {floor} or newer (not checked)"
            ));
            Ok(())
        }
        None => {
            notes.push(format!(
                "driver version unknown; {engine}'s image needs NVIDIA driver {floor} or newer \
                 (not checked)"
            ));
            Ok(())
        }
    }
}

/// The CUDA major an image is built on and the oldest NVIDIA driver branch it runs on, for
/// the images this table names when their tag says: vLLM's `vllm/vllm-openai:v<X.Y...>` (CUDA
/// 12 before 0.21, CUDA 13 from it) and SGLang's `lmsysorg/sglang` tags ending `-cu12x` or
/// `-cu13x`. `None` for any other image, or a tag that names no version (`latest`): what it
/// needs is not known, and nothing is judged on it.
pub fn cuda_driver_floor(image: &str) -> Option<(u32, u32)> {
    let lower = image.trim().to_ascii_lowercase();
    let lower = lower.split('@').next().unwrap_or_default();
    let (repository, tag) = lower.rsplit_once(':')?;
    if tag.contains('/') {
        return None;
    }
    if repository.ends_with("vllm/vllm-openai") {
        let mut parts = tag.strip_prefix('v')?.split(['.', '-']);
        let major: u32 = parts.next()?.parse().ok()?;
        let minor: u32 = parts.next()?.parse().ok()?;
        return Some(if (major, minor) >= CUDA_75_FROM {
            (13, CUDA_13_DRIVER)
        } else {
            (12, CUDA_12_DRIVER)
        });
    }
    if repository.ends_with("lmsysorg/sglang") {
        if tag.contains("-cu12") {
            return Some((12, CUDA_12_DRIVER));
        }
        if tag.contains("-cu13") {
            return Some((13, CUDA_13_DRIVER));
        }
    }
    None
}

/// The branch of an NVIDIA driver version (`580` of `580.159.04`).
pub fn driver_branch(version: &str) -> Option<u32> {
    let branch = version.trim().split('.').next()?;
    (!branch.is_empty() && branch.len() <= 4)
        .then(|| branch.parse().ok())
        .flatten()
}

/// The oldest of `versions` by driver branch, then by the whole version's numbers; versions
/// that do not parse sort first, so an odd one is shown rather than hidden.
pub fn oldest_driver<'a>(versions: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let numbers = |version: &str| -> Vec<Option<u64>> {
        version.split('.').map(|part| part.parse().ok()).collect()
    };
    versions.into_iter().min_by_key(|version| numbers(version))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(vendor: Vendor, family: Family, product: &str) -> DeviceFacts<'_> {
        DeviceFacts {
            vendor,
            family,
            product,
            driver_version: Some("580.159.04"),
        }
    }

    #[test]
    fn drivers_older_than_the_images_cuda_are_refused_and_unknown_ones_noted() {
        let h100 = |driver| DeviceFacts {
            vendor: Vendor::Nvidia,
            family: Family::Gpu,
            product: "NVIDIA H100 80GB HBM3",
            driver_version: driver,
        };
        // Today's vLLM is a CUDA 13 build: 550 is too old, 580 is enough.
        let refusal = image_for(&vllm(None), h100(Some("550.90.07"))).unwrap_err();
        assert!(refusal.contains("CUDA 13"), "{refusal}");
        assert!(refusal.contains("550.90.07"), "{refusal}");
        assert!(refusal.contains("--engine-version 0.20"), "{refusal}");
        let fits = image_for(&vllm(None), h100(Some("580.159.04"))).unwrap();
        assert!(fits.notes.is_empty(), "{:?}", fits.notes);
        // vLLM 0.20 is a CUDA 12 build: 550 runs it, 470 does not.
        assert!(image_for(&vllm(Some("0.20.0")), h100(Some("550.90.07"))).is_ok());
        let old = image_for(&vllm(Some("0.20.0")), h100(Some("470.256.02"))).unwrap_err();
        assert!(old.contains("CUDA 12") && old.contains("525"), "{old}");
        // SGLang's images are CUDA 13 builds; no older image to suggest.
        let sglang = EngineChoice {
            kind: EngineKind::Sglang,
            ..EngineChoice::default()
        };
        let refusal = image_for(&sglang, h100(Some("570.86.15"))).unwrap_err();
        assert!(refusal.contains("580") && !refusal.contains("--engine-version"));
        // Unknown or unreadable: planned, and said.
        let unknown = image_for(&vllm(None), h100(None)).unwrap();
        assert!(
            unknown
                .notes
                .iter()
                .any(|n| n.contains("driver version unknown"))
        );
        let odd = image_for(&vllm(None), h100(Some("banana"))).unwrap();
        assert!(odd.notes.iter().any(|n| n.contains("not understood")));
    }

    #[test]
    fn an_images_cuda_floor_comes_from_its_tag_where_the_table_knows_it() {
        assert_eq!(
            cuda_driver_floor("docker.io/vllm/vllm-openai:v0.21.0"),
            Some((13, 580))
        );
        assert_eq!(
            cuda_driver_floor("vllm/vllm-openai:v0.20.2"),
            Some((12, 525))
        );
        assert_eq!(
            cuda_driver_floor("registry:5000/mirror/vllm/vllm-openai:v0.14.1@sha256:ab"),
            Some((12, 525))
        );
        assert_eq!(cuda_driver_floor("docker.io/vllm/vllm-openai:latest"), None);
        assert_eq!(
            cuda_driver_floor("docker.io/vllm/vllm-openai-rocm:v0.21.0"),
            None
        );
        assert_eq!(
            cuda_driver_floor("lmsysorg/sglang:v0.5.19-cu129"),
            Some((12, 525))
        );
        assert_eq!(cuda_driver_floor("lmsysorg/sglang:v0.5.20"), None);
        assert_eq!(cuda_driver_floor("registry:5000/image"), None);
    }

    #[test]
    fn the_oldest_driver_is_by_number_not_by_text() {
        assert_eq!(
            oldest_driver(["580.159.04", "550.90.07", "1000.1"]),
            Some("550.90.07")
        );
        assert_eq!(
            oldest_driver(["580.65.06", "580.159.04"]),
            Some("580.65.06")
        );
        assert_eq!(oldest_driver([]), None);
    }

    fn vllm(version: Option<&str>) -> EngineChoice {
        EngineChoice {
            version: version.map(|v| v.parse().unwrap()),
            ..EngineChoice::default()
        }
    }

    #[test]
    fn each_device_family_gets_its_own_image() {
        let pick = |choice: &EngineChoice, vendor, family, product| {
            image_for(choice, device(vendor, family, product)).unwrap()
        };
        let current = vllm(None);
        let h100 = pick(
            &current,
            Vendor::Nvidia,
            Family::Gpu,
            "NVIDIA H100 80GB HBM3",
        );
        assert_eq!(h100.image, "docker.io/vllm/vllm-openai:latest");
        let pinned = pick(
            &vllm(Some("0.11.2")),
            Vendor::Nvidia,
            Family::Gpu,
            "NVIDIA A100-SXM4-80GB",
        );
        assert_eq!(pinned.image, "docker.io/vllm/vllm-openai:v0.11.2");
        let mi300x = pick(&current, Vendor::Amd, Family::Gpu, "AMD Instinct MI300X");
        assert_eq!(mi300x.image, "docker.io/vllm/vllm-openai-rocm:latest");
        assert_eq!(mi300x.platform, "rocm");
        let gaudi = pick(&current, Vendor::Intel, Family::Asic, "Intel Gaudi 3");
        assert!(gaudi.image.starts_with("vault.habana.ai/gaudi-docker/"));
        let trn2 = pick(&current, Vendor::Aws, Family::Asic, "AWS Trainium2");
        assert!(trn2.image.contains("pytorch-inference-vllm-neuronx"));
        let tpu = pick(&current, Vendor::Google, Family::Tpu, "Google TPU v6e");
        assert_eq!(tpu.image, "docker.io/vllm/vllm-tpu:latest");
        let sglang = EngineChoice {
            kind: EngineKind::Sglang,
            ..EngineChoice::default()
        };
        let on_h100 = pick(
            &sglang,
            Vendor::Nvidia,
            Family::Gpu,
            "NVIDIA H100 80GB HBM3",
        );
        assert_eq!(on_h100.image, "docker.io/lmsysorg/sglang:latest");
    }

    #[test]
    fn unsupported_devices_are_refused_with_the_reason() {
        let refuse = |choice: &EngineChoice, vendor, family, product| {
            image_for(choice, device(vendor, family, product)).unwrap_err()
        };
        let v100 = refuse(
            &vllm(None),
            Vendor::Nvidia,
            Family::Gpu,
            "Tesla V100-SXM2-32GB",
        );
        assert!(
            v100.contains("needs compute capability 7.5 or higher") && v100.contains("has 7.0"),
            "{v100}"
        );
        // The releases documented with a 7.0 minimum still take it.
        assert!(
            image_for(
                &vllm(Some("0.10.2")),
                device(Vendor::Nvidia, Family::Gpu, "Tesla V100-SXM2-32GB")
            )
            .is_ok()
        );
        let old_rocm = refuse(
            &vllm(Some("0.9.2")),
            Vendor::Amd,
            Family::Gpu,
            "AMD Instinct MI300X",
        );
        assert!(old_rocm.contains("no official ROCm image"), "{old_rocm}");
        let mi100 = refuse(&vllm(None), Vendor::Amd, Family::Gpu, "AMD Instinct MI100");
        assert!(mi100.contains("is gfx908"), "{mi100}");
        let v5p = refuse(&vllm(None), Vendor::Google, Family::Tpu, "Google TPU v5p");
        assert!(v5p.contains("v5e, v6e and v7x"), "{v5p}");
        let sglang = EngineChoice {
            kind: EngineKind::Sglang,
            ..EngineChoice::default()
        };
        let on_amd = refuse(&sglang, Vendor::Amd, Family::Gpu, "AMD Instinct MI300X");
        assert!(on_amd.contains("no SGLang image"), "{on_amd}");
    }

    #[test]
    fn unknown_products_are_noted_not_refused() {
        let picked = image_for(
            &vllm(None),
            device(Vendor::Nvidia, Family::Gpu, "NVIDIA Future GPU"),
        )
        .unwrap();
        assert!(
            picked.notes[0].contains("not checked"),
            "{:?}",
            picked.notes
        );
    }
}
