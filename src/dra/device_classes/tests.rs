//! DeviceClass tests: names and order, CEL shape (driver test first, keys checked before
//! use), memory thresholds against the product table, product selection against the
//! table's own matching, and the committed chart file against the generator.

use std::path::Path;

use super::*;

fn expression(class: &DeviceClass) -> String {
    let selectors = class.spec.selectors.as_deref().unwrap_or_default();
    assert_eq!(selectors.len(), 1, "one selector per class");
    selectors[0]
        .cel
        .as_ref()
        .map(|c| c.expression.clone())
        .unwrap_or_default()
}

fn class_named(name: &str) -> DeviceClass {
    device_classes()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no class {name}"))
}

/// Splits a CEL expression at `||` outside parentheses and string literals.
fn top_level_clauses(expr: &str) -> Vec<String> {
    let (mut depth, mut quoted, mut start) = (0i32, false, 0usize);
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => quoted = !quoted,
            b'(' if !quoted => depth += 1,
            b')' if !quoted => depth -= 1,
            b'|' if !quoted && depth == 0 && bytes.get(i + 1) == Some(&b'|') => {
                out.push(expr[start..i].trim().to_string());
                start = i + 2;
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(expr[start..].trim().to_string());
    out
}

#[test]
fn classes_are_the_families_precisions_and_memory_steps_in_order() {
    let names: Vec<String> = device_classes()
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(
        names,
        [
            "gpu.hwaccel.io",
            "asic.hwaccel.io",
            "fp8.hwaccel.io",
            "fp4.hwaccel.io",
            "hbm-40g-plus.hwaccel.io",
            "hbm-80g-plus.hwaccel.io",
            "hbm-141g-plus.hwaccel.io",
            "hbm-192g-plus.hwaccel.io",
        ]
    );
    assert_eq!(device_classes(), device_classes(), "deterministic");
}

#[test]
fn every_clause_tests_its_driver_before_reading_its_keys() {
    for class in device_classes() {
        let expr = expression(&class);
        assert!(expr.len() < 10 * 1024, "{expr}");
        for clause in top_level_clauses(&expr) {
            let rest = clause
                .strip_prefix("(device.driver == '")
                .unwrap_or_else(|| panic!("clause does not start with the driver: {clause}"));
            let driver = &rest[..rest.find('\'').unwrap()];
            assert!(known(driver).is_some(), "{driver}");
            // Every attribute or capacity read is of this driver's domain, and each key is
            // checked with `in` before it is read.
            for lookup in ["device.attributes['", "device.capacity['"] {
                for (at, _) in clause.match_indices(lookup) {
                    let domain = &clause[at + lookup.len()..];
                    let domain = &domain[..domain.find('\'').unwrap()];
                    assert_eq!(domain, driver, "{clause}");
                    let after = &clause[at..];
                    let member = after.find("].").map(|i| &after[i + 2..]);
                    if let Some(member) = member {
                        let key: String = member
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric())
                            .collect();
                        let guard =
                            format!("'{key}' in {}", &after[..after.find(']').unwrap() + 1]);
                        let guarded_at = clause.find(&guard);
                        assert!(
                            guarded_at.is_some_and(|g| g < at),
                            "{key} read before `{guard}` in {clause}"
                        );
                    }
                }
            }
        }
    }
}

fn known(driver: &str) -> Option<&'static KnownDriver> {
    super::super::drivers::known(driver)
}

#[test]
fn family_class_takes_only_whole_gpus_of_drivers_that_publish_partitions() {
    assert_eq!(
        expression(&class_named("gpu.hwaccel.io")),
        "(device.driver == 'gpu.nvidia.com' && 'type' in device.attributes['gpu.nvidia.com'] \
         && device.attributes['gpu.nvidia.com'].type == 'gpu') \
         || (device.driver == 'gpu.amd.com' && 'type' in device.attributes['gpu.amd.com'] \
         && device.attributes['gpu.amd.com'].type == 'amdgpu') \
         || (device.driver == 'gpu.intel.com' && 'type' in device.attributes['gpu.intel.com'] \
         && device.attributes['gpu.intel.com'].type == 'gpu')"
    );
    assert_eq!(
        expression(&class_named("asic.hwaccel.io")),
        "(device.driver == 'gaudi.intel.com') || (device.driver == 'neuron.aws.com' \
         && !('resourceType' in device.attributes['neuron.aws.com'] \
         && device.attributes['neuron.aws.com'].resourceType == 'neuron_node'))"
    );
}

#[test]
fn memory_class_compares_the_capacity_with_a_threshold_under_80gib() {
    let expr = expression(&class_named("hbm-80g-plus.hwaccel.io"));
    // 95 % of the H100's 81,559 MiB: an "80 GB" H100 reports less than 80 GiB.
    assert_eq!(memory_threshold_mib(80), Some(77_481));
    assert!(expr.starts_with(
        "(device.driver == 'gpu.nvidia.com' && 'type' in device.attributes['gpu.nvidia.com'] \
         && device.attributes['gpu.nvidia.com'].type == 'gpu' \
         && 'memory' in device.capacity['gpu.nvidia.com'] \
         && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('77481Mi')) >= 0)"
    ));
    // Gaudi publishes no memory capacity: both Gaudis (96 and 128 GB) are in by product.
    assert!(
        expr.contains("(device.driver == 'gaudi.intel.com' && 'model' in"),
        "{expr}"
    );
    let asic = expression(&class_named("hbm-141g-plus.hwaccel.io"));
    assert!(!asic.contains("gaudi"), "no Gaudi has 141 GB: {asic}");
}

#[test]
fn memory_steps_come_from_the_table_and_separate_its_products() {
    for &step in MEMORY_STEPS_GB {
        assert!(
            PRODUCTS.iter().any(|p| p.nominal_gb == step),
            "{step} GB is no product's size"
        );
        let threshold = memory_threshold_mib(step).unwrap();
        for p in PRODUCTS {
            assert_eq!(
                p.memory_mib >= threshold,
                p.nominal_gb >= step,
                "{} ({} MiB) against the {step} GB threshold {threshold} MiB",
                p.name,
                p.memory_mib
            );
        }
    }
    assert_eq!(memory_threshold_mib(100_000), None);
}

/// Whether a device whose driver publishes `name` as its product is in the class that
/// `wanted` defines, by the same pattern sets the CEL encodes.
fn selected(driver: &KnownDriver, wanted: &dyn Fn(&Product) -> bool, name: &str) -> bool {
    pattern_sets(driver, wanted)
        .iter()
        .any(|set| name_matches(set, name))
}

fn fp8(p: &Product) -> bool {
    p.precisions.contains(&Precision::Fp8)
}

#[test]
fn product_selection_agrees_with_the_table_for_every_product_name() {
    let fp4 = |p: &Product| {
        p.precisions.contains(&Precision::Nvfp4) || p.precisions.contains(&Precision::Mxfp4)
    };
    // A display name is in a class exactly when the table's own lookup maps it to a
    // product of the class ("Intel Gaudi 2" maps to none: its pattern is `gaudi2`).
    for driver in KNOWN_DRIVERS {
        for product in products_of(driver) {
            let found =
                crate::plan::products::lookup(product.name, Some(product.nominal_gb as f64));
            let name = product.name;
            assert_eq!(
                selected(driver, &fp8, name),
                found.is_some_and(fp8),
                "{name}"
            );
            assert_eq!(
                selected(driver, &fp4, name),
                found.is_some_and(fp4),
                "{name}"
            );
        }
    }
}

#[test]
fn product_selection_on_names_drivers_publish() {
    let nvidia = known("gpu.nvidia.com").unwrap();
    // Product names as NVML reports them (`nvidia-smi --query-gpu=name`), which the NVIDIA
    // DRA driver publishes as `productName` (dra-driver-nvidia-gpu deviceinfo.go).
    for (name, fp8_native) in [
        ("NVIDIA H100 80GB HBM3", true),
        ("NVIDIA H100 PCIe", true),
        ("NVIDIA H100 NVL", true),
        ("NVIDIA H200", true),
        ("NVIDIA H20", true),
        ("NVIDIA L4", true),
        ("NVIDIA L40S", true),
        ("NVIDIA B200", true),
        ("NVIDIA GB200", true),
        ("NVIDIA H800", true),
        ("NVIDIA H800 PCIe", true),
        ("NVIDIA A100-SXM4-80GB", false),
        ("NVIDIA A100-SXM4-40GB", false),
        ("NVIDIA A100 80GB PCIe", false),
        ("NVIDIA A10G", false),
        ("Tesla T4", false),
        ("Tesla V100-SXM2-32GB", false),
    ] {
        assert_eq!(selected(nvidia, &fp8, name), fp8_native, "{name}");
    }
    let gaudi = known("gaudi.intel.com").unwrap();
    assert!(selected(gaudi, &fp8, "HL-225"));
    assert!(selected(gaudi, &fp8, "Gaudi3"));
    let expr = expression(&class_named("fp8.hwaccel.io"));
    assert!(
        expr.contains("matches('(?i)(h100|h800|h200|h20|l40s|l4|4090|gb200|b200)([^0-9]|$)')"),
        "{expr}"
    );
    assert!(!expr.contains("a100"), "{expr}");
    // FP4 on NVIDIA: the B200 and the GB200, and no Hopper part.
    for (name, fp4) in [
        ("NVIDIA GB200", true),
        ("NVIDIA B200", true),
        ("NVIDIA H800", false),
        ("NVIDIA H100 80GB HBM3", false),
    ] {
        assert_eq!(selected(nvidia, &fp4_native, name), fp4, "{name}");
    }
}

#[test]
fn a_gb200_is_not_a_192_gb_part() {
    // 189,471 MiB (`nvidia-smi` on a GB200 tray) is above 95 % of an MI300X's 196,608 MiB:
    // the threshold is raised above it, and stays under the smallest 192 GB part.
    let threshold = memory_threshold_mib(192).unwrap();
    assert!(threshold > 189_471 && threshold < 196_608, "{threshold}");
    assert_eq!(memory_threshold_mib(141), Some(143_771 * 95 / 100));
}

#[test]
fn pattern_words_become_separator_runs() {
    assert_eq!(pattern_regex("v5 lite"), "v5[^a-z0-9]+lite");
    assert_eq!(pattern_regex("h100"), "h100");
    for p in PRODUCTS {
        for pattern in p.patterns {
            assert!(
                pattern
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == ' '),
                "{pattern} needs escaping in a regular expression"
            );
        }
    }
}

#[test]
fn yaml_parses_back_to_the_same_classes() {
    for class in device_classes() {
        let yaml = to_yaml(&class).unwrap();
        let back: DeviceClass = serde_saphyr::from_str(yaml.trim_start_matches("---\n")).unwrap();
        assert_eq!(back, class);
    }
}

#[test]
fn committed_chart_file_matches_the_generator() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts/hwaccel-operator/templates/dra-deviceclasses.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == chart_template().unwrap(),
        "{} is stale or missing: run `make generate` and commit it",
        path.display()
    );
}

#[test]
fn extended_resource_names_are_valid_unique_and_on_every_class() {
    let classes = with_extended_resource_names(device_classes());
    let mut seen = std::collections::BTreeSet::new();
    for class in &classes {
        let class_name = class.metadata.name.as_deref().unwrap();
        let name = class.spec.extended_resource_name.as_deref().unwrap();
        // An extended resource name: `<domain>/<name>`, the domain not kubernetes.io (that is
        // a native resource), the name a DNS label (IsExtendedResourceName in k8s.io/api).
        let (domain, short) = name.split_once('/').unwrap();
        assert_eq!(domain, EXTENDED_RESOURCE_DOMAIN);
        assert!(!domain.contains("kubernetes.io"), "{name}");
        assert!(
            crate::names::is_valid_label_value(short) && !short.is_empty(),
            "{name}"
        );
        assert!(
            class_name.starts_with(&format!("{short}.")),
            "{class_name} -> {name}"
        );
        assert!(seen.insert(name.to_string()), "{name} used twice");
        // Nothing else about the class changes.
        let plain = device_classes()
            .into_iter()
            .find(|c| c.metadata.name == class.metadata.name);
        let mut stripped = class.clone();
        stripped.spec.extended_resource_name = None;
        assert_eq!(Some(stripped), plain);
    }
    assert_eq!(seen.len(), device_classes().len());
    assert_eq!(
        extended_resource_name("hbm-80g-plus.hwaccel.io"),
        "hwaccel.io/hbm-80g-plus"
    );
}

#[test]
fn the_chart_puts_each_extended_resource_name_behind_its_value() {
    let chart = chart_template().unwrap();
    for class in device_classes() {
        let name = class.metadata.name.unwrap();
        let guarded = format!(
            "\nspec:\n{{{{- if {EXTENDED_RESOURCE_VALUE} }}}}\n  extendedResourceName: {}\n{{{{- end }}}}\n  selectors:",
            extended_resource_name(&name)
        );
        assert!(chart.contains(&guarded), "{name}: {chart}");
    }
}
