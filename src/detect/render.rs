//! The people-facing table view of a detection report.

use crate::output::{Table, human_bytes};

use super::Report;

/// Renders the report as tables: devices, interconnects, NICs, node facts, warnings.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let mut devices = Table::new([
        "ID",
        "VENDOR",
        "FAMILY",
        "MODEL",
        "MEMORY",
        "ARCH",
        "PRECISIONS",
        "NUMA",
        "HEALTH",
    ]);
    for device in &report.devices {
        let precisions: Vec<&str> = device.precisions.iter().map(|p| p.as_str()).collect();
        devices.row([
            device.id.clone(),
            device.vendor.to_string(),
            device.family.to_string(),
            device.model.clone(),
            device
                .memory_bytes
                .map(human_bytes)
                .unwrap_or_else(|| "-".into()),
            device
                .architecture
                .clone()
                .or_else(|| device.compute_capability.clone())
                .unwrap_or_else(|| "-".into()),
            if precisions.is_empty() {
                "-".into()
            } else {
                precisions.join(",")
            },
            device
                .numa_node
                .map_or_else(|| "-".into(), |n| n.to_string()),
            format!("{:?}", device.health.status).to_lowercase(),
        ]);
        for partition in &device.partitions {
            devices.row([
                format!("  └ {}", partition.id.as_deref().unwrap_or(&partition.kind)),
                String::new(),
                partition.kind.clone(),
                partition.profile.clone(),
                partition.memory_bytes.map(human_bytes).unwrap_or_default(),
            ]);
        }
    }
    if devices.is_empty() {
        out.push_str("No accelerators found.\n");
    } else {
        out.push_str(&devices.render());
    }

    if !report.interconnects.is_empty() {
        let mut groups = Table::new(["INTERCONNECT", "ID", "DEVICES", "TOPOLOGY"]);
        for group in &report.interconnects {
            groups.row([
                format!("{:?}", group.kind).to_lowercase(),
                group.id.clone(),
                group.devices.len().to_string(),
                group.topology.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        out.push('\n');
        out.push_str(&groups.render());
    }
    if !report.nics.is_empty() {
        let mut nics = Table::new(["NIC", "KIND", "RATE", "STATE", "NUMA"]);
        for nic in &report.nics {
            nics.row([
                nic.name.clone(),
                format!("{:?}", nic.kind).to_lowercase(),
                nic.rate_gbps
                    .map_or_else(|| "-".into(), |r| format!("{r} Gb/s")),
                nic.state.clone().unwrap_or_else(|| "-".into()),
                nic.numa_node.map_or_else(|| "-".into(), |n| n.to_string()),
            ]);
        }
        out.push('\n');
        out.push_str(&nics.render());
    }

    let cpu = &report.node.cpu;
    let runtime = &report.node.runtime;
    out.push('\n');
    let mut node = Table::new(["NODE", "VALUE"]);
    if let Some(model) = &cpu.model {
        let threads = cpu
            .threads
            .map_or_else(String::new, |t| format!(", {t} threads"));
        let cores = cpu
            .cores
            .map_or_else(String::new, |c| format!(", {c} cores"));
        node.row(["cpu".to_string(), format!("{model}{cores}{threads}")]);
    }
    if let Some(memory) = cpu.memory_bytes {
        node.row(["memory".to_string(), human_bytes(memory)]);
    }
    if !cpu.ai_flags.is_empty() {
        node.row(["cpu ai flags".to_string(), cpu.ai_flags.join(",")]);
    }
    if !report.node.numa.is_empty() {
        node.row(["numa nodes".to_string(), report.node.numa.len().to_string()]);
    }
    if let Some(cloud) = &runtime.cloud {
        let instance = runtime.instance_type.as_deref().unwrap_or("?");
        node.row(["cloud".to_string(), format!("{cloud} {instance}")]);
    }
    if let Some(container) = &runtime.container {
        node.row(["container".to_string(), container.clone()]);
    }
    if runtime.kubernetes {
        node.row(["kubernetes".to_string(), "yes".to_string()]);
    }
    if !node.is_empty() {
        out.push_str(&node.render());
    }

    for warning in &report.warnings {
        out.push_str(&format!(
            "warning: [{}] {}\n",
            warning.backend, warning.message
        ));
    }
    if !report.timings.is_empty() {
        out.push('\n');
        let mut timings = Table::new(["BACKEND", "MICROS"]);
        for timing in &report.timings {
            timings.row([timing.backend.clone(), timing.micros.to_string()]);
        }
        out.push_str(&timings.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{Device, Family, Vendor};

    #[test]
    fn a_model_name_of_70000_chars_renders_cut() {
        // A tool or a hand-written report can name a device anything; the table used to
        // panic on any cell wider than 65,535 characters.
        let mut report = Report::empty();
        let model = "M".repeat(70_000);
        report.devices.push(Device::new(
            "0000:18:00.0",
            Vendor::Nvidia,
            Family::Gpu,
            model.as_str(),
            "nvidia",
        ));
        let text = table(&report);
        assert!(text.contains("0000:18:00.0"), "{text}");
        assert!(text.lines().all(|line| line.chars().count() < 1_000));
    }
}
