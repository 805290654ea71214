//! What amdgpu publishes on each GPU's PCI device in sysfs (the directory
//! `/sys/class/drm/cardN/device` points to): VRAM size, VBIOS, partition modes on MI300-class
//! parts, and the RAS error counters and retired-page list that health is judged from.

use crate::detect::{HostRoot, parse_u64};
use crate::hardware::{Health, HealthStatus};

/// amdgpu's facts about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AmdgpuFacts {
    /// `mem_info_vram_total`.
    pub vram_bytes: Option<u64>,
    /// `vbios_version`.
    pub vbios: Option<String>,
    /// `product_name` from the board FRU, when the board has one.
    pub product_name: Option<String>,
    /// `unique_id`, a per-ASIC hex id.
    pub unique_id: Option<String>,
    /// `serial_number`: the board serial from the FRU, the key the AMD device metrics
    /// exporter labels its series with (`serial_number`).
    pub serial_number: Option<String>,
    /// `current_compute_partition` (`SPX`).
    pub compute_partition: Option<String>,
    /// `available_compute_partition`.
    pub compute_partitions_available: Vec<String>,
    /// `current_memory_partition` (`NPS1`).
    pub memory_partition: Option<String>,
    /// `available_memory_partition`.
    pub memory_partitions_available: Vec<String>,
    /// Health from the `ras/` directory; `None` when the GPU has no RAS support.
    pub health: Option<Health>,
}

/// Reads amdgpu's attributes from a GPU's sysfs directory (host-absolute).
pub fn read(host: &HostRoot, dir: &str) -> AmdgpuFacts {
    let attr = |name: &str| host.read_trimmed(format!("{dir}/{name}"));
    let list = |name: &str| attr(name).map(|s| parse_mode_list(&s)).unwrap_or_default();
    AmdgpuFacts {
        vram_bytes: attr("mem_info_vram_total")
            .and_then(|s| parse_u64(&s))
            .filter(|&b| b > 0),
        vbios: attr("vbios_version"),
        product_name: attr("product_name"),
        unique_id: attr("unique_id"),
        serial_number: attr("serial_number").filter(|s| is_known(s)),
        compute_partition: attr("current_compute_partition").map(|s| s.to_ascii_uppercase()),
        compute_partitions_available: list("available_compute_partition"),
        memory_partition: attr("current_memory_partition").map(|s| s.to_ascii_uppercase()),
        memory_partitions_available: list("available_memory_partition"),
        health: read_ras(host, &format!("{dir}/ras")),
    }
}

/// Whether a FRU text is a value rather than a placeholder (boards without a FRU read
/// empty, `N/A` or all zeros).
pub fn is_known(text: &str) -> bool {
    let text = text.trim();
    !text.is_empty() && !text.eq_ignore_ascii_case("n/a") && !text.chars().all(|c| c == '0')
}

/// Parses a list of partition modes (`SPX, DPX, QPX, CPX`).
pub fn parse_mode_list(text: &str) -> Vec<String> {
    text.split([',', ' ', '\n'])
        .map(str::trim)
        .filter(|mode| !mode.is_empty())
        .map(str::to_ascii_uppercase)
        .collect()
}

/// Error counts of one RAS block (`ras/<block>_err_count`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorCount {
    /// Uncorrectable errors (`ue:`).
    pub uncorrected: u64,
    /// Corrected errors (`ce:`).
    pub corrected: u64,
}

/// Parses a RAS error-count file: `ue: N` and `ce: N` lines (newer kernels add `de:` for
/// deferred errors, which are not counted here).
pub fn parse_error_count(text: &str) -> Option<ErrorCount> {
    let mut count = ErrorCount::default();
    let mut seen = false;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<u64>() else {
            continue;
        };
        match key.trim() {
            "ue" => count.uncorrected = value,
            "ce" => count.corrected = value,
            _ => continue,
        }
        seen = true;
    }
    seen.then_some(count)
}

/// The retired-page list (`ras/gpu_vram_bad_pages`), counted by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BadPages {
    /// Pages retired and no longer used (`R`).
    pub reserved: u64,
    /// Pages marked bad, awaiting retirement (`P`).
    pub pending: u64,
    /// Pages that could not be retired (`F`).
    pub failed: u64,
}

/// Parses `gpu_vram_bad_pages`: one `pfn : size : flag` line per bad page.
pub fn parse_bad_pages(text: &str) -> BadPages {
    let mut pages = BadPages::default();
    for line in text.lines() {
        let mut fields = line.split(':').map(str::trim);
        let (Some(pfn), Some(_size), Some(flag)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if parse_u64(pfn).is_none() {
            continue;
        }
        match flag {
            "R" => pages.reserved += 1,
            "P" => pages.pending += 1,
            "F" => pages.failed += 1,
            _ => {}
        }
    }
    pages
}

/// Parses `ras/features` (`feature mask: 0x...`); bit 0 is the memory controller (UMC), i.e.
/// ECC on VRAM.
pub fn parse_feature_mask(text: &str) -> Option<u64> {
    let (_, mask) = text.trim().split_once(':')?;
    parse_u64(mask)
}

/// What the `ras/` directory holds, gathered for the health verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RasState {
    /// The feature mask.
    pub features: Option<u64>,
    /// Error counts per block (`umc`, `gfx`, ...), sorted by block.
    pub blocks: Vec<(String, ErrorCount)>,
    /// Bad VRAM pages.
    pub bad_pages: BadPages,
}

fn read_ras(host: &HostRoot, dir: &str) -> Option<Health> {
    let names = host.list(dir);
    if names.is_empty() {
        return None;
    }
    let blocks = names
        .iter()
        .filter_map(|name| {
            let block = name.strip_suffix("_err_count")?;
            let count = parse_error_count(&host.read(format!("{dir}/{name}"))?)?;
            Some((block.to_string(), count))
        })
        .collect();
    let state = RasState {
        features: host
            .read(format!("{dir}/features"))
            .and_then(|t| parse_feature_mask(&t)),
        blocks,
        bad_pages: host
            .read(format!("{dir}/gpu_vram_bad_pages"))
            .map(|t| parse_bad_pages(&t))
            .unwrap_or_default(),
    };
    Some(health(&state))
}

/// The health verdict from RAS: uncorrectable errors, or pages that are bad but not yet (or
/// never) retired, make a GPU unhealthy; retired pages alone make it degraded, since the memory
/// is still usable but shrinking.
pub fn health(state: &RasState) -> Health {
    let umc = state
        .blocks
        .iter()
        .find(|(block, _)| block == "umc")
        .map(|(_, count)| *count);
    let mut health = Health {
        status: HealthStatus::Healthy,
        ecc_enabled: state.features.map(|mask| mask & 1 == 1),
        ecc_corrected: umc.map(|c| c.corrected),
        ecc_uncorrected: umc.map(|c| c.uncorrected),
        retired_pages: Some(state.bad_pages.reserved),
        reasons: Vec::new(),
    };
    let mut worsen = |status: HealthStatus, reason: String| {
        health.status = health.status.max(status);
        health.reasons.push(reason);
    };
    for (block, count) in &state.blocks {
        if count.uncorrected > 0 {
            worsen(
                HealthStatus::Unhealthy,
                format!("{} uncorrectable errors in {block}", count.uncorrected),
            );
        }
    }
    let pages = state.bad_pages;
    if pages.pending > 0 {
        worsen(
            HealthStatus::Unhealthy,
            format!("{} VRAM pages pending retirement", pages.pending),
        );
    }
    if pages.failed > 0 {
        worsen(
            HealthStatus::Unhealthy,
            format!("{} bad VRAM pages could not be retired", pages.failed),
        );
    }
    if pages.reserved > 0 {
        worsen(
            HealthStatus::Degraded,
            format!("{} VRAM pages retired", pages.reserved),
        );
    }
    health.reasons.sort();
    health
}

#[cfg(test)]
mod tests {
    use super::*;

    const UMC: &str = include_str!(
        "../../../../../fixtures/hosts/mi300x-8x/sys/bus/pci/devices/0000:a6:00.0/ras/umc_err_count"
    );
    const BAD_PAGES: &str = include_str!(
        "../../../../../fixtures/hosts/mi300x-8x/sys/bus/pci/devices/0000:a6:00.0/ras/gpu_vram_bad_pages"
    );
    const FEATURES: &str = include_str!(
        "../../../../../fixtures/hosts/mi300x-8x/sys/bus/pci/devices/0000:a6:00.0/ras/features"
    );

    #[test]
    fn ras_captures_parse() {
        let umc = parse_error_count(UMC).unwrap();
        assert_eq!(umc.uncorrected, 0);
        assert!(umc.corrected > 0);
        let pages = parse_bad_pages(BAD_PAGES);
        assert_eq!((pages.reserved, pages.pending, pages.failed), (2, 0, 0));
        assert_eq!(parse_feature_mask(FEATURES).map(|m| m & 1), Some(1));
    }

    #[test]
    fn error_counts_with_deferred_line_and_junk() {
        let count = parse_error_count("ue: 2\nce: 7\nde: 1\n").unwrap();
        assert_eq!(
            count,
            ErrorCount {
                uncorrected: 2,
                corrected: 7
            }
        );
        assert_eq!(parse_error_count("garbage"), None);
        assert_eq!(parse_error_count(""), None);
    }

    #[test]
    fn bad_page_flags() {
        let text = "0x00001000 : 0x00001000 : R\n0x00002000 : 0x00001000 : P\n\
                    0x00003000 : 0x00001000 : F\nnot a page\n";
        let pages = parse_bad_pages(text);
        assert_eq!((pages.reserved, pages.pending, pages.failed), (1, 1, 1));
    }

    #[test]
    fn verdicts() {
        let clean = RasState {
            features: Some(0x3),
            blocks: vec![("umc".into(), ErrorCount::default())],
            bad_pages: BadPages::default(),
        };
        let healthy = health(&clean);
        assert_eq!(healthy.status, HealthStatus::Healthy);
        assert_eq!(healthy.ecc_enabled, Some(true));
        assert_eq!(healthy.ecc_uncorrected, Some(0));

        let mut broken = clean.clone();
        broken.blocks.push((
            "gfx".into(),
            ErrorCount {
                uncorrected: 1,
                corrected: 0,
            },
        ));
        broken.bad_pages.reserved = 3;
        let unhealthy = health(&broken);
        assert_eq!(unhealthy.status, HealthStatus::Unhealthy);
        assert_eq!(
            unhealthy.reasons,
            ["1 uncorrectable errors in gfx", "3 VRAM pages retired"]
        );
    }

    #[test]
    fn mode_lists() {
        assert_eq!(
            parse_mode_list("SPX, DPX, QPX, CPX\n"),
            ["SPX", "DPX", "QPX", "CPX"]
        );
        assert!(parse_mode_list("").is_empty());
    }
}
