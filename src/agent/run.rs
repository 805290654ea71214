//! The agent's main loop: detect, debounce, publish, wait.
//!
//! Each cycle runs detection on a blocking thread, folds the report into the
//! [`PresenceTracker`] (so a missing or failing device does not flap), then publishes three
//! things by server-side apply as field manager `hwaccel-agent`, each only when it changed:
//! the Node's labels, the AcceleratorInventory's spec, and its status conditions. Errors never
//! stop the loop: the cycle is retried with exponential backoff while the apiserver is away,
//! and nothing is ever deleted, neither on error nor on shutdown.
//!
//! Before the first publish the agent reads its existing inventory and seeds the tracker with
//! it, so a restarted agent whose first detection fails keeps the node's labels for the
//! grace (the devices of backends it runs, and only until detection confirms or misses them).
//!
//! A steady cycle makes one request, a metadata GET of its inventory answered from the
//! apiserver's watch cache: the first publish starts watches of the agent's own Node and slices
//! ([`super::own_objects`], ADR 0010), and while they are current a cycle reads their caches;
//! while one is not (starting, failing, not heard from lately) the cycle makes the read it
//! replaces (a GET, a LIST). An inventory whose version differs from the agent's last write is
//! read whole: deleted, it is written again on the next cycle; changed by anyone else (the
//! controller writes `status.freeDevices` after every change in use), the agent's own fields
//! (the spec, its status fields) are compared with what is stored and only a difference there
//! is written back (and logged), so the controller never plans on an edited inventory for
//! longer than one interval, and the controller's own writes cost the agent one more GET and
//! no write. Conditions
//! are merged into the stored ones, so a condition's `lastTransitionTime` moves only when its
//! status does.
//!
//! The Node's metadata (watched, or one small GET) gives its uid for the inventory's
//! ownerReference (a new uid means the Node was re-created: its labels are written again),
//! and the `hwaccel.io/expected-devices` annotation and the instance type label say how many
//! accelerators the node should have (see [`crate::fleet::expected`]), which the status
//! (`expectedDevices`, `DevicesMissing`), the `hwaccel.io/devices-missing` label and the device
//! metrics compare detection with.
//!
//! The status is written by server-side apply of the agent's fields only (`Ready`, `Degraded`,
//! `DevicesMissing`, `HostMountsWritable` (see [`super::host_mounts`]), `observedGeneration`, `expectedDevices`, `expectedSource`): the
//! controller's `freeDevices` and any condition it adds are never sent, so never taken over.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{GetParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;

use super::compat_labels::CompatLabels;
use super::devices_missing::DevicesMissing;
use super::dra_labels::{SliceReader, fill_from_published};
use super::host_mounts::{self, HOST_MOUNTS_WRITABLE};
use super::hotplug::DeviceFingerprint;
use super::metrics::{AgentMetrics, DeviceRow, NodeCounts};
use super::node_labels::{LabelOutcome, NodeLabeler};
use super::own_objects::OwnObjects;
use super::own_slice::OwnSlicePublisher;
use super::presence::PresenceTracker;
use super::watched::Timing;
use crate::api::conditions::{self, DEGRADED, DEVICES_MISSING, READY};
use crate::api::{AcceleratorInventory, AcceleratorInventorySpec, AcceleratorInventoryStatus};
use crate::backoff::{Backoff, Retries};
use crate::detect::{BackendSelection, CommandRunner, Detector, HostRoot, ProcessView};
use crate::dra::own_slices::OwnFamily;
use crate::fleet::expected::{
    EXPECTED_DEVICES_ANNOTATION, ExpectedInputs, INSTANCE_TYPE_LABEL, next_seen_most,
};
use crate::hardware::HealthStatus;
use crate::hardware::Report;
use crate::labels;
use crate::server::Readiness;
use std::collections::{BTreeMap, BTreeSet};

/// The agent's field manager.
pub use crate::names::keys::AGENT_FIELD_MANAGER as FIELD_MANAGER;

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The Node this agent runs on (from the downward API).
    pub node_name: String,
    /// Root of the host's filesystem (`/host` in the pod).
    pub host_root: std::path::PathBuf,
    /// Backends to run.
    pub backends: BackendSelection,
    /// Directories searched for vendor tools before `$PATH`.
    pub tool_paths: Vec<std::path::PathBuf>,
    /// Deadline for each vendor tool.
    pub tool_timeout: Duration,
    /// Time between detections on a quiet node.
    pub interval: Duration,
    /// Time between checks of the device directories for hot-plug.
    pub hotplug_poll: Duration,
    /// Clean misses before a device is removed.
    pub misses_to_remove: u32,
    /// Longest wait between retries while the API is failing.
    pub max_backoff: Duration,
}

/// Longest wait for this node's ResourceSlices each cycle; past it the labels go out from
/// detection alone.
const SLICE_LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// What one publish did, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishOutcome {
    /// Node labels were written.
    pub labels_written: bool,
    /// The inventory spec was written.
    pub inventory_written: bool,
    /// The inventory status was written.
    pub status_written: bool,
}

/// One node agent.
pub struct Agent {
    config: AgentConfig,
    detector: Arc<Detector>,
    nodes: Api<Node>,
    inventories: Api<AcceleratorInventory>,
    labeler: NodeLabeler,
    /// This node's DRA ResourceSlices, a second source for the labels.
    slices: SliceReader,
    /// For starting the watches of the agent's own objects on the first publish.
    client: Client,
    /// The watches of the agent's own Node, inventory and slices (started on the first
    /// publish, inside the runtime); a cycle reads them instead of the API while current.
    own: Option<OwnObjects>,
    /// The opt-in `hwaccel.io` slice for driverless devices (off unless families are set).
    own_slices: OwnSlicePublisher,
    /// The opt-in vendor compatibility labels (off unless enabled).
    compat: CompatLabels,
    tracker: PresenceTracker,
    metrics: AgentMetrics,
    seeded: bool,
    applied_spec: Option<AcceleratorInventorySpec>,
    applied_status: Option<AcceleratorInventoryStatus>,
    /// The inventory's resourceVersion after the agent's last write (or as last read).
    applied_version: Option<String>,
    /// False after an error: what is stored is read again before the next comparison, so
    /// the conditions keep their stored transition times.
    synced: bool,
    generation: Option<i64>,
    heartbeat: crate::health::Heartbeat,
    /// The most accelerators this agent's detections confirmed while the `seen` source
    /// applied, so `seen` only grows. Never seeded from the stored status (issue 35: a forged
    /// `expectedDevices`, or forged devices kept for the grace, left `DevicesMissing` for ever).
    seen_most: u32,
    /// The malformed annotation value last warned about, so a bad value is logged once.
    warned_annotation: Option<String>,
    /// Host paths mounted writable under the host root, found at start.
    writable_host_mounts: Vec<String>,
    /// The uid of the Node as last read: a different one means the Node was re-created under
    /// the same name, without the labels the agent remembers writing.
    node_uid: Option<String>,
    /// The device-plugin resources of the Node's allocatable, as last read.
    plugin_resources: Option<BTreeMap<String, u32>>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// An agent for one node.
    pub fn new(config: AgentConfig, client: Client, metrics: AgentMetrics) -> Self {
        let config_root = config.host_root.clone();
        let runner =
            CommandRunner::with_extra_paths(&config.tool_paths).with_timeout(config.tool_timeout);
        // The agent reads the host under `--host-root`, but the container and Kubernetes facts
        // are its own process's (issue 28): the pod's `/proc/self`, service-account mount and
        // environment, which the host root does not hold.
        let detector = Detector::new(HostRoot::new(&config.host_root), runner, &config.backends)
            .with_process(ProcessView::own());
        let nodes: Api<Node> = Api::all(client.clone());
        let labeler = NodeLabeler::new(nodes.clone(), &config.node_name, FIELD_MANAGER);
        let slices = SliceReader::new(client.clone(), &config.node_name, SLICE_LIST_TIMEOUT);
        let own_slices = OwnSlicePublisher::new(
            client.clone(),
            &config.node_name,
            BTreeSet::new(),
            FIELD_MANAGER,
        );
        let tracker = PresenceTracker::new(config.misses_to_remove, detector.backend_names());
        let compat = CompatLabels::new(nodes.clone(), &config.node_name);
        Self {
            slices,
            own_slices,
            compat,
            tracker,
            detector: Arc::new(detector),
            inventories: Api::all(client.clone()),
            client,
            own: None,
            nodes,
            labeler,
            metrics,
            seeded: false,
            applied_spec: None,
            applied_status: None,
            applied_version: None,
            synced: false,
            generation: None,
            heartbeat: crate::health::Heartbeat::default(),
            seen_most: 0,
            warned_annotation: None,
            writable_host_mounts: Vec::new(),
            node_uid: None,
            plugin_resources: None,
            config,
        }
        .with_writable_host_mounts(host_mounts::check(&config_root))
    }

    /// Reports `paths` as the host paths mounted writable under the host root (found at start
    /// from `/proc/self/mountinfo`; tests inject them): a warning now, the
    /// `writable_host_mounts` gauge and the `HostMountsWritable` condition.
    pub fn with_writable_host_mounts(mut self, paths: Vec<String>) -> Self {
        if !paths.is_empty() {
            tracing::warn!(
                count = paths.len(),
                paths = %paths.iter().take(10).cloned().collect::<Vec<_>>().join(", "),
                "host mounts are writable below their top (no recursive read-only mounts on \
                 this node's runtime); see docs/security.md"
            );
        }
        self.metrics
            .writable_host_mounts
            .set(i64::try_from(paths.len()).unwrap_or(i64::MAX));
        self.writable_host_mounts = paths;
        self
    }

    /// Publishes an own `hwaccel.io` ResourceSlice for devices of `families` that no driver
    /// or device plugin exposes (see [`crate::dra::own_slices`]); empty keeps it off.
    pub fn with_own_slices(mut self, families: BTreeSet<OwnFamily>) -> Self {
        self.own_slices.set_families(families);
        self
    }

    /// Writes the vendor compatibility labels (`nvidia.com/gpu.product`...) on this Node
    /// where no other labeler holds them (see [`super::compat_labels`]); off releases them.
    pub fn with_compat_labels(mut self, enabled: bool) -> Self {
        self.compat.set_enabled(enabled);
        self
    }

    /// Reads the process's own facts (container, Kubernetes) from `process` instead of the
    /// running process: for tests, which must not depend on where they run.
    pub fn with_process(mut self, process: ProcessView) -> Self {
        let runner = CommandRunner::with_extra_paths(&self.config.tool_paths)
            .with_timeout(self.config.tool_timeout);
        let host = HostRoot::new(&self.config.host_root);
        let detector = Detector::new(host, runner, &self.config.backends).with_process(process);
        self.detector = Arc::new(detector);
        self
    }

    /// Beats `heartbeat` after every cycle, for `/healthz` (see [`crate::health`]).
    pub fn with_heartbeat(mut self, heartbeat: crate::health::Heartbeat) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// Runs detection once on a blocking thread and records its timings.
    pub async fn detect(&self) -> Report {
        let detector = Arc::clone(&self.detector);
        let (report, timings) = match tokio::task::spawn_blocking(move || detector.run(false)).await
        {
            Ok(result) => result,
            Err(err) => {
                self.metrics.failed("detect");
                let mut report = Report::empty();
                report.warnings.push(crate::hardware::Warning {
                    backend: "agent".into(),
                    message: format!("detection thread failed: {err}"),
                });
                (report, Vec::new())
            }
        };
        self.metrics.detections.inc();
        for timing in timings {
            let label = super::metrics::BackendLabel {
                backend: timing.backend,
            };
            self.metrics
                .backend_seconds
                .get_or_create(&label)
                .observe(timing.micros as f64 / 1e6);
        }
        self.metrics
            .warnings
            .set(i64::try_from(report.warnings.len()).unwrap_or(i64::MAX));
        report
    }

    /// One full cycle: detect, debounce, publish.
    pub async fn cycle(&mut self) -> Result<PublishOutcome, kube::Error> {
        let report = self.detect().await;
        self.publish(&report).await
    }

    /// Folds a detection into the tracker and publishes the result where it changed.
    pub async fn publish(&mut self, detected: &Report) -> Result<PublishOutcome, kube::Error> {
        self.seed_once().await?;
        let own = self.own.get_or_insert_with(|| {
            OwnObjects::start(&self.client, &self.config.node_name, Timing::default())
        });
        let cached_node = own.node_object();
        let cached_slices = own.slices();
        // The whole Node: its metadata, and what its device plugins advertise.
        let node = match cached_node {
            Some(node) => node,
            None => self.nodes.get(&self.config.node_name).await?,
        };
        self.plugin_resources = Some(crate::dra::device_plugins::advertised(
            node.status
                .as_ref()
                .and_then(|status| status.allocatable.as_ref())
                .unwrap_or(&BTreeMap::new()),
        ));
        let node = node.metadata;
        if node.uid != self.node_uid {
            if self.node_uid.is_some() {
                tracing::warn!("the Node was re-created under the same name; labelling it again");
                self.labeler.invalidate();
                self.compat.invalidate();
            }
            self.node_uid.clone_from(&node.uid);
        }
        let published = self.tracker.observe(detected);
        let stale: Vec<String> = self.tracker.stale_devices().map(str::to_string).collect();
        self.metrics
            .devices
            .set(i64::try_from(published.accelerators().count()).unwrap_or(0));
        self.metrics
            .stale_devices
            .set(i64::try_from(stale.len()).unwrap_or(0));

        let uid = node.uid.clone().unwrap_or_default();
        let inventory = AcceleratorInventory::from_report(&self.config.node_name, &published)
            .owned_by_node(&uid);
        let missing = self.devices_missing(&node, &published, &stale, &inventory);
        self.record_device_metrics(&inventory, &missing);

        let mut outcome = PublishOutcome::default();
        // Labels also count what DRA drivers publish and detection missed (DRA-only nodes);
        // the inventory stays detection only.
        let from_slices = self.slices.published(cached_slices).await;
        let merged = if from_slices.is_empty() {
            published.clone()
        } else {
            fill_from_published(&published, &from_slices)
        };
        let mut node_labels = labels::labels_for(&merged);
        node_labels.set_devices_missing(missing.missing());
        for (key, reason) in &node_labels.dropped {
            tracing::warn!(key, reason, "label dropped");
        }
        match self.labeler.apply(&node_labels.labels).await? {
            LabelOutcome::Unchanged => {}
            LabelOutcome::Applied { skipped } => {
                self.metrics.wrote("node_labels");
                outcome.labels_written = true;
                if !skipped.is_empty() {
                    tracing::warn!(?skipped, "labels owned by another field manager left alone");
                }
            }
        }
        match self.compat.sync(&node, &merged).await {
            Ok(true) => self.metrics.wrote("compat_labels"),
            Ok(false) => {}
            Err(err) => {
                self.metrics.failed("compat_labels");
                tracing::warn!(error = %err, "writing the compatibility labels failed");
            }
        }

        self.sync_with_stored().await?;
        if self.applied_spec.as_ref() != Some(&inventory.spec) {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            let applied = self
                .inventories
                .patch(&self.config.node_name, &params, &Patch::Apply(&inventory))
                .await?;
            self.generation = applied.metadata.generation;
            self.applied_version = applied.metadata.resource_version;
            self.synced = true;
            self.applied_spec = Some(inventory.spec.clone());
            self.metrics.wrote("inventory");
            outcome.inventory_written = true;
        }
        // After the inventory, so the slice never names a device the inventory lacks.
        self.own_slices.sync(&inventory.spec.devices).await;

        let status = self.next_status(detected, &published, &stale, &missing);
        if self.applied_status.as_ref() != Some(&status) {
            let patch = json!({
                "apiVersion": crate::names::keys::API_VERSION,
                "kind": "AcceleratorInventory",
                "status": status,
            });
            let params = PatchParams::apply(FIELD_MANAGER).force();
            let applied = self
                .inventories
                .patch_status(&self.config.node_name, &params, &Patch::Apply(&patch))
                .await?;
            self.applied_version = applied.metadata.resource_version;
            self.synced = true;
            // What is stored, not what was sent: transition times are kept to the second, and
            // a comparison with the nanosecond copy would see every later read as an edit.
            self.applied_status = Some(applied.status.map(agent_fields).unwrap_or(status));
            self.metrics.wrote("inventory_status");
            outcome.status_written = true;
        }
        Ok(outcome)
    }

    /// Forgets cached API state after an error, so the next cycle re-reads instead of trusting
    /// what may not have been written.
    pub fn invalidate(&mut self) {
        self.labeler.invalidate();
        self.synced = false;
    }

    /// The watches of the agent's own objects, once the first publish started them.
    pub fn own_objects(&self) -> Option<&OwnObjects> {
        self.own.as_ref()
    }

    /// Brings the cached copy of the agent's fields up to date with what is stored, so the
    /// comparisons that follow write only what differs. Once synced, one metadata GET a cycle
    /// asks for the inventory no older than the agent's last write (`resourceVersion` set to
    /// it: the apiserver answers from its watch cache, no etcd read); the same version means
    /// nothing changed. Otherwise a full GET: someone else wrote (the controller's
    /// `freeDevices`, a user's edit), or the cheap read failed (the cache more than its few
    /// seconds behind, an error). A deleted inventory may have gone with a Node that was
    /// re-created under the same name; the Node's uid is read (from the Node watch, or a GET)
    /// every cycle anyway.
    ///
    /// Why a read and not a watch (ADR 0010): a watch held by every agent costs the apiserver
    /// tens of KiB of memory per node for as long as the agent runs; the read costs a lookup
    /// in the watch cache once an interval, within the one read per cycle issue 26 allows.
    async fn sync_with_stored(&mut self) -> Result<(), kube::Error> {
        let name = self.config.node_name.clone();
        if self.synced {
            let Some(written) = self.applied_version.clone() else {
                // Nothing stored yet as far as the agent knows: this cycle creates it.
                return Ok(());
            };
            match self
                .inventories
                .get_metadata_opt_with(&name, &GetParams::at(&written))
                .await
            {
                Ok(Some(meta)) if meta.metadata.resource_version.as_deref() == Some(&*written) => {
                    return Ok(());
                }
                Ok(None) => {
                    // Absent at a version no older than the agent's write: deleted since.
                    tracing::warn!("the inventory was deleted; writing it again");
                    self.forget_stored();
                    return Ok(());
                }
                Ok(Some(_)) => {}
                Err(err) => {
                    tracing::debug!(error = %err, "the inventory's cached read failed; reading it whole");
                }
            }
        }
        let Some(stored) = self.inventories.get_opt(&name).await? else {
            if self.applied_version.is_some() {
                tracing::warn!("the inventory was deleted; writing it again");
            }
            self.forget_stored();
            self.synced = true;
            return Ok(());
        };
        let status = stored.status.map(agent_fields);
        let ours_changed = self.synced
            && (self.applied_spec.as_ref() != Some(&stored.spec) || self.applied_status != status);
        if ours_changed {
            tracing::warn!(
                "the inventory's agent fields were changed by someone else; writing them again"
            );
        } else {
            tracing::debug!("the inventory was written by someone else; agent fields unchanged");
        }
        self.generation = stored.metadata.generation;
        self.applied_version = stored.metadata.resource_version;
        self.applied_spec = Some(stored.spec);
        self.applied_status = status;
        self.synced = true;
        Ok(())
    }

    /// Forgets everything about the stored inventory: the next comparisons write it whole.
    fn forget_stored(&mut self) {
        self.applied_spec = None;
        self.applied_status = None;
        self.applied_version = None;
    }

    /// Compares what the node should have (its annotation, instance type, or the most seen)
    /// with what the last detection saw.
    fn devices_missing(
        &mut self,
        node: &kube::api::ObjectMeta,
        published: &Report,
        stale: &[String],
        inventory: &AcceleratorInventory,
    ) -> DevicesMissing {
        let annotation = node
            .annotations
            .as_ref()
            .and_then(|a| a.get(EXPECTED_DEVICES_ANNOTATION))
            .map(String::as_str);
        let instance_type = node
            .labels
            .as_ref()
            .and_then(|l| l.get(INSTANCE_TYPE_LABEL))
            .map(String::as_str);
        let inputs = ExpectedInputs {
            annotation,
            instance_type,
            seen_most: self.seen_most,
            published: u32::try_from(published.accelerators().count()).unwrap_or(u32::MAX),
        };
        let (expected, ignored) = crate::fleet::expected::expected(&inputs);
        match ignored {
            Some(reason) => {
                if self.warned_annotation.as_deref() != annotation {
                    tracing::warn!(%reason, "expected-devices annotation ignored");
                    self.warned_annotation = annotation.map(str::to_string);
                }
            }
            None => self.warned_annotation = None,
        }
        let unconfirmed: BTreeSet<&str> = self.tracker.unconfirmed_devices().collect();
        let confirmed = published
            .accelerators()
            .filter(|d| !unconfirmed.contains(d.id.as_str()))
            .count();
        self.seen_most = next_seen_most(
            expected,
            self.seen_most,
            u32::try_from(confirmed).unwrap_or(u32::MAX),
        );
        DevicesMissing::new(
            expected,
            instance_type,
            published,
            stale,
            &inventory.spec.devices,
        )
    }

    fn record_device_metrics(&self, inventory: &AcceleratorInventory, missing: &DevicesMissing) {
        let node = &self.config.node_name;
        let rows: Vec<DeviceRow> = inventory
            .spec
            .devices
            .iter()
            .filter_map(|d| DeviceRow::of(node, d))
            .collect();
        let counts = NodeCounts {
            expected: missing.expected,
            present: missing.present,
            missing: missing.missing(),
        };
        self.metrics.device_series.set(node, &rows, counts);
    }

    /// Reads the existing inventory once and seeds the tracker and caches with it.
    async fn seed_once(&mut self) -> Result<(), kube::Error> {
        if self.seeded {
            return Ok(());
        }
        if let Some(existing) = self.inventories.get_opt(&self.config.node_name).await? {
            let previous = existing.to_report();
            // Only devices a backend of ours can confirm, and only for the grace (see
            // `PresenceTracker::seed`): the stored inventory is not evidence.
            let dropped = self.tracker.seed(previous.devices, previous.interconnects);
            if !dropped.is_empty() {
                tracing::warn!(
                    dropped = dropped.len(),
                    first = ?dropped.iter().take(8).collect::<Vec<_>>(),
                    "stored devices of backends this agent does not run are not kept"
                );
            }
            self.generation = existing.metadata.generation;
            self.applied_version = existing.metadata.resource_version;
            self.applied_spec = Some(existing.spec);
            // Not `status.expectedDevices`: the stored count is no more evidence than the
            // stored devices (see `seen_most`).
            self.applied_status = existing.status.map(agent_fields);
            tracing::info!("seeded from the existing inventory");
        }
        self.seeded = true;
        self.synced = true;
        Ok(())
    }

    fn next_status(
        &self,
        detected: &Report,
        published: &Report,
        stale: &[String],
        missing: &DevicesMissing,
    ) -> AcceleratorInventoryStatus {
        let mut status = agent_fields(self.applied_status.clone().unwrap_or_default());
        let now = Time(jiff_now());
        let generation = self.generation;
        conditions::set(
            &mut status.conditions,
            conditions::condition(
                READY,
                Some(true),
                "Detected",
                "the inventory reflects the latest detection",
                generation,
                &now,
            ),
        );
        conditions::set(
            &mut status.conditions,
            degraded_condition(detected, published, stale, generation, &now),
        );
        conditions::set(
            &mut status.conditions,
            missing.condition(&self.config.node_name, generation, &now),
        );
        conditions::set(
            &mut status.conditions,
            host_mounts::condition(&self.writable_host_mounts, generation, &now),
        );
        status.observed_generation = generation;
        status.expected_devices = Some(missing.expected.count);
        status.expected_source = Some(missing.expected.source.as_str().to_string());
        status.device_plugin_resources = self.plugin_resources.clone();
        status
    }
}

/// The condition types the agent owns in the inventory's status.
const AGENT_CONDITIONS: [&str; 4] = [READY, DEGRADED, DEVICES_MISSING, HOST_MOUNTS_WRITABLE];

/// `status` cut to the fields the agent owns: what it sends by server-side apply, and what it
/// compares with before writing (so the controller's `freeDevices` never causes a write and
/// is never taken over).
fn agent_fields(mut status: AcceleratorInventoryStatus) -> AcceleratorInventoryStatus {
    status.free_devices = None;
    status
        .conditions
        .retain(|c| AGENT_CONDITIONS.contains(&c.type_.as_str()));
    status
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// Degraded when a detector failed, devices are kept stale, or a device is unhealthy.
fn degraded_condition(
    detected: &Report,
    published: &Report,
    stale: &[String],
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let unhealthy: Vec<&str> = published
        .devices
        .iter()
        .filter(|d| {
            matches!(
                d.health.status,
                HealthStatus::Unhealthy | HealthStatus::Degraded
            )
        })
        .map(|d| d.id.as_str())
        .collect();
    let (reason, message) = if !detected.warnings.is_empty() {
        let failing: std::collections::BTreeSet<&str> = detected
            .warnings
            .iter()
            .map(|w| w.backend.as_str())
            .collect();
        let first = &detected.warnings[0];
        (
            "DetectorFailed",
            format!(
                "backends failing: {}; first: {}",
                failing.into_iter().collect::<Vec<_>>().join(", "),
                first.message
            ),
        )
    } else if !stale.is_empty() {
        (
            "DevicesMissing",
            format!("kept while missing: {}", stale.join(", ")),
        )
    } else if !unhealthy.is_empty() {
        (
            "DevicesUnhealthy",
            format!("unhealthy: {}", unhealthy.join(", ")),
        )
    } else {
        return conditions::condition(DEGRADED, Some(false), "Healthy", "", generation, now);
    };
    conditions::condition(DEGRADED, Some(true), reason, &message, generation, now)
}

/// The publish loop's retries after a failed cycle: 1 s, doubling up to `--max-backoff`, each
/// wait jittered into the upper half of its step so that agents which lost the apiserver
/// together do not all come back in the same second.
#[must_use]
pub fn publish_backoff(max_backoff: Duration) -> Backoff {
    Backoff::new(Duration::from_secs(1), max_backoff)
}

/// Runs the agent until `shutdown` flips to true: a cycle per interval, an extra cycle when the
/// device directories change, jittered exponential backoff while cycles fail.
pub async fn run(mut agent: Agent, readiness: Arc<Readiness>, mut shutdown: watch::Receiver<bool>) {
    let host = HostRoot::new(&agent.config.host_root);
    let mut fingerprint = DeviceFingerprint::read(&host);
    let mut retries = Retries::new(publish_backoff(agent.config.max_backoff));
    loop {
        let wait = match agent.cycle().await {
            Ok(outcome) => {
                readiness.set(true);
                retries.reset();
                tracing::debug!(?outcome, "cycle done");
                agent.config.interval
            }
            Err(err) => {
                readiness.set(false);
                agent.metrics.failed("publish");
                agent.invalidate();
                let wait = retries.next_wait();
                tracing::warn!(error = %err, retry_in = ?wait, "publishing failed; will retry");
                wait
            }
        };
        agent.heartbeat.beat();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let poll = agent
                .config
                .hotplug_poll
                .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            tokio::select! {
                _ = shutdown.changed() => {
                    tracing::info!("shutting down; published state is left in place");
                    return;
                }
                () = tokio::time::sleep(poll) => {}
            }
            if *shutdown.borrow() {
                return;
            }
            let now = DeviceFingerprint::read(&host);
            if now != fingerprint {
                fingerprint = now;
                tracing::info!("device directories changed; detecting now");
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
    }
}
