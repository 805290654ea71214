//! Workloads rendered from plans and from placement statuses: pod counts, devices, where the
//! pods may go, and what is refused.

use super::*;
use crate::api::placement::{
    Assignment, EngineStatus, PlanStatus, PodClaimFragment, PodResourceClaimRef,
    PodResourceClaimTemplateRef, PodTemplateClaimFragment,
};
use crate::plan::inventory::Reservations;
use crate::plan::model::presets;
use crate::plan::search::{PlanRequest, plan};
use crate::plan::shorthand::parse_hardware;

fn args() -> EmitArgs {
    EmitArgs {
        emit: Some(EmitKind::Deployment),
        placement: None,
        image: None,
        served_model: None,
        name: None,
        namespace: None,
        resource_name: None,
    }
}

fn planned(preset: &str, hardware: &str, context: u64, concurrency: u64) -> (Plan, Vec<NodeSpec>) {
    planned_with(
        preset,
        hardware,
        PlanRequest::serve(Some(context), concurrency),
    )
}

fn planned_with(preset: &str, hardware: &str, request: PlanRequest) -> (Plan, Vec<NodeSpec>) {
    let model = presets::find(preset).unwrap().unwrap();
    let nodes = parse_hardware(hardware).unwrap();
    (
        plan(&model, &nodes, &Reservations::none(), &request).unwrap(),
        nodes,
    )
}

#[test]
fn one_node_replicas_become_one_deployment_pinned_to_the_planned_nodes() {
    let (plan, nodes) = planned("llama-3.1-8b", "2x4xH100", 8192, 200);
    assert!(plan.fits, "{}", plan.to_table());
    let work = from_plan(&args(), &plan, &nodes).unwrap().unwrap();
    assert_eq!(work.replicas, plan.replicas.unwrap());
    assert_eq!(work.nodes_per_replica, 1);
    assert_eq!(work.devices_per_pod, plan.tp.unwrap() * plan.pp.unwrap());
    assert_eq!(work.model, "meta-llama/Llama-3.1-8B-Instruct");
    let objects = objects(&work, EmitKind::Deployment).unwrap();
    let [deployment] = objects.as_slice() else {
        panic!("one Deployment: {objects:?}");
    };
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["spec"]["replicas"], plan.replicas.unwrap());
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["resources"]["limits"]["nvidia.com/gpu"],
        work.devices_per_pod.to_string()
    );
    assert_eq!(container["command"], json!(["vllm", "serve"]));
    let args: Vec<String> = serde_json::from_value(container["args"].clone()).unwrap();
    assert_eq!(args[0], work.model);
    assert_eq!(&args[1..], plan.engine.as_ref().unwrap().vllm.as_slice());
    let hosts = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(hosts["key"], "kubernetes.io/hostname");
    let planned_nodes: BTreeSet<&str> = plan.assignments.iter().map(|a| a.node.as_str()).collect();
    let values: BTreeSet<&str> = hosts["values"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(values, planned_nodes);
    // The selector matches the template's labels (the apiserver refuses it otherwise).
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
    );
}

#[test]
fn a_replica_across_nodes_is_a_leader_worker_set_and_not_a_deployment() {
    // 405B in bf16 (810 GB) needs two 8 x 80 GB nodes per replica.
    let request =
        PlanRequest::serve(Some(8192), 1).with_precision(crate::hardware::Precision::Bf16);
    let (plan, nodes) = planned_with("llama-3.1-405b", "2x8xH100+ib", request);
    assert!(plan.fits, "{}", plan.to_table());
    let work = from_plan(&args(), &plan, &nodes).unwrap().unwrap();
    assert!(work.nodes_per_replica > 1, "{work:?}");
    let err = objects(&work, EmitKind::Deployment).unwrap_err();
    assert!(err.to_string().contains("--emit lws"), "{err}");
    let [lws] = objects(&work, EmitKind::Lws).unwrap().try_into().unwrap();
    assert_eq!(lws["apiVersion"], "leaderworkerset.x-k8s.io/v1");
    let group = &lws["spec"]["leaderWorkerTemplate"];
    assert_eq!(group["size"], work.nodes_per_replica);
    for template in ["leaderTemplate", "workerTemplate"] {
        let container = &group[template]["spec"]["containers"][0];
        assert_eq!(
            container["resources"]["limits"]["nvidia.com/gpu"],
            work.devices_per_pod.to_string()
        );
    }
    let leader = group["leaderTemplate"]["spec"]["containers"][0]["args"][0]
        .as_str()
        .unwrap();
    assert!(
        leader.contains("--ray_cluster_size=$(LWS_GROUP_SIZE)"),
        "{leader}"
    );
    assert!(
        leader.contains("vllm serve meta-llama/Llama-3.1-405B-Instruct --tensor-parallel-size"),
        "{leader}"
    );
    assert!(
        leader.contains("--distributed-executor-backend ray"),
        "{leader}"
    );
    let worker = group["workerTemplate"]["spec"]["containers"][0]["args"][0]
        .as_str()
        .unwrap();
    assert!(
        worker.contains("worker --ray_address=$(LWS_LEADER_ADDRESS)"),
        "{worker}"
    );
}

#[test]
fn a_plan_that_does_not_fit_emits_nothing_but_its_reasons() {
    let (plan, nodes) = planned("llama-3.1-405b", "1x1xL4", 8192, 1);
    assert!(!plan.fits);
    let refusal = from_plan(&args(), &plan, &nodes).unwrap().unwrap_err();
    assert!(!refusal.is_empty());
}

#[test]
fn amd_devices_ask_for_the_amd_plugin_resource_and_a_flag_overrides_it() {
    let (plan, nodes) = planned("llama-3.1-8b", "1x8xMI300X", 8192, 1);
    let work = from_plan(&args(), &plan, &nodes).unwrap().unwrap();
    assert!(matches!(&work.target, Target::Hosts { resource, .. } if resource == "amd.com/gpu"));
    let mut flags = args();
    flags.resource_name = Some("example.com/accel".into());
    let work = from_plan(&flags, &plan, &nodes).unwrap().unwrap();
    assert!(
        matches!(&work.target, Target::Hosts { resource, .. } if resource == "example.com/accel")
    );
}

/// Issue 35: `--emit` with `--placement` asked for `nvidia.com/gpu` whatever the devices; an
/// AMD plan's status (as the controller writes it) now gives the AMD plugin's resource, and a
/// status naming none is refused with the way out instead of a guess.
#[test]
fn a_placements_pods_ask_for_its_devices_vendor_resource() {
    let (plan, _) = planned("llama-3.1-8b", "1x8xMI300X", 8192, 1);
    let mut st = crate::controller::placement::core::outcome::planned_status(&plan, "ml", "llama");
    st.allocation = Some("labels".into());
    let engine = st.engine.as_ref().unwrap();
    assert!(
        engine.image.as_deref().unwrap_or_default().contains("rocm"),
        "{engine:?}"
    );
    let work = from_placement(&args(), placement(st.clone()))
        .unwrap()
        .unwrap();
    assert!(
        matches!(&work.target, Target::Selector { resource, .. } if resource == "amd.com/gpu"),
        "{:?}",
        work.target
    );
    let container = &objects(&work, EmitKind::Deployment).unwrap()[0]["spec"]["template"]["spec"]["containers"]
        [0];
    assert_eq!(
        container["resources"]["limits"]["amd.com/gpu"],
        work.devices_per_pod.to_string()
    );
    assert!(
        container["resources"]["limits"]
            .get("nvidia.com/gpu")
            .is_none()
    );

    st.engine.as_mut().unwrap().device_resource = None;
    let refused = from_placement(&args(), placement(st.clone())).unwrap_err();
    assert!(refused.to_string().contains("--resource-name"), "{refused}");
    let mut flags = args();
    flags.resource_name = Some("example.com/accel".into());
    let work = from_placement(&flags, placement(st)).unwrap().unwrap();
    assert!(
        matches!(&work.target, Target::Selector { resource, .. } if resource == "example.com/accel")
    );
}

fn status(allocation: &str, replicas: u32) -> ModelPlacementStatus {
    ModelPlacementStatus {
        state: Some("Planned".into()),
        model: Some("llama-3.1-8b".into()),
        plan: Some(PlanStatus {
            precision: "bf16".into(),
            tensor_parallel: 2,
            pipeline_parallel: 1,
            replicas,
            devices: 2 * replicas,
            nodes: replicas,
            ..PlanStatus::default()
        }),
        assignments: (0..replicas)
            .map(|r| Assignment {
                node: format!("node-{r}"),
                devices: vec!["0".into(), "1".into()],
                replica: r,
                stage: 0,
            })
            .collect(),
        node_selector: BTreeMap::from([("hwaccel.io/placement-x".into(), "true".into())]),
        allocation: Some(allocation.into()),
        engine: Some(EngineStatus {
            model: Some("meta-llama/Llama-3.1-8B-Instruct".into()),
            vllm: vec!["--tensor-parallel-size".into(), "2".into()],
            sglang: vec![],
            notes: vec![],
            device_resource: Some("nvidia.com/gpu".into()),
            ..EngineStatus::default()
        }),
        ..ModelPlacementStatus::default()
    }
}

fn placement(status: ModelPlacementStatus) -> PlacementObject {
    let value = json!({
        "apiVersion": "hwaccel.io/v1alpha1",
        "kind": "ModelPlacement",
        "metadata": {"name": "llama", "namespace": "ml", "managedFields": [{"manager": "x"}]},
        "spec": {"model": {"preset": "llama-3.1-8b"}, "goal": {"serve": {}}},
        "status": status,
    });
    parse_placement(&serde_json::to_string(&value).unwrap()).unwrap()
}

#[test]
fn a_labels_placement_selects_its_nodes_by_the_status_selector() {
    let work = from_placement(&args(), placement(status("labels", 2)))
        .unwrap()
        .unwrap();
    assert_eq!(
        (work.name.as_str(), work.namespace.as_deref()),
        ("llama", Some("ml"))
    );
    let [deployment] = objects(&work, EmitKind::Deployment)
        .unwrap()
        .try_into()
        .unwrap();
    assert_eq!(deployment["metadata"]["namespace"], "ml");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["hwaccel.io/placement-x"], "true");
    assert!(pod.get("affinity").is_none());
    assert_eq!(
        pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "2"
    );
    assert_eq!(
        pod["containers"][0]["args"],
        json!([
            "meta-llama/Llama-3.1-8B-Instruct",
            "--tensor-parallel-size",
            "2"
        ])
    );
}

#[test]
fn a_claims_placement_gives_each_replica_its_own_deployment_and_claim() {
    let mut st = status("claims", 2);
    st.claims = (0..2)
        .map(|r| PlacementClaim {
            name: format!("llama-r{r}-s0"),
            replica: r,
            stage: 0,
            node: format!("node-{r}"),
            devices: vec![],
            allocated: true,
            pod_template: PodClaimFragment {
                resource_claims: vec![PodResourceClaimRef {
                    name: "accelerators".into(),
                    resource_claim_name: format!("llama-r{r}-s0"),
                }],
                node_selector: BTreeMap::from([(
                    "kubernetes.io/hostname".into(),
                    format!("node-{r}"),
                )]),
            },
        })
        .collect();
    let work = from_placement(&args(), placement(st)).unwrap().unwrap();
    let deployments = objects(&work, EmitKind::Deployment).unwrap();
    assert_eq!(deployments.len(), 2);
    for (r, deployment) in deployments.iter().enumerate() {
        assert_eq!(deployment["spec"]["replicas"], 1);
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(
            pod["resourceClaims"][0]["resourceClaimName"],
            format!("llama-r{r}-s0")
        );
        assert_eq!(
            pod["nodeSelector"]["kubernetes.io/hostname"],
            format!("node-{r}")
        );
        let resources = &pod["containers"][0]["resources"];
        assert_eq!(resources["claims"][0]["name"], "accelerators");
        assert!(
            resources.get("limits").is_none(),
            "claims, not extended resources"
        );
    }
    // Two replicas' claims cannot share one LeaderWorkerSet template.
    assert!(objects(&work, EmitKind::Lws).is_err());
}

#[test]
fn a_claim_template_placement_names_the_template_in_every_pod() {
    let mut st = status("claimTemplate", 3);
    st.pod_template = Some(PodTemplateClaimFragment {
        resource_claims: vec![PodResourceClaimTemplateRef {
            name: "accelerators".into(),
            resource_claim_template_name: "llama".into(),
        }],
    });
    let work = from_placement(&args(), placement(st)).unwrap().unwrap();
    let [deployment] = objects(&work, EmitKind::Deployment)
        .unwrap()
        .try_into()
        .unwrap();
    assert_eq!(deployment["spec"]["replicas"], 3);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["resourceClaims"][0]["resourceClaimTemplateName"],
        "llama"
    );
}

#[test]
fn an_unplanned_placement_emits_its_reasons_and_bad_files_are_errors() {
    let pending = ModelPlacementStatus {
        state: Some("Pending".into()),
        reasons: vec!["weights need 810 GB".into()],
        suggestions: vec!["precision fp8".into()],
        ..ModelPlacementStatus::default()
    };
    let refusal = from_placement(&args(), placement(pending))
        .unwrap()
        .unwrap_err();
    assert_eq!(refusal, ["weights need 810 GB", "precision fp8"]);
    let mut old = status("labels", 1);
    old.engine = None;
    assert!(from_placement(&args(), placement(old)).is_err());
    assert!(parse_placement("kind: Deployment\n").is_err());
    assert!(parse_placement("{not yaml: [").is_err());
    let list =
        json!({"kind": "List", "items": [{"kind": "ModelPlacement", "metadata": {"name": "a"}}]});
    assert!(parse_placement(&list.to_string()).is_ok());
}

#[test]
fn names_are_dns_labels_and_odd_arguments_are_quoted_for_the_shell() {
    assert_eq!(dns_name("llama-3.1-70b"), "llama-3-1-70b");
    assert_eq!(dns_name("70B params"), "m-70b-params");
    assert_eq!(dns_name("..."), "model");
    assert!(dns_name(&"x".repeat(200)).len() <= 50);
    assert_eq!(
        shell_quote("meta-llama/Llama-3.1-8B"),
        "meta-llama/Llama-3.1-8B"
    );
    assert_eq!(shell_quote("a b"), "'a b'");
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
}

#[test]
fn yaml_streams_and_json_lists_hold_every_object() {
    let work = from_placement(&args(), placement(status("labels", 1)))
        .unwrap()
        .unwrap();
    let yaml = render(&work, EmitKind::Deployment, Format::Yaml).unwrap();
    assert!(
        yaml.starts_with("---\n") && yaml.contains("kind: Deployment"),
        "{yaml}"
    );
    let json: Value =
        serde_json::from_str(&render(&work, EmitKind::Lws, Format::Json).unwrap()).unwrap();
    assert_eq!(json["kind"], "LeaderWorkerSet");
}

#[test]
fn a_disaggregated_plan_becomes_a_decode_and_a_prefill_workload_on_their_own_nodes() {
    let mut request = PlanRequest::serve(Some(8192), 32);
    request.disaggregation = Some(crate::plan::search::Disaggregation::default());
    let (plan, nodes) = planned_with("llama-3.1-70b", "1x4xH100+nvswitch,1x4xL40S", request);
    let prefill = plan.prefill.as_deref().expect("a prefill pool");
    assert!(plan.fits && prefill.fits, "{}", plan.to_table());
    let work = from_plan(&args(), &plan, &nodes).unwrap().unwrap();
    let pool = work.prefill.as_deref().expect("the prefill workload");
    assert_eq!(
        (work.name.as_str(), pool.name.as_str()),
        ("llama-3-1-70b-decode", "llama-3-1-70b-prefill")
    );
    let deployments = objects(&work, EmitKind::Deployment).unwrap();
    let [decode, prefill_deployment] = deployments.as_slice() else {
        panic!("two Deployments: {deployments:?}");
    };
    let nodes_of = |deployment: &Value| {
        deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchExpressions"][0]["values"]
            .clone()
    };
    assert_ne!(nodes_of(decode), nodes_of(prefill_deployment));
    let args_of = |deployment: &Value| {
        deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string()
    };
    for (deployment, expected) in [(decode, &plan), (prefill_deployment, prefill)] {
        let tp = expected.tp.unwrap().to_string();
        assert!(
            args_of(deployment).contains(&format!("\"--tensor-parallel-size\",\"{tp}\"")),
            "{}",
            args_of(deployment)
        );
        assert!(args_of(deployment).contains("NixlConnector"));
    }
}

#[test]
fn a_disaggregated_placement_selects_each_pool_by_its_role_label() {
    let mut st = status("labels", 2);
    st.decode = Some(crate::api::placement::RoleNodes {
        node_names: Some("node-0,node-1".into()),
        node_selector: BTreeMap::from([(
            "decode.placement.hwaccel.io/ml.llama".into(),
            "true".into(),
        )]),
    });
    st.prefill = Some(crate::api::placement::PrefillStatus {
        plan: Some(PlanStatus {
            tensor_parallel: 1,
            replicas: 1,
            devices: 1,
            nodes: 1,
            ..PlanStatus::default()
        }),
        assignments: vec![Assignment {
            node: "node-9".into(),
            devices: vec!["0".into()],
            replica: 0,
            stage: 0,
        }],
        node_names: Some("node-9".into()),
        node_selector: BTreeMap::from([(
            "prefill.placement.hwaccel.io/ml.llama".into(),
            "true".into(),
        )]),
        engine: Some(EngineStatus {
            model: Some("meta-llama/Llama-3.1-8B-Instruct".into()),
            vllm: vec!["--tensor-parallel-size".into(), "1".into()],
            sglang: vec![],
            notes: vec![],
            ..EngineStatus::default()
        }),
    });
    let work = from_placement(&args(), placement(st.clone()))
        .unwrap()
        .unwrap();
    let [decode, prefill] = objects(&work, EmitKind::Deployment)
        .unwrap()
        .try_into()
        .unwrap();
    assert_eq!(
        (
            decode["metadata"]["name"].as_str(),
            prefill["metadata"]["name"].as_str()
        ),
        (Some("llama-decode"), Some("llama-prefill"))
    );
    let selector = |d: &Value| d["spec"]["template"]["spec"]["nodeSelector"].clone();
    assert_eq!(
        selector(&decode),
        json!({"decode.placement.hwaccel.io/ml.llama": "true"})
    );
    assert_eq!(
        selector(&prefill),
        json!({"prefill.placement.hwaccel.io/ml.llama": "true"})
    );
    assert_eq!(
        (
            decode["spec"]["replicas"].as_u64(),
            prefill["spec"]["replicas"].as_u64()
        ),
        (Some(2), Some(1))
    );
    // A status whose decode pool has no role selector is refused, not emitted to every node.
    st.decode = None;
    assert!(from_placement(&args(), placement(st)).is_err());
}
