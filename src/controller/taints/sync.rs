//! Health taints (`--health-taints none|dryRun|enforce`): keeps unhealthy nodes' devices out
//! of new placements by the scheduler's own means.
//!
//! - A sick device that a DRA driver publishes, where the apiserver serves DeviceTaintRule
//!   (discovered at start: `resource.k8s.io/v1`, GA since 1.37, else `v1beta2`): one
//!   DeviceTaintRule per device, in that version, effect
//!   `None` in a dry run (reported, scheduling unchanged) and `NoSchedule` when enforced;
//!   deleted when the device is healthy again.
//! - Anything else (devices missing, a sick device no slice publishes, no DeviceTaintRule):
//!   when enforced, the Node taint `hwaccel.io/devices-unhealthy=<reason>:NoSchedule`, edited
//!   into the Node's taints with a resourceVersion guard so no other taint is touched; in a
//!   dry run, a Normal Event on the Node listing the pods on it instead.
//!
//! Which taints and rules exist is listed once at start and then remembered, so a steady
//! fleet costs no reads and no writes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1beta2::DeviceTaintRule;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};

use tracing::Instrument;

use super::core::{
    HealthTaints, MANAGED_BY, MANAGED_BY_LABEL, RULES_GROUP, SCOPE_LABEL, TAINT_KEY, WHOLE_CLUSTER,
    device_taint_rule, edited_taints, in_scope, rule_document, rule_effect, rules_version,
    scope_of,
};
use crate::controller::context::{Context, FIELD_MANAGER};
use crate::controller::core::fleet_figures::{NodeStats, Unhealthy};
use crate::controller::core::fleet_view::FleetView;
use crate::controller::node_events::{cut, node_span, publish_node_event};

/// Page size of the start-up Node list.
const LIST_PAGE: u32 = 500;
/// Most pods a dry-run Event names.
const PODS_LISTED: u32 = 20;
/// How often the Nodes we taint are read again, so a taint removed by hand comes back: one
/// GET per tainted Node (the Node cache holds metadata only, so it cannot tell).
pub const TAINT_CHECK: std::time::Duration = std::time::Duration::from_secs(60);

/// The health-taint state between fleet passes.
#[derive(Debug)]
pub(crate) struct Taints {
    mode: HealthTaints,
    selector: Option<String>,
    /// The scope label value of this controller's DeviceTaintRules.
    scope: String,
    /// The `resource.k8s.io` version DeviceTaintRules are written in, when the apiserver
    /// serves them at all.
    rules_version: Option<&'static str>,
    /// Nodes carrying our taint, with its value; `None` until listed.
    tainted: Option<BTreeMap<String, String>>,
    /// Our DeviceTaintRules by name, with their effect; `None` until listed.
    rules: Option<BTreeMap<String, String>>,
    /// Dry run: the reason last reported per node, so each is reported once.
    reported: BTreeMap<String, String>,
    /// How often our Node taints are read again, and when they last were.
    check_every: std::time::Duration,
    checked_at: Option<std::time::Instant>,
}

impl Taints {
    /// Starts in `mode`, discovering whether DeviceTaintRules are served; the Nodes it taints
    /// are read again every `check_every`.
    pub(crate) async fn new(
        ctx: &Context,
        mode: HealthTaints,
        selector: Option<String>,
        check_every: std::time::Duration,
    ) -> Self {
        let rules_version = if mode == HealthTaints::None {
            None
        } else {
            served_rules_version(ctx).await
        };
        if mode != HealthTaints::None {
            tracing::info!(
                %mode,
                rules_served = rules_version.is_some(),
                rules_version = rules_version.unwrap_or("none"),
                "health taints on"
            );
        }
        Self {
            mode,
            scope: scope_of(selector.as_deref()),
            selector,
            rules_version,
            tainted: None,
            rules: None,
            reported: BTreeMap::new(),
            check_every,
            checked_at: None,
        }
    }

    /// Whether the mode writes or reports anything (not `none`).
    pub(crate) fn active(&self) -> bool {
        self.mode != HealthTaints::None
    }

    /// Brings taints, rules and dry-run reports in line with the nodes' health. In a
    /// `taint_pass` span; the work on one node runs in a `node` span inside it.
    #[tracing::instrument(name = "taint_pass", skip_all, fields(mode = %self.mode))]
    pub(crate) async fn sync(
        &mut self,
        ctx: &Context,
        stats: &[std::sync::Arc<NodeStats>],
        view: &FleetView,
    ) {
        if self.mode == HealthTaints::None {
            return;
        }
        let mut node_reasons: BTreeMap<String, Unhealthy> = BTreeMap::new();
        let mut rules: BTreeMap<String, DeviceTaintRule> = BTreeMap::new();
        let effect = self.mode.rule_effect().unwrap_or("None");
        for node in stats {
            let Some(unhealthy) = node.unhealthy() else {
                continue;
            };
            let mut unpublished = BTreeMap::new();
            for (device, health) in &node.sick {
                match view.dra_device(&node.node, device) {
                    Some(published) if self.rules_version.is_some() => {
                        let rule = device_taint_rule(
                            &node.node,
                            device,
                            published,
                            ("DeviceUnhealthy", effect),
                            &self.scope,
                        );
                        if let Some(name) = rule.metadata.name.clone() {
                            rules.insert(name, rule);
                        }
                    }
                    _ => {
                        unpublished.insert(device.clone(), health.clone());
                    }
                }
            }
            // The node as a whole: devices missing, or sick devices no rule can name.
            let node_wide = match unhealthy {
                Unhealthy::DevicesMissing(_) => Some(unhealthy),
                Unhealthy::Devices(_) if !unpublished.is_empty() => {
                    Some(Unhealthy::Devices(unpublished))
                }
                Unhealthy::Devices(_) => None,
            };
            if let Some(reason) = node_wide {
                node_reasons.insert(node.node.clone(), reason);
            }
        }
        let affected = node_reasons.len() + rules.len();
        ctx.metrics
            .health_taint_targets
            .set(i64::try_from(affected).unwrap_or(i64::MAX));
        let wanted: BTreeMap<String, String> = match self.mode {
            HealthTaints::Enforce => node_reasons
                .iter()
                .map(|(node, why)| (node.clone(), why.reason().to_string()))
                .collect(),
            // A dry run writes no Node taint, and takes back one an earlier enforce left.
            _ => BTreeMap::new(),
        };
        self.sync_node_taints(ctx, &wanted).await;
        if self.mode == HealthTaints::DryRun {
            self.report_dry_run(ctx, &node_reasons).await;
        }
        if let Some(version) = self.rules_version {
            self.sync_rules(ctx, version, &rules).await;
        }
    }

    /// Adds, changes or removes our Node taint where the wanted value differs from what the
    /// Node carries.
    async fn sync_node_taints(&mut self, ctx: &Context, wanted: &BTreeMap<String, String>) {
        if self.tainted.is_none() {
            match list_tainted(ctx, self.selector.as_deref()).await {
                Ok(tainted) => self.tainted = Some(tainted),
                Err(err) => {
                    ctx.metrics.failed("node_taint");
                    tracing::warn!(error = %err, "listing Nodes for health taints failed; the next pass retries");
                    return;
                }
            }
        }
        // Now and then, read the Nodes that should carry our taint even if we believe they
        // do: someone may have removed it by hand (`kubectl taint ... -`).
        let check = self
            .checked_at
            .is_none_or(|at| at.elapsed() >= self.check_every);
        if check {
            self.checked_at = Some(std::time::Instant::now());
        }
        let Some(tainted) = self.tainted.as_mut() else {
            return;
        };
        let mut nodes: Vec<String> = wanted.keys().cloned().collect();
        nodes.extend(tainted.keys().cloned());
        nodes.sort();
        nodes.dedup();
        for node in nodes {
            let want = wanted.get(&node);
            if want == tainted.get(&node) && !(check && want.is_some()) {
                continue;
            }
            let started = std::time::Instant::now();
            match set_node_taint(ctx, &node, want.map(String::as_str))
                .instrument(node_span(&node))
                .await
            {
                Ok((now, wrote)) => {
                    match now {
                        Some(value) => tainted.insert(node.clone(), value),
                        None => tainted.remove(&node),
                    };
                    if wrote {
                        ctx.metrics.wrote("node_taint", started.elapsed());
                        tracing::info!(%node, taint = ?want, "health taint updated");
                    }
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    tainted.remove(&node);
                }
                Err(err) => {
                    // A conflict (the Node changed between read and write) or an outage:
                    // the next pass tries again.
                    ctx.metrics.failed("node_taint");
                    tracing::warn!(%node, error = %err, "updating the health taint failed");
                }
            }
        }
    }

    /// Dry run: one Normal Event per node and reason, naming the pods on the node.
    async fn report_dry_run(&mut self, ctx: &Context, reasons: &BTreeMap<String, Unhealthy>) {
        self.reported.retain(|node, _| reasons.contains_key(node));
        for (node, why) in reasons {
            if self.reported.get(node).map(String::as_str) == Some(why.reason()) {
                continue;
            }
            let pods = match pods_on(ctx, node).instrument(node_span(node)).await {
                Ok(pods) => pods,
                Err(err) => {
                    tracing::warn!(%node, error = %err, "listing the pods on an unhealthy node failed");
                    continue;
                }
            };
            let listed = if pods.is_empty() {
                "no pods run on it".to_string()
            } else {
                format!("pods on it that it would affect: {}", pods.join(", "))
            };
            let note = format!(
                "dry run: would taint {TAINT_KEY}={}:NoSchedule ({}); {listed}",
                why.reason(),
                why.message()
            );
            publish_node_event(
                ctx,
                node,
                Event {
                    type_: EventType::Normal,
                    reason: "DevicesUnhealthyDryRun".to_string(),
                    note: Some(cut(&note)),
                    action: "Taint".to_string(),
                    secondary: None,
                },
            );
            self.reported.insert(node.clone(), why.reason().to_string());
        }
    }

    /// Writes missing or changed DeviceTaintRules in `version` and deletes ours that are no
    /// longer wanted. Through a dynamic `Api`, since the typed rule is `v1beta2`'s (see
    /// [`super::core`]) and `v1` has the same fields.
    async fn sync_rules(
        &mut self,
        ctx: &Context,
        version: &str,
        wanted: &BTreeMap<String, DeviceTaintRule>,
    ) {
        let api: Api<DynamicObject> =
            Api::all_with(ctx.client.clone(), &super::rules_resource(version));
        if self.rules.is_none() {
            // The whole-cluster controller also lists rules without a scope label (written
            // before scopes existed); a scoped one lists only its own.
            let selector = if self.scope == WHOLE_CLUSTER {
                format!("{MANAGED_BY_LABEL}={MANAGED_BY}")
            } else {
                format!(
                    "{MANAGED_BY_LABEL}={MANAGED_BY},{SCOPE_LABEL}={}",
                    self.scope
                )
            };
            match api.list(&ListParams::default().labels(&selector)).await {
                Ok(list) => {
                    self.rules = Some(
                        list.items
                            .into_iter()
                            .filter(|r| in_scope(r.metadata.labels.as_ref(), &self.scope))
                            .filter_map(|r| {
                                let effect = rule_effect(&r.data)?.to_string();
                                Some((r.metadata.name?, effect))
                            })
                            .collect(),
                    );
                }
                Err(err) => {
                    ctx.metrics.failed("device_taint_rule");
                    tracing::warn!(error = %err, "listing DeviceTaintRules failed; the next pass retries");
                    return;
                }
            }
        }
        let Some(existing) = self.rules.as_mut() else {
            return;
        };
        for (name, rule) in wanted {
            if existing.get(name) == Some(&rule.spec.taint.effect) {
                continue;
            }
            let started = std::time::Instant::now();
            let body = rule_document(rule, version);
            match api
                .patch(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await
            {
                Ok(_) => {
                    ctx.metrics.wrote("device_taint_rule", started.elapsed());
                    existing.insert(name.clone(), rule.spec.taint.effect.clone());
                }
                Err(err) => {
                    ctx.metrics.failed("device_taint_rule");
                    tracing::warn!(rule = %name, error = %err, "writing a DeviceTaintRule failed");
                }
            }
        }
        let gone: Vec<String> = existing
            .keys()
            .filter(|name| !wanted.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            let started = std::time::Instant::now();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    ctx.metrics.wrote("device_taint_rule", started.elapsed());
                    existing.remove(&name);
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    existing.remove(&name);
                }
                Err(err) => {
                    ctx.metrics.failed("device_taint_rule");
                    tracing::warn!(rule = %name, error = %err, "deleting a DeviceTaintRule failed");
                }
            }
        }
    }
}

/// The newest `resource.k8s.io` version that serves `devicetaintrules` (`v1`, else
/// `v1beta2`); `None` when neither does (a 404 or any failure counts as not served, and
/// Node taints are used instead).
async fn served_rules_version(ctx: &Context) -> Option<&'static str> {
    let mut served = Vec::new();
    for version in super::core::RULES_VERSIONS {
        let group_version = format!("{RULES_GROUP}/{version}");
        match ctx.client.list_api_group_resources(&group_version).await {
            Ok(list) if list.resources.iter().any(|r| r.name == "devicetaintrules") => {
                served.push(version);
                // The first served version wins; the older ones need not be asked.
                break;
            }
            Ok(_) => {
                tracing::debug!(%group_version, "DeviceTaintRule not served in this version");
            }
            Err(err) => {
                tracing::debug!(%group_version, error = %err, "DeviceTaintRule not served in this version");
            }
        }
    }
    rules_version(|version| served.contains(&version))
}

/// Nodes in scope that carry our taint, with its value.
async fn list_tainted(
    ctx: &Context,
    selector: Option<&str>,
) -> Result<BTreeMap<String, String>, kube::Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut tainted = BTreeMap::new();
    let mut params = ListParams::default().limit(LIST_PAGE);
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    loop {
        let page = api.list(&params).await?;
        for node in &page.items {
            let ours = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .and_then(|t| t.iter().find(|t| t.key == TAINT_KEY));
            if let (Some(name), Some(taint)) = (&node.metadata.name, ours) {
                tainted.insert(name.clone(), taint.value.clone().unwrap_or_default());
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(tainted),
        }
    }
}

/// Sets our taint on `node` to `reason` (or removes it), leaving every other taint alone;
/// returns the value it carries now and whether that took a write. The write is guarded by
/// the resourceVersion it read, so a taint someone else added in between is never lost (the
/// write fails with a conflict instead, and the next pass reads again).
async fn set_node_taint(
    ctx: &Context,
    node: &str,
    reason: Option<&str>,
) -> Result<(Option<String>, bool), kube::Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let current = api.get(node).await?;
    let taints = current
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let Some(next) = edited_taints(&taints, reason) else {
        return Ok((reason.map(str::to_string), false));
    };
    // A merge patch replaces the list whole; the resourceVersion in it makes the write
    // conditional on the Node being as read.
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "spec": {"taints": next},
    });
    api.patch(
        node,
        &PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        },
        &Patch::Merge(&patch),
    )
    .await?;
    Ok((reason.map(str::to_string), true))
}

/// `namespace/name` of the pods on `node`, at most [`PODS_LISTED`].
async fn pods_on(ctx: &Context, node: &str) -> Result<Vec<String>, kube::Error> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let params = ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .limit(PODS_LISTED);
    let list = api.list(&params).await?;
    Ok(list
        .items
        .iter()
        .map(|pod| {
            format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or(""),
                pod.metadata.name.as_deref().unwrap_or("")
            )
        })
        .collect())
}
