//! What a watch cache keeps of an object's metadata: the labels and annotations its readers
//! read, and no field ownership, cut from the object's JSON text before it is decoded.
//!
//! Labels, annotations and `managedFields` are the parts of an object a writer can grow at
//! will (up to the apiserver's object size limit). Decoded, a label costs several times its
//! JSON: issue 35 measured 40 placements with 55,000 labels each taking a fresh controller to
//! 331 MB, and 40 ResourceClaims in any namespace (the ordinary DRA right to create claims is
//! all it takes) to 546 MB, over the chart's 256 MiB limit on every start. Dropping what no
//! reader looks at *after* decoding bounds what stays cached, but not the peak of decoding a
//! page; cutting it from the text first bounds both, since the unkept keys are only skipped
//! over, never built into maps.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// The metadata a kind's readers read.
pub trait Projection {
    /// Whether readers read the label `key`. By default only the operator's own
    /// (`hwaccel.io/...`).
    fn keeps_label(key: &str) -> bool {
        key.starts_with(OWN_PREFIX)
    }

    /// Whether readers read annotations at all. By default they do not.
    const KEEPS_ANNOTATIONS: bool = false;

    /// Cuts the decoded body to what readers read (by default, nothing is cut).
    fn settle(&mut self) {}
}

/// The prefix of the label keys the operator writes and reads on its own and DRA objects.
const OWN_PREFIX: &str = crate::names::keys::LABEL_PREFIX;

// A ModelPlacement's projection (it keeps only the planner's subset of an inline config) is in
// `controller::cache`: only a layer above the planner may name what the planner reads.

impl Projection for crate::api::AcceleratorInventory {}

/// Claims: only `hwaccel.io/placement` is read (which placement a claim belongs to); the
/// spec and status are read whole.
impl Projection for k8s_openapi::api::resource::v1::ResourceClaim {}

/// The object's JSON text without the metadata its readers do not read (`None` when there is
/// nothing to cut, or the text is not an object with a metadata object: the caller decodes
/// the text as it is, and fails on it as it would have). Works on raw text one level at a
/// time and borrows from `text`; the unkept labels are skipped, not collected.
pub fn project<K: Projection>(text: &str) -> Option<String> {
    let mut object: BTreeMap<Cow<'_, str>, &RawValue> = serde_json::from_str(text).ok()?;
    let metadata = object.get("metadata")?;
    let mut fields: BTreeMap<Cow<'_, str>, &RawValue> =
        serde_json::from_str(metadata.get()).ok()?;
    let mut cut = fields.remove("managedFields").is_some();
    if !K::KEEPS_ANNOTATIONS {
        cut |= fields.remove("annotations").is_some();
    }
    let labels = fields
        .get("labels")
        .map(|labels| serde_json::from_str::<KeptLabels<K>>(labels.get()));
    let kept_labels = match labels {
        Some(Ok(KeptLabels { kept, dropped, .. })) if dropped > 0 => {
            cut = true;
            Some(kept)
        }
        _ => None,
    };
    if !cut {
        return None;
    }
    let kept_labels = kept_labels
        .map(|kept| serde_json::value::to_raw_value(&kept))
        .transpose()
        .ok()?;
    if let Some(kept) = &kept_labels {
        fields.insert(Cow::Borrowed("labels"), kept);
    }
    let metadata = serde_json::value::to_raw_value(&fields).ok()?;
    object.insert(Cow::Borrowed("metadata"), &metadata);
    serde_json::to_string(&object).ok()
}

/// A labels object, keeping the entries `K` reads and counting the others.
struct KeptLabels<'a, K> {
    kept: BTreeMap<Cow<'a, str>, Cow<'a, str>>,
    dropped: usize,
    kind: std::marker::PhantomData<K>,
}

impl<'de: 'a, 'a, K: Projection> Deserialize<'de> for KeptLabels<'a, K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(KeptLabelsVisitor(std::marker::PhantomData))
    }
}

struct KeptLabelsVisitor<'a, K>(std::marker::PhantomData<(&'a (), K)>);

impl<'de: 'a, 'a, K: Projection> Visitor<'de> for KeptLabelsVisitor<'a, K> {
    type Value = KeptLabels<'a, K>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a map of label keys to values")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = BTreeMap::new();
        let mut dropped = 0;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if K::keeps_label(&key) {
                kept.insert(key, map.next_value::<Cow<'de, str>>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
                dropped += 1;
            }
        }
        Ok(KeptLabels {
            kept,
            dropped,
            kind: std::marker::PhantomData,
        })
    }
}

/// Drops an object's field ownership, which no cache reader reads: for the watches of kinds
/// decoded whole (Nodes' metadata, ResourceSlices), where a projection is not needed.
pub fn drop_managed_fields<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// An object decoded from its projection ([`project`]); for caches of kinds whose every
/// object decodes (built-in kinds the apiserver validates), where [`crate::api::Lenient`]'s
/// per-object errors are not needed.
#[derive(Debug, Clone)]
pub struct Projected<K>(pub K);

impl<K> Projected<K> {
    /// The object.
    pub fn into_inner(self) -> K {
        self.0
    }
}

impl<'de, K: DeserializeOwned + Projection> Deserialize<'de> for Projected<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // One object's text at a time (a list page is decoded item by item).
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        let projected = project::<K>(raw.get());
        let text = projected.as_deref().unwrap_or(raw.get());
        let mut object: K = serde_json::from_str(text).map_err(serde::de::Error::custom)?;
        object.settle();
        Ok(Projected(object))
    }
}

impl<K: kube::Resource<DynamicType = ()>> kube::Resource for Projected<K> {
    crate::api::wrapper_resource_statics!();

    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        self.0.meta_mut()
    }
}

#[cfg(test)]
mod tests;
