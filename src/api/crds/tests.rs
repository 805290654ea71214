//! CRD tests: the committed `crds/` files match the generated ones, and the schema obeys the
//! apiserver's structural-schema rules, so installing it would not be refused, and an
//! inventory we write has no field the apiserver would prune.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

use super::*;
use crate::api::{AcceleratorInventoryStatus, conditions};
use crate::testing::report::{h100_x8, with_node_facts};

/// The formats an apiserver recognises (apiextensions `supportedFormats`).
const SUPPORTED_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "date-time",
    "int32",
    "int64",
    "float",
    "double",
];

/// Keys a schema inside `allOf`/`anyOf`/`oneOf`/`not` may not set in a structural schema.
const FORBIDDEN_IN_JUNCTORS: &[&str] = &[
    "type",
    "description",
    "default",
    "additionalProperties",
    "nullable",
];

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds")
}

fn inventory_crd() -> CustomResourceDefinition {
    all()
        .into_iter()
        .find(|crd| crd.spec.names.kind == "AcceleratorInventory")
        .expect("AcceleratorInventory CRD")
}

fn schema_of(crd: &CustomResourceDefinition) -> Value {
    let version = &crd.spec.versions[0];
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref());
    serde_json::to_value(schema.expect("a schema")).unwrap()
}

#[test]
fn committed_crds_match_the_generated_ones() {
    let mut expected = BTreeSet::new();
    for crd in all() {
        let name = file_name(&crd);
        let path = crds_dir().join(&name);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == to_yaml(&crd).unwrap(),
            "{} is stale or missing: run `make generate` and commit crds/",
            path.display()
        );
        expected.insert(name);
    }
    let present: BTreeSet<String> = std::fs::read_dir(crds_dir())
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    assert_eq!(present, expected, "crds/ holds a file no CRD generates");
}

#[test]
fn committed_yaml_parses_back_to_the_same_crd() {
    for crd in all() {
        let text = std::fs::read_to_string(crds_dir().join(file_name(&crd))).unwrap();
        let parsed: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(parsed, crd);
    }
}

#[test]
fn all_yaml_is_one_document_per_crd() {
    let text = all_yaml().unwrap();
    assert_eq!(text.matches("\n---\n").count() + 1, all().len());
    assert!(text.starts_with("---\n"));
}

#[test]
fn names_scope_columns_and_subresources() {
    let crd = inventory_crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("acceleratorinventories.hwaccel.io")
    );
    assert_eq!(crd.spec.group, "hwaccel.io");
    assert_eq!(crd.spec.scope, "Cluster");
    let names = &crd.spec.names;
    assert!(
        names
            .short_names
            .as_ref()
            .unwrap()
            .contains(&"accinv".to_string())
    );
    assert_eq!(names.plural, "acceleratorinventories");
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.served && version.storage);
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    let columns = version.additional_printer_columns.as_ref().unwrap();
    let default_columns: Vec<(&str, &str)> = columns
        .iter()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| (c.name.as_str(), c.json_path.as_str()))
        .collect();
    assert_eq!(
        default_columns,
        [
            ("Node", ".spec.nodeName"),
            ("Accelerators", ".spec.summary.accelerators"),
            ("Product", ".spec.summary.product"),
            ("Memory", ".spec.summary.memoryLayout"),
            ("Healthy", ".spec.summary.healthy"),
            ("Degraded", ".spec.summary.degraded"),
            ("Free", ".status.freeDevices"),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
    let selectable = version.selectable_fields.as_ref().unwrap();
    assert_eq!(selectable[0].json_path, ".spec.nodeName");
}

/// Checks the structural-schema rules; returns every violation with its path.
fn structural_violations(schema: &Value, path: &str, out: &mut Vec<String>) {
    let Some(object) = schema.as_object() else {
        out.push(format!("{path}: not an object"));
        return;
    };
    for key in ["$ref", "$schema", "definitions", "$defs"] {
        if object.contains_key(key) {
            out.push(format!("{path}: has {key}"));
        }
    }
    let int_or_string = object.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let preserve = object.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let kind = object.get("type").and_then(Value::as_str);
    if kind.is_none() && !int_or_string && !preserve {
        out.push(format!("{path}: no type"));
    }
    if let Some(format) = object.get("format").and_then(Value::as_str)
        && !SUPPORTED_FORMATS.contains(&format)
    {
        out.push(format!("{path}: unsupported format {format}"));
    }
    if object.contains_key("properties") && object.contains_key("additionalProperties") {
        out.push(format!("{path}: both properties and additionalProperties"));
    }
    for junctor in ["allOf", "anyOf", "oneOf"] {
        for (i, sub) in object
            .get(junctor)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            junctor_violations(sub, object, &format!("{path}.{junctor}[{i}]"), out);
        }
    }
    if let Some(not) = object.get("not") {
        junctor_violations(not, object, &format!("{path}.not"), out);
    }
    if object.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
        list_map_violations(object, path, out);
    }
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        for (name, sub) in properties {
            structural_violations(sub, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = object.get("items") {
        structural_violations(items, &format!("{path}[]"), out);
    }
    if let Some(additional) = object.get("additionalProperties").filter(|v| v.is_object()) {
        structural_violations(additional, &format!("{path}{{}}"), out);
    }
}

/// A value validation inside a junctor may not set types, defaults or descriptions, and may
/// only name properties the enclosing schema declares.
fn junctor_violations(
    sub: &Value,
    parent: &serde_json::Map<String, Value>,
    path: &str,
    out: &mut Vec<String>,
) {
    let Some(sub) = sub.as_object() else { return };
    for key in FORBIDDEN_IN_JUNCTORS {
        if sub.contains_key(*key) {
            out.push(format!("{path}: sets {key}"));
        }
    }
    let declared = parent.get("properties").and_then(Value::as_object);
    for name in sub
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = name.as_str().unwrap_or_default();
        if !declared.is_some_and(|props| props.contains_key(name)) {
            out.push(format!("{path}: requires undeclared {name}"));
        }
    }
}

/// A list-map's items are objects whose keys are required (or defaulted) scalars.
fn list_map_violations(list: &serde_json::Map<String, Value>, path: &str, out: &mut Vec<String>) {
    let items = list.get("items").and_then(Value::as_object);
    let required: Vec<&str> = items
        .and_then(|i| i.get("required"))
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for key in list
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = key.as_str().unwrap_or_default();
        if !required.contains(&key) {
            out.push(format!("{path}: list-map key {key} is not required"));
        }
    }
}

#[test]
fn schema_is_structural() {
    let mut violations = Vec::new();
    structural_violations(&schema_of(&inventory_crd()), "", &mut violations);
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn structural_check_catches_what_the_apiserver_refuses() {
    let bad = serde_json::json!({
        "type": "object",
        "properties": {
            "untyped": {"description": "x"},
            "count": {"type": "integer", "format": "uint32"},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "list": {"type": "array", "x-kubernetes-list-type": "map",
                     "x-kubernetes-list-map-keys": ["name"],
                     "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        },
    });
    let mut violations = Vec::new();
    structural_violations(&bad, "", &mut violations);
    assert_eq!(violations.len(), 6, "{violations:#?}");
}

#[test]
fn no_unsigned_formats_survive() {
    let text = serde_json::to_string(&schema_of(&inventory_crd())).unwrap();
    assert!(!text.contains("\"uint"), "an unsigned format is left");
    assert!(text.contains("4294967295"), "u32 bounds were expected");
}

/// Paths in `value` that the schema does not declare (the apiserver would prune them).
fn undeclared_fields(value: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (name, field) in fields {
                let sub = properties.and_then(|p| p.get(name)).or(additional);
                match sub {
                    Some(sub) => undeclared_fields(field, sub, &format!("{path}.{name}"), out),
                    None => out.push(format!("{path}.{name}")),
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    undeclared_fields(item, item_schema, &format!("{path}[]"), out);
                }
            }
        }
        _ => {}
    }
}

#[test]
fn a_full_inventory_has_no_field_the_apiserver_would_prune() {
    let mut inventory =
        AcceleratorInventory::from_report("gpu-node-1", &with_node_facts(h100_x8()));
    inventory.spec.devices[0]
        .details
        .insert("pciDeviceId".into(), "0x2330".into());
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    );
    let mut status = AcceleratorInventoryStatus::default();
    conditions::set(
        &mut status.conditions,
        conditions::condition(conditions::READY, Some(true), "Detected", "", Some(1), &now),
    );
    status.observed_generation = Some(1);
    inventory.status = Some(status);
    let mut value = serde_json::to_value(&inventory).unwrap();
    let object = value.as_object_mut().unwrap();
    for top_level in ["apiVersion", "kind", "metadata"] {
        object.remove(top_level);
    }
    let mut undeclared = Vec::new();
    undeclared_fields(&value, &schema_of(&inventory_crd()), "", &mut undeclared);
    assert!(undeclared.is_empty(), "{undeclared:#?}");
}

/// Paths of strings, lists and maps without a size bound.
fn unbounded(schema: &Value, path: &str, out: &mut Vec<String>) {
    let Some(object) = schema.as_object() else {
        return;
    };
    let has = |key: &str| object.contains_key(key);
    match object.get("type").and_then(Value::as_str) {
        Some("string") if !has("maxLength") && !has("enum") => out.push(path.to_string()),
        Some("array") if !has("maxItems") => out.push(path.to_string()),
        Some("object") if has("additionalProperties") && !has("maxProperties") => {
            out.push(path.to_string());
        }
        _ => {}
    }
    if let Some(items) = object.get("items") {
        unbounded(items, &format!("{path}[]"), out);
    }
    if let Some(values) = object.get("additionalProperties") {
        unbounded(values, &format!("{path}{{}}"), out);
    }
    for (name, child) in object
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&name.as_str()) {
            continue;
        }
        unbounded(child, &format!("{path}.{name}"), out);
    }
}

#[test]
fn every_string_list_and_map_a_client_writes_is_bounded() {
    for crd in all() {
        let mut out = Vec::new();
        unbounded(&schema_of(&crd), "", &mut out);
        assert!(out.is_empty(), "{}: unbounded {out:?}", crd.spec.names.kind);
    }
    let inventory = schema_of(&inventory_crd());
    let devices = &inventory["properties"]["spec"]["properties"]["devices"];
    assert_eq!(devices["maxItems"], crate::api::bounds::MAX_DEVICES);
    let device = &devices["items"]["properties"];
    assert_eq!(device["attributes"]["maxProperties"], 32);
    assert_eq!(device["capacity"]["maxProperties"], 32);
    // The inline config is JSON text, bounded as a whole: the apiserver refuses a longer one
    // with no CEL cost at all (a free-form object could be bounded only in its top-level keys).
    let placement = all()
        .into_iter()
        .find(|crd| crd.spec.names.kind == "ModelPlacement")
        .expect("ModelPlacement CRD");
    let model = &schema_of(&placement)["properties"]["spec"]["properties"]["model"];
    let config = &model["properties"]["huggingFaceConfig"];
    assert_eq!(config["type"], "string");
    assert_eq!(config["maxLength"], crate::api::placement::MAX_CONFIG_CHARS);
}
