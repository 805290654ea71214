//! The Helm chart's security invariants, checked on `helm template` output: every container
//! hardened, every host mount read-only and on the narrow list, RBAC without wildcards, the
//! admission policies bound to the chart's own service accounts, optional parts rendered only
//! when asked. Skipped with a notice when no helm binary is found (see `tests/helm/mod.rs`).

use crate::helm;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use helm::{chart_dir, documents, find_helm, name_of, of_kind, skip_notice};

const NAMESPACE: &str = "hwaccel-system";
const NODE_NAME_CLAIM: &str = "authentication.kubernetes.io/node-name";

/// Renders the repository's chart as release `hwaccel` in `hwaccel-system`, or `None` without
/// helm. Panics with helm's message when rendering fails.
fn render(test: &str, extra: &[&str]) -> Option<Vec<Value>> {
    render_chart(test, &chart_dir(), "hwaccel", NAMESPACE, extra)
}

fn render_chart(
    test: &str,
    chart: &Path,
    release: &str,
    namespace: &str,
    extra: &[&str],
) -> Option<Vec<Value>> {
    let Some(helm) = find_helm() else {
        skip_notice(test);
        return None;
    };
    match helm::template(&helm, chart, release, namespace, extra) {
        Ok(yaml) => Some(documents(&yaml)),
        Err(err) => panic!("helm template {extra:?} failed:\n{err}"),
    }
}

/// Every pod template in the rendered objects, with the name of the workload it belongs to.
fn pod_specs(docs: &[Value]) -> Vec<(String, &Value)> {
    docs.iter()
        .filter(|doc| {
            matches!(
                doc["kind"].as_str(),
                Some("DaemonSet" | "Deployment" | "Job")
            )
        })
        .map(|doc| {
            let label = format!("{}/{}", doc["kind"].as_str().unwrap_or("?"), name_of(doc));
            (label, &doc["spec"]["template"]["spec"])
        })
        .collect()
}

fn containers(pod: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|field| pod[field].as_array())
        .flatten()
        .collect()
}

/// A container's setting, falling back to the pod's security context (Kubernetes' own rule
/// for the fields both levels have).
fn effective<'a>(pod: &'a Value, container: &'a Value, field: &str) -> &'a Value {
    let own = &container["securityContext"][field];
    if own.is_null() {
        &pod["securityContext"][field]
    } else {
        own
    }
}

fn assert_hardened(docs: &[Value], expect_non_root: bool) {
    let pods = pod_specs(docs);
    assert!(
        pods.len() >= 3,
        "expected agent, controller and cleanup pods, got {pods:?}"
    );
    for (workload, pod) in pods {
        for flag in ["hostNetwork", "hostPID", "hostIPC"] {
            assert_ne!(pod[flag], true, "{workload}: {flag}");
        }
        let all = containers(pod);
        assert!(!all.is_empty(), "{workload} has no containers");
        for container in all {
            let what = format!("{workload} container {}", container["name"]);
            let security = &container["securityContext"];
            assert_eq!(
                security["readOnlyRootFilesystem"], true,
                "{what}: readOnlyRootFilesystem"
            );
            assert_eq!(
                security["allowPrivilegeEscalation"], false,
                "{what}: allowPrivilegeEscalation"
            );
            assert_ne!(security["privileged"], true, "{what}: privileged");
            let dropped: Vec<&Value> = security["capabilities"]["drop"]
                .as_array()
                .map(|list| list.iter().collect())
                .unwrap_or_default();
            assert!(
                dropped.contains(&&Value::from("ALL")),
                "{what}: capabilities.drop lacks ALL"
            );
            let added = &security["capabilities"]["add"];
            assert!(
                added.is_null() || added.as_array().is_some_and(Vec::is_empty),
                "{what}: adds capabilities {added}"
            );
            assert_eq!(
                effective(pod, container, "seccompProfile")["type"],
                "RuntimeDefault",
                "{what}: seccomp"
            );
            if expect_non_root {
                assert_eq!(
                    effective(pod, container, "runAsNonRoot"),
                    true,
                    "{what}: runAsNonRoot"
                );
                let uid = effective(pod, container, "runAsUser");
                assert!(
                    uid.as_u64().is_some_and(|uid| uid > 0),
                    "{what}: runAsUser {uid}"
                );
            }
        }
    }
}

fn agent_daemonset(docs: &[Value]) -> &Value {
    let daemonsets = of_kind(docs, "DaemonSet");
    assert_eq!(daemonsets.len(), 1, "exactly one DaemonSet (the agent)");
    daemonsets[0]
}

#[test]
fn default_render_has_every_component() {
    let Some(docs) = render("default_render_has_every_component", &[]) else {
        return;
    };
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|doc| doc["kind"].as_str()).collect();
    for kind in [
        "DaemonSet",
        "Deployment",
        "PodDisruptionBudget",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "Service",
        "Job",
    ] {
        assert!(
            kinds.contains(kind),
            "no {kind} in the default render: {kinds:?}"
        );
    }
    assert!(
        !kinds.contains("ServiceMonitor"),
        "ServiceMonitor must be opt-in"
    );

    let agent = agent_daemonset(&docs);
    let container = &agent["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"].as_array().expect("agent env");
    let node_name = env
        .iter()
        .find(|var| var["name"] == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        node_name["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(args.first(), Some(&"agent"));
    assert!(args.contains(&"--node-name=$(NODE_NAME)"), "{args:?}");
    assert!(args.contains(&"--host-root=/host"), "{args:?}");

    let tolerations = &agent["spec"]["template"]["spec"]["tolerations"];
    assert_eq!(
        tolerations[0]["operator"], "Exists",
        "the agent must run on tainted GPU nodes"
    );
    assert!(
        tolerations[0]["key"].is_null(),
        "tolerate every taint by default"
    );

    let deployments = of_kind(&docs, "Deployment");
    let controller = deployments[0];
    assert_eq!(controller["spec"]["replicas"], 2);
    let pod = &controller["spec"]["template"]["spec"];
    assert!(
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            .is_array(),
        "controller replicas should prefer different nodes"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        for (workload, pod) in [
            ("agent", &agent["spec"]["template"]["spec"]),
            ("controller", pod),
        ] {
            assert_eq!(
                pod["containers"][0][probe]["httpGet"]["port"], "health",
                "{workload} {probe}: the probes have a port of their own (issue 27 item 3)"
            );
        }
    }
}

/// Issue 27 item 3 and issue 28: the probes use a port no Service exposes and no NetworkPolicy
/// rule admits a pod to, and the readiness probe waits longer than `/readyz` holds a request,
/// so a normal start answers the first probe 200 instead of a Warning.
#[test]
fn probes_have_their_own_port_and_outwait_the_held_readiness_answer() {
    let test = "probes_have_their_own_port_and_outwait_the_held_readiness_answer";
    let Some(docs) = render(test, &[]) else {
        return;
    };
    let hold = hwaccel::server::READY_HOLD.as_secs();
    for workload in [
        of_kind(&docs, "DaemonSet")[0],
        of_kind(&docs, "Deployment")[0],
    ] {
        let name = name_of(workload);
        let container = &workload["spec"]["template"]["spec"]["containers"][0];
        let ports = container["ports"].as_array().expect("ports");
        let port_of = |wanted: &str| {
            ports
                .iter()
                .find(|p| p["name"] == wanted)
                .and_then(|p| p["containerPort"].as_u64())
                .unwrap_or_else(|| panic!("{name}: no port {wanted}"))
        };
        let (health, metrics) = (port_of("health"), port_of("metrics"));
        assert_ne!(health, metrics, "{name}");
        let args = container["args"].to_string();
        assert!(
            args.contains(&format!("--health-addr=0.0.0.0:{health}")),
            "{name}: {args}"
        );
        assert!(
            args.contains(&format!("--metrics-addr=0.0.0.0:{metrics}")),
            "{name}: {args}"
        );
        let readiness = &container["readinessProbe"];
        let timeout = readiness["timeoutSeconds"]
            .as_u64()
            .expect("timeoutSeconds");
        assert!(
            timeout > hold,
            "{name}: readiness timeoutSeconds {timeout} must exceed the {hold} s hold of /readyz"
        );
        assert!(
            readiness["initialDelaySeconds"].as_u64().unwrap_or(0) >= 1,
            "{name}"
        );
        let liveness = &container["livenessProbe"];
        assert_eq!(liveness["httpGet"]["path"], "/healthz", "{name}");
    }
    for service in of_kind(&docs, "Service") {
        let ports = service["spec"]["ports"].to_string();
        assert!(
            !ports.contains("health"),
            "{} exposes the health port: {ports}",
            name_of(service)
        );
    }
    for policy in of_kind(&docs, "NetworkPolicy") {
        let rules = policy["spec"]["ingress"].to_string();
        assert!(
            !rules.contains("health"),
            "{} admits a peer to the health port: {rules}",
            name_of(policy)
        );
    }
    // One port for both is refused, by the schema and by the template's own check.
    let Some(helm) = find_helm() else {
        return;
    };
    for extra in [&[][..], &["--skip-schema-validation"][..]] {
        let err = template_with_values(&helm, "probes:\n  port: 8080\n", extra)
            .expect_err("probes.port = metrics.port");
        assert!(err.contains("must differ from metrics.port"), "{err}");
    }
}

#[test]
fn every_container_is_hardened() {
    let Some(docs) = render("every_container_is_hardened", &[]) else {
        return;
    };
    assert_hardened(&docs, true);
    let Some(docs) = render(
        "every_container_is_hardened",
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "agent.supplementalGroups={44,109}",
        ],
    ) else {
        return;
    };
    assert_hardened(&docs, true);
    let pod = &agent_daemonset(&docs)["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"]["supplementalGroups"],
        serde_json::json!([44, 109])
    );
}

#[test]
fn run_as_root_switch_changes_only_the_agent_uid() {
    let Some(docs) = render(
        "run_as_root_switch_changes_only_the_agent_uid",
        ROOT_WITH_RECURSIVE_READ_ONLY,
    ) else {
        return;
    };
    // Capabilities, read-only root and no privilege escalation stay for every container.
    assert_hardened(&docs, false);
    let agent = &agent_daemonset(&docs)["spec"]["template"]["spec"];
    assert_eq!(agent["securityContext"]["runAsUser"], 0);
    assert_eq!(agent["securityContext"]["runAsNonRoot"], false);
    let controller = &of_kind(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(
        controller["securityContext"]["runAsNonRoot"], true,
        "only the agent may run as root"
    );
}

/// A root agent as the chart accepts it without an acknowledgement: with every host mount
/// recursively read-only.
const ROOT_WITH_RECURSIVE_READ_ONLY: &[&str] = &[
    "--set",
    "agent.runAsRoot=true",
    "--set",
    "agent.hostMounts.recursiveReadOnly=Enabled",
];

/// Every hostPath volumeMount of every agent pod: (workload, mount).
fn host_volume_mounts(docs: &[Value]) -> Vec<(String, Value)> {
    let mut found = Vec::new();
    for (workload, pod) in pod_specs(docs) {
        let host_volumes: BTreeSet<&str> = pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|volume| volume["hostPath"].is_object())
            .filter_map(|volume| volume["name"].as_str())
            .collect();
        for container in containers(pod) {
            for mount in container["volumeMounts"].as_array().into_iter().flatten() {
                if host_volumes.contains(mount["name"].as_str().unwrap_or_default()) {
                    found.push((workload.clone(), mount.clone()));
                }
            }
        }
    }
    found
}

/// Issue 28: on containerd < 2.0 a read-only hostPath mount is read-only only at its top.
/// Every host mount carries the chosen recursiveReadOnly (with readOnly and no propagation,
/// which Kubernetes requires for it).
#[test]
fn every_host_mount_is_recursively_read_only_as_chosen() {
    let test = "every_host_mount_is_recursively_read_only_as_chosen";
    for (extra, expected) in [
        (&[][..], "IfPossible"),
        (
            &["--set", "agent.hostMounts.recursiveReadOnly=Enabled"][..],
            "Enabled",
        ),
    ] {
        let extra = [
            extra,
            &[
                "--set",
                "agent.hostMounts.procFiles={cpuinfo,driver/nvidia/version}",
            ],
            &[
                "--set",
                "agent.hostMounts.extra[0].name=tpu-env",
                "--set",
                "agent.hostMounts.extra[0].hostPath=/etc/hwaccel",
                "--set",
                "agent.hostMounts.extra[0].type=Directory",
            ],
        ]
        .concat();
        let Some(docs) = render(test, &extra) else {
            return;
        };
        let mounts = host_volume_mounts(&docs);
        // sys, dev, 2 /proc files, os-release, one extra.
        assert_eq!(mounts.len(), 6, "{mounts:#?}");
        for (workload, mount) in mounts {
            assert_eq!(mount["recursiveReadOnly"], expected, "{workload}: {mount}");
            assert_eq!(mount["readOnly"], true, "{workload}: {mount}");
            assert!(mount["mountPropagation"].is_null(), "{workload}: {mount}");
        }
    }
}

/// A root agent could write the host's cgroup files through a mount that is read-only only
/// at its top: refused unless every mount is recursively read-only or the risk is
/// acknowledged, with and without the schema, and the NOTES say what stays writable.
#[test]
fn run_as_root_needs_recursive_read_only_or_an_acknowledgement() {
    let test = "run_as_root_needs_recursive_read_only_or_an_acknowledgement";
    let Some(helm) = find_helm() else {
        skip_notice(test);
        return;
    };
    let chart = chart_dir();
    for skip_schema in [false, true] {
        let mut args = vec!["--set", "agent.runAsRoot=true"];
        if skip_schema {
            args.push("--skip-schema-validation");
        }
        let err = helm::template(&helm, &chart, "hwaccel", NAMESPACE, &args)
            .expect_err("runAsRoot with IfPossible is refused");
        assert!(err.contains("acknowledgeWritableHostMounts"), "{err}");
        assert!(err.contains("recursiveReadOnly=Enabled"), "{err}");
        let mut bad = vec!["--set", "agent.hostMounts.recursiveReadOnly=Disabled"];
        if skip_schema {
            bad.push("--skip-schema-validation");
        }
        let err = helm::template(&helm, &chart, "hwaccel", NAMESPACE, &bad)
            .expect_err("Disabled is refused");
        assert!(err.contains("recursiveReadOnly"), "{err}");
    }
    render(test, ROOT_WITH_RECURSIVE_READ_ONLY).expect("helm found above");
    let acknowledged = [
        "--set",
        "agent.runAsRoot=true",
        "--set",
        "agent.hostMounts.acknowledgeWritableHostMounts=true",
    ];
    let docs = render(test, &acknowledged).expect("helm found above");
    for (workload, mount) in host_volume_mounts(&docs) {
        assert_eq!(mount["recursiveReadOnly"], "IfPossible", "{workload}");
    }
    let notes = install_notes(&helm, &acknowledged).expect("dry-run install");
    assert!(notes.contains("cgroup files"), "{notes}");
    assert!(notes.contains("HostMountsWritable"), "{notes}");
    let notes = install_notes(&helm, ROOT_WITH_RECURSIVE_READ_ONLY).expect("dry-run install");
    assert!(!notes.contains("cgroup files"), "{notes}");
}

#[test]
fn host_mounts_are_read_only_and_narrow() {
    let Some(docs) = render("host_mounts_are_read_only_and_narrow", &[]) else {
        return;
    };
    let mut host_paths = BTreeSet::new();
    for (workload, pod) in pod_specs(&docs) {
        let host_volumes: Vec<&Value> = pod["volumes"]
            .as_array()
            .map(|volumes| {
                volumes
                    .iter()
                    .filter(|volume| volume["hostPath"].is_object())
                    .collect()
            })
            .unwrap_or_default();
        if !workload.starts_with("DaemonSet/") {
            assert!(
                host_volumes.is_empty(),
                "{workload} mounts host paths: {host_volumes:?}"
            );
        }
        for volume in host_volumes {
            let path = volume["hostPath"]["path"].as_str().expect("hostPath.path");
            host_paths.insert(path.to_string());
            let mounts: Vec<&Value> = containers(pod)
                .into_iter()
                .filter_map(|container| container["volumeMounts"].as_array())
                .flatten()
                .filter(|mount| mount["name"] == volume["name"])
                .collect();
            assert!(
                !mounts.is_empty(),
                "{workload}: host volume {path} is never mounted"
            );
            for mount in mounts {
                assert_eq!(
                    mount["readOnly"], true,
                    "{workload}: {path} must be mounted read-only"
                );
                let target = mount["mountPath"].as_str().unwrap_or_default();
                assert!(
                    target.starts_with("/host/"),
                    "{workload}: {path} mounted at {target}"
                );
                assert!(
                    mount["mountPropagation"].is_null(),
                    "{workload}: {path} propagates mounts"
                );
            }
        }
    }
    // The whole host /proc would show every host process; only single files are mounted.
    let expected: BTreeSet<String> = [
        "/sys",
        "/dev",
        "/proc/cpuinfo",
        "/proc/meminfo",
        "/proc/sys/kernel/osrelease",
        "/etc/os-release",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(host_paths, expected);
}

#[test]
fn rbac_is_least_privilege() {
    let Some(docs) = render("rbac_is_least_privilege", &[]) else {
        return;
    };
    let mut roles = of_kind(&docs, "ClusterRole");
    roles.extend(of_kind(&docs, "Role"));
    assert!(
        roles.len() >= 4,
        "agent, controller, cleanup and leader-election roles"
    );
    for role in &roles {
        for rule in role["rules"].as_array().expect("rules") {
            for field in ["apiGroups", "resources", "verbs"] {
                let values = rule[field].as_array().expect(field);
                assert!(
                    !values.contains(&Value::from("*")),
                    "{}: wildcard {field}",
                    name_of(role)
                );
            }
            let resources = rule["resources"].as_array().expect("resources");
            let verbs = rule["verbs"].as_array().expect("verbs");
            assert!(
                !resources.contains(&Value::from("secrets")),
                "{}: secrets",
                name_of(role)
            );
            if resources.contains(&Value::from("nodes")) {
                for forbidden in ["create", "delete", "deletecollection", "update"] {
                    assert!(
                        !verbs.contains(&Value::from(forbidden)),
                        "{}: {forbidden} nodes",
                        name_of(role)
                    );
                }
            }
            for forbidden_verb in ["escalate", "bind", "impersonate", "deletecollection"] {
                assert!(
                    !verbs.contains(&Value::from(forbidden_verb)),
                    "{}: {forbidden_verb}",
                    name_of(role)
                );
            }
            // The controller deletes the ResourceClaims it made: RBAC cannot narrow that by
            // label, so the chart's `controller-claim-writes` admission policy confines it to
            // claims labelled and owned by a placement (checked in the policy test below and,
            // with the controller's token, in tests/cluster_security.rs).
            if rule["apiGroups"] == serde_json::json!(["resource.k8s.io"]) {
                for forbidden in ["update", "deletecollection"] {
                    assert!(
                        !verbs.contains(&Value::from(forbidden)),
                        "{forbidden}: {rule}"
                    );
                }
                if verbs.contains(&Value::from("delete")) || verbs.contains(&Value::from("create"))
                {
                    assert_eq!(name_of(role), "hwaccel-controller", "{rule}");
                    let claims = rule["resources"] == serde_json::json!(["resourceclaims"]);
                    let templates =
                        rule["resources"] == serde_json::json!(["resourceclaimtemplates"]);
                    // health.taints: the controller's own DeviceTaintRules.
                    let taint_rules = rule["resources"] == serde_json::json!(["devicetaintrules"]);
                    assert!(claims || templates || taint_rules, "{rule}");
                    // A claim is never rewritten; a template is applied (server-side apply).
                    assert!(
                        templates || taint_rules || !verbs.contains(&Value::from("patch")),
                        "{rule}"
                    );
                }
                continue;
            }
            // Otherwise the one delete: the uninstall hook removes the agent DaemonSet by name
            // (helm deletes it a moment later anyway), from a namespaced Role.
            if verbs.contains(&Value::from("delete")) {
                assert_eq!(
                    role["kind"],
                    "Role",
                    "{}: cluster-wide delete",
                    name_of(role)
                );
                assert_eq!(rule["resources"], serde_json::json!(["daemonsets"]));
                assert_eq!(rule["resourceNames"], serde_json::json!(["hwaccel-agent"]));
                assert_eq!(verbs.len(), 1, "{}: {verbs:?}", name_of(role));
            }
        }
    }
    let agent = roles
        .iter()
        .find(|role| name_of(role) == "hwaccel-agent")
        .expect("agent ClusterRole");
    let verbs_for = |resource: &str| {
        agent["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .find(|rule| rule["resources"] == serde_json::json!([resource]))
            .map(|rule| rule["verbs"].clone())
            .unwrap_or_else(|| panic!("no agent rule for {resource}"))
    };
    // Reads (its Node's metadata is watched by name, docs/decisions/0010) and one write verb:
    // server-side apply of its labels; never update or delete.
    assert_eq!(
        verbs_for("nodes"),
        serde_json::json!(["get", "list", "watch", "patch"]),
        "the agent reads Nodes and only patches them"
    );
    // Its inventory is read by name, never listed or watched (issue 41): a stolen agent token
    // cannot list every node's inventory.
    assert_eq!(
        verbs_for("acceleratorinventories"),
        serde_json::json!(["get", "create", "patch"]),
        "the agent reads its inventory by name and applies it"
    );
}

#[test]
fn admission_policies_match_the_chart_service_accounts() {
    // A release name and namespace other than the defaults, so a hard-coded name would show.
    let Some(docs) = render_chart(
        "admission_policies_match_the_chart_service_accounts",
        &chart_dir(),
        "gpu-labels",
        "platform-ops",
        &[],
    ) else {
        return;
    };
    let agent = agent_daemonset(&docs);
    let namespace = agent["metadata"]["namespace"].as_str().expect("namespace");
    let service_account = agent["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("SA");
    assert_eq!(namespace, "platform-ops");
    let agent_user = format!("system:serviceaccount:{namespace}:{service_account}");

    let all_policies = of_kind(&docs, "ValidatingAdmissionPolicy");
    assert_eq!(
        all_policies.len(),
        5,
        "node writes, agent inventory writes, controller placement, claim and DeviceTaintRule \
         writes"
    );
    // The controller's placement policy: only its own finalizer on a ModelPlacement.
    let placements = all_policies
        .iter()
        .find(|policy| {
            policy["spec"]["matchConstraints"]["resourceRules"]
                .to_string()
                .contains("modelplacements")
        })
        .expect("a policy over the controller's placement writes");
    let controller_user = agent_user.replace(
        service_account,
        &service_account.replace("-agent", "-controller"),
    );
    assert!(
        placements["spec"]["matchConditions"]
            .to_string()
            .contains(&format!("'{controller_user}'")),
        "{}",
        placements["spec"]["matchConditions"]
    );
    let checks = placements["spec"]["validations"].to_string();
    assert!(checks.contains("object.spec == oldObject.spec"), "{checks}");
    assert!(checks.contains("hwaccel.io/placement-cleanup"), "{checks}");
    // The controller's claim policy: only claims labelled and owned by a placement.
    let claims = all_policies
        .iter()
        .find(|policy| {
            policy["spec"]["matchConstraints"]["resourceRules"]
                .to_string()
                .contains("resourceclaims")
        })
        .expect("a policy over the controller's claim writes");
    assert!(
        claims["spec"]["matchConditions"]
            .to_string()
            .contains(&format!("'{controller_user}'")),
        "{}",
        claims["spec"]["matchConditions"]
    );
    let checks = claims["spec"]["validations"].to_string();
    assert!(checks.contains("hwaccel.io/placement"), "{checks}");
    assert!(checks.contains("ModelPlacement"), "{checks}");
    // The controller's DeviceTaintRule policy: its own rules only, one device each, never
    // evicting; rendered even with health taints off, and over every served version.
    let rules = all_policies
        .iter()
        .find(|policy| {
            policy["spec"]["matchConstraints"]["resourceRules"]
                .to_string()
                .contains("devicetaintrules")
        })
        .expect("a policy over the controller's DeviceTaintRule writes");
    assert!(
        rules["spec"]["matchConditions"]
            .to_string()
            .contains(&format!("'{controller_user}'")),
        "{}",
        rules["spec"]["matchConditions"]
    );
    let rule_match = &rules["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule_match["apiVersions"], serde_json::json!(["*"]));
    assert_eq!(
        rule_match["operations"],
        serde_json::json!(["CREATE", "UPDATE", "DELETE"])
    );
    let checks = rules["spec"]["validations"].to_string();
    for needle in [
        "oldObject.metadata.?labels[?'hwaccel.io/managed-by']",
        "object.metadata.?labels[?'hwaccel.io/managed-by']",
        "['NoSchedule', 'None']",
        "['driver', 'pool', 'device']",
    ] {
        assert!(checks.contains(needle), "{needle}: {checks}");
    }
    assert!(!checks.contains("NoExecute'"), "{checks}");
    let policies: Vec<_> = all_policies
        .into_iter()
        .filter(|policy| {
            policy["spec"]["matchConditions"]
                .to_string()
                .contains(&format!("'{agent_user}'"))
        })
        .collect();
    assert_eq!(policies.len(), 2, "node writes and agent inventory writes");
    for policy in &policies {
        let spec = &policy["spec"];
        assert_eq!(spec["failurePolicy"], "Fail", "{}", name_of(policy));
        let conditions = spec["matchConditions"].to_string();
        assert!(
            conditions.contains(&format!("'{agent_user}'")),
            "{} does not match {agent_user}: {conditions}",
            name_of(policy)
        );
        let checks = format!("{}{}", spec["variables"], spec["validations"]);
        assert!(
            checks.contains(NODE_NAME_CLAIM),
            "{} ignores the node-name claim",
            name_of(policy)
        );
        let resources = spec["matchConstraints"]["resourceRules"].to_string();
        let operations = spec["matchConstraints"]["resourceRules"][0]["operations"].to_string();
        assert!(
            operations.contains("UPDATE") && operations.contains("CREATE"),
            "{}: {operations}",
            name_of(policy)
        );
        assert!(
            resources.contains("nodes") || resources.contains("acceleratorinventories"),
            "{resources}"
        );
    }
    let inventory = policies
        .iter()
        .find(|policy| {
            policy["spec"]["matchConstraints"]["resourceRules"]
                .to_string()
                .contains("acceleratorinventories/status")
        })
        .expect("a policy over acceleratorinventories and their status");
    assert!(
        inventory["spec"]["validations"]
            .to_string()
            .contains("object.metadata.name == variables.boundNode")
    );
    assert!(
        inventory["spec"]["validations"]
            .to_string()
            .contains("object.spec.nodeName == variables.boundNode"),
        "an inventory named after the agent's node must describe that node"
    );
    let nodes = policies
        .iter()
        .find(|policy| {
            policy["spec"]["matchConstraints"]["resourceRules"]
                .to_string()
                .contains("\"nodes\"")
        })
        .expect("a policy over nodes");
    let prefixes = nodes["spec"]["variables"].to_string();
    assert!(
        prefixes.contains("['hwaccel.io/']"),
        "the agent's label prefix: {prefixes}"
    );

    let bindings = of_kind(&docs, "ValidatingAdmissionPolicyBinding");
    let policy_names: BTreeSet<&str> = of_kind(&docs, "ValidatingAdmissionPolicy")
        .iter()
        .map(|policy| name_of(policy))
        .collect();
    let bound: BTreeSet<&str> = bindings
        .iter()
        .filter_map(|binding| binding["spec"]["policyName"].as_str())
        .collect();
    assert_eq!(policy_names, bound, "every policy has a binding");
    for binding in bindings {
        assert_eq!(
            binding["spec"]["validationActions"],
            serde_json::json!(["Deny"])
        );
    }
}

/// Issue 27: the claim policy admits a claim only under exactly one owner, the controller
/// reference of the ModelPlacement its `hwaccel.io/placement` label names, in the version the
/// CRD serves (the garbage collector cannot map another and would keep the claim), and keeps
/// labels and owners as they are on update. What it cannot do, look the owner up, the garbage
/// collector does: `cluster_security::controller_token_may_write_only_claims_owned_by_the_placement_their_label_names`.
#[test]
fn the_claim_policy_admits_one_controller_owner_the_label_names() {
    let Some(docs) = render(
        "the_claim_policy_admits_one_controller_owner_the_label_names",
        &[],
    ) else {
        return;
    };
    let policy = of_kind(&docs, "ValidatingAdmissionPolicy")
        .into_iter()
        .find(|policy| name_of(policy) == "hwaccel-controller-claim-writes")
        .expect("the controller's claim policy");
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    let rules = spec["matchConstraints"]["resourceRules"][0].clone();
    assert_eq!(
        rules["apiVersions"],
        serde_json::json!(["*"]),
        "every served version"
    );
    assert_eq!(
        rules["operations"],
        serde_json::json!(["CREATE", "UPDATE", "DELETE"])
    );
    let checks = format!("{}{}", spec["variables"], spec["validations"]);
    let version = format!("'{}'", hwaccel::api::API_VERSION);
    for needle in [
        "size(variables.owners) == 1",
        version.as_str(),
        "variables.owners[0].kind == 'ModelPlacement'",
        "variables.owners[0].name == variables.placement",
        "variables.owners[0].?controller.orValue(false)",
        "!variables.owners[0].?blockOwnerDeletion.orValue(false)",
        "object.metadata.?ownerReferences == oldObject.metadata.?ownerReferences",
    ] {
        assert!(checks.contains(needle), "{needle}: {checks}");
    }
    // The old, loose check: any one ModelPlacement owner among several, any version.
    assert!(!checks.contains(".exists(o"), "{checks}");
    assert!(!checks.contains("startsWith('hwaccel.io/')"), "{checks}");
}

/// The controller's rules for `resources` in `docs`, as (apiGroups, verbs) pairs.
fn controller_rules_for(docs: &[Value], resource: &str) -> Vec<Value> {
    of_kind(docs, "ClusterRole")
        .into_iter()
        .filter(|role| name_of(role) == "hwaccel-controller")
        .flat_map(|role| role["rules"].as_array().cloned().unwrap_or_default())
        .filter(|rule| rule["resources"] == serde_json::json!([resource]))
        .map(|rule| rule["verbs"].clone())
        .collect()
}

#[test]
fn health_taint_rights_follow_the_mode() {
    for (mode, rules, pods) in [
        ("none", false, false),
        ("dryRun", true, true),
        ("enforce", true, false),
    ] {
        let set = format!("health.taints={mode}");
        let Some(docs) = render("health_taint_rights_follow_the_mode", &["--set", &set]) else {
            return;
        };
        let taint_rules = controller_rules_for(&docs, "devicetaintrules");
        if rules {
            assert_eq!(
                taint_rules,
                vec![serde_json::json!(["list", "create", "patch", "delete"])],
                "{mode}"
            );
        } else {
            assert!(taint_rules.is_empty(), "{mode}: {taint_rules:?}");
        }
        // `get` on pods in every mode: the pods a placement's claims are reserved for, read
        // by name for their device health; `list` and `watch` for plan conformance (by
        // default), `list` for the dry-run report.
        let pod_rules = controller_rules_for(&docs, "pods");
        let mut expected = vec![
            serde_json::json!(["get"]),
            serde_json::json!(["list", "watch"]),
        ];
        if pods {
            expected.push(serde_json::json!(["list"]));
        }
        assert_eq!(pod_rules, expected, "{mode}");
        // Whenever the controller may taint a Node, only with NoSchedule.
        let node_checks = of_kind(&docs, "ValidatingAdmissionPolicy")
            .into_iter()
            .filter(|p| name_of(p).ends_with("-node-writes"))
            .map(|p| p["spec"]["validations"].to_string())
            .collect::<String>();
        assert_eq!(
            node_checks.contains("t.effect == 'NoSchedule'"),
            rules,
            "{mode}: {node_checks}"
        );
        // freeDevices is written in every mode.
        assert_eq!(
            controller_rules_for(&docs, "acceleratorinventories/status"),
            vec![serde_json::json!(["patch"])]
        );
        let args = of_kind(&docs, "Deployment")
            .into_iter()
            .flat_map(|d| {
                containers(&d["spec"]["template"]["spec"])
                    .into_iter()
                    .cloned()
            })
            .flat_map(|c| c["args"].as_array().cloned().unwrap_or_default())
            .collect::<Vec<_>>();
        assert!(
            args.contains(&Value::from(format!("--health-taints={mode}"))),
            "{args:?}"
        );
    }
}

/// The controller container's arguments.
fn controller_args(docs: &[Value]) -> Vec<String> {
    of_kind(docs, "Deployment")
        .into_iter()
        .flat_map(|d| {
            containers(&d["spec"]["template"]["spec"])
                .into_iter()
                .cloned()
        })
        .flat_map(|c| c["args"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_counted_models_reach_the_controller() {
    let Some(docs) = render("the_counted_models_reach_the_controller", &[]) else {
        return;
    };
    let args = controller_args(&docs);
    for arg in [
        "--capacity-interval=60s",
        "--capacity-model=llama-3.1-8b@8192/bf16",
        "--capacity-model=llama-3.1-70b@8192/bf16",
    ] {
        assert!(args.iter().any(|a| a == arg), "{arg} missing: {args:?}");
    }
    let Some(docs) = render(
        "the_counted_models_reach_the_controller",
        &["--set", "controller.capacity.models=null"],
    ) else {
        return;
    };
    let args = controller_args(&docs);
    assert!(
        !args.iter().any(|a| a.starts_with("--capacity-model")),
        "{args:?}"
    );
}

#[test]
fn admission_policies_can_be_turned_off() {
    let Some(docs) = render(
        "admission_policies_can_be_turned_off",
        &["--set", "admissionPolicy.enabled=false"],
    ) else {
        return;
    };
    assert!(of_kind(&docs, "ValidatingAdmissionPolicy").is_empty());
    assert!(of_kind(&docs, "ValidatingAdmissionPolicyBinding").is_empty());
}

#[test]
fn service_monitors_select_the_metrics_services() {
    let Some(docs) = render(
        "service_monitors_select_the_metrics_services",
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.serviceMonitor.labels.release=prom",
        ],
    ) else {
        return;
    };
    let monitors = of_kind(&docs, "ServiceMonitor");
    assert_eq!(
        monitors.len(),
        2,
        "one for the agents, one for the controller"
    );
    let services = of_kind(&docs, "Service");
    for monitor in monitors {
        assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
        let selector = monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels");
        let selected: Vec<&&Value> = services
            .iter()
            .filter(|service| {
                selector
                    .iter()
                    .all(|(key, value)| &service["metadata"]["labels"][key] == value)
            })
            .collect();
        assert_eq!(
            selected.len(),
            1,
            "{} selects {} Services",
            name_of(monitor),
            selected.len()
        );
        let port = &monitor["spec"]["endpoints"][0]["port"];
        assert_eq!(port, "metrics");
        assert!(
            selected[0]["spec"]["ports"]
                .to_string()
                .contains("\"metrics\"")
        );
    }
}

#[test]
fn prometheus_rule_and_dashboard_are_opt_in() {
    let Some(docs) = render("prometheus_rule_and_dashboard_are_opt_in", &[]) else {
        return;
    };
    assert!(
        of_kind(&docs, "PrometheusRule").is_empty(),
        "a PrometheusRule needs the Prometheus Operator's CRDs: opt-in"
    );
    assert!(
        of_kind(&docs, "ConfigMap")
            .iter()
            .all(|map| map["metadata"]["labels"]["grafana_dashboard"].is_null()),
        "the dashboard ConfigMap must be opt-in"
    );
}

#[test]
fn prometheus_rule_and_dashboard_render_with_their_labels() {
    let Some(docs) = render(
        "prometheus_rule_and_dashboard_render_with_their_labels",
        &[
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.prometheusRule.labels.release=prom",
            "--set",
            "metrics.dashboard.enabled=true",
            "--set",
            "metrics.dashboard.namespace=monitoring",
            "--set",
            "metrics.dashboard.annotations.grafana_folder=GPUs",
            "--set",
            "metrics.serviceMonitor.enabled=true",
        ],
    ) else {
        return;
    };
    let rules = of_kind(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rules[0]["metadata"]["namespace"], NAMESPACE);
    assert_eq!(rules[0]["metadata"]["labels"]["release"], "prom");
    assert_eq!(
        rules[0]["metadata"]["labels"]["app.kubernetes.io/name"],
        "hwaccel-operator"
    );

    let dashboards: Vec<&Value> = of_kind(&docs, "ConfigMap")
        .into_iter()
        .filter(|map| map["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect();
    assert_eq!(dashboards.len(), 1, "one dashboard ConfigMap");
    let dashboard = dashboards[0];
    assert_eq!(dashboard["metadata"]["namespace"], "monitoring");
    assert_eq!(
        dashboard["metadata"]["annotations"]["grafana_folder"],
        "GPUs"
    );
    let json = dashboard["data"]["hwaccel-fleet.json"]
        .as_str()
        .expect("the dashboard JSON under data");
    let shipped: Value = serde_json::from_str(json).expect("the ConfigMap holds valid JSON");
    let file = std::fs::read_to_string(chart_dir().join("dashboards/hwaccel-fleet.json"))
        .expect("dashboards/hwaccel-fleet.json");
    let file: Value = serde_json::from_str(&file).expect("the chart file is JSON");
    assert_eq!(
        shipped, file,
        "the ConfigMap ships the chart's file unchanged"
    );

    // The placement series carry their own `namespace`: only the controller's scrape
    // honours exported labels; an agent may not name other nodes.
    for monitor in of_kind(&docs, "ServiceMonitor") {
        let honour = &monitor["spec"]["endpoints"][0]["honorLabels"];
        match monitor["metadata"]["labels"]["app.kubernetes.io/component"].as_str() {
            Some("controller") => assert_eq!(honour, true),
            _ => assert!(honour.is_null(), "{}", name_of(monitor)),
        }
    }
}

#[test]
fn dashboard_sidecar_label_is_configurable() {
    let Some(docs) = render(
        "dashboard_sidecar_label_is_configurable",
        &[
            "--set",
            "metrics.dashboard.enabled=true",
            "--set",
            "metrics.dashboard.sidecarLabel=example.com/dashboard",
            "--set",
            "metrics.dashboard.sidecarLabelValue=fleet",
        ],
    ) else {
        return;
    };
    let labelled: Vec<&Value> = of_kind(&docs, "ConfigMap")
        .into_iter()
        .filter(|map| map["metadata"]["labels"]["example.com/dashboard"] == "fleet")
        .collect();
    assert_eq!(labelled.len(), 1);
    assert!(labelled[0]["metadata"]["labels"]["grafana_dashboard"].is_null());
    assert_eq!(labelled[0]["metadata"]["namespace"], NAMESPACE);
}

#[test]
fn bad_alert_windows_are_refused_with_and_without_the_schema() {
    let Some(helm) = find_helm() else {
        skip_notice("bad_alert_windows_are_refused_with_and_without_the_schema");
        return;
    };
    let chart = chart_dir();
    for bad in ["soon", "10", "-5m", "5 m", "1.5h"] {
        let value = format!("metrics.prometheusRule.unschedulableFor={bad}");
        for skip_schema in [false, true] {
            let mut args = vec![
                "--set",
                "metrics.prometheusRule.enabled=true",
                "--set",
                &value,
            ];
            if skip_schema {
                args.push("--skip-schema-validation");
            }
            let result = helm::template(&helm, &chart, "hwaccel", NAMESPACE, &args);
            assert!(
                result.is_err(),
                "{value} (skip schema: {skip_schema}) rendered"
            );
        }
    }
    for good in ["15m", "1h30m", "90s"] {
        let value = format!("metrics.prometheusRule.unschedulableFor={good}");
        let args = [
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            &value,
        ];
        helm::template(&helm, &chart, "hwaccel", NAMESPACE, &args)
            .unwrap_or_else(|err| panic!("{value} refused: {err}"));
    }
}

#[test]
fn schema_rejects_unknown_and_unsafe_values() {
    let Some(helm) = find_helm() else {
        skip_notice("schema_rejects_unknown_and_unsafe_values");
        return;
    };
    let chart = chart_dir();
    for bad in [
        "agent.bogus=1",
        "agent.hostMounts.extra[0].name=x,agent.hostMounts.extra[0].hostPath=/etc,agent.hostMounts.extra[0].mountPath=/etc",
        "logFormat=xml",
        "admissionPolicy.failurePolicy=Maybe",
        "health.taints=Enforce",
    ] {
        let result = helm::template(&helm, &chart, "hwaccel", NAMESPACE, &["--set", bad]);
        assert!(
            result.is_err(),
            "--set {bad} should be rejected by values.schema.json"
        );
    }
}

#[test]
fn pdb_only_with_two_or_more_replicas() {
    let Some(docs) = render(
        "pdb_only_with_two_or_more_replicas",
        &["--set", "controller.replicas=1"],
    ) else {
        return;
    };
    assert!(
        of_kind(&docs, "PodDisruptionBudget").is_empty(),
        "minAvailable 1 of 1 would block drains"
    );
}

#[test]
fn cleanup_rights_exist_only_while_the_hook_runs() {
    let Some(docs) = render("cleanup_rights_exist_only_while_the_hook_runs", &[]) else {
        return;
    };
    let cleanup: Vec<&Value> = docs
        .iter()
        .filter(|doc| doc["metadata"]["labels"]["app.kubernetes.io/component"] == "cleanup")
        .collect();
    let kinds: BTreeSet<&str> = cleanup
        .iter()
        .filter_map(|doc| doc["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ClusterRole",
            "ClusterRoleBinding",
            "Job",
            "Role",
            "RoleBinding",
            "ServiceAccount"
        ])
    );
    for doc in cleanup {
        let annotations = &doc["metadata"]["annotations"];
        assert_eq!(annotations["helm.sh/hook"], "pre-delete", "{}", doc["kind"]);
        let policy = annotations["helm.sh/hook-delete-policy"]
            .as_str()
            .unwrap_or_default();
        assert!(
            policy.contains("hook-succeeded"),
            "{}: {policy}",
            doc["kind"]
        );
        if doc["kind"] != "Job" {
            assert!(
                policy.contains("hook-failed"),
                "{} outlives a failed cleanup: {policy}",
                doc["kind"]
            );
        }
    }
    let job = of_kind(&docs, "Job")[0];
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["args"],
        serde_json::json!([
            "cleanup",
            "--all-nodes",
            "--namespace=hwaccel-system",
            "--stop-controller=hwaccel-controller",
            "--stop-agent=hwaccel-agent",
            "--writer-pods=app.kubernetes.io/name=hwaccel-operator,app.kubernetes.io/instance=hwaccel,app.kubernetes.io/component in (agent,controller)",
            "--lease=hwaccel-controller",
            "--stop-timeout-seconds=120",
        ])
    );
    // The hook's namespaced rights: each write limited to one object by name.
    let role = of_kind(&docs, "Role")
        .into_iter()
        .find(|role| name_of(role) == "hwaccel-cleanup")
        .expect("the cleanup Role");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    for rule in role["rules"].as_array().expect("rules") {
        let verbs = rule["verbs"].as_array().expect("verbs");
        let writes = verbs.iter().any(|verb| verb != "get" && verb != "list");
        if writes || rule["resources"] == serde_json::json!(["leases"]) {
            assert!(
                rule["resourceNames"]
                    .as_array()
                    .is_some_and(|names| names.len() == 1),
                "{rule}: not limited to one object"
            );
        }
    }
    let rules = role["rules"].to_string();
    assert!(rules.contains("deployments/scale") && rules.contains("hwaccel-controller"));
    // The Job lives long enough to remove the labels after the writers stopped.
    let deadline = job["spec"]["activeDeadlineSeconds"]
        .as_u64()
        .expect("deadline");
    assert!(deadline >= 120 + 60, "{deadline}");
    let Some(helm) = find_helm() else {
        return;
    };
    let err = helm::template(
        &helm,
        &chart_dir(),
        "hwaccel",
        NAMESPACE,
        &["--set", "cleanup.activeDeadlineSeconds=100"],
    )
    .expect_err("a deadline shorter than the stop timeout is refused");
    assert!(err.contains("stopTimeoutSeconds"), "{err}");
    let Some(docs) = render(
        "cleanup_rights_exist_only_while_the_hook_runs",
        &["--set", "cleanup.enabled=false"],
    ) else {
        return;
    };
    assert!(of_kind(&docs, "Job").is_empty());
}

#[test]
fn committed_manifests_have_no_hooks() {
    // kubectl apply would run a hook Job at once: the uninstall cleanup must not be in there.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/hwaccel-operator.yaml");
    let text =
        std::fs::read_to_string(&path).expect("manifests/hwaccel-operator.yaml (make manifests)");
    let docs = documents(&text);
    assert!(!of_kind(&docs, "DaemonSet").is_empty());
    for doc in &docs {
        assert!(
            doc["metadata"]["annotations"]["helm.sh/hook"].is_null(),
            "hook in manifests: {}",
            name_of(doc)
        );
        if doc["metadata"]["namespace"].is_string() {
            assert_eq!(doc["metadata"]["namespace"], NAMESPACE);
        }
    }
}

/// Copies a directory tree (the chart) so a test can add files to its copy.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// A copy of the chart whose files/crds/ holds exactly `crds` (file name, YAML).
fn chart_with_crds(crds: &[(&str, &str)]) -> std::io::Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::tempdir()?;
    let chart = dir.path().join("hwaccel-operator");
    copy_tree(&chart_dir(), &chart)?;
    let crd_dir = chart.join("files/crds");
    for entry in std::fs::read_dir(&crd_dir)? {
        std::fs::remove_file(entry?.path())?;
    }
    for (name, yaml) in crds {
        std::fs::write(crd_dir.join(name), yaml)?;
    }
    Ok((dir, chart))
}

const TEST_CRD: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.hwaccel.io
  annotations:
    generated-by: hwaccel crds
spec:
  group: hwaccel.io
  names: {kind: Widget, plural: widgets}
  scope: Cluster
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              count: {type: integer, minimum: 0, maximum: 4096}
";

#[test]
fn crds_are_templates_kept_on_uninstall() {
    let test = "crds_are_templates_kept_on_uninstall";
    let (_dir, chart) = chart_with_crds(&[("widgets.yaml", TEST_CRD)]).expect("chart copy");
    let Some(docs) = render_chart(test, &chart, "hwaccel", NAMESPACE, &[]) else {
        return;
    };
    let crds = of_kind(&docs, "CustomResourceDefinition");
    assert_eq!(crds.len(), 1);
    let crd = crds[0];
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert_eq!(
        crd["metadata"]["annotations"]["generated-by"], "hwaccel crds",
        "own annotations survive"
    );
    assert_eq!(
        crd["metadata"]["labels"]["app.kubernetes.io/part-of"],
        "hwaccel-operator"
    );
    let count = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["count"];
    assert_eq!(
        count["maximum"], 4096,
        "the schema passes through unchanged"
    );

    let Some(docs) = render_chart(
        test,
        &chart,
        "hwaccel",
        NAMESPACE,
        &["--set", "crds.keep=false"],
    ) else {
        return;
    };
    let crd = of_kind(&docs, "CustomResourceDefinition")[0];
    assert!(crd["metadata"]["annotations"]["helm.sh/resource-policy"].is_null());

    let Some(docs) = render_chart(
        test,
        &chart,
        "hwaccel",
        NAMESPACE,
        &["--set", "crds.install=false"],
    ) else {
        return;
    };
    assert!(of_kind(&docs, "CustomResourceDefinition").is_empty());
}

#[test]
fn crds_dir_accepts_only_crds() {
    let Some(helm) = find_helm() else {
        skip_notice("crds_dir_accepts_only_crds");
        return;
    };
    let (_dir, chart) = chart_with_crds(&[(
        "oops.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )])
    .expect("chart copy");
    let result = helm::template(&helm, &chart, "hwaccel", NAMESPACE, &[]);
    assert!(result.is_err_and(|err| err.contains("other than a CustomResourceDefinition")));
}

/// `helm template` of the repository chart with one values file (written from `yaml`) plus
/// `extra` flags: the rendered YAML, or helm's error.
fn template_with_values(helm: &Path, yaml: &str, extra: &[&str]) -> Result<String, String> {
    let dir = tempfile::tempdir().map_err(|err| err.to_string())?;
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, yaml).map_err(|err| err.to_string())?;
    let file = file.to_string_lossy().into_owned();
    let mut args = vec!["-f", file.as_str()];
    args.extend_from_slice(extra);
    helm::template(helm, &chart_dir(), "hwaccel", NAMESPACE, &args)
}

/// Values of `agent.interval` around every bound of the grammar, plus the ones the issue
/// reported (`1m30s`, `500us`, `0s` and a number too large for any integer).
const INTERVAL_TABLE: &[&str] = &[
    "60s",
    "1s",
    "9s",
    "10s",
    "59s",
    "99s",
    "999s",
    "1000s",
    "9999s",
    "10000s",
    "79999s",
    "80000s",
    "85999s",
    "86000s",
    "86399s",
    "86400s",
    "86401s",
    "86500s",
    "90000s",
    "99999s",
    "100000s",
    "0s",
    "1m",
    "9m",
    "10m",
    "99m",
    "100m",
    "999m",
    "1000m",
    "1399m",
    "1400m",
    "1439m",
    "1440m",
    "1441m",
    "1500m",
    "9999m",
    "0m",
    "1h",
    "9h",
    "10h",
    "19h",
    "20h",
    "23h",
    "24h",
    "25h",
    "30h",
    "99h",
    "0h",
    "1m30s",
    "500us",
    "500ms",
    "1µs",
    "1.5m",
    "060s",
    "60",
    "",
    "s",
    "-5s",
    "5d",
    "10S",
    "1H",
    "99999999999999999999h",
    "18446744073709551615s",
    "60 s",
    "+60s",
];

#[test]
fn agent_interval_schema_accepts_exactly_what_the_binary_accepts() {
    let test = "agent_interval_schema_accepts_exactly_what_the_binary_accepts";
    let Some(helm) = find_helm() else {
        skip_notice(test);
        return;
    };
    let show = ["--show-only", "templates/agent-daemonset.yaml"];
    let mut disagreements = Vec::new();
    for value in INTERVAL_TABLE {
        let binary = hwaccel::duration::parse_interval(value);
        // A JSON string is a YAML double-quoted scalar: the value reaches helm byte for byte.
        let quoted = serde_json::to_string(value).expect("a string serialises");
        let values = format!("agent:\n  interval: {quoted}\n");
        let chart = template_with_values(&helm, &values, &show);
        // The template's own check (for --skip-schema-validation) must agree as well.
        let mut unchecked = show.to_vec();
        unchecked.push("--skip-schema-validation");
        let template = template_with_values(&helm, &values, &unchecked);
        if binary.is_ok() != chart.is_ok() || binary.is_ok() != template.is_ok() {
            disagreements.push(format!(
                "{value:?}: binary {binary:?}, schema {:?}, template {:?}",
                chart.as_ref().map(|_| "accepts"),
                template.as_ref().map(|_| "accepts"),
            ));
        }
        if let Ok(yaml) = chart {
            let arg = format!("--interval={value}");
            assert!(yaml.contains(&arg), "{value:?} not passed as {arg}");
        }
    }
    assert!(
        disagreements.is_empty(),
        "chart and binary disagree:\n{}",
        disagreements.join("\n")
    );
}

#[test]
fn agent_binary_refuses_a_bad_interval_with_a_message_and_no_panic() {
    for (value, message) in [
        ("99999999999999999999h", "too large"),
        ("0s", "between 1s and 24h"),
        ("1m30s", "compound"),
        ("500us", "sub-second"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hwaccel"))
            .args(["agent", "--node-name", "n1", "--interval", value])
            .env("KUBECONFIG", "/nonexistent")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("run hwaccel");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{value}: {stderr}");
        assert!(stderr.contains(message), "{value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{value}: {stderr}");
    }
}

#[test]
fn other_chart_durations_and_quantities_are_bounded() {
    let test = "other_chart_durations_and_quantities_are_bounded";
    let Some(helm) = find_helm() else {
        skip_notice(test);
        return;
    };
    let chart = chart_dir();
    for good in [
        "metrics.serviceMonitor.interval=1m30s",
        "metrics.serviceMonitor.scrapeTimeout=500ms",
        "agent.resources.limits.memory=64Mi",
        "agent.resources.requests.cpu=0.5",
        "controller.pdb.minAvailable=50%",
        "cleanup.activeDeadlineSeconds=600",
        "controller.capacity.models={qwen3-32b@32768,llama-3.1-8b/fp8}",
        "controller.capacity.interval=5m",
    ] {
        let result = helm::template(&helm, &chart, "hwaccel", NAMESPACE, &["--set", good]);
        assert!(result.is_ok(), "--set {good}: {result:?}");
    }
    for bad in [
        // Prometheus refuses fractions and microseconds.
        "metrics.serviceMonitor.interval=1.5s",
        "metrics.serviceMonitor.scrapeTimeout=500us",
        "metrics.serviceMonitor.interval=",
        // Not Kubernetes quantities: the apiserver would refuse the whole install.
        "agent.resources.limits.memory=64mi",
        "agent.resources.limits.memory=1.2.3",
        "agent.resources.requests.cpu=...",
        "controller.pdb.minAvailable=150%",
        "controller.replicas=1000",
        "cleanup.activeDeadlineSeconds=999999999",
        // An argument smuggled into the controller's command line.
        "controller.capacity.models={llama-3.1-8b --health-taints=enforce}",
        "controller.capacity.models={x;y}",
        "controller.capacity.interval=1d",
        "controller.capacity.interval=60s --selector=x",
    ] {
        let result = helm::template(&helm, &chart, "hwaccel", NAMESPACE, &["--set", bad]);
        assert!(result.is_err(), "--set {bad} should be refused");
    }
}

/// Values with one extra host mount, as a values file.
fn extra_mount_values(mount: &str) -> String {
    format!("agent:\n  hostMounts:\n    extra:\n      - {mount}\n")
}

#[test]
fn host_mounts_outside_the_allowlist_are_refused() {
    let test = "host_mounts_outside_the_allowlist_are_refused";
    let Some(helm) = find_helm() else {
        skip_notice(test);
        return;
    };
    let refused = [
        extra_mount_values("{name: root, hostPath: /, type: Directory}"),
        extra_mount_values("{name: pki, hostPath: /var/lib/kubelet/pki, type: Directory}"),
        extra_mount_values("{name: k8s, hostPath: /etc/kubernetes, type: Directory}"),
        extra_mount_values("{name: up, hostPath: /sys/../etc, type: Directory}"),
        extra_mount_values("{name: up, hostPath: /etc/hwaccel/../kubernetes, type: Directory}"),
        extra_mount_values("{name: dot, hostPath: /etc/hwaccel/./x, type: Directory}"),
        extra_mount_values("{name: dbl, hostPath: /etc/hwaccel//x, type: Directory}"),
        extra_mount_values("{name: sock, hostPath: /etc/hwaccel/x.sock, type: Socket}"),
        extra_mount_values("{name: untyped, hostPath: /etc/hwaccel}"),
        extra_mount_values("{name: rw, hostPath: /etc/hwaccel, type: Directory, readOnly: false}"),
        extra_mount_values(
            "{name: elsewhere, hostPath: /etc/hwaccel, mountPath: /host/etc/os-release, type: Directory}",
        ),
        "agent:\n  hostMounts:\n    procFiles: [\"1/root/etc/kubernetes/admin.conf\"]\n".into(),
        "agent:\n  hostMounts:\n    procFiles: [\"sys/../../etc/shadow\"]\n".into(),
        "agent:\n  hostMounts:\n    procFiles: [\"self/environ\"]\n".into(),
    ];
    for values in &refused {
        // Refused by the schema, and by the template when the schema is skipped.
        for extra in [&[][..], &["--skip-schema-validation"][..]] {
            let result = template_with_values(&helm, values, extra);
            assert!(result.is_err(), "accepted with {extra:?}:\n{values}");
        }
        let err = template_with_values(&helm, values, &["--skip-schema-validation"])
            .expect_err("refused");
        assert!(
            err.contains("agent.hostMounts"),
            "the template's message names the value: {err}"
        );
    }

    // What detection reads is accepted, read-only, at /host<hostPath>.
    let values = "agent:\n  hostMounts:\n    procFiles: [cpuinfo, driver/nvidia/version]\n    \
                  extra:\n      - {name: tpu-env, hostPath: /etc/hwaccel, type: Directory}\n      \
                  - {name: nv, hostPath: /proc/driver/nvidia, mountPath: /host/proc/driver/nvidia, type: Directory}\n";
    let yaml = template_with_values(&helm, values, &[]).expect("allowed mounts render");
    let docs = documents(&yaml);
    let pod = &agent_daemonset(&docs)["spec"]["template"]["spec"];
    let mounts = pod["containers"][0]["volumeMounts"].to_string();
    for path in [
        "/host/etc/hwaccel",
        "/host/proc/driver/nvidia",
        "/host/proc/driver/nvidia/version",
    ] {
        assert!(mounts.contains(&format!("\"{path}\"")), "{path}: {mounts}");
    }
    let volumes = pod["volumes"].as_array().expect("volumes");
    let tpu = volumes
        .iter()
        .find(|volume| volume["name"] == "host-extra-tpu-env")
        .expect("tpu-env volume");
    assert_eq!(tpu["hostPath"]["type"], "Directory");
    for mount in pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
    {
        if mount["name"] != "tmp" {
            assert_eq!(mount["readOnly"], true, "{mount}");
        }
    }
}

#[test]
fn failure_policy_ignore_needs_an_acknowledgement_and_notes_say_what_it_opens() {
    let test = "failure_policy_ignore_needs_an_acknowledgement_and_notes_say_what_it_opens";
    let Some(helm) = find_helm() else {
        skip_notice(test);
        return;
    };
    let chart = chart_dir();
    let ignore = ["--set", "admissionPolicy.failurePolicy=Ignore"];
    let err = helm::template(&helm, &chart, "hwaccel", NAMESPACE, &ignore)
        .expect_err("Ignore without an acknowledgement is refused");
    assert!(err.contains("acknowledgeFailOpen"), "{err}");
    assert!(err.contains("fails open"), "{err}");

    let acknowledged = [
        "--set",
        "admissionPolicy.failurePolicy=Ignore",
        "--set",
        "admissionPolicy.acknowledgeFailOpen=true",
    ];
    let docs = render(test, &acknowledged).expect("helm found above");
    for policy in of_kind(&docs, "ValidatingAdmissionPolicy") {
        assert_eq!(policy["spec"]["failurePolicy"], "Ignore");
    }
    let notes = install_notes(&helm, &acknowledged).expect("dry-run install");
    for phrase in [
        "failurePolicy=Ignore",
        "cannot evaluate",
        "RBAC alone",
        "any Node (any label, taints, annotations)",
        "any\nnode's AcceleratorInventory",
    ] {
        assert!(notes.contains(phrase), "NOTES lack {phrase:?}:\n{notes}");
    }
    let notes = install_notes(&helm, &[]).expect("dry-run install");
    assert!(
        !notes.contains("failurePolicy=Ignore"),
        "the default (Fail) needs no warning:\n{notes}"
    );
}

/// The NOTES `helm install --dry-run=client` prints (no cluster needed).
fn install_notes(helm: &Path, extra: &[&str]) -> Result<String, String> {
    let home = tempfile::tempdir().map_err(|err| err.to_string())?;
    let output = std::process::Command::new(helm)
        .args(["install", "hwaccel"])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--dry-run=client"])
        .args(extra)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .map_err(|err| err.to_string())?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(stdout
        .split_once("NOTES:")
        .map(|(_, notes)| notes.to_string())
        .unwrap_or(stdout))
}

/// Kinds that must exist before any agent or controller pod can write: everything that
/// confines or authorises them.
const BEFORE_WORKLOADS: &[&str] = &[
    "CustomResourceDefinition",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "NetworkPolicy",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// The kind of every document with its position, and the position of the first workload
/// (`usize::MAX` when there is none, which fails every ordering check).
fn kind_positions(docs: &[Value]) -> (Vec<(usize, String)>, usize) {
    let kinds: Vec<(usize, String)> = docs
        .iter()
        .enumerate()
        .map(|(at, doc)| (at, doc["kind"].as_str().unwrap_or_default().to_string()))
        .collect();
    let first_workload = kinds
        .iter()
        .find(|(_, kind)| matches!(kind.as_str(), "DaemonSet" | "Deployment"))
        .map_or(usize::MAX, |(at, _)| *at);
    (kinds, first_workload)
}

#[test]
fn committed_manifests_create_policies_and_rbac_before_the_workloads() {
    // kubectl apply creates objects in file order: an agent started before its admission
    // policies exist could write any Node with RBAC alone.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/hwaccel-operator.yaml");
    let text = std::fs::read_to_string(&path).expect("manifests/hwaccel-operator.yaml");
    let docs = documents(&text);
    let (kinds, first_workload) = kind_positions(&docs);
    assert_ne!(first_workload, usize::MAX, "no workload in manifests/");
    for kind in BEFORE_WORKLOADS {
        let last = kinds
            .iter()
            .filter(|(_, k)| k == kind)
            .map(|(at, _)| *at)
            .max();
        // Every kind the chart renders by default must be there (NetworkPolicy can be off).
        if *kind == "ValidatingAdmissionPolicy"
            || *kind == "ValidatingAdmissionPolicyBinding"
            || *kind == "CustomResourceDefinition"
            || *kind == "ClusterRoleBinding"
        {
            assert!(last.is_some(), "no {kind} in manifests/");
        }
        if let Some(last) = last {
            assert!(
                last < first_workload,
                "{kind} at {last} after the first workload at {first_workload}"
            );
        }
    }
    // The policies come before every identity they confine is even authorised.
    let last_policy = kinds
        .iter()
        .filter(|(_, k)| k.starts_with("ValidatingAdmissionPolicy"))
        .map(|(at, _)| *at)
        .max()
        .expect("policies");
    let first_binding = kinds
        .iter()
        .find(|(_, k)| k == "ClusterRoleBinding")
        .map(|(at, _)| *at)
        .expect("bindings");
    assert!(last_policy < first_binding, "policies before RBAC bindings");
}

#[test]
fn order_script_keeps_every_document_and_sorts_stably() {
    let input = "# header\n---\n# a\nkind: Deployment\nmetadata: {name: d}\n---\nkind: ClusterRole\nmetadata: {name: r1}\n---\nkind: ValidatingAdmissionPolicy\nmetadata: {name: p}\nspec:\n  x:\n    kind: Nested\n---\nkind: ClusterRole\nmetadata: {name: r2}\n---\nkind: Service\nmetadata: {name: s}\n";
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/order-manifests.sh");
    let mut child = std::process::Command::new(&script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run scripts/order-manifests.sh");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).expect("write");
    }
    let output = child.wait_with_output().expect("wait");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("utf-8");
    assert!(text.starts_with("# header\n---\n"), "{text}");
    let names: Vec<String> = documents(&text)
        .iter()
        .map(|doc| name_of(doc).to_string())
        .collect();
    assert_eq!(names, ["p", "r1", "r2", "s", "d"]);
    assert_eq!(text.len(), input.len(), "nothing lost or added");
}

#[test]
fn helm_install_order_creates_crds_and_rbac_before_the_workloads() {
    // `helm template` lists objects in the order `helm install` creates them (helm sorts by
    // its kind list). Helm does not know ValidatingAdmissionPolicy and creates it after the
    // workloads, in the same install and within milliseconds; docs/install.md says why that
    // leaves no usable window and how to close it completely (policies first).
    // Hooks are created at their own time (the uninstall hook only on uninstall).
    let Some(docs) = render(
        "helm_install_order_creates_crds_and_rbac_before_the_workloads",
        &["--no-hooks"],
    ) else {
        return;
    };
    let (kinds, first_workload) = kind_positions(&docs);
    assert_ne!(first_workload, usize::MAX, "no workload rendered");
    for kind in BEFORE_WORKLOADS {
        if kind.starts_with("ValidatingAdmissionPolicy") {
            continue;
        }
        for (at, _) in kinds.iter().filter(|(_, k)| k == kind) {
            assert!(
                *at < first_workload,
                "{kind} at {at} after the first workload"
            );
        }
    }
}

#[test]
fn network_policies_admit_only_the_scrapers_to_the_metrics_port() {
    let test = "network_policies_admit_only_the_scrapers_to_the_metrics_port";
    let Some(docs) = render(test, &[]) else {
        return;
    };
    let policies = of_kind(&docs, "NetworkPolicy");
    assert_eq!(
        policies.len(),
        2,
        "one for the agents, one for the controller"
    );
    for (workload, kind) in [("agent", "DaemonSet"), ("controller", "Deployment")] {
        let pods = of_kind(&docs, kind)[0];
        let pod_labels = &pods["spec"]["template"]["metadata"]["labels"];
        let policy = policies
            .iter()
            .find(|policy| {
                policy["spec"]["podSelector"]["matchLabels"]
                    .as_object()
                    .expect("matchLabels")
                    .iter()
                    .all(|(key, value)| &pod_labels[key] == value)
            })
            .unwrap_or_else(|| panic!("no NetworkPolicy selects the {workload} pods"));
        let spec = &policy["spec"];
        // Ingress only: the pods must keep reaching the API server.
        assert_eq!(
            spec["policyTypes"],
            serde_json::json!(["Ingress"]),
            "{workload}"
        );
        let rules = spec["ingress"].as_array().expect("ingress rules");
        assert_eq!(rules.len(), 1, "{workload}: {rules:?}");
        assert_eq!(
            rules[0]["ports"],
            serde_json::json!([{"port": "metrics", "protocol": "TCP"}]),
            "{workload}: only the metrics port"
        );
        let from = rules[0]["from"].as_array().expect("from");
        assert!(
            !from.is_empty(),
            "{workload}: an empty from would admit everyone"
        );
        assert_eq!(
            from[0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
            "prometheus"
        );
        let port_name = &pods["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"];
        assert_eq!(port_name, "metrics", "{workload}: the named port exists");
    }

    // Named scrapers replace the default; [] admits no pod at all; the switch removes them.
    let Some(docs) = render(
        test,
        &[
            "--set",
            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=obs",
        ],
    ) else {
        return;
    };
    for policy in of_kind(&docs, "NetworkPolicy") {
        assert_eq!(
            policy["spec"]["ingress"][0]["from"],
            serde_json::json!([{"namespaceSelector": {"matchLabels": {"team": "obs"}}}])
        );
    }
    let Some(docs) = render(test, &["--set-json", "networkPolicy.metricsFrom=[]"]) else {
        return;
    };
    for policy in of_kind(&docs, "NetworkPolicy") {
        assert_eq!(policy["spec"]["ingress"], serde_json::json!([]), "deny all");
        assert_eq!(
            policy["spec"]["policyTypes"],
            serde_json::json!(["Ingress"])
        );
    }
    let Some(docs) = render(test, &["--set", "networkPolicy.enabled=false"]) else {
        return;
    };
    assert!(of_kind(&docs, "NetworkPolicy").is_empty());
    let Some(helm) = find_helm() else {
        return;
    };
    let bogus = "networkPolicy.metricsFrom[0].hostNetwork=true";
    assert!(
        helm::template(&helm, &chart_dir(), "hwaccel", NAMESPACE, &["--set", bogus]).is_err(),
        "unknown peer fields are refused"
    );
}

// ---------------------------------------------------------------------------------------------
// agent.nvml: a second agent DaemonSet with the glibc image on NVIDIA node pools.

const NVML_ON: &[&str] = &["--set", "agent.nvml.enabled=true"];
const NFD_NVIDIA: &str = "feature.node.kubernetes.io/pci-10de.present";
const GFD_NVIDIA: &str = "nvidia.com/gpu.present";

/// The DaemonSet named `name`.
fn daemonset<'a>(docs: &'a [Value], name: &str) -> &'a Value {
    of_kind(docs, "DaemonSet")
        .into_iter()
        .find(|doc| name_of(doc) == name)
        .unwrap_or_else(|| panic!("no DaemonSet {name}"))
}

/// `(name, value)` of a container's plain env entries.
fn env_of(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .map(|env| {
            env.iter()
                .filter_map(|entry| {
                    Some((
                        entry["name"].as_str()?.to_string(),
                        entry["value"].as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether one node-selector requirement holds for `labels` (Kubernetes' semantics: NotIn and
/// DoesNotExist also hold where the label is absent).
fn requirement_holds(requirement: &Value, labels: &[(&str, &str)]) -> bool {
    let key = requirement["key"]
        .as_str()
        .unwrap_or_else(|| panic!("no key: {requirement}"));
    let value = labels.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    let values: Vec<&str> = requirement["values"]
        .as_array()
        .map(|values| values.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match requirement["operator"].as_str().unwrap_or_default() {
        "In" => value.is_some_and(|value| values.contains(&value)),
        "NotIn" => !value.is_some_and(|value| values.contains(&value)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        other => panic!("operator {other} not modelled here"),
    }
}

/// Whether the kube-scheduler would place a pod of this DaemonSet on a node with `labels` and
/// `name`: the nodeSelector, and any one of the required node-affinity terms (each term
/// requires all of its matchExpressions and matchFields).
fn schedules_on(daemonset: &Value, name: &str, labels: &[(&str, &str)]) -> bool {
    let pod = &daemonset["spec"]["template"]["spec"];
    let selector_ok = pod["nodeSelector"].as_object().is_none_or(|selector| {
        selector
            .iter()
            .all(|(key, value)| labels.iter().any(|(k, v)| k == key && value == v))
    });
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let affinity_ok = match terms.as_array() {
        None => true,
        Some(terms) => terms.iter().any(|term| {
            let expressions = term["matchExpressions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let fields = term["matchFields"].as_array().cloned().unwrap_or_default();
            expressions
                .iter()
                .all(|requirement| requirement_holds(requirement, labels))
                && fields
                    .iter()
                    .all(|requirement| requirement_holds(requirement, &[("metadata.name", name)]))
        }),
    };
    selector_ok && affinity_ok
}

/// Nodes of every kind the split must handle: labelled by NFD, by GFD, by both, with the
/// labels set to other values, unlabelled, and in two pools.
const NODES: &[(&str, &[(&str, &str)])] = &[
    ("cpu", &[("kubernetes.io/os", "linux")]),
    (
        "nfd-gpu",
        &[("kubernetes.io/os", "linux"), (NFD_NVIDIA, "true")],
    ),
    (
        "gfd-gpu",
        &[("kubernetes.io/os", "linux"), (GFD_NVIDIA, "true")],
    ),
    (
        "both-gpu",
        &[
            ("kubernetes.io/os", "linux"),
            (NFD_NVIDIA, "true"),
            (GFD_NVIDIA, "true"),
        ],
    ),
    (
        "labelled-false",
        &[
            ("kubernetes.io/os", "linux"),
            (NFD_NVIDIA, "false"),
            (GFD_NVIDIA, "false"),
        ],
    ),
    (
        "pool-a-gpu",
        &[
            ("kubernetes.io/os", "linux"),
            ("pool", "a"),
            (GFD_NVIDIA, "true"),
        ],
    ),
    (
        "pool-a-cpu",
        &[("kubernetes.io/os", "linux"), ("pool", "a")],
    ),
    (
        "pool-b-gpu",
        &[
            ("kubernetes.io/os", "linux"),
            ("pool", "b"),
            (NFD_NVIDIA, "true"),
        ],
    ),
    (
        "windows-gpu",
        &[("kubernetes.io/os", "windows"), (GFD_NVIDIA, "true")],
    ),
];

/// For every node of [`NODES`], which agents would run there.
fn agents_per_node(docs: &[Value]) -> Vec<(&'static str, Vec<String>)> {
    let daemonsets = of_kind(docs, "DaemonSet");
    NODES
        .iter()
        .map(|(node, labels)| {
            let agents = daemonsets
                .iter()
                .filter(|ds| schedules_on(ds, node, labels))
                .map(|ds| name_of(ds).to_string())
                .collect();
            (*node, agents)
        })
        .collect()
}

#[test]
fn nvml_agents_are_off_by_default() {
    let Some(docs) = render("nvml_agents_are_off_by_default", &[]) else {
        return;
    };
    let agent = agent_daemonset(&docs);
    assert_eq!(name_of(agent), "hwaccel-agent");
    let pod = &agent["spec"]["template"]["spec"];
    assert!(pod["runtimeClassName"].is_null());
    assert!(
        pod["affinity"].is_null(),
        "no node split: {}",
        pod["affinity"]
    );
    let env = env_of(&pod["containers"][0]);
    assert!(
        env.iter()
            .all(|(name, _)| !name.starts_with("NVIDIA_") && name != "HWACCEL_NVML"),
        "{env:?}"
    );
    // Every linux node runs the one agent.
    for (node, agents) in agents_per_node(&docs) {
        let expected: Vec<String> = if node == "windows-gpu" {
            vec![]
        } else {
            vec!["hwaccel-agent".into()]
        };
        assert_eq!(agents, expected, "{node}");
    }
}

#[test]
fn nvml_agents_run_the_glibc_image_under_the_nvidia_runtime() {
    let test = "nvml_agents_run_the_glibc_image_under_the_nvidia_runtime";
    let Some(docs) = render(test, NVML_ON) else {
        return;
    };
    assert_eq!(of_kind(&docs, "DaemonSet").len(), 2);
    let static_agent = daemonset(&docs, "hwaccel-agent");
    let nvml_agent = daemonset(&docs, "hwaccel-agent-nvml");
    let static_pod = &static_agent["spec"]["template"]["spec"];
    let nvml_pod = &nvml_agent["spec"]["template"]["spec"];
    assert_eq!(nvml_pod["runtimeClassName"], "nvidia");
    assert!(static_pod["runtimeClassName"].is_null());
    let static_image = static_pod["containers"][0]["image"]
        .as_str()
        .expect("image");
    let nvml_image = nvml_pod["containers"][0]["image"].as_str().expect("image");
    assert_eq!(nvml_image, format!("{static_image}-glibc"));
    let env = env_of(&nvml_pod["containers"][0]);
    for expected in [
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("NVIDIA_DRIVER_CAPABILITIES", "utility"),
        ("HWACCEL_NVML", "container"),
    ] {
        assert!(
            env.contains(&(expected.0.into(), expected.1.into())),
            "{expected:?} in {env:?}"
        );
    }
    let static_env = env_of(&static_pod["containers"][0]);
    assert!(
        static_env
            .iter()
            .all(|(name, _)| !name.starts_with("NVIDIA_") && name != "HWACCEL_NVML"),
        "{static_env:?}"
    );
    // The same binary in the same way: arguments, probes, ports.
    for field in [
        "args",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "resources",
    ] {
        assert_eq!(
            static_pod["containers"][0][field], nvml_pod["containers"][0][field],
            "{field}"
        );
    }
}

#[test]
fn nvml_agent_image_follows_the_chart_image_or_its_own_values() {
    let test = "nvml_agent_image_follows_the_chart_image_or_its_own_values";
    let image = |extra: &[&str]| -> Option<String> {
        let mut args = NVML_ON.to_vec();
        args.extend_from_slice(extra);
        let docs = render(test, &args)?;
        let pod = &daemonset(&docs, "hwaccel-agent-nvml")["spec"]["template"]["spec"];
        Some(pod["containers"][0]["image"].as_str()?.to_string())
    };
    let Some(derived) = image(&["--set", "image.tag=v9.9.9"]) else {
        return;
    };
    assert_eq!(derived, "ghcr.io/hwaccel/hwaccel-operator:v9.9.9-glibc");
    let digest = format!("sha256:{}", "a".repeat(64));
    // A digest of the static image is not the glibc image's: only the NVML digest pins it.
    let static_digest = format!("image.digest={digest}");
    assert_eq!(
        image(&["--set", &static_digest, "--set", "image.tag=v1"]).as_deref(),
        Some("ghcr.io/hwaccel/hwaccel-operator:v1-glibc")
    );
    let own = [
        "--set",
        "agent.nvml.image.repository=registry.example/hwaccel",
        "--set",
        "agent.nvml.image.tag=glibc-build",
    ];
    assert_eq!(
        image(&own).as_deref(),
        Some("registry.example/hwaccel:glibc-build")
    );
    let pinned = format!("agent.nvml.image.digest={digest}");
    assert_eq!(
        image(&["--set", &pinned]),
        Some(format!("ghcr.io/hwaccel/hwaccel-operator@{digest}"))
    );
    let Some(docs) = render(
        test,
        &[NVML_ON, &["--set", "agent.nvml.runtimeClassName="]].concat(),
    ) else {
        return;
    };
    let pod = &daemonset(&docs, "hwaccel-agent-nvml")["spec"]["template"]["spec"];
    assert!(
        pod["runtimeClassName"].is_null(),
        "empty: the node's default runtime"
    );
}

#[test]
fn nvml_and_default_agents_split_the_nodes_exactly() {
    let test = "nvml_and_default_agents_split_the_nodes_exactly";
    let Some(docs) = render(test, NVML_ON) else {
        return;
    };
    let expected = |node: &str| -> Vec<String> {
        match node {
            "windows-gpu" => vec![],
            "cpu" | "labelled-false" | "pool-a-cpu" => vec!["hwaccel-agent".into()],
            _ => vec!["hwaccel-agent-nvml".into()],
        }
    };
    for (node, agents) in agents_per_node(&docs) {
        assert_eq!(agents, expected(node), "{node}");
    }
    // With the user's own node affinity (two terms: pool a, or one node by name), both agents
    // keep it and still split: nothing outside it, exactly one agent inside it.
    let affinity = r#"agent.affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"pool","operator":"In","values":["a"]}]},{"matchFields":[{"key":"metadata.name","operator":"In","values":["cpu","both-gpu"]}]}]}}}"#;
    let Some(docs) = render(test, &[NVML_ON, &["--set-json", affinity]].concat()) else {
        return;
    };
    for (node, agents) in agents_per_node(&docs) {
        let wanted = match node {
            "pool-a-gpu" | "both-gpu" => vec!["hwaccel-agent-nvml".to_string()],
            "pool-a-cpu" | "cpu" => vec!["hwaccel-agent".to_string()],
            _ => vec![],
        };
        assert_eq!(agents, wanted, "{node} with agent.affinity");
    }
    // One pool by its own label, with Exists.
    let pool = r#"agent.nvml.nodes=[{"key":"pool","operator":"Exists"}]"#;
    let Some(docs) = render(test, &[NVML_ON, &["--set-json", pool]].concat()) else {
        return;
    };
    for (node, agents) in agents_per_node(&docs) {
        let wanted = match node {
            "windows-gpu" => vec![],
            node if node.starts_with("pool-") => vec!["hwaccel-agent-nvml".to_string()],
            _ => vec!["hwaccel-agent".to_string()],
        };
        assert_eq!(agents, wanted, "{node} with pool Exists");
    }
}

#[test]
fn nvml_agents_keep_the_agent_security_context_mounts_and_identity() {
    let test = "nvml_agents_keep_the_agent_security_context_mounts_and_identity";
    for extra in [&[][..], ROOT_WITH_RECURSIVE_READ_ONLY] {
        let Some(docs) = render(test, &[NVML_ON, extra].concat()) else {
            return;
        };
        assert_hardened(&docs, extra.is_empty());
        let static_pod = &daemonset(&docs, "hwaccel-agent")["spec"]["template"]["spec"];
        let nvml_pod = &daemonset(&docs, "hwaccel-agent-nvml")["spec"]["template"]["spec"];
        for field in [
            "securityContext",
            "serviceAccountName",
            "automountServiceAccountToken",
            "hostNetwork",
            "hostPID",
            "hostIPC",
            "volumes",
            "tolerations",
            "nodeSelector",
        ] {
            assert_eq!(static_pod[field], nvml_pod[field], "{field} ({extra:?})");
        }
        for field in ["securityContext", "volumeMounts"] {
            assert_eq!(
                static_pod["containers"][0][field], nvml_pod["containers"][0][field],
                "container {field} ({extra:?})"
            );
        }
        let security = &nvml_pod["containers"][0]["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert_eq!(nvml_pod["containers"].as_array().map(Vec::len), Some(1));
        assert!(nvml_pod["initContainers"].is_null());
    }
}

#[test]
fn nvml_agents_are_selected_by_the_agent_services_and_policies_only_as_agents() {
    let test = "nvml_agents_are_selected_by_the_agent_services_and_policies_only_as_agents";
    let Some(docs) = render(
        test,
        &[NVML_ON, &["--set", "metrics.serviceMonitor.enabled=true"]].concat(),
    ) else {
        return;
    };
    let static_agent = daemonset(&docs, "hwaccel-agent");
    let nvml_agent = daemonset(&docs, "hwaccel-agent-nvml");
    let matches = |selector: &Value, labels: &Value| {
        selector
            .as_object()
            .expect("matchLabels")
            .iter()
            .all(|(key, value)| &labels[key] == value)
    };
    let static_labels = &static_agent["spec"]["template"]["metadata"]["labels"];
    let nvml_labels = &nvml_agent["spec"]["template"]["metadata"]["labels"];
    // Each DaemonSet's selector matches its own pods; the NVML one never the default pods, so
    // it cannot adopt them. (The default selector predates the NVML agent and cannot change:
    // it also matches NVML pods, which carry the NVML DaemonSet's controller reference and so
    // are never adopted.)
    let static_selector = &static_agent["spec"]["selector"]["matchLabels"];
    let nvml_selector = &nvml_agent["spec"]["selector"]["matchLabels"];
    assert!(matches(static_selector, static_labels));
    assert!(matches(nvml_selector, nvml_labels));
    assert!(!matches(nvml_selector, static_labels));
    // The metrics Service and the agents' NetworkPolicy cover both.
    let service = of_kind(&docs, "Service")
        .into_iter()
        .find(|service| name_of(service) == "hwaccel-agent-metrics")
        .expect("the agents' metrics Service");
    let policy = of_kind(&docs, "NetworkPolicy")
        .into_iter()
        .find(|policy| matches(&policy["spec"]["podSelector"]["matchLabels"], static_labels))
        .expect("the agents' NetworkPolicy");
    for labels in [static_labels, nvml_labels] {
        assert!(matches(&service["spec"]["selector"], labels), "{labels}");
        assert!(
            matches(&policy["spec"]["podSelector"]["matchLabels"], labels),
            "{labels}"
        );
    }
}

#[test]
fn uninstall_hook_stops_the_nvml_agents_too() {
    let test = "uninstall_hook_stops_the_nvml_agents_too";
    for (extra, expected) in [
        (&[][..], vec!["hwaccel-agent"]),
        (NVML_ON, vec!["hwaccel-agent", "hwaccel-agent-nvml"]),
    ] {
        let Some(docs) = render(test, extra) else {
            return;
        };
        let job = of_kind(&docs, "Job")[0];
        let stopped: Vec<&str> = job["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|arg| arg.as_str()?.strip_prefix("--stop-agent="))
            .collect();
        assert_eq!(stopped, expected, "{extra:?}");
        let role = of_kind(&docs, "Role")
            .into_iter()
            .find(|role| name_of(role) == "hwaccel-cleanup")
            .expect("the cleanup Role");
        let rule = role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .find(|rule| rule["resources"] == serde_json::json!(["daemonsets"]))
            .expect("the DaemonSet rule");
        assert_eq!(
            rule["resourceNames"],
            serde_json::json!(expected),
            "{extra:?}"
        );
        assert_eq!(rule["verbs"], serde_json::json!(["delete"]));
        // The pods it waits for (component agent) include the NVML agents' pods.
        let selector = job["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(Value::as_str)
            .find_map(|arg| arg.strip_prefix("--writer-pods="))
            .expect("--writer-pods");
        assert!(selector.contains("app.kubernetes.io/component in (agent,controller)"));
    }
}

#[test]
fn nvml_node_split_values_are_refused_with_and_without_the_schema() {
    let Some(helm) = find_helm() else {
        skip_notice("nvml_node_split_values_are_refused_with_and_without_the_schema");
        return;
    };
    let chart = chart_dir();
    for bad in [
        r#"agent.nvml.nodes=[]"#,
        r#"agent.nvml.nodes=[{"key":"gpu","operator":"NotIn","values":["false"]}]"#,
        r#"agent.nvml.nodes=[{"key":"gpu","operator":"In","values":[]}]"#,
        r#"agent.nvml.nodes=[{"key":"gpu","operator":"In"}]"#,
        r#"agent.nvml.nodes=[{"key":"gpu","operator":"Exists","values":["x"]}]"#,
        r#"agent.nvml.nodes=[{"key":"gpu","operator":"Gt","values":["1"]}]"#,
    ] {
        for skip_schema in [false, true] {
            let mut args = vec!["--set", "agent.nvml.enabled=true", "--set-json", bad];
            if skip_schema {
                args.push("--skip-schema-validation");
            }
            let result = helm::template(&helm, &chart, "hwaccel", NAMESPACE, &args);
            assert!(
                result.is_err(),
                "{bad} (skip schema: {skip_schema}) rendered"
            );
        }
    }
    for bad in [
        "agent.nvml.bogus=1",
        "agent.nvml.driverCapabilities=compute",
        "agent.nvml.runtimeClassName=Not_A_Name",
    ] {
        let result = helm::template(&helm, &chart, "hwaccel", NAMESPACE, &["--set", bad]);
        assert!(
            result.is_err(),
            "--set {bad} should be rejected by values.schema.json"
        );
    }
}

/// The arguments of every agent container (both agent DaemonSets).
fn agent_args(docs: &[Value]) -> Vec<String> {
    of_kind(docs, "DaemonSet")
        .into_iter()
        .flat_map(|d| {
            containers(&d["spec"]["template"]["spec"])
                .into_iter()
                .cloned()
        })
        .flat_map(|c| c["args"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

#[test]
fn compat_labels_are_opt_in_and_open_exactly_their_keys_to_writes() {
    for (values, on) in [
        (&[][..], false),
        (&["--set", "agent.compatLabels=true"][..], true),
    ] {
        let Some(docs) = render(
            "compat_labels_are_opt_in_and_open_exactly_their_keys_to_writes",
            values,
        ) else {
            return;
        };
        assert_eq!(
            agent_args(&docs).iter().any(|a| a == "--compat-labels"),
            on,
            "{values:?}"
        );
        let policy = of_kind(&docs, "ValidatingAdmissionPolicy")
            .into_iter()
            .find(|p| name_of(p).ends_with("-node-writes"))
            .expect("the node-writes policy");
        let variables = policy["spec"]["variables"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let variable = |name: &str| {
            variables
                .iter()
                .find(|v| v["name"] == name)
                .and_then(|v| v["expression"].as_str())
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(variable("exactKeysWritable"), on.to_string(), "{values:?}");
        let keys = variable("exactKeys");
        for key in [
            "nvidia.com/gpu.product",
            "nvidia.com/gpu.count",
            "nvidia.com/gpu.memory",
            "nvidia.com/gpu.family",
            "amd.com/gpu.product-name",
        ] {
            assert!(keys.contains(&format!("'{key}'")), "{key}: {keys}");
        }
        // Never the controller's, and no prefix: exact keys only.
        assert!(keys.contains("!= 'system:serviceaccount:"), "{keys}");
        assert!(!keys.contains("'nvidia.com/'"), "{keys}");
    }
}

#[test]
fn listing_pods_for_conformance_is_granted_and_passed_only_when_asked() {
    for (list, rules) in [("true", 2), ("false", 1)] {
        let set = format!("controller.conformance.listPods={list}");
        let Some(docs) = render(
            "listing_pods_for_conformance_is_granted_and_passed_only_when_asked",
            &["--set", &set],
        ) else {
            return;
        };
        assert_eq!(controller_rules_for(&docs, "pods").len(), rules, "{list}");
        let args = of_kind(&docs, "Deployment")
            .into_iter()
            .filter(|d| name_of(d) == "hwaccel-controller")
            .map(|d| d["spec"]["template"]["spec"]["containers"][0]["args"].to_string())
            .collect::<String>();
        assert!(
            args.contains(&format!("--conformance-list-pods={list}")),
            "{list}: {args}"
        );
    }
}
