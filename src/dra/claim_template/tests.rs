//! Claim template tests: the prioritized list's order, selectors and constraints, and every
//! refusal.

use super::*;

/// A TP group of two H100s on one PCIe root, as the NVIDIA driver names them
/// (`productName` from NVML, dra-driver-nvidia-gpu deviceinfo.go).
fn h100_pair() -> Alternative {
    Alternative {
        name: "h100-tp2".to_string(),
        driver: "gpu.nvidia.com".to_string(),
        product: Some("NVIDIA H100 80GB HBM3".to_string()),
        min_memory_bytes: None,
        count: 2,
        same_domain_attribute: Some("resource.kubernetes.io/pcieRoot".to_string()),
        memory_request: None,
        partition_profile: None,
    }
}

fn mi300x() -> Alternative {
    Alternative {
        name: "mi300x".to_string(),
        driver: "gpu.amd.com".to_string(),
        product: None,
        min_memory_bytes: Some(192 * 1_000_000_000),
        count: 1,
        same_domain_attribute: None,
        memory_request: None,
        partition_profile: None,
    }
}

fn build(alternatives: &[Alternative]) -> Result<ResourceClaimTemplate, TemplateError> {
    claim_template("models", "llama-70b", None, alternatives)
}

fn request(template: &ResourceClaimTemplate) -> &DeviceRequest {
    let requests = template
        .spec
        .spec
        .devices
        .as_ref()
        .unwrap()
        .requests
        .as_ref();
    let requests = requests.unwrap();
    assert_eq!(requests.len(), 1);
    &requests[0]
}

fn selector(sub: &DeviceSubRequest) -> &str {
    &sub.selectors.as_ref().unwrap()[0]
        .cel
        .as_ref()
        .unwrap()
        .expression
}

#[test]
fn alternatives_become_a_first_available_list_in_order() {
    let template = build(&[h100_pair(), mi300x()]).unwrap();
    assert_eq!(template.metadata.name.as_deref(), Some("llama-70b"));
    assert_eq!(template.metadata.namespace.as_deref(), Some("models"));
    let request = request(&template);
    assert_eq!(request.name, REQUEST_NAME);
    assert!(request.exactly.is_none());
    let subs = request.first_available.as_ref().unwrap();
    let names: Vec<&str> = subs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["h100-tp2", "mi300x"]);
    assert_eq!(subs[0].device_class_name, "gpu.hwaccel.io");
    assert_eq!(subs[0].count, Some(2));
    assert_eq!(subs[0].allocation_mode.as_deref(), Some("ExactCount"));
    assert_eq!(
        selector(&subs[0]),
        "device.driver == 'gpu.nvidia.com' && 'productName' in device.attributes['gpu.nvidia.com'] \
         && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
    );
    assert_eq!(
        selector(&subs[1]),
        "device.driver == 'gpu.amd.com' && 'memory' in device.capacity['gpu.amd.com'] \
         && device.capacity['gpu.amd.com'].memory.compareTo(quantity('192000000000')) >= 0"
    );
}

#[test]
fn same_domain_constraint_is_scoped_to_its_subrequest() {
    let template = build(&[h100_pair(), mi300x()]).unwrap();
    let constraints = template
        .spec
        .spec
        .devices
        .as_ref()
        .unwrap()
        .constraints
        .clone()
        .unwrap();
    assert_eq!(
        constraints,
        [DeviceConstraint {
            match_attribute: Some("resource.kubernetes.io/pcieRoot".to_string()),
            requests: Some(vec!["accelerators/h100-tp2".to_string()]),
            distinct_attribute: None,
        }]
    );
    // A single device needs no shared domain: no constraint that could only exclude.
    let mut single = h100_pair();
    single.count = 1;
    let template = build(&[single]).unwrap();
    assert!(template.spec.spec.devices.unwrap().constraints.is_none());
}

#[test]
fn owner_is_set_when_given() {
    let owner = OwnerReference {
        api_version: "hwaccel.io/v1alpha1".to_string(),
        kind: "ModelPlacement".to_string(),
        name: "llama".to_string(),
        uid: "0b7c1c9e-9d55-4e55-a3c5-4f3c3a6e1d11".to_string(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let template = claim_template("models", "t", Some(owner.clone()), &[mi300x()]).unwrap();
    assert_eq!(template.metadata.owner_references, Some(vec![owner]));
}

#[test]
fn product_quotes_are_escaped() {
    let mut alt = h100_pair();
    alt.product = Some(r"it's a \ GPU".to_string());
    let template = build(&[alt]).unwrap();
    let sub = &request(&template).first_available.as_ref().unwrap()[0];
    assert!(
        selector(sub).ends_with(r"productName == 'it\'s a \\ GPU'"),
        "{}",
        selector(sub)
    );
}

#[test]
fn refusals() {
    let err = |alternatives: &[Alternative]| build(alternatives).unwrap_err();
    assert_eq!(err(&[]), TemplateError::NoAlternatives);
    let nine: Vec<Alternative> = (0..9)
        .map(|i| Alternative {
            name: format!("alt-{i}"),
            ..mi300x()
        })
        .collect();
    assert_eq!(err(&nine), TemplateError::TooManyAlternatives { count: 9 });
    assert!(build(&nine[..8]).is_ok(), "eight is the limit, not over it");
    assert_eq!(
        err(&[mi300x(), mi300x()]),
        TemplateError::DuplicateName("mi300x".to_string())
    );
    for count in [0, MAX_COUNT + 1, 64] {
        let alt = Alternative { count, ..mi300x() };
        assert!(
            matches!(err(&[alt]), TemplateError::BadCount { count: c, .. } if c == count),
            "{count}"
        );
    }
    assert!(
        build(&[Alternative {
            count: MAX_COUNT,
            ..mi300x()
        }])
        .is_ok()
    );
    for name in ["", "H100", "-a", "a-", "a.b", &"a".repeat(64)] {
        let alt = Alternative {
            name: name.to_string(),
            ..mi300x()
        };
        assert!(
            matches!(
                err(&[alt]),
                TemplateError::BadName {
                    what: "alternative name",
                    ..
                }
            ),
            "{name:?}"
        );
    }
    let unknown = Alternative {
        driver: "gpu.example.com".to_string(),
        ..mi300x()
    };
    assert!(matches!(
        err(&[unknown]),
        TemplateError::UnknownDriver { .. }
    ));
    // Gaudi's driver publishes no memory capacity.
    let gaudi = Alternative {
        driver: "gaudi.intel.com".to_string(),
        ..mi300x()
    };
    assert!(matches!(
        err(&[gaudi]),
        TemplateError::NoMemoryCapacity { .. }
    ));
    for product in ["", &"x".repeat(65), "a\nb"] {
        let alt = Alternative {
            product: Some(product.to_string()),
            ..h100_pair()
        };
        assert!(
            matches!(err(&[alt]), TemplateError::BadProduct { .. }),
            "{product:?}"
        );
    }
    for attribute in [
        "pcieRoot",
        "Resource.k8s.io/pcieRoot",
        "a.io/9lives",
        "a.io/",
        &format!("a.io/{}", "x".repeat(33)),
    ] {
        let alt = Alternative {
            same_domain_attribute: Some(attribute.to_string()),
            memory_request: None,
            partition_profile: None,
            ..h100_pair()
        };
        assert!(
            matches!(err(&[alt]), TemplateError::BadAttribute { .. }),
            "{attribute:?}"
        );
    }
}

#[test]
fn namespace_and_template_names_are_checked() {
    let e = claim_template("Models", "t", None, &[mi300x()]).unwrap_err();
    assert!(matches!(
        e,
        TemplateError::BadName {
            what: "namespace",
            ..
        }
    ));
    let e = claim_template("models", "t..x", None, &[mi300x()]).unwrap_err();
    assert!(matches!(
        e,
        TemplateError::BadName {
            what: "template name",
            ..
        }
    ));
    assert!(claim_template("models", "llama.v3-70b", None, &[mi300x()]).is_ok());
    assert!(
        e.to_string().contains("template name \"t..x\" is invalid"),
        "{e}"
    );
}

/// A share's claim asks for its memory in `capacity.requests`, under the driver's memory
/// capacity name; a request of nothing, of more than any device holds, or of a driver that
/// publishes no memory is refused.
#[test]
fn a_memory_request_becomes_the_subrequests_capacity_request() {
    let share = Alternative {
        memory_request: Some(24 << 30),
        partition_profile: None,
        ..mi300x()
    };
    let template = build(&[share]).unwrap();
    let subrequest = &template
        .spec
        .spec
        .devices
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()[0]
        .first_available
        .as_ref()
        .unwrap()[0];
    let requests = subrequest
        .capacity
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert_eq!(requests.get("memory").map(|q| q.0.as_str()), Some("24Gi"));
    assert!(
        build(&[mi300x()])
            .unwrap()
            .spec
            .spec
            .devices
            .unwrap()
            .requests
            .unwrap()[0]
            .first_available
            .as_ref()
            .unwrap()[0]
            .capacity
            .is_none()
    );
    for bytes in [0, u64::MAX] {
        let alt = Alternative {
            memory_request: Some(bytes),
            partition_profile: None,
            ..mi300x()
        };
        assert!(
            matches!(
                build(&[alt]).unwrap_err(),
                TemplateError::BadMemoryRequest { .. }
            ),
            "{bytes}"
        );
    }
    let gaudi = Alternative {
        driver: "gaudi.intel.com".to_string(),
        min_memory_bytes: None,
        memory_request: Some(1 << 30),
        partition_profile: None,
        ..mi300x()
    };
    assert!(matches!(
        build(&[gaudi]).unwrap_err(),
        TemplateError::NoMemoryCapacity { .. }
    ));
}

/// A partition alternative names the driver's partition class and selects the profile; a
/// driver whose partitions we do not know, or a profile no attribute can hold, is refused.
#[test]
fn a_partition_alternative_asks_the_partition_class_for_its_profile() {
    let mig = Alternative {
        name: "mig".to_string(),
        driver: "gpu.nvidia.com".to_string(),
        product: None,
        min_memory_bytes: None,
        count: 1,
        same_domain_attribute: None,
        memory_request: None,
        partition_profile: Some("3g.40gb".to_string()),
    };
    let template = build(std::slice::from_ref(&mig)).unwrap();
    let subrequest = &template.spec.spec.devices.unwrap().requests.unwrap()[0]
        .first_available
        .clone()
        .unwrap()[0];
    assert_eq!(subrequest.device_class_name, "mig.nvidia.com");
    let cel = &subrequest.selectors.as_ref().unwrap()[0]
        .cel
        .as_ref()
        .unwrap()
        .expression;
    assert!(cel.contains("== '3g.40gb'"), "{cel}");
    // AMD's partitions are claimed through the driver's own class, by `partitionProfile`.
    let amd = Alternative {
        driver: "gpu.amd.com".to_string(),
        partition_profile: Some("cpx_nps4".to_string()),
        ..mig.clone()
    };
    let template = build(&[amd]).unwrap();
    let subrequest = &template.spec.spec.devices.unwrap().requests.unwrap()[0]
        .first_available
        .clone()
        .unwrap()[0];
    assert_eq!(subrequest.device_class_name, "gpu.amd.com");
    let cel = &subrequest.selectors.as_ref().unwrap()[0]
        .cel
        .as_ref()
        .unwrap()
        .expression;
    assert!(
        cel.contains("device.attributes['gpu.amd.com'].partitionProfile == 'cpx_nps4'"),
        "{cel}"
    );
    let intel = Alternative {
        driver: "gpu.intel.com".to_string(),
        ..mig.clone()
    };
    assert!(matches!(
        build(&[intel]).unwrap_err(),
        TemplateError::NoPartitions { .. }
    ));
    let long = Alternative {
        partition_profile: Some("x".repeat(65)),
        ..mig
    };
    assert!(matches!(
        build(&[long]).unwrap_err(),
        TemplateError::BadProduct { .. }
    ));
}
