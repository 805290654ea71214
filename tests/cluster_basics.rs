//! Basic behaviour of the real control plane that the operator relies on.
//!
//! Needs a cluster: `tests/cluster/up.sh [--full] && cargo test --test cluster_tier -- --ignored cluster_basics::`
//! (see docs/testing.md). Every test works in its own namespace / with its own names.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, SelfSubjectReview, TokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Node, Pod, PodSpec, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind, ObjectMeta};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use support::{DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, wait_for};

fn labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

fn api_error(e: &kube::Error) -> Option<&kube::core::Status> {
    match e {
        kube::Error::Api(s) => Some(s),
        _ => None,
    }
}

/// (a) Server-side apply: a field manager that stops sending a label removes it;
/// labels owned by another manager are untouched.
#[tokio::test]
#[ignore = "needs cluster"]
async fn node_labels_server_side_apply() -> Result<()> {
    let tc = TestCluster::new().await?;
    let nodes: Api<Node> = Api::all(tc.client());
    let name = tc.unique_name("node");
    nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?;

    let apply = |mgr: &'static str, l: serde_json::Value| {
        let nodes = nodes.clone();
        let name = name.clone();
        async move {
            let patch = json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": name, "labels": l },
            });
            nodes
                .patch(&name, &PatchParams::apply(mgr), &Patch::Apply(&patch))
                .await
        }
    };
    apply(
        "test-manager-a",
        json!({ "hwaccel.io/a1": "x", "hwaccel.io/a2": "y" }),
    )
    .await?;
    apply("test-manager-b", json!({ "other.example.com/b": "z" })).await?;
    let n = apply("test-manager-a", json!({ "hwaccel.io/a1": "x2" })).await?;

    let l = labels(&n);
    ensure!(
        l.get("hwaccel.io/a1").map(String::as_str) == Some("x2"),
        "a1 not updated: {l:?}"
    );
    ensure!(
        !l.contains_key("hwaccel.io/a2"),
        "a2 should be removed when A stops applying it: {l:?}"
    );
    ensure!(
        l.get("other.example.com/b").map(String::as_str) == Some("z"),
        "B's label lost: {l:?}"
    );

    // Same result when read back, and the managers are recorded.
    let n = nodes.get(&name).await?;
    ensure!(
        labels(&n) == l,
        "read-back differs: {:?} vs {l:?}",
        labels(&n)
    );
    let managers: Vec<_> = n
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    ensure!(
        managers.iter().any(|m| m == "test-manager-a")
            && managers.iter().any(|m| m == "test-manager-b"),
        "managedFields: {managers:?}"
    );
    nodes.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}

/// (b) A CRD's OpenAPI schema and its CEL rules (`x-kubernetes-validations`) are
/// enforced by the apiserver.
#[tokio::test]
#[ignore = "needs cluster"]
async fn crd_schema_and_cel_validation() -> Result<()> {
    let tc = TestCluster::new().await?;
    let group = format!("{}.test.hwaccel.io", tc.prefix());
    let crd_name = format!("widgets.{group}");
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": crd_name },
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget" },
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": {
                        "type": "object",
                        "required": ["minReplicas", "maxReplicas"],
                        "properties": {
                            "minReplicas": { "type": "integer", "minimum": 0 },
                            "maxReplicas": { "type": "integer", "maximum": 100 },
                            "mode": { "type": "string", "enum": ["fast", "safe"] }
                        },
                        "x-kubernetes-validations": [{
                            "rule": "self.minReplicas <= self.maxReplicas",
                            "message": "minReplicas must not exceed maxReplicas"
                        }]
                    }}
                }}
            }]
        }
    }))?;
    let crds: Api<CustomResourceDefinition> = Api::all(tc.client());
    crds.create(&PostParams::default(), &crd).await?;
    tokio::time::timeout(
        DEFAULT_TIMEOUT,
        await_condition(crds.clone(), &crd_name, conditions::is_crd_established()),
    )
    .await
    .context("CRD not established in time")??;

    let gvk = GroupVersionKind::gvk(&group, "v1alpha1", "Widget");
    let widgets: Api<DynamicObject> = Api::namespaced_with(
        tc.client(),
        tc.namespace(),
        &ApiResource::from_gvk_with_plural(&gvk, "widgets"),
    );
    let widget = |name: &str, spec: serde_json::Value| -> Result<DynamicObject> {
        Ok(serde_json::from_value(json!({
            "apiVersion": format!("{group}/v1alpha1"), "kind": "Widget",
            "metadata": { "name": name }, "spec": spec,
        }))?)
    };

    // A valid object (the endpoint may need a moment after Established).
    let ok = widget(
        "ok",
        json!({ "minReplicas": 1, "maxReplicas": 3, "mode": "fast" }),
    )?;
    wait_for(DEFAULT_TIMEOUT, "valid Widget accepted", || {
        let (widgets, ok) = (widgets.clone(), ok.clone());
        async move {
            match widgets.create(&PostParams::default(), &ok).await {
                Ok(o) => Ok(Some(o)),
                Err(e) if api_error(&e).is_some_and(|s| s.code == 404) => Ok(None),
                Err(e) => Err(e.into()),
            }
        }
    })
    .await?;

    let reject = |name: &'static str, spec: serde_json::Value, want: &'static str| {
        let widgets = widgets.clone();
        let obj = widget(name, spec);
        async move {
            let err = match widgets.create(&PostParams::default(), &obj?).await {
                Ok(_) => bail!("{name}: invalid Widget was accepted"),
                Err(e) => e,
            };
            let s = api_error(&err).ok_or_else(|| anyhow!("{name}: not an API error: {err}"))?;
            ensure!(
                s.code == 422 && s.is_invalid(),
                "{name}: expected 422 Invalid, got {s:?}"
            );
            ensure!(
                s.message.contains(want),
                "{name}: message lacks {want:?}: {}",
                s.message
            );
            Ok(())
        }
    };
    reject(
        "schema-max",
        json!({ "minReplicas": 1, "maxReplicas": 101 }),
        "spec.maxReplicas",
    )
    .await?;
    reject(
        "schema-type",
        json!({ "minReplicas": "one", "maxReplicas": 2 }),
        "spec.minReplicas",
    )
    .await?;
    reject(
        "schema-enum",
        json!({ "minReplicas": 1, "maxReplicas": 2, "mode": "x" }),
        "spec.mode",
    )
    .await?;
    reject(
        "schema-required",
        json!({ "minReplicas": 1 }),
        "spec.maxReplicas",
    )
    .await?;
    reject(
        "cel",
        json!({ "minReplicas": 5, "maxReplicas": 2 }),
        "minReplicas must not exceed maxReplicas",
    )
    .await?;

    crds.delete(&crd_name, &DeleteParams::default()).await?;
    Ok(())
}

/// (c) Leases (what leader election uses): create, update with optimistic
/// concurrency (a stale resourceVersion is a 409), read back.
#[tokio::test]
#[ignore = "needs cluster"]
async fn lease_round_trip() -> Result<()> {
    let tc = TestCluster::new().await?;
    let leases: Api<Lease> = Api::namespaced(tc.client(), tc.namespace());
    let name = tc.unique_name("lease");
    // The apiserver keeps microseconds; round so the read-back compares equal.
    let now = || -> Result<MicroTime> {
        let t = k8s_openapi::jiff::Timestamp::now();
        Ok(MicroTime(k8s_openapi::jiff::Timestamp::from_microsecond(
            t.as_microsecond(),
        )?))
    };
    let acquired = now()?;
    let created = leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("holder-1".into()),
                    lease_duration_seconds: Some(15),
                    acquire_time: Some(acquired.clone()),
                    renew_time: Some(acquired.clone()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            },
        )
        .await?;

    let mut next = created.clone();
    let renewed = now()?;
    if let Some(spec) = next.spec.as_mut() {
        spec.holder_identity = Some("holder-2".into());
        spec.renew_time = Some(renewed.clone());
        spec.lease_transitions = Some(1);
    }
    let updated = leases.replace(&name, &PostParams::default(), &next).await?;
    ensure!(
        updated.metadata.resource_version != created.metadata.resource_version,
        "resourceVersion did not change"
    );

    // Replacing from the stale copy must conflict.
    let mut stale = created.clone();
    if let Some(spec) = stale.spec.as_mut() {
        spec.holder_identity = Some("holder-3".into());
    }
    match leases.replace(&name, &PostParams::default(), &stale).await {
        Ok(_) => bail!("stale update accepted"),
        Err(e) => ensure!(
            api_error(&e).is_some_and(|s| s.code == 409),
            "expected 409, got {e}"
        ),
    }

    let got = leases.get(&name).await?;
    let spec = got.spec.ok_or_else(|| anyhow!("lease has no spec"))?;
    ensure!(
        spec.holder_identity.as_deref() == Some("holder-2"),
        "holder: {:?}",
        spec.holder_identity
    );
    ensure!(spec.lease_duration_seconds == Some(15));
    ensure!(spec.lease_transitions == Some(1));
    ensure!(
        spec.acquire_time == Some(acquired),
        "acquireTime: {:?}",
        spec.acquire_time
    );
    ensure!(
        spec.renew_time == Some(renewed),
        "renewTime: {:?}",
        spec.renew_time
    );
    Ok(())
}

/// (d) A ValidatingAdmissionPolicy + binding is enforced by the apiserver.
#[tokio::test]
#[ignore = "needs cluster"]
async fn validating_admission_policy_enforced() -> Result<()> {
    let tc = TestCluster::new().await?;
    let policy_name = tc.unique_name("deny-forbidden-key");
    let message = "ConfigMaps here must not carry the key 'forbidden'";
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(tc.client());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(tc.client());
    // Only this test's namespace is affected (selected by its label).
    let this_namespace = MatchResources {
        namespace_selector: Some(LabelSelector {
            match_labels: Some([(TEST_LABEL.to_string(), tc.prefix().to_string())].into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    policies
        .create(
            &PostParams::default(),
            &ValidatingAdmissionPolicy {
                metadata: ObjectMeta {
                    name: Some(policy_name.clone()),
                    ..Default::default()
                },
                spec: Some(ValidatingAdmissionPolicySpec {
                    failure_policy: Some("Fail".into()),
                    match_constraints: Some(MatchResources {
                        resource_rules: Some(vec![NamedRuleWithOperations {
                            api_groups: Some(vec![String::new()]),
                            api_versions: Some(vec!["v1".into()]),
                            operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                            resources: Some(vec!["configmaps".into()]),
                            ..Default::default()
                        }]),
                        ..this_namespace.clone()
                    }),
                    validations: Some(vec![Validation {
                        expression: "!has(object.data) || !('forbidden' in object.data)".into(),
                        message: Some(message.into()),
                        reason: Some("Forbidden".into()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                status: None,
            },
        )
        .await?;
    bindings
        .create(
            &PostParams::default(),
            &ValidatingAdmissionPolicyBinding {
                metadata: ObjectMeta {
                    name: Some(policy_name.clone()),
                    ..Default::default()
                },
                spec: ValidatingAdmissionPolicyBindingSpec {
                    policy_name: policy_name.clone(),
                    validation_actions: vec!["Deny".into()],
                    match_resources: Some(this_namespace),
                    ..Default::default()
                },
            },
        )
        .await?;

    let cms: Api<ConfigMap> = Api::namespaced(tc.client(), tc.namespace());
    let cm = |name: &str, key: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some([(key.to_string(), "v".to_string())].into()),
        ..Default::default()
    };
    // The policy reaches the admission plugin asynchronously: retry until denied.
    let status = wait_for(DEFAULT_TIMEOUT, "the policy to deny a ConfigMap", || {
        let (cms, bad) = (cms.clone(), cm("bad", "forbidden"));
        async move {
            match cms.create(&PostParams::default(), &bad).await {
                Ok(_) => {
                    cms.delete("bad", &DeleteParams::default()).await?;
                    Ok(None)
                }
                Err(kube::Error::Api(s)) => Ok(Some(s)),
                Err(e) => Err(e.into()),
            }
        }
    })
    .await?;
    ensure!(
        status.code == 403 && status.is_forbidden(),
        "expected 403 Forbidden, got {status:?}"
    );
    ensure!(
        status.message.contains(message),
        "message: {}",
        status.message
    );
    ensure!(
        status.message.contains(&policy_name),
        "message should name the policy: {}",
        status.message
    );

    // Allowed objects still go through.
    cms.create(&PostParams::default(), &cm("good", "allowed"))
        .await?;

    bindings
        .delete(&policy_name, &DeleteParams::default())
        .await?;
    policies
        .delete(&policy_name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// ServiceAccount tokens bound to a Pod carry the node name, and the apiserver puts it
/// in the user's `extra["authentication.kubernetes.io/node-name"]` (what the agent's
/// ValidatingAdmissionPolicy keys on).
#[tokio::test]
#[ignore = "needs cluster"]
async fn pod_bound_token_carries_node_name() -> Result<()> {
    let tc = TestCluster::new().await?;
    let node_name = tc.unique_name("node");
    let nodes: Api<Node> = Api::all(tc.client());
    nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some(node_name.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(tc.client(), tc.namespace());
    sas.create(
        &PostParams::default(),
        &ServiceAccount {
            metadata: ObjectMeta {
                name: Some("agent".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(tc.client(), tc.namespace());
    let pod = pods
        .create(
            &PostParams::default(),
            &Pod {
                metadata: ObjectMeta {
                    name: Some("agent".into()),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    node_name: Some(node_name.clone()),
                    service_account_name: Some("agent".into()),
                    containers: vec![Container {
                        name: "agent".into(),
                        image: Some("registry.invalid/never-pulled:0".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await?;

    let tr = sas
        .create_token_request(
            "agent",
            &PostParams::default(),
            &TokenRequest {
                spec: Some(TokenRequestSpec {
                    expiration_seconds: Some(600),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: pod.metadata.name.clone(),
                        uid: pod.metadata.uid.clone(),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await?;
    let token = tr
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| anyhow!("TokenRequest without a token"))?;

    let as_agent = tc.client_with_token(&token).await?;
    let review = Api::<SelfSubjectReview>::all(as_agent)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let user = review
        .status
        .and_then(|s| s.user_info)
        .ok_or_else(|| anyhow!("SelfSubjectReview without userInfo"))?;
    let want_user = format!("system:serviceaccount:{}:agent", tc.namespace());
    ensure!(
        user.username.as_deref() == Some(want_user.as_str()),
        "username: {:?}",
        user.username
    );
    let extra = user.extra.unwrap_or_default();
    ensure!(
        extra.get("authentication.kubernetes.io/node-name") == Some(&vec![node_name.clone()]),
        "node-name claim missing: {extra:?}"
    );
    ensure!(
        extra.get("authentication.kubernetes.io/pod-name") == Some(&vec!["agent".to_string()]),
        "pod-name claim missing: {extra:?}"
    );
    nodes.delete(&node_name, &DeleteParams::default()).await?;
    Ok(())
}

/// Full tier only: a Node annotated `kwok.x-k8s.io/node=fake` is made Ready by kwok
/// (reporting only the loopback address), and a Pod scheduled onto it runs.
#[tokio::test]
#[ignore = "needs cluster"]
async fn kwok_fake_node_runs_pods() -> Result<()> {
    let tc = TestCluster::new().await?;
    if !tc.full() {
        eprintln!("skipped: needs the full tier (tests/cluster/up.sh --full)");
        return Ok(());
    }
    let name = tc.unique_name("kwok-node");
    let nodes: Api<Node> = Api::all(tc.client());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": { "kwok.x-k8s.io/node": "fake" },
                    "labels": { "kubernetes.io/hostname": name, "type": "kwok" },
                },
            }))?,
        )
        .await?;
    let node = wait_for(DEFAULT_TIMEOUT, "kwok node Ready", || {
        let (nodes, name) = (nodes.clone(), name.clone());
        async move {
            let n = nodes.get(&name).await?;
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            Ok(ready.then_some(n))
        }
    })
    .await?;
    let addrs: Vec<_> = node
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .collect();
    ensure!(
        addrs == ["127.0.0.1"],
        "kwok node must only advertise loopback: {addrs:?}"
    );

    // kcm creates the namespace's default ServiceAccount; the scheduler binds the
    // Pod; kwok marks it Running.
    let pods: Api<Pod> = Api::namespaced(tc.client(), tc.namespace());
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "fake" },
        "spec": {
            "nodeSelector": { "kubernetes.io/hostname": name },
            "containers": [{ "name": "c", "image": "registry.invalid/never-pulled:0" }],
        },
    }))?;
    wait_for(
        DEFAULT_TIMEOUT,
        "Pod created (default ServiceAccount exists)",
        || {
            let (pods, pod) = (pods.clone(), pod.clone());
            async move {
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(p) => Ok(Some(p)),
                    Err(e)
                        if api_error(&e).is_some_and(|s| {
                            s.code == 403 && s.message.contains("serviceaccount")
                        }) =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e.into()),
                }
            }
        },
    )
    .await?;
    let running = wait_for(
        Duration::from_secs(180),
        "Pod Running on the kwok node",
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("fake").await?;
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                Ok((phase.as_deref() == Some("Running")).then_some(p))
            }
        },
    )
    .await?;
    let bound = running.spec.and_then(|s| s.node_name);
    ensure!(
        bound.as_deref() == Some(name.as_str()),
        "bound to {bound:?}"
    );
    Ok(())
}
