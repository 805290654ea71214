//! The ModelPlacement controller against a real kube-apiserver: a model that fits is planned
//! on real inventory nodes with a nodeSelector that selects exactly those nodes; competing
//! placements never share a device and a deletion lets a waiting one in; invalid specs are
//! refused by the apiserver or marked `Planned=False`; a model that does not fit says why;
//! losing an inventory re-plans; a training placement's loss reaches the planner; a
//! placement label removed by hand comes back; a refused
//! label write keeps `Ready` false until a retry lands it; with two
//! leader-elected replicas only the leader writes and a handover reserves nothing twice.
//!
//! Each test runs its own controller in-process, scoped to the test's namespace and to Nodes
//! and inventories labelled `hwaccel.io/test=<prefix>`, so tests run in parallel.
//! Run with the cluster up: `tests/cluster/up.sh --full && cargo test --test
//! cluster_tier -- --include-ignored cluster_controller::`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use hwaccel::api::placement::{
    ModelPlacementSpec, ModelPlacementStatus, OptimizerStates, PrecisionChoice, TrainAdamw,
    TrainKernels, TrainLoss, TrainMethod,
};
use hwaccel::api::{AcceleratorInventory, ModelPlacement, conditions};
use hwaccel::controller::leader::LeaseConfig;
use hwaccel::controller::metrics::{ControllerMetrics, WriteLabel};
use hwaccel::controller::{self, Config};
use hwaccel::testing::{InventoryBuilder, PlacementBuilder};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use support::nodes::apply_inventory;
use support::{DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, install_crds, wait_for};

/// A Node plus its AcceleratorInventory, detected from a fixture host, both labelled for
/// this test.
pub(crate) async fn add_node(cluster: &TestCluster, scenario: &str) -> Result<String> {
    let client = cluster.client();
    let name = cluster.unique_name(scenario);
    let labels = BTreeMap::from([
        (TEST_LABEL.to_string(), cluster.prefix().to_string()),
        ("kubernetes.io/hostname".to_string(), name.clone()),
    ]);
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    publish_inventory(cluster, &name, scenario).await?;
    Ok(name)
}

async fn publish_inventory(cluster: &TestCluster, node: &str, scenario: &str) -> Result<()> {
    let inventory = InventoryBuilder::fixture(scenario)
        .node(node)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    apply_inventory(&cluster.client(), &inventory).await?;
    Ok(())
}

pub(crate) fn scoped_config(cluster: &TestCluster, identity: &str) -> Config {
    let mut config = Config::cluster_wide(identity);
    config.namespace = Some(cluster.namespace().to_string());
    config.selector = Some(format!("{TEST_LABEL}={}", cluster.prefix()));
    config.debounce = Duration::from_millis(200);
    config.inventory_grace = INVENTORY_GRACE;
    config
}

/// How long this file's controllers keep plans on a Node whose inventory is missing.
const INVENTORY_GRACE: Duration = Duration::from_secs(6);

pub(crate) fn metrics() -> ControllerMetrics {
    ControllerMetrics::register(&mut prometheus_client::registry::Registry::default())
}

/// Runs a controller for this test until the handle is aborted (dropped at the test's end).
pub(crate) struct Running(pub(crate) tokio::task::JoinHandle<Result<()>>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) fn start_controller(cluster: &TestCluster) -> Running {
    let client = cluster.client();
    let config = scoped_config(cluster, "test-controller");
    Running(tokio::spawn(controller::run(
        client,
        config,
        metrics(),
        std::future::pending(),
    )))
}

pub(crate) async fn create_placement(
    cluster: &TestCluster,
    name: &str,
    spec: ModelPlacementSpec,
) -> Result<()> {
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(&PostParams::default(), &ModelPlacement::new(name, spec))
        .await?;
    Ok(())
}

/// Waits until the placement's status is in `state` for its current generation.
pub(crate) async fn wait_state(
    cluster: &TestCluster,
    name: &str,
    state: &str,
) -> Result<ModelPlacementStatus> {
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    wait_for(DEFAULT_TIMEOUT, &format!("{name} {state}"), || {
        let api = api.clone();
        async move {
            let placement = api.get(name).await?;
            let generation = placement.metadata.generation;
            Ok(placement.status.filter(|s| {
                s.state.as_deref() == Some(state) && s.observed_generation == generation
            }))
        }
    })
    .await
}

fn planned_reason(status: &ModelPlacementStatus) -> Option<(String, String)> {
    conditions::find(&status.conditions, "Planned").map(|c| (c.status.clone(), c.reason.clone()))
}

pub(crate) fn devices_of(status: &ModelPlacementStatus) -> BTreeSet<(String, String)> {
    status
        .assignments
        .iter()
        .flat_map(|a| a.devices.iter().map(|d| (a.node.clone(), d.clone())))
        .collect()
}

async fn nodes_selected_by(
    cluster: &TestCluster,
    selector: &BTreeMap<String, String>,
) -> Result<BTreeSet<String>> {
    let text: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let out = cluster
        .kubectl_ok(&["get", "nodes", "-l", &text.join(","), "-o", "name"])
        .await?;
    Ok(out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("node/"))
        .map(str::to_string)
        .collect())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_model_that_fits_is_planned_with_an_exact_node_selector() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let h100 = add_node(&cluster, "h100-8x-nvswitch").await?;
    let mi300 = add_node(&cluster, "mi300x-8x").await?;
    let _controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "llama",
        PlacementBuilder::serve("llama-3.1-70b")
            .precision(PrecisionChoice::Bf16)
            .spec(),
    )
    .await?;
    let status = wait_state(&cluster, "llama", "Planned").await?;
    assert_eq!(
        planned_reason(&status),
        Some(("True".into(), "Planned".into()))
    );
    let plan = status.plan.as_ref().context("a plan")?;
    assert_eq!(plan.precision, "bf16");
    let chosen: BTreeSet<String> = status.assignments.iter().map(|a| a.node.clone()).collect();
    assert!(!chosen.is_empty());
    assert!(
        chosen.iter().all(|n| *n == h100 || *n == mi300),
        "{chosen:?}"
    );
    // Device names are the inventory's own.
    let inventories: Api<AcceleratorInventory> = Api::all(cluster.client());
    for assignment in &status.assignments {
        let inventory = inventories.get(&assignment.node).await?;
        let names: BTreeSet<&str> = inventory
            .spec
            .devices
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert!(
            assignment
                .devices
                .iter()
                .all(|d| names.contains(d.as_str())),
            "{assignment:?} not in {names:?}"
        );
    }
    let selected = wait_for(DEFAULT_TIMEOUT, "labels on the chosen nodes", || {
        let cluster = &cluster;
        let selector = status.node_selector.clone();
        let chosen = chosen.clone();
        async move {
            let selected = nodes_selected_by(cluster, &selector).await?;
            Ok((selected == chosen).then_some(selected))
        }
    })
    .await?;
    assert_eq!(selected, chosen);
    let ready = conditions::find(&status.conditions, conditions::READY).context("Ready")?;
    assert_eq!(ready.status, "True", "{ready:?}");
    // A placement label removed by hand comes back from the Node watch, long before the
    // 10-minute periodic reconcile.
    let (key, _) = status
        .node_selector
        .iter()
        .next()
        .context("a selector label")?;
    let victim = chosen.iter().next().context("a chosen node")?;
    cluster
        .kubectl_ok(&["label", "node", victim, &format!("{key}-")])
        .await?;
    let restored = wait_for(Duration::from_secs(30), "the label restored", || {
        let cluster = &cluster;
        let selector = status.node_selector.clone();
        async move {
            let selected = nodes_selected_by(cluster, &selector).await?;
            Ok(selected.contains(victim).then_some(selected))
        }
    })
    .await?;
    assert_eq!(restored, chosen);
    assert_eq!(
        status.node_names.as_deref(),
        Some(
            chosen
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(",")
                .as_str()
        )
    );
    let events = cluster
        .kubectl_ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=llama",
            "-o",
            "jsonpath={.items[*].reason}",
        ])
        .await?;
    // A first plan is routine: its Planned condition says it, and no Event repeats it.
    assert!(!events.contains("Planned"), "events: {events}");
    Ok(())
}

/// Refuses placement labels on Nodes labelled `hwaccel.io/deny-placement-labels=<prefix>`
/// (so only this test's Node is affected), as a webhook or policy of the cluster might.
async fn refuse_placement_labels(cluster: &TestCluster) -> Result<()> {
    use k8s_openapi::api::admissionregistration::v1::{
        MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
        ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
        ValidatingAdmissionPolicySpec, Validation,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    let name = cluster.unique_name("refuse-placement-labels");
    let these_nodes = MatchResources {
        object_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                DENY_LABEL.to_string(),
                cluster.prefix().to_string(),
            )])),
            ..LabelSelector::default()
        }),
        ..MatchResources::default()
    };
    let policy = ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec![String::new()]),
                    api_versions: Some(vec!["v1".into()]),
                    operations: Some(vec!["UPDATE".into()]),
                    resources: Some(vec!["nodes".into()]),
                    ..NamedRuleWithOperations::default()
                }]),
                ..these_nodes.clone()
            }),
            validations: Some(vec![Validation {
                expression: "!has(object.metadata.labels) || !object.metadata.labels.exists(k, k.startsWith('placement.hwaccel.io/'))".into(),
                message: Some("placement labels are refused on this node".into()),
                ..Validation::default()
            }]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    Api::<ValidatingAdmissionPolicy>::all(cluster.client())
        .create(&PostParams::default(), &policy)
        .await?;
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: name,
            validation_actions: vec!["Deny".into()],
            match_resources: Some(these_nodes),
            ..ValidatingAdmissionPolicyBindingSpec::default()
        },
    };
    Api::<ValidatingAdmissionPolicyBinding>::all(cluster.client())
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

const DENY_LABEL: &str = "hwaccel.io/deny-placement-labels";

fn ready_of(status: &ModelPlacementStatus) -> Option<(String, String)> {
    conditions::find(&status.conditions, conditions::READY)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_refused_label_write_takes_ready_back_until_a_retry_lands() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let node = add_node(&cluster, "h100-8x-nvswitch").await?;
    cluster
        .kubectl_ok(&[
            "label",
            "node",
            &node,
            &format!("{DENY_LABEL}={}", cluster.prefix()),
        ])
        .await?;
    refuse_placement_labels(&cluster).await?;
    // The policy reaches the admission chain asynchronously: wait until a (dry-run) write of
    // a placement label is refused.
    let nodes: Api<Node> = Api::all(cluster.client());
    wait_for(DEFAULT_TIMEOUT, "the policy to refuse placement labels", || {
        let nodes = nodes.clone();
        let node = node.clone();
        async move {
            let probe = serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": node, "labels": { "placement.hwaccel.io/probe.x": "true" } },
            });
            let refused = nodes
                .patch(
                    &node,
                    &PatchParams::apply("probe").dry_run(),
                    &Patch::Apply(&probe),
                )
                .await
                .is_err();
            Ok(refused.then_some(()))
        }
    })
    .await?;
    let _controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "llama",
        PlacementBuilder::serve("llama-3.1-8b")
            .precision(PrecisionChoice::Bf16)
            .spec(),
    )
    .await?;
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    let refused = wait_for(DEFAULT_TIMEOUT, "Ready=False LabelWriteFailed", || {
        let api = api.clone();
        async move {
            let status = api.get_status("llama").await?.status;
            Ok(status.filter(|s| ready_of(s) == Some(("False".into(), "LabelWriteFailed".into()))))
        }
    })
    .await?;
    assert_eq!(refused.state.as_deref(), Some("Planned"), "{refused:?}");
    let message = conditions::find(&refused.conditions, conditions::READY)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains("refused on this node"), "{message}");
    // Lift the refusal: the controller's retry lands the label and Ready turns True.
    cluster
        .kubectl_ok(&["label", "node", &node, &format!("{DENY_LABEL}-")])
        .await?;
    let ready = wait_for(DEFAULT_TIMEOUT, "Ready=True", || {
        let api = api.clone();
        async move {
            let status = api.get_status("llama").await?.status;
            Ok(status.filter(|s| ready_of(s) == Some(("True".into(), "NodesLabelled".into()))))
        }
    })
    .await?;
    assert_eq!(
        nodes_selected_by(&cluster, &ready.node_selector).await?,
        BTreeSet::from([node])
    );
    Ok(())
}

/// The value of `key` on Node `node`, if it has the label.
async fn node_label(cluster: &TestCluster, node: &str, key: &str) -> Result<Option<String>> {
    let node = Api::<Node>::all(cluster.client()).get(node).await?;
    Ok(node.metadata.labels.unwrap_or_default().get(key).cloned())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_hand_edited_placement_label_is_taken_back_and_the_node_stays_writable() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let node = add_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "edited",
        PlacementBuilder::serve("llama-3.1-8b")
            .precision(PrecisionChoice::Bf16)
            .spec(),
    )
    .await?;
    let status = wait_state(&cluster, "edited", "Planned").await?;
    let (key, value) = status
        .node_selector
        .iter()
        .next()
        .context("a selector label")?;
    wait_for(DEFAULT_TIMEOUT, "the label written", || async {
        Ok((node_label(&cluster, &node, key).await?.as_ref() == Some(value)).then_some(()))
    })
    .await?;
    // `kubectl label --overwrite` makes kubectl's field manager the owner of the key: an apply
    // without force conflicts on it from then on (409), for every label of that Node.
    cluster
        .kubectl_ok(&[
            "label",
            "node",
            &node,
            &format!("{key}=hand-edited"),
            "--overwrite",
        ])
        .await?;
    wait_for(
        Duration::from_secs(30),
        "the edited label taken back",
        || async {
            Ok((node_label(&cluster, &node, key).await?.as_ref() == Some(value)).then_some(()))
        },
    )
    .await?;
    // The Node is still writable: a new placement there gets its label and Ready, and the
    // first one's deletion completes (its finalizer removes its label).
    create_placement(
        &cluster,
        "next",
        PlacementBuilder::serve("llama-3.1-8b")
            .precision(PrecisionChoice::Bf16)
            .spec(),
    )
    .await?;
    let next = wait_state(&cluster, "next", "Planned").await?;
    let next_key =
        controller::placement::core::labels::placement_label_key(cluster.namespace(), "next");
    wait_for(DEFAULT_TIMEOUT, "next Ready with its label", || {
        let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
        let (cluster, node, next_key) = (&cluster, &node, &next_key);
        async move {
            let labelled = node_label(cluster, node, next_key).await?.is_some();
            let status = api.get("next").await?.status.unwrap_or_default();
            let ready = conditions::find(&status.conditions, conditions::READY)
                .is_some_and(|c| c.status == "True");
            Ok((labelled && ready).then_some(()))
        }
    })
    .await?;
    assert_eq!(next.assignments[0].node, node);
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    api.delete("edited", &DeleteParams::default()).await?;
    wait_for(DEFAULT_TIMEOUT, "the edited placement deleted", || {
        let api = api.clone();
        async move { Ok(api.get_opt("edited").await?.is_none().then_some(())) }
    })
    .await?;
    assert_eq!(node_label(&cluster, &node, key).await?, None);
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_placement_nested_deeper_than_json_decoders_go_is_invalid_and_the_rest_is_planned()
-> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    add_node(&cluster, "h100-8x-nvswitch").await?;
    // 130 levels inside huggingFaceConfig: the apiserver stores it (kubectl, in Go, sends it),
    // but serde_json gives up at 128, so decoding any list holding it used to fail, and with
    // it the controller's start. It is created before the controller starts, as after an
    // upgrade.
    let depth = 130;
    let config = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    // The config is JSON text inside the placement (a string field, bounded in size).
    let config = serde_json::to_string(&config)?;
    let deep = format!(
        r#"{{"apiVersion":"hwaccel.io/v1alpha1","kind":"ModelPlacement",
            "metadata":{{"name":"deep"}},
            "spec":{{"model":{{"huggingFaceConfig":{config}}},"goal":{{"serve":{{}}}}}}}}"#
    );
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), deep)?;
    let path = file.path().to_string_lossy().into_owned();
    cluster.kubectl_ok(&["create", "-f", &path]).await?;
    let _controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "shallow",
        PlacementBuilder::serve("llama-3.1-8b")
            .precision(PrecisionChoice::Bf16)
            .spec(),
    )
    .await?;
    wait_state(&cluster, "shallow", "Planned").await?;
    // The deep one is judged on its own: Invalid, saying why. (Read with kubectl: this
    // test's own JSON decoder could not read the object either.)
    let reason = wait_for(DEFAULT_TIMEOUT, "deep marked Invalid", || {
        let cluster = &cluster;
        async move {
            let out = cluster
                .kubectl_ok(&[
                    "get",
                    "modelplacement",
                    "deep",
                    "-o",
                    r#"jsonpath={.status.state}/{.status.reasons[0]}"#,
                ])
                .await?;
            Ok(out.starts_with("Invalid/").then_some(out))
        }
    })
    .await?;
    assert!(reason.contains("recursion limit"), "{reason}");
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn competing_placements_never_share_devices_and_a_deletion_lets_the_next_in() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let node = add_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    // 70B at bf16 for 40 concurrent 8k requests takes 4 of the node's 8 H100s.
    let spec = || {
        PlacementBuilder::serve("llama-3.1-70b")
            .precision(PrecisionChoice::Bf16)
            .concurrency(40)
            .spec()
    };
    create_placement(&cluster, "first", spec()).await?;
    let first = wait_state(&cluster, "first", "Planned").await?;
    create_placement(&cluster, "second", spec()).await?;
    let second = wait_state(&cluster, "second", "Planned").await?;
    create_placement(&cluster, "third", spec()).await?;
    let third = wait_state(&cluster, "third", "Pending").await?;
    let (a, b) = (devices_of(&first), devices_of(&second));
    assert_eq!(a.len(), 4, "{first:?}");
    assert_eq!(b.len(), 4, "{second:?}");
    assert!(a.is_disjoint(&b), "shared devices: {a:?} / {b:?}");
    assert!(a.iter().chain(&b).all(|(n, _)| *n == node));
    assert_eq!(
        planned_reason(&third),
        Some(("False".into(), "Unschedulable".into()))
    );
    assert!(third.assignments.is_empty());

    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    api.delete("first", &DeleteParams::default()).await?;
    let third = wait_state(&cluster, "third", "Planned").await?;
    assert_eq!(
        devices_of(&third),
        a,
        "the freed devices go to the waiting placement"
    );
    let second_now = wait_state(&cluster, "second", "Planned").await?;
    assert_eq!(devices_of(&second_now), b, "a held plan is stable");
    // The deleted placement's label is gone from the node; the others' are there.
    let first_key =
        controller::placement::core::labels::placement_label_key(cluster.namespace(), "first");
    wait_for(DEFAULT_TIMEOUT, "first's label removed", || {
        let client = cluster.client();
        let node = node.clone();
        let key = first_key.clone();
        async move {
            let node = Api::<Node>::all(client).get(&node).await?;
            let labels = node.metadata.labels.unwrap_or_default();
            Ok((!labels.contains_key(&key)).then_some(()))
        }
    })
    .await?;
    let selected = nodes_selected_by(&cluster, &third.node_selector).await?;
    assert_eq!(selected, BTreeSet::from([node]));
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn invalid_specs_are_refused_by_the_apiserver_or_marked_invalid() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    add_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    let two_sources = PlacementBuilder::serve("llama-3.1-8b")
        .precision(PrecisionChoice::Auto)
        .parameters("8B")
        .spec();
    let err = create_placement(&cluster, "two-sources", two_sources)
        .await
        .expect_err("CEL refuses two model sources");
    assert!(
        err.to_string()
            .contains("set exactly one of preset, parameters or huggingFaceConfig"),
        "{err}"
    );
    create_placement(
        &cluster,
        "unknown",
        PlacementBuilder::serve("llama-3.1-7b")
            .precision(PrecisionChoice::Auto)
            .spec(),
    )
    .await?;
    let status = wait_state(&cluster, "unknown", "Invalid").await?;
    assert_eq!(
        planned_reason(&status),
        Some(("False".into(), "Invalid".into()))
    );
    assert!(
        status.reasons[0].contains("unknown model preset")
            && status.reasons[0].contains("llama-3.1-8b"),
        "{:?}",
        status.reasons
    );
    // Fixing the spec is a new generation, planned at once.
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    let fix = serde_json::json!({"spec": {"model": {"preset": "llama-3.1-8b"}}});
    api.patch("unknown", &PatchParams::default(), &Patch::Merge(&fix))
        .await?;
    wait_state(&cluster, "unknown", "Planned").await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_model_that_does_not_fit_says_why_and_what_would() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    add_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "huge",
        PlacementBuilder::serve("llama-3.1-405b")
            .precision(PrecisionChoice::Bf16)
            .spec(),
    )
    .await?;
    let status = wait_state(&cluster, "huge", "Pending").await?;
    assert_eq!(
        planned_reason(&status),
        Some(("False".into(), "Unschedulable".into()))
    );
    assert!(
        status.reasons.iter().any(|r| r.contains("budget")),
        "{:?}",
        status.reasons
    );
    assert!(
        status
            .suggestions
            .iter()
            .any(|s| s.contains("fp8") || s.contains("more node")),
        "{:?}",
        status.suggestions
    );
    assert!(status.assignments.is_empty() && status.node_selector.is_empty());
    Ok(())
}

/// Issue 38: a training placement's `goal.train.loss` reaches the planner through the
/// apiserver. LoRA of Llama 3.1 8B at 32k tokens fits one H100 with a fused loss; with
/// transformers' own, whose whole logits are 47 GiB on every device, it fits none (even
/// ZeRO-3 over all the node's free devices, whose sharding leaves each device's activations
/// whole); each status
/// says which loss it assumed, and a loss outside the enum is refused by the schema.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_training_placements_loss_reaches_the_planner() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    add_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    let lora = || PlacementBuilder::train("llama-3.1-8b", TrainMethod::Lora).seq_len(32_768);
    create_placement(&cluster, "standard", lora().spec()).await?;
    create_placement(&cluster, "fused", lora().loss(TrainLoss::Fused).spec()).await?;
    let fused = wait_state(&cluster, "fused", "Planned").await?;
    let standard = wait_state(&cluster, "standard", "Pending").await?;
    assert_eq!(device_count(&fused), 1, "{:?}", fused.assignments);
    assert_eq!(device_count(&standard), 0, "{:?}", standard.assignments);
    assert!(
        standard
            .reasons
            .iter()
            // Over all the devices the fused placement left (seven or eight, by which was
            // planned first).
            .any(|r| r.contains("even ZeRO-3 over all")),
        "{:?}",
        standard.reasons
    );
    assert!(says(&fused, "loss fused:"), "{:?}", fused.reasons);
    assert!(says(&standard, "loss standard:"), "{:?}", standard.reasons);
    // A loss outside the enum never reaches the controller (the typed client cannot send one,
    // so kubectl does).
    let out = create_with_train_field(&cluster, lora().spec(), "loss", "chunky").await?;
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Unsupported value"),
        "loss chunky accepted: {out:?}"
    );
    Ok(())
}

/// The devices a placement's status holds.
fn device_count(status: &ModelPlacementStatus) -> usize {
    status.assignments.iter().map(|a| a.devices.len()).sum()
}

/// Whether one of a placement's reasons starts with `prefix`.
fn says(status: &ModelPlacementStatus, prefix: &str) -> bool {
    status.reasons.iter().any(|r| r.starts_with(prefix))
}

/// Creates a placement through kubectl with `spec.goal.train.<field>` set to `value`, which
/// the typed client cannot send when it is outside the field's enum.
async fn create_with_train_field(
    cluster: &TestCluster,
    spec: ModelPlacementSpec,
    field: &str,
    value: &str,
) -> Result<std::process::Output> {
    let name = format!("{field}-{value}").to_lowercase();
    let mut object = serde_json::to_value(ModelPlacement::new(&name, spec))?;
    object["spec"]["goal"]["train"][field] = serde_json::json!(value);
    let file = cluster
        .env()
        .work
        .join(format!("{}-{name}.json", cluster.prefix()));
    std::fs::write(&file, serde_json::to_vec(&object)?)?;
    let path = file.to_str().context("path")?;
    let out = cluster.kubectl(&["create", "-f", path]).await;
    let _ = std::fs::remove_file(&file);
    out
}

/// Issue 38: `goal.train.adamw` reaches the planner. A BF16 full fine-tune of Llama 3.1 8B
/// fits one H100 with a fused AdamW; PyTorch's foreach AdamW holds a copy of the moments
/// during the step (measured on an A100: a full fine-tune's peak is five times its BF16
/// parameter bytes), which needs the moments sharded over two. The reasons say which was
/// assumed; an AdamW outside the enum is refused by the apiserver.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_training_placements_adamw_reaches_the_planner() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    add_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    let full = || {
        PlacementBuilder::train("llama-3.1-8b", TrainMethod::Full)
            .optimizer_states(OptimizerStates::Bf16)
    };
    create_placement(&cluster, "fused", full().spec()).await?;
    create_placement(
        &cluster,
        "foreach",
        full().adamw(TrainAdamw::Foreach).spec(),
    )
    .await?;
    let fused = wait_state(&cluster, "fused", "Planned").await?;
    let foreach = wait_state(&cluster, "foreach", "Planned").await?;
    assert_eq!(device_count(&fused), 1, "{:?}", fused.assignments);
    assert_eq!(device_count(&foreach), 2, "{:?}", foreach.assignments);
    assert!(says(&fused, "adamw fused:"), "{:?}", fused.reasons);
    assert!(says(&foreach, "adamw foreach:"), "{:?}", foreach.reasons);
    let out = create_with_train_field(&cluster, full().spec(), "adamw", "adam").await?;
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Unsupported value"),
        "adamw adam accepted: {out:?}"
    );
    Ok(())
}

/// Issue 38: `goal.train.kernels` reaches the planner. Liger Kernel's RMSNorm returns its
/// input's dtype, so a QLoRA base prepared for training keeps a 16-bit residual stream (its
/// checkpoints half as large): Llama 3.1 70B QLoRA at 10,240 tokens fits one H100 with
/// `kernels: liger` and needs two with transformers' own layers. The reasons say which was
/// assumed; kernels outside the enum are refused by the apiserver.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_training_placements_kernels_reach_the_planner() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    add_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    let qlora = || PlacementBuilder::train("llama-3.1-70b", TrainMethod::Qlora).seq_len(10_240);
    create_placement(&cluster, "standard", qlora().spec()).await?;
    create_placement(
        &cluster,
        "liger",
        qlora().kernels(TrainKernels::Liger).spec(),
    )
    .await?;
    let standard = wait_state(&cluster, "standard", "Planned").await?;
    let liger = wait_state(&cluster, "liger", "Planned").await?;
    assert_eq!(device_count(&standard), 2, "{:?}", standard.assignments);
    assert_eq!(device_count(&liger), 1, "{:?}", liger.assignments);
    assert!(
        says(&standard, "kernels standard:"),
        "{:?}",
        standard.reasons
    );
    assert!(says(&liger, "kernels liger:"), "{:?}", liger.reasons);
    let out = create_with_train_field(&cluster, qlora().spec(), "kernels", "triton").await?;
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Unsupported value"),
        "kernels triton accepted: {out:?}"
    );
    Ok(())
}

/// Issues 27 and 28: a placement whose nodes have no accelerator names them (not "the
/// inventory has no nodes"), and a selector that is not label syntax is Invalid.
#[tokio::test]
#[ignore = "needs cluster"]
async fn refusals_name_nodes_without_accelerators_and_invalid_selectors() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let cpu = add_node(&cluster, "cpu-only-vm").await?;
    let _controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "cpu",
        PlacementBuilder::serve("llama-3.1-8b")
            .node_selector("kubernetes.io/hostname", &cpu)
            .spec(),
    )
    .await?;
    let status = wait_state(&cluster, "cpu", "Pending").await?;
    let reasons = status.reasons.join("; ");
    assert!(
        reasons.contains(&format!("with no usable accelerator: {cpu}")),
        "{reasons}"
    );
    assert!(!reasons.contains("has no nodes"), "{reasons}");

    create_placement(
        &cluster,
        "typo",
        PlacementBuilder::serve("llama-3.1-8b")
            .node_selector("bad key", "x")
            .spec(),
    )
    .await?;
    let status = wait_state(&cluster, "typo", "Invalid").await?;
    let reasons = status.reasons.join("; ");
    assert!(reasons.contains("not a valid label key"), "{reasons}");
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn losing_an_inventory_replans_its_placements() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let first = add_node(&cluster, "h100-8x-nvswitch").await?;
    let second = add_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "moving",
        PlacementBuilder::serve("llama-3.1-70b")
            .precision(PrecisionChoice::Bf16)
            .spec(),
    )
    .await?;
    let before = wait_state(&cluster, "moving", "Planned").await?;
    let old_node = before.assignments[0].node.clone();
    let other = if old_node == first { &second } else { &first };
    let inventories = Api::<AcceleratorInventory>::all(cluster.client());
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    let degraded = |status: &ModelPlacementStatus| {
        conditions::find(&status.conditions, conditions::DEGRADED)
            .is_some_and(|c| c.status == "True" && c.message.contains("inventory missing"))
    };

    // Deleted while its Node stays: the plan is kept (Degraded) for the grace period, and
    // when the agent writes the inventory back in time, nothing moved.
    inventories
        .delete(&old_node, &DeleteParams::default())
        .await?;
    let kept = wait_for(DEFAULT_TIMEOUT, "plan kept, Degraded", || {
        let api = api.clone();
        async move {
            let status = api.get("moving").await?.status.unwrap_or_default();
            Ok(degraded(&status).then_some(status))
        }
    })
    .await?;
    assert_eq!(devices_of(&kept), devices_of(&before), "{kept:?}");
    publish_inventory(&cluster, &old_node, "h100-8x-nvswitch").await?;
    let back = wait_for(DEFAULT_TIMEOUT, "Degraded cleared", || {
        let api = api.clone();
        async move {
            let status = api.get("moving").await?.status.unwrap_or_default();
            let healthy = conditions::find(&status.conditions, conditions::DEGRADED)
                .is_some_and(|c| c.status == "False");
            Ok(healthy.then_some(status))
        }
    })
    .await?;
    assert_eq!(devices_of(&back), devices_of(&before), "{back:?}");

    // Deleted for longer than the grace period: planned elsewhere.
    inventories
        .delete(&old_node, &DeleteParams::default())
        .await?;
    let after = wait_for(DEFAULT_TIMEOUT, "re-planned on the other node", || {
        let api = api.clone();
        let other = other.clone();
        async move {
            let status = api.get("moving").await?.status.unwrap_or_default();
            let moved = !status.assignments.is_empty()
                && status.assignments.iter().all(|a| a.node == other);
            Ok(moved.then_some(status))
        }
    })
    .await?;
    assert_eq!(
        planned_reason(&after),
        Some(("True".into(), "Replanned".into()))
    );
    let message = conditions::find(&after.conditions, "Planned")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains(&old_node), "{message}");
    let selected = wait_for(DEFAULT_TIMEOUT, "label moved", || {
        let cluster = &cluster;
        let selector = after.node_selector.clone();
        let other = other.clone();
        async move {
            let selected = nodes_selected_by(cluster, &selector).await?;
            Ok((selected == BTreeSet::from([other])).then_some(selected))
        }
    })
    .await?;
    assert_eq!(selected.len(), 1);
    let events = cluster
        .kubectl_ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=moving",
            "-o",
            "jsonpath={.items[*].reason}",
        ])
        .await?;
    assert!(events.contains("Replanned"), "events: {events}");
    Ok(())
}

fn writes(metrics: &ControllerMetrics) -> u64 {
    ["status", "node_labels"]
        .iter()
        .map(|object| {
            metrics
                .api_writes
                .get_or_create(&WriteLabel {
                    object: (*object).to_string(),
                })
                .get()
        })
        .sum()
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn only_the_leader_writes_and_a_handover_reserves_nothing_twice() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    add_node(&cluster, "h100-8x-nvswitch").await?;
    let lease_name = cluster.unique_name("lease");
    let start = |identity: &str| {
        let mut lease = LeaseConfig::new(cluster.namespace(), &lease_name, identity);
        lease.lease_duration = Duration::from_secs(4);
        lease.renew_deadline = Duration::from_secs(3);
        lease.retry_period = Duration::from_millis(500);
        let metrics = metrics();
        let handle = tokio::spawn(controller::run_elected(
            cluster.client(),
            scoped_config(&cluster, identity),
            lease,
            metrics.clone(),
            || {},
            std::future::pending(),
        ));
        (Running(handle), metrics)
    };
    let (alpha, alpha_metrics) = start("alpha");
    let (beta, beta_metrics) = start("beta");
    let spec = || {
        PlacementBuilder::serve("llama-3.1-70b")
            .precision(PrecisionChoice::Bf16)
            .concurrency(40)
            .spec()
    };
    create_placement(&cluster, "one", spec()).await?;
    let one = wait_state(&cluster, "one", "Planned").await?;
    let leases: Api<Lease> = Api::namespaced(cluster.client(), cluster.namespace());
    let holder = leases
        .get(&lease_name)
        .await?
        .spec
        .and_then(|s| s.holder_identity)
        .context("a holder")?;
    let (leader, leader_metrics, standby_metrics, standby) = match holder.as_str() {
        "alpha" => (alpha, alpha_metrics, beta_metrics, "beta"),
        "beta" => (beta, beta_metrics, alpha_metrics, "alpha"),
        other => bail!("unexpected holder {other}"),
    };
    assert!(writes(&leader_metrics) > 0, "the leader wrote");
    assert_eq!(writes(&standby_metrics), 0, "the standby wrote nothing");
    // Kill the leader: the standby takes over after the lease expires.
    drop(leader);
    create_placement(&cluster, "two", spec()).await?;
    let two = wait_state(&cluster, "two", "Planned").await?;
    let holder = leases
        .get(&lease_name)
        .await?
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some(standby));
    assert!(writes(&standby_metrics) > 0);
    let one_now = wait_state(&cluster, "one", "Planned").await?;
    assert_eq!(
        devices_of(&one_now),
        devices_of(&one),
        "held plans survive the handover"
    );
    assert!(
        devices_of(&one).is_disjoint(&devices_of(&two)),
        "the new leader's ledger knew the old leader's reservations"
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn graceful_shutdown_releases_the_lease() -> Result<()> {
    hwaccel::telemetry::init(hwaccel::telemetry::LogFormat::Text, "warn");
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let lease_name = cluster.unique_name("lease");
    let mut lease = LeaseConfig::new(cluster.namespace(), &lease_name, "solo");
    lease.retry_period = Duration::from_millis(500);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(controller::run_elected(
        cluster.client(),
        scoped_config(&cluster, "solo"),
        lease,
        metrics(),
        || {},
        async move {
            let _ = stopped.await;
        },
    ));
    let leases: Api<Lease> = Api::namespaced(cluster.client(), cluster.namespace());
    let holder = |leases: Api<Lease>, name: String| async move {
        anyhow::Ok(
            leases
                .get_opt(&name)
                .await?
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity),
        )
    };
    wait_for(DEFAULT_TIMEOUT, "solo leads", || {
        let check = holder(leases.clone(), lease_name.clone());
        async move { Ok(check.await?.filter(|h| h == "solo")) }
    })
    .await?;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .context("shutdown within 30 s")???;
    let after: Option<String> = holder(leases.clone(), lease_name.clone()).await?;
    assert_eq!(after, None, "released for the standby");
    Ok(())
}
