//! The linter on crafted slices: one test per class, the apiserver's rules at their edges.

use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{Value, json};

use super::*;

/// A slice of `driver` for node `n1` holding `devices`.
fn slice(driver: &str, devices: Value) -> ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "n1-slice"},
        "spec": {
            "driver": driver,
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        }
    }))
    .expect("a ResourceSlice")
}

/// An NVIDIA whole GPU as the driver publishes it, with `changes` merged into its attributes.
fn nvidia_gpu(name: &str, changes: Value) -> Value {
    let mut attributes = json!({
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "uuid": {"string": format!("GPU-{name}")},
        "driverVersion": {"version": "550.54.15"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
    });
    for (key, value) in changes.as_object().into_iter().flatten() {
        if value.is_null() {
            attributes.as_object_mut().unwrap().remove(key);
        } else {
            attributes[key] = value.clone();
        }
    }
    json!({"name": name, "attributes": attributes, "capacity": {"memory": {"value": "81559Mi"}}})
}

fn classes(findings: &[Finding]) -> Vec<Class> {
    findings.iter().map(|f| f.class).collect()
}

#[test]
fn a_slice_as_the_driver_publishes_it_is_clean() {
    let findings = lint(&[slice(
        "gpu.nvidia.com",
        json!([
            nvidia_gpu("gpu-0", json!({})),
            nvidia_gpu("gpu-1", json!({}))
        ]),
    )]);
    assert_eq!(findings, vec![]);
}

#[test]
fn a_version_that_is_not_semver_is_refused_with_the_field_named() {
    for bad in [
        "580.65.06",
        "0.10.1.1",
        "12.4",
        "v1.2.3",
        "1.2.3-",
        "1.2.3+",
        "1.2.3-01",
    ] {
        let findings = lint(&[slice(
            "gpu.amd.com",
            json!([{"name": "gpu-0", "attributes": {"driverVersion": {"version": bad}}}]),
        )]);
        let refused: Vec<&Finding> = findings
            .iter()
            .filter(|f| f.class == Class::Refused)
            .collect();
        assert_eq!(refused.len(), 1, "{bad}: {findings:?}");
        assert_eq!(refused[0].severity, Severity::Error);
        assert_eq!(refused[0].device.as_deref(), Some("gpu-0"));
        assert!(
            refused[0].message.contains("driverVersion") && refused[0].message.contains(bad),
            "{}",
            refused[0].message
        );
        assert_eq!(Class::Refused.audit_reason(), "DriverSliceMissing");
    }
}

#[test]
fn semver_follows_the_apiservers_expression() {
    for good in [
        "0.0.0",
        "550.54.15",
        "1.2.3-rc.1",
        "1.2.3-0.alpha",
        "1.2.3+cu121.x-1",
        "6.12.12-rc1+b",
    ] {
        assert!(is_semver(good), "{good}");
    }
    for bad in [
        "",
        "1",
        "1.2",
        "01.2.3",
        "1.2.3.4",
        "1.2.3-",
        "1.2.3-a..b",
        "1.2.3+",
        "1.2.3+a_b",
        "1.2.3-00",
    ] {
        assert!(!is_semver(bad), "{bad}");
    }
}

#[test]
fn an_empty_slice_of_a_known_driver_is_an_error() {
    let findings = lint(&[slice("gpu.amd.com", json!([]))]);
    assert_eq!(classes(&findings), vec![Class::EmptySlice]);
    assert_eq!(findings[0].severity, Severity::Error);
    assert!(
        findings[0]
            .message
            .contains("gpu.amd.com publishes no device")
    );
}

#[test]
fn node_selection_must_be_exactly_one() {
    let mut both = slice("gpu.nvidia.com", json!([nvidia_gpu("gpu-0", json!({}))]));
    both.spec.all_nodes = Some(true);
    let findings = lint(&[both]);
    assert_eq!(classes(&findings), vec![Class::Refused]);
    assert!(
        findings[0].message.contains("nodeName, allNodes are"),
        "{}",
        findings[0].message
    );

    let mut none = slice("gpu.nvidia.com", json!([nvidia_gpu("gpu-0", json!({}))]));
    none.spec.node_name = None;
    assert!(lint(&[none])[0].message.contains("none is"));
}

#[test]
fn device_names_attribute_names_values_and_counts_follow_the_apiserver() {
    let mut many = serde_json::Map::new();
    for i in 0..33 {
        many.insert(format!("a{i}"), json!({"int": i}));
    }
    let findings = lint(&[slice(
        "gpu.nvidia.com",
        json!([
            nvidia_gpu("GPU-0", json!({})),
            nvidia_gpu("gpu-1", json!({})),
            nvidia_gpu("gpu-1", json!({})),
            nvidia_gpu("gpu-2", json!({"9lives": {"int": 1}, "a-b": {"int": 1}})),
            nvidia_gpu("gpu-3", json!({"productName": {"string": "x".repeat(65)}})),
            nvidia_gpu("gpu-4", json!({"uuid": {"string": "a", "int": 1}})),
            {"name": "gpu-5", "attributes": many},
        ]),
    )]);
    let refused = |device: &str, needle: &str| {
        assert!(
            findings.iter().any(|f| f.class == Class::Refused
                && f.device.as_deref() == Some(device)
                && f.message.contains(needle)),
            "{device}: {needle} in {findings:#?}"
        );
    };
    refused("GPU-0", "not a DNS label");
    refused("gpu-1", "appears twice");
    refused("gpu-2", "\"9lives\"");
    refused("gpu-2", "\"a-b\"");
    refused("gpu-3", "string of 65 bytes");
    refused("gpu-4", "2 values set");
    refused("gpu-5", "33 attributes and capacities");
}

#[test]
fn quantities_in_every_form_the_apiserver_keeps_are_accepted() {
    for good in ["81559Mi", "1e3", "1E+3", "1.5G", "500m", ".5", "+4k", "12"] {
        assert!(is_quantity(good), "{good}");
    }
    for bad in ["", "12 Gi", "Gi", "1.2.3", "1e", "1x", "1e3Mi", "."] {
        assert!(!is_quantity(bad), "{bad}");
    }
}

#[test]
fn unknown_memory_placeholder_products_and_missing_identity_are_warnings() {
    let mut gpu0 = nvidia_gpu("gpu-0", json!({"productName": {"string": "N/A"}}));
    gpu0["capacity"]["memory"]["value"] = json!("0");
    let gpu1 = nvidia_gpu(
        "gpu-1",
        json!({"uuid": null, "resource.kubernetes.io/pciBusID": null}),
    );
    let mut gpu2 = nvidia_gpu("gpu-2", json!({}));
    gpu2.as_object_mut().unwrap().remove("capacity");
    let findings = lint(&[slice("gpu.nvidia.com", json!([gpu0, gpu1, gpu2]))]);
    let has = |device: &str, class: Class, needle: &str| {
        assert!(
            findings.iter().any(|f| f.class == class
                && f.device.as_deref() == Some(device)
                && f.message.contains(needle)
                && f.severity == Severity::Warning),
            "{device} {class}: {needle} in {findings:#?}"
        );
    };
    has("gpu-0", Class::Sentinel, "memory capacity 0");
    has("gpu-0", Class::Sentinel, "placeholder");
    has("gpu-1", Class::MissingFact, "no PCI bus id and no UUID");
    has("gpu-2", Class::MissingFact, "no memory capacity");
    assert_eq!(findings.len(), 4, "{findings:#?}");
}

#[test]
fn partitions_are_not_held_to_a_whole_devices_facts() {
    let mig = json!({
        "name": "gpu-0-mig-1g10gb-19-0",
        "attributes": {"type": {"string": "mig"}, "uuid": {"string": "MIG-1"}},
        "capacity": {"memory": {"value": "9984Mi"}},
    });
    assert_eq!(lint(&[slice("gpu.nvidia.com", json!([mig]))]), vec![]);
}

#[test]
fn deprecated_and_driver_scoped_names_are_information() {
    let intel = json!([{
        "name": "0000-0a-00-0-0x0bd5",
        "attributes": {
            "model": {"string": "Max 1550"},
            "type": {"string": "gpu"},
            "pciAddress": {"string": "0000:0a:00.0"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:0a:00.0"},
        },
        "capacity": {"memory": {"value": "131072Mi"}},
    }]);
    let findings = lint(&[slice("gpu.intel.com", intel)]);
    assert_eq!(classes(&findings), vec![Class::Deprecated]);
    assert_eq!(findings[0].severity, Severity::Info);
    assert!(
        findings[0]
            .message
            .contains("resource.kubernetes.io/pciBusID")
    );

    let amd = json!([{
        "name": "gpu-1-129",
        "attributes": {
            "type": {"string": "amdgpu"},
            "productName": {"string": "AMD Instinct MI300X"},
            "numaNode": {"int": -1},
            "resource.kubernetes.io/pciBusID": {"string": "0000:11:00.0"},
        },
        "capacity": {"memory": {"value": "196592Mi"}},
    }]);
    let findings = lint(&[slice("gpu.amd.com", amd)]);
    assert_eq!(
        classes(&findings),
        vec![Class::Sentinel, Class::DriverScoped],
        "{findings:#?}"
    );
    assert!(findings[0].message.contains("NUMA node -1"));
}

#[test]
fn an_unknown_driver_gets_the_apiservers_rules_only() {
    let findings = lint(&[slice(
        "npu.example.com",
        json!([{"name": "npu-0", "attributes": {"fw": {"version": "1.02.3"}}}]),
    )]);
    assert_eq!(
        classes(&findings),
        vec![Class::Refused, Class::UnknownDriver]
    );
}

#[test]
fn findings_per_slice_are_bounded() {
    let devices: Vec<Value> = (0..120)
        .map(|i| json!({"name": format!("BAD-{i}")}))
        .collect();
    let findings = lint(&[slice("npu.example.com", Value::Array(devices))]);
    assert_eq!(findings.len(), MAX_FINDINGS_PER_SLICE);
    assert!(
        findings
            .iter()
            .any(|f| f.message.contains("more findings in this slice not shown")),
        "{findings:#?}"
    );
}

#[test]
fn the_same_finding_on_many_devices_is_one_row_with_a_count() {
    let devices: Vec<Value> = (0..8)
        .map(|i| {
            let mut gpu = nvidia_gpu(&format!("gpu-{i}"), json!({}));
            gpu["capacity"]["memory"]["value"] = json!("0");
            gpu
        })
        .collect();
    let findings = lint(&[slice("gpu.nvidia.com", Value::Array(devices))]);
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert_eq!(findings[0].device.as_deref(), Some("gpu-0"));
    assert_eq!(findings[0].repeats, 7);
}

#[test]
fn a_pool_split_over_slices_is_still_read_device_by_device() {
    let mut part = slice(
        "gpu.nvidia.com",
        json!([{
            "name": "gpu-0",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-0"}},
            "capacity": {"memory": {"value": "0"}},
        }]),
    );
    part.spec.pool.resource_slice_count = 2;
    let findings = lint(&[part]);
    assert_eq!(
        classes(&findings),
        vec![Class::Sentinel, Class::MissingFact],
        "{findings:#?}"
    );
}
