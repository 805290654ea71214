//! The projection against objects as the apiserver returns them, with metadata grown by a
//! writer, and the decoded objects' size.

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Resource as _;

use super::*;
use crate::api::{AcceleratorInventory, Lenient, ModelPlacement};

/// `labels` generated labels, one `hwaccel.io/placement`, one annotation of `annotation`
/// bytes and managedFields naming every label, around `rest` (the kind's own fields).
fn grown(kind: &str, api_version: &str, labels: usize, annotation: usize, rest: &str) -> String {
    let mut label_text = String::from(r#""hwaccel.io/placement":"llama""#);
    let mut owned = String::new();
    for i in 0..labels {
        label_text.push_str(&format!(r#","example.com/label-{i:06}":"value-{i}""#));
        owned.push_str(&format!(r#""f:example.com/label-{i:06}":{{}},"#));
    }
    owned.push_str(r#""f:hwaccel.io/placement":{}"#);
    format!(
        r#"{{"apiVersion":"{api_version}","kind":"{kind}","metadata":{{"name":"big","namespace":"ns",
            "uid":"u1","resourceVersion":"7","labels":{{{label_text}}},
            "annotations":{{"example.com/blob":"{blob}"}},
            "managedFields":[{{"manager":"kubectl","operation":"Update","fieldsType":"FieldsV1",
                "fieldsV1":{{"f:metadata":{{"f:labels":{{{owned}}}}}}}}}]}},{rest}}}"#,
        blob = "x".repeat(annotation)
    )
}

const CLAIM_REST: &str = r#""spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.nvidia.com"}}]}},
    "status":{"allocation":{"devices":{"results":[{"request":"gpu","driver":"gpu.nvidia.com","pool":"node-a","device":"gpu-0"}]}}}"#;

#[test]
fn a_claim_keeps_its_own_label_spec_and_status_and_nothing_a_writer_grew() {
    let text = grown(
        "ResourceClaim",
        "resource.k8s.io/v1",
        2_000,
        4_096,
        CLAIM_REST,
    );
    let claim = serde_json::from_str::<Projected<ResourceClaim>>(&text)
        .expect("decodes")
        .into_inner();
    let meta = claim.meta();
    assert_eq!(meta.name.as_deref(), Some("big"));
    assert_eq!(meta.uid.as_deref(), Some("u1"));
    assert_eq!(meta.resource_version.as_deref(), Some("7"));
    let labels = meta.labels.as_ref().expect("labels");
    assert_eq!(
        labels.iter().collect::<Vec<_>>(),
        [(&"hwaccel.io/placement".to_string(), &"llama".to_string())]
    );
    assert!(meta.annotations.is_none());
    assert!(meta.managed_fields.is_none());
    let results = claim
        .status
        .and_then(|status| status.allocation)
        .and_then(|allocation| allocation.devices)
        .and_then(|devices| devices.results)
        .expect("the allocation");
    assert_eq!(results[0].device, "gpu-0");
    let requests = claim.spec.devices.and_then(|devices| devices.requests);
    assert_eq!(requests.expect("requests")[0].name, "gpu");
}

#[test]
fn the_projection_is_the_object_less_the_unread_metadata() {
    let text = grown("ResourceClaim", "resource.k8s.io/v1", 3, 10, CLAIM_REST);
    let whole: ResourceClaim = serde_json::from_str(&text).expect("decodes whole");
    let projected = project::<ResourceClaim>(&text).expect("something to cut");
    let mut expected = whole.clone();
    expected.metadata.managed_fields = None;
    expected.metadata.annotations = None;
    expected
        .metadata
        .labels
        .as_mut()
        .expect("labels")
        .retain(|key, _| key.starts_with("hwaccel.io/"));
    let projected: ResourceClaim = serde_json::from_str(&projected).expect("decodes");
    assert_eq!(projected, expected);
}

#[test]
fn an_object_with_nothing_to_cut_is_left_alone() {
    let text = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
        "metadata":{"name":"small","labels":{"hwaccel.io/placement":"a"}},"spec":{}}"#;
    assert_eq!(project::<ResourceClaim>(text), None);
    // Not an object, or no metadata object: decoded as it is, failing as it would have.
    assert_eq!(project::<ResourceClaim>("[1,2]"), None);
    assert_eq!(project::<ResourceClaim>(r#"{"metadata":7}"#), None);
    assert!(serde_json::from_str::<Projected<ResourceClaim>>(r#"{"metadata":7}"#).is_err());
}

#[test]
fn escaped_label_keys_are_judged_by_their_value() {
    // "hwaccel.io\/placement" is the key hwaccel.io/placement written with an escape.
    let text = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
        "metadata":{"name":"e","labels":{"hwaccel.io\/placement":"a","other":"b"}},"spec":{}}"#;
    let claim = serde_json::from_str::<Projected<ResourceClaim>>(text)
        .expect("decodes")
        .into_inner();
    let labels = claim.metadata.labels.expect("labels");
    assert_eq!(labels.len(), 1);
    assert_eq!(labels["hwaccel.io/placement"], "a");
}

#[test]
fn placements_and_inventories_decode_leniently_from_their_projection() {
    let placement = grown(
        "ModelPlacement",
        "hwaccel.io/v1alpha1",
        500,
        1_000,
        r#""spec":{"model":{"parameters":"8B"},"goal":{"serve":{}}}"#,
    );
    let decoded: Lenient<ModelPlacement> = serde_json::from_str(&placement).expect("decodes");
    let placement = decoded.decoded().expect("a placement");
    assert_eq!(placement.meta().labels.as_ref().map(BTreeMap::len), Some(1));
    assert!(placement.meta().annotations.is_none());
    assert!(placement.meta().managed_fields.is_none());

    // One that does not fit the type keeps its projected metadata only.
    let odd = grown(
        "ModelPlacement",
        "hwaccel.io/v1alpha1",
        500,
        1_000,
        r#""spec":{"model":{},"goal":{"serve":{"context":"many"}}}"#,
    );
    let decoded: Lenient<ModelPlacement> = serde_json::from_str(&odd).expect("decodes");
    assert!(decoded.error().is_some());
    assert_eq!(decoded.meta().uid.as_deref(), Some("u1"));
    assert_eq!(decoded.meta().labels.as_ref().map(BTreeMap::len), Some(1));
    assert!(decoded.meta().annotations.is_none());

    let inventory = grown(
        "AcceleratorInventory",
        "hwaccel.io/v1alpha1",
        500,
        1_000,
        r#""spec":{"nodeName":"big","devices":[]}"#,
    );
    let decoded: Lenient<AcceleratorInventory> = serde_json::from_str(&inventory).expect("decodes");
    let meta = decoded.meta();
    assert_eq!(meta.labels.as_ref().map(BTreeMap::len), Some(1));
    assert!(meta.annotations.is_none() && meta.managed_fields.is_none());
}
