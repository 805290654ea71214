//! Writes the agent's labels onto its own Node by server-side apply.
//!
//! Server-side apply with a dedicated field manager gives the semantics users need: the
//! labels we send are ours, labels we stop sending are removed by the apiserver, and labels
//! that anyone else set are untouched. Two refinements on top:
//!
//! * **No write when nothing changed.** The last applied set is remembered; after a restart
//!   the Node is read once and compared, so a steady node causes zero writes.
//! * **Never take a label from someone else.** We apply without `force`. A key under our prefix
//!   that another field manager owns (an administrator pinned `hwaccel.io/product` by hand) is
//!   left out of our set instead of being overwritten; on a conflict the Node is re-read and
//!   the apply retried once without the contested keys.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// What an apply did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelOutcome {
    /// The Node already carried exactly these labels under our ownership; no write.
    Unchanged,
    /// The labels were written.
    Applied {
        /// Keys left out because another field manager owns them.
        skipped: Vec<String>,
    },
}

/// Applies label sets to one Node under one field manager.
#[derive(Debug, Clone)]
pub struct NodeLabeler {
    api: Api<Node>,
    node_name: String,
    field_manager: String,
    last_applied: Option<BTreeMap<String, String>>,
}

impl NodeLabeler {
    /// A labeler for `node_name` writing as `field_manager`.
    pub fn new(api: Api<Node>, node_name: &str, field_manager: &str) -> Self {
        Self {
            api,
            node_name: node_name.to_string(),
            field_manager: field_manager.to_string(),
            last_applied: None,
        }
    }

    /// Forgets what was applied, so the next `apply` re-reads the Node (after an error).
    pub fn invalidate(&mut self) {
        self.last_applied = None;
    }

    /// Makes `desired` the complete set of labels this manager owns on the Node.
    pub async fn apply(
        &mut self,
        desired: &BTreeMap<String, String>,
    ) -> Result<LabelOutcome, kube::Error> {
        if self.last_applied.as_ref() == Some(desired) {
            return Ok(LabelOutcome::Unchanged);
        }
        let result = self.apply_uncached(desired).await;
        match &result {
            Ok(_) => self.last_applied = Some(desired.clone()),
            Err(_) => self.last_applied = None,
        }
        result
    }

    async fn apply_uncached(
        &self,
        desired: &BTreeMap<String, String>,
    ) -> Result<LabelOutcome, kube::Error> {
        let node = self.api.get(&self.node_name).await?;
        let mut ownership = LabelOwnership::of(&node, &self.field_manager);
        let mut sendable = ownership.without_foreign(desired);
        if ownership.already_matches(&node, &sendable) {
            return Ok(LabelOutcome::Unchanged);
        }
        match self.send(&sendable).await {
            Ok(()) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Someone took a key between our read and our write: read again, leave the
                // contested keys alone, and try once more.
                let node = self.api.get(&self.node_name).await?;
                ownership = LabelOwnership::of(&node, &self.field_manager);
                sendable = ownership.without_foreign(desired);
                self.send(&sendable).await?;
            }
            Err(err) => return Err(err),
        }
        let skipped = desired
            .keys()
            .filter(|k| !sendable.contains_key(*k))
            .cloned()
            .collect();
        Ok(LabelOutcome::Applied { skipped })
    }

    async fn send(&self, labels: &BTreeMap<String, String>) -> Result<(), kube::Error> {
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": self.node_name, "labels": labels },
        });
        let params = PatchParams::apply(&self.field_manager);
        self.api
            .patch(&self.node_name, &params, &Patch::Apply(&patch))
            .await
            .map(drop)
    }
}

/// Which label keys each field manager owns on a Node, from its managedFields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelOwnership {
    ours: BTreeSet<String>,
    foreign: BTreeSet<String>,
}

impl LabelOwnership {
    /// Reads ownership from the Node's managedFields.
    pub fn of(node: &Node, field_manager: &str) -> Self {
        Self::of_meta(&node.metadata, field_manager)
    }

    /// Reads ownership from an object's metadata (a Node read with `get_metadata`).
    pub fn of_meta(meta: &ObjectMeta, field_manager: &str) -> Self {
        let mut ownership = Self::default();
        for entry in meta.managed_fields.iter().flatten() {
            let Some(fields) = &entry.fields_v1 else {
                continue;
            };
            let keys = fields
                .0
                .get("f:metadata")
                .and_then(|m| m.get("f:labels"))
                .and_then(|labels| labels.as_object())
                .into_iter()
                .flat_map(|labels| labels.keys())
                .filter_map(|key| key.strip_prefix("f:"))
                .map(str::to_string);
            let is_ours = entry.manager.as_deref() == Some(field_manager)
                && entry.operation.as_deref() == Some("Apply");
            if is_ours {
                ownership.ours.extend(keys);
            } else {
                ownership.foreign.extend(keys);
            }
        }
        ownership
    }

    /// True when someone else holds `key` on the object `meta`: another field manager owns it
    /// (even alongside us), or it is there and nobody's managedFields claim it.
    pub fn held_by_others(&self, meta: &ObjectMeta, key: &str) -> bool {
        let present = meta
            .labels
            .as_ref()
            .is_some_and(|labels| labels.contains_key(key));
        self.foreign.contains(key) || (present && !self.ours.contains(key))
    }

    /// True when the manager owns at least one label.
    pub fn owns_any(&self) -> bool {
        !self.ours.is_empty()
    }

    /// The desired labels minus keys another manager owns and we do not.
    pub fn without_foreign(&self, desired: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        desired
            .iter()
            .filter(|(key, _)| self.ours.contains(*key) || !self.foreign.contains(*key))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// True when the Node carries exactly `labels` and we own exactly those keys.
    pub fn already_matches(&self, node: &Node, labels: &BTreeMap<String, String>) -> bool {
        let current = node.metadata.labels.clone().unwrap_or_default();
        let owned_as_desired = self.ours.iter().eq(labels.keys());
        owned_as_desired && labels.iter().all(|(k, v)| current.get(k) == Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    fn entry(manager: &str, operation: &str, keys: &[&str]) -> ManagedFieldsEntry {
        let labels: serde_json::Map<String, serde_json::Value> =
            keys.iter().map(|k| (format!("f:{k}"), json!({}))).collect();
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_v1: Some(FieldsV1(json!({ "f:metadata": { "f:labels": labels } }))),
            ..ManagedFieldsEntry::default()
        }
    }

    fn node(labels: &[(&str, &str)], managed: Vec<ManagedFieldsEntry>) -> Node {
        let mut node = Node::default();
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        node.metadata.managed_fields = Some(managed);
        node
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn keys_owned_by_another_manager_are_left_out() {
        let node = node(
            &[
                ("hwaccel.io/product", "pinned"),
                ("hwaccel.io/present", "true"),
            ],
            vec![
                entry("kubectl-label", "Update", &["hwaccel.io/product"]),
                entry("hwaccel-agent", "Apply", &["hwaccel.io/present"]),
            ],
        );
        let ownership = LabelOwnership::of(&node, "hwaccel-agent");
        let desired = map(&[
            ("hwaccel.io/product", "h100"),
            ("hwaccel.io/present", "true"),
        ]);
        assert_eq!(
            ownership.without_foreign(&desired),
            map(&[("hwaccel.io/present", "true")])
        );
    }

    #[test]
    fn a_node_already_carrying_our_labels_needs_no_write() {
        let node = node(
            &[
                ("hwaccel.io/present", "true"),
                ("kubernetes.io/os", "linux"),
            ],
            vec![entry("hwaccel-agent", "Apply", &["hwaccel.io/present"])],
        );
        let ownership = LabelOwnership::of(&node, "hwaccel-agent");
        assert!(ownership.already_matches(&node, &map(&[("hwaccel.io/present", "true")])));
        assert!(!ownership.already_matches(&node, &map(&[("hwaccel.io/present", "false")])));
        // Dropping a key we own is a change: the apply removes it.
        assert!(!ownership.already_matches(&node, &BTreeMap::new()));
    }
}
