//! Objects decoded one at a time, so one the controller cannot read does not stop it.
//!
//! kube decodes a list (and a watch event) as a whole: a single stored object that does not
//! fit our Rust types (a field of the wrong shape that the schema let through, a value nested
//! deeper than serde_json's recursion limit, an object written under an older schema) fails
//! the whole list, and a controller whose start-up list fails crash-loops. [`Lenient`] takes
//! each object's JSON as raw text first (skipping over raw JSON has no depth limit), then
//! decodes it on its own; an object that does not decode keeps its metadata and the error,
//! so the controller can skip it, count it and say so in an Event.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::api::projection::{Projection, project};

/// An object of kind `K`, or the metadata of one that could not be decoded as `K`.
// The watch caches keep each object behind an `Arc` already; boxing the large variant would
// add a second allocation per object for the rare undecodable one's sake.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Lenient<K> {
    /// Decoded.
    Decoded(K),
    /// Not decodable as `K`.
    Undecodable {
        /// The object's metadata (empty when even that did not decode).
        metadata: ObjectMeta,
        /// Why it did not decode.
        error: String,
    },
}

impl<K> Lenient<K> {
    /// The decoded object, if it decoded.
    pub fn decoded(&self) -> Option<&K> {
        match self {
            Self::Decoded(object) => Some(object),
            Self::Undecodable { .. } => None,
        }
    }

    /// Why the object did not decode, if it did not.
    pub fn error(&self) -> Option<&str> {
        match self {
            Self::Decoded(_) => None,
            Self::Undecodable { error, .. } => Some(error),
        }
    }
}

/// Only the metadata of an object; every other field is skipped unread.
#[derive(Deserialize)]
struct MetadataOnly {
    #[serde(default)]
    metadata: ObjectMeta,
}

impl<'de, K: DeserializeOwned + Projection + Resource> Deserialize<'de> for Lenient<K> {
    /// Decodes the object's projection ([`crate::api::projection`]): only the metadata its
    /// readers read is ever built (issue 27 item 1 and issue 35 High 3: the controller's
    /// caches held every byte tenants stored in their objects' labels and annotations).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        let projected = project::<K>(raw.get());
        let mut decoded = decode::<K>(projected.as_deref().unwrap_or(raw.get()));
        // Where the text could not be projected (not an object with metadata), the decoded
        // object still keeps nothing unread.
        let metadata = match &mut decoded {
            Lenient::Decoded(object) => {
                object.settle();
                object.meta_mut()
            }
            Lenient::Undecodable { metadata, .. } => metadata,
        };
        metadata.managed_fields = None;
        if !K::KEEPS_ANNOTATIONS {
            metadata.annotations = None;
        }
        Ok(decoded)
    }
}

/// Decodes one object's JSON text. When that fails, it tries again without
/// `metadata.managedFields`: the apiserver records field ownership as a tree shaped like the
/// object, so an object nested too deeply for the decoder has managedFields that are too deep
/// as well, and the controller never reads them.
pub fn decode<K: DeserializeOwned>(text: &str) -> Lenient<K> {
    let err = match serde_json::from_str::<K>(text) {
        Ok(object) => return Lenient::Decoded(object),
        Err(err) => err,
    };
    let stripped = without_managed_fields(text);
    let text = stripped.as_deref().unwrap_or(text);
    if stripped.is_some()
        && let Ok(object) = serde_json::from_str::<K>(text)
    {
        return Lenient::Decoded(object);
    }
    Lenient::Undecodable {
        metadata: serde_json::from_str::<MetadataOnly>(text)
            .map(|m| m.metadata)
            .unwrap_or_default(),
        error: err.to_string(),
    }
}

/// The object's JSON without `metadata.managedFields`, if it had them. Works on raw text, one
/// level at a time, so it never decodes the deep parts.
fn without_managed_fields(text: &str) -> Option<String> {
    type Fields = BTreeMap<String, Box<RawValue>>;
    let mut object: Fields = serde_json::from_str(text).ok()?;
    let mut metadata: Fields = serde_json::from_str(object.get("metadata")?.get()).ok()?;
    metadata.remove("managedFields")?;
    object.insert(
        "metadata".to_string(),
        serde_json::value::to_raw_value(&metadata).ok()?,
    );
    serde_json::to_string(&object).ok()
}

impl<K: Resource<DynamicType = ()>> Resource for Lenient<K> {
    crate::api::wrapper_resource_statics!();

    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Decoded(object) => object.meta(),
            Self::Undecodable { metadata, .. } => metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Decoded(object) => object.meta_mut(),
            Self::Undecodable { metadata, .. } => metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::ObjectList;

    use super::*;
    use crate::api::ModelPlacement;

    /// A placement whose `huggingFaceConfig` is the JSON text `config`.
    fn placement(name: &str, config: &str) -> String {
        let config = serde_json::to_string(config).expect("a string encodes");
        format!(
            r#"{{"apiVersion":"hwaccel.io/v1alpha1","kind":"ModelPlacement",
                "metadata":{{"name":"{name}","namespace":"ns"}},
                "spec":{{"model":{{"huggingFaceConfig":{config}}},"goal":{{"serve":{{}}}}}}}}"#
        )
    }

    fn nested(depth: usize) -> String {
        format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth))
    }

    #[test]
    fn a_config_nested_deeper_than_serde_json_decodes_still_lists() {
        let deep = placement("deep", &nested(300));
        // The apiserver's list of placements, with the deep one between two ordinary ones.
        let list = format!(
            r#"{{"apiVersion":"hwaccel.io/v1alpha1","kind":"ModelPlacementList","metadata":{{}},
                "items":[{},{},{}]}}"#,
            placement("a", "{}"),
            deep,
            placement("b", "{}")
        );
        let items = serde_json::from_str::<ObjectList<Lenient<ModelPlacement>>>(&list)
            .expect("the list decodes")
            .items;
        let names: Vec<_> = items.iter().map(|p| p.meta().name.clone()).collect();
        assert_eq!(
            names,
            [Some("a".into()), Some("deep".into()), Some("b".into())]
        );
        // The deep one decodes as a placement (the config is kept as text); reading the
        // config is what fails, and that is the planner's business.
        let deep = items[1].decoded().expect("decoded");
        let config = deep
            .spec
            .model
            .hugging_face_config
            .as_ref()
            .expect("config");
        assert!(config.value().is_err());
    }

    #[test]
    fn managed_fields_as_deep_as_the_object_do_not_stop_it_decoding() {
        // What the apiserver returns for a deep config: managedFields mirror its shape.
        let fields = nested(300).replace(r#""a""#, r#""f:a""#);
        let text = placement("deep", &nested(300)).replacen(
            r#""namespace":"ns"}"#,
            &format!(
                r#""namespace":"ns","managedFields":[{{"manager":"kubectl","operation":"Update","fieldsType":"FieldsV1","fieldsV1":{fields}}}]}}"#
            ),
            1,
        );
        assert!(text.contains("managedFields"));
        let lenient: Lenient<ModelPlacement> = decode(&text);
        let placement = lenient
            .decoded()
            .expect("decoded without its managedFields");
        assert_eq!(placement.meta().name.as_deref(), Some("deep"));
        assert!(placement.meta().managed_fields.is_none());
    }

    #[test]
    fn an_object_that_does_not_fit_the_type_keeps_its_metadata_and_the_error() {
        let text = r#"{"apiVersion":"hwaccel.io/v1alpha1","kind":"ModelPlacement",
            "metadata":{"name":"odd","namespace":"ns","uid":"u1"},
            "spec":{"model":{},"goal":{"serve":{"context":"many"}}}}"#;
        let lenient: Lenient<ModelPlacement> = decode(text);
        assert!(lenient.decoded().is_none());
        assert_eq!(lenient.meta().name.as_deref(), Some("odd"));
        assert_eq!(lenient.meta().uid.as_deref(), Some("u1"));
        assert!(
            lenient
                .error()
                .is_some_and(|e| e.contains("context") || e.contains("invalid type"))
        );
    }
}
