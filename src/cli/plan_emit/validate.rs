//! What `--emit` writes, checked as Kubernetes would check it, before anything is printed.
//!
//! The strings come from flags and from a placement file anyone can hand-edit: a namespace
//! with a newline in it, a node selector key with a space, an image with a line break would
//! otherwise be copied into YAML that `kubectl apply` refuses (or, worse, that means
//! something else), and a replica count past `i32::MAX` used to surface as an "internal"
//! error from the typed Deployment. Each refusal names the field and what is wrong with it.

use crate::names::{is_valid_label_key, is_valid_label_value};
use crate::plan::error::{PlanError, Result};

use super::{Target, Workload};

/// Checks one pool's workload (the caller checks a prefill pool on its own).
pub(super) fn check(workload: &Workload) -> Result<()> {
    if let Some(namespace) = &workload.namespace {
        dns_label(namespace).map_err(|why| refuse("namespace", namespace, why))?;
    }
    dns_label(&workload.name).map_err(|why| refuse("name", &workload.name, why))?;
    image(&workload.image).map_err(|why| refuse("image", &workload.image, why))?;
    for (what, count) in [
        ("replicas", workload.replicas),
        ("nodes per replica", workload.nodes_per_replica),
        ("devices per pod", workload.devices_per_pod),
    ] {
        if i32::try_from(count).is_err() {
            return Err(PlanError::constraint(format!(
                "{what} {count} is more than Kubernetes takes ({})",
                i32::MAX
            )));
        }
    }
    match &workload.target {
        Target::Hosts { nodes, resource } => {
            for node in nodes {
                dns_subdomain(node).map_err(|why| refuse("node name", node, why))?;
            }
            extended_resource(resource).map_err(|why| refuse("resource name", resource, why))?;
        }
        Target::Selector { selector, resource } => {
            selector_of(selector.iter())?;
            extended_resource(resource).map_err(|why| refuse("resource name", resource, why))?;
        }
        Target::Claims(per_replica) => {
            for claim in per_replica.iter().flatten() {
                for r in &claim.pod_template.resource_claims {
                    dns_label(&r.name).map_err(|why| refuse("pod claim name", &r.name, why))?;
                    dns_subdomain(&r.resource_claim_name)
                        .map_err(|why| refuse("claim name", &r.resource_claim_name, why))?;
                }
                selector_of(claim.pod_template.node_selector.iter())?;
            }
        }
        Target::ClaimTemplate(name, template) => {
            dns_label(name).map_err(|why| refuse("pod claim name", name, why))?;
            dns_subdomain(template).map_err(|why| refuse("claim template name", template, why))?;
        }
        // The template itself was built and checked by `dra::claim_template`.
        Target::Share { nodes, claim, .. } => {
            for node in nodes {
                dns_subdomain(node).map_err(|why| refuse("node name", node, why))?;
            }
            dns_label(claim).map_err(|why| refuse("pod claim name", claim, why))?;
        }
    }
    Ok(())
}

/// A node selector's keys and values are label keys and values.
fn selector_of<'a>(selector: impl Iterator<Item = (&'a String, &'a String)>) -> Result<()> {
    for (key, value) in selector {
        if !is_valid_label_key(key) {
            return Err(refuse("nodeSelector key", key, "not a label key"));
        }
        if !is_valid_label_value(value) {
            return Err(refuse("nodeSelector value", value, "not a label value"));
        }
    }
    Ok(())
}

fn refuse(what: &str, value: &str, why: &str) -> PlanError {
    // Debug formatting shows a newline as `\n` and cuts nothing a reader needs; long values
    // are cut so the message stays one readable line.
    let shown: String = value.chars().take(80).collect();
    PlanError::constraint(format!(
        "{what} {shown:?} is not valid in Kubernetes: {why}"
    ))
}

/// RFC 1123 label: 1 to 63 lowercase letters, digits or '-', alphanumeric at both ends
/// (namespaces, object names used as labels, pod claim names).
fn dns_label(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > 63 {
        return Err("must be 1 to 63 characters");
    }
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !name.chars().all(|c| alnum(c) || c == '-') {
        return Err("only lowercase letters, digits and '-' are allowed");
    }
    if !name.starts_with(alnum) || !name.ends_with(alnum) {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters (object names).
fn dns_subdomain(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("must be 1 to 253 characters");
    }
    name.split('.').try_for_each(dns_label)
}

/// An extended resource: a qualified name with a domain (`nvidia.com/gpu`).
fn extended_resource(name: &str) -> std::result::Result<(), &'static str> {
    if !name.contains('/') || !is_valid_label_key(name) {
        return Err("must be a qualified name with a domain, like nvidia.com/gpu");
    }
    Ok(())
}

/// A container image: Kubernetes refuses surrounding whitespace; a line break or control
/// character inside would make the printed YAML mean something else to whoever reads it.
fn image(image: &str) -> std::result::Result<(), &'static str> {
    if image.is_empty() {
        return Err("must not be empty");
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not hold whitespace or control characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> Workload {
        Workload {
            name: "llama".to_string(),
            namespace: Some("serving".to_string()),
            image: super::super::DEFAULT_IMAGE.to_string(),
            engine: crate::plan::engine::choice::EngineKind::Vllm,
            model: "meta-llama/Llama-3.1-8B-Instruct".to_string(),
            args: vec!["--tensor-parallel-size".to_string(), "1".to_string()],
            replicas: 2,
            nodes_per_replica: 1,
            devices_per_pod: 1,
            target: Target::Selector {
                selector: [("placement.hwaccel.io/llama".to_string(), "true".to_string())].into(),
                resource: "nvidia.com/gpu".to_string(),
            },
            prefill: None,
            placement: None,
        }
    }

    fn refused(workload: &Workload) -> String {
        match check(workload) {
            Ok(()) => panic!("accepted: {workload:?}"),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn a_plain_workload_passes() {
        assert!(check(&workload()).is_ok());
    }

    #[test]
    fn a_namespace_with_a_newline_is_refused_and_shown_escaped() {
        let mut bad = workload();
        bad.namespace = Some("serving\nkind: Secret".to_string());
        let message = refused(&bad);
        assert!(
            message.contains("namespace \"serving\\nkind: Secret\""),
            "{message}"
        );
        assert!(!message.contains('\n'), "{message}");
    }

    #[test]
    fn replicas_past_what_kubernetes_takes_are_refused_not_an_internal_error() {
        let mut bad = workload();
        bad.replicas = u32::MAX;
        let message = refused(&bad);
        assert!(message.contains("replicas 4294967295"), "{message}");
        assert!(!message.contains("internal"), "{message}");
    }

    #[test]
    fn selectors_images_resources_and_claim_names_are_checked() {
        let mut bad = workload();
        bad.target = Target::Selector {
            selector: [("bad key".to_string(), "true".to_string())].into(),
            resource: "nvidia.com/gpu".to_string(),
        };
        assert!(refused(&bad).contains("nodeSelector key"));
        let mut bad = workload();
        bad.image = "vllm:latest\n".to_string();
        assert!(refused(&bad).contains("image"));
        let mut bad = workload();
        bad.target = Target::Hosts {
            nodes: vec!["node-a".to_string()],
            resource: "gpu".to_string(),
        };
        assert!(refused(&bad).contains("resource name"));
        let mut bad = workload();
        bad.target = Target::ClaimTemplate("gpus".to_string(), "Not_A_Name".to_string());
        assert!(refused(&bad).contains("claim template name"));
    }
}
