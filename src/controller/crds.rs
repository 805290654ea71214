//! Start-up check: the apiserver serves the CRDs the controller watches. Without them every
//! watch answers 404 and kube-runtime retries it forever, so a controller started before its
//! CRDs were installed would sit there, never Ready and never saying why. It exits at once
//! instead (status 1), naming each missing CRD and how to install it.
//!
//! Which CRDs are missing is a pure question over the resource names the apiserver lists for
//! `hwaccel.io/v1alpha1` ([`missing`]); [`ensure_served`] asks it.

use std::time::Duration;

use kube::{Client, Resource};

use crate::api::{API_VERSION, AcceleratorInventory, GROUP, ModelPlacement};
use crate::backoff::Backoff;

/// Asks before giving up when the apiserver does not answer the question at all (a 404 is an
/// answer): 1 s, 2 s, 4 s, 8 s.
const ATTEMPTS: u32 = 5;
const RETRY: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));

/// A CRD the controller cannot run without.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needed {
    /// `AcceleratorInventory`.
    pub kind: String,
    /// `acceleratorinventories`.
    pub plural: String,
}

impl Needed {
    fn of<K: Resource<DynamicType = ()>>() -> Self {
        Self {
            kind: K::kind(&()).into_owned(),
            plural: K::plural(&()).into_owned(),
        }
    }

    /// The CRD's name: `acceleratorinventories.hwaccel.io`.
    pub fn crd_name(&self) -> String {
        format!("{}.{GROUP}", self.plural)
    }
}

/// The CRDs the controller watches.
pub fn needed() -> Vec<Needed> {
    vec![
        Needed::of::<AcceleratorInventory>(),
        Needed::of::<ModelPlacement>(),
    ]
}

/// The needed CRDs whose resource is not among `served` (the resource names the apiserver
/// lists for [`API_VERSION`]; subresources such as `modelplacements/status` do not count).
pub fn missing(served: &[String]) -> Vec<Needed> {
    needed()
        .into_iter()
        .filter(|needed| !served.contains(&needed.plural))
        .collect()
}

/// What a controller without its CRDs says before it exits.
pub fn missing_message(missing: &[Needed]) -> String {
    let listed: Vec<String> = missing
        .iter()
        .map(|m| format!("{} (CRD {})", m.kind, m.crd_name()))
        .collect();
    format!(
        "the apiserver does not serve {} in {API_VERSION}: the CRDs are not installed. \
         Install them with the Helm chart (crds.install=true, the default), or with \
         `hwaccel crds | kubectl apply --server-side -f -` (or `kubectl apply --server-side \
         -f crds/` from a checkout), then start the controller again (docs/install.md)",
        listed.join(" and ")
    )
}

/// Returns an error naming the missing CRDs, or why the apiserver could not be asked, when
/// the controller cannot run; `Ok` when every CRD it watches is served.
pub async fn ensure_served(client: &Client) -> anyhow::Result<()> {
    let mut attempt = 1;
    let served: Vec<String> = loop {
        match client.list_api_group_resources(API_VERSION).await {
            Ok(list) => break list.resources.into_iter().map(|r| r.name).collect(),
            // The group version is not served at all: no CRD of ours is installed.
            Err(kube::Error::Api(status)) if status.code == 404 => break Vec::new(),
            Err(err) if attempt < ATTEMPTS => {
                let wait = RETRY.wait(attempt);
                tracing::warn!(error = %err, retry_in = ?wait, "asking which {GROUP} resources the apiserver serves failed");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(err) => {
                return Err(anyhow::Error::new(err).context(format!(
                    "could not ask the apiserver whether the {GROUP} CRDs are installed"
                )));
            }
        }
    };
    let missing = missing(&served);
    if missing.is_empty() {
        Ok(())
    } else {
        anyhow::bail!(missing_message(&missing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn both_served_is_nothing_missing() {
        let served = names(&[
            "acceleratorinventories",
            "acceleratorinventories/status",
            "modelplacements",
            "modelplacements/status",
        ]);
        assert_eq!(missing(&served), []);
    }

    #[test]
    fn a_subresource_alone_does_not_count() {
        let served = names(&["acceleratorinventories", "modelplacements/status"]);
        let missing = missing(&served);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert_eq!(missing[0].kind, "ModelPlacement");
        assert_eq!(missing[0].crd_name(), "modelplacements.hwaccel.io");
    }

    #[test]
    fn nothing_served_names_both_and_how_to_install_them() {
        let missing = missing(&[]);
        let message = missing_message(&missing);
        for expected in [
            "AcceleratorInventory (CRD acceleratorinventories.hwaccel.io)",
            "ModelPlacement (CRD modelplacements.hwaccel.io)",
            "hwaccel crds | kubectl apply --server-side -f -",
            "hwaccel.io/v1alpha1",
        ] {
            assert!(message.contains(expected), "{expected} not in: {message}");
        }
    }
}
