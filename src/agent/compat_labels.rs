//! The opt-in compatibility labels (`--compat-labels`, chart `agent.compatLabels`): the vendor
//! labels other tools still read, written on the agent's own Node from the same merged view
//! (detection plus this node's DRA slices) as its `hwaccel.io/` labels. See
//! [`crate::labels::compat`] for the values and `docs/decisions/0009-compat-labels-in-the-agent.md`
//! for why the agent writes them.
//!
//! They are written by server-side apply under a field manager of their own,
//! [`FIELD_MANAGER`], so they can be told apart from our own labels, released on their own
//! when the option is turned off, and released by `hwaccel cleanup` on uninstall. A vendor's
//! group of keys is left alone whenever anyone else holds one of them (GFD, the AMD labeller,
//! an administrator): we never fight another labeler, we only stand in where none runs.
//! A failure here is logged and counted, never fails the agent's cycle: these labels are a
//! courtesy to other tools, the node's own labels and inventory come first.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;

use super::node_labels::{LabelOutcome, LabelOwnership, NodeLabeler};
use crate::hardware::Report;
use crate::labels::compat::{compat_labels, without_foreign_groups};

/// The field manager of the compatibility labels.
pub use crate::names::keys::COMPAT_LABELS_FIELD_MANAGER as FIELD_MANAGER;

/// Keeps one Node's compatibility labels in step with its devices.
#[derive(Debug, Clone)]
pub struct CompatLabels {
    enabled: bool,
    labeler: NodeLabeler,
    /// The keys last found held by someone else, so yielding is logged once per change.
    yielded: std::collections::BTreeSet<String>,
}

impl CompatLabels {
    /// Compatibility labels for `node_name`, off until [`Self::set_enabled`].
    pub fn new(nodes: Api<Node>, node_name: &str) -> Self {
        Self {
            enabled: false,
            labeler: NodeLabeler::new(nodes, node_name, FIELD_MANAGER),
            yielded: Default::default(),
        }
    }

    /// Forgets what was written, so the next sync compares with the Node again (a Node
    /// re-created under the same name carries none of the labels).
    pub fn invalidate(&mut self) {
        self.labeler.invalidate();
    }

    /// Turns writing on or off; off releases what an earlier run wrote.
    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
    }

    /// Brings the labels in line with `report` given the Node's metadata `node` (its labels
    /// and managedFields, read this cycle). True when something was written.
    pub async fn sync(&mut self, node: &ObjectMeta, report: &Report) -> Result<bool, kube::Error> {
        let ownership = LabelOwnership::of_meta(node, FIELD_MANAGER);
        if !self.enabled {
            // Off: one release when an earlier run left labels, nothing otherwise.
            if !ownership.owns_any() {
                return Ok(false);
            }
            self.labeler.invalidate();
        }
        let desired = if self.enabled {
            compat_labels(report)
        } else {
            Default::default()
        };
        let (sendable, yielded) =
            without_foreign_groups(&desired, |key| ownership.held_by_others(node, key));
        if yielded != self.yielded {
            if !yielded.is_empty() {
                tracing::info!(
                    held = ?yielded,
                    "compatibility labels held by another manager; leaving their group to it"
                );
            }
            self.yielded = yielded;
        }
        match self.labeler.apply(&sendable).await {
            Ok(LabelOutcome::Unchanged) => Ok(false),
            Ok(LabelOutcome::Applied { .. }) => Ok(true),
            Err(err) => {
                self.labeler.invalidate();
                Err(err)
            }
        }
    }
}
