//! The ResourceClaimTemplate of a `claimTemplate` placement: written by server-side apply
//! when it changes, deleted when the placement goes away or leaves that mode.
//!
//! A template's spec is immutable, so a changed list of alternatives replaces the template
//! (delete, then apply); claims already made from the old one keep their devices. Whether it
//! changed is told by a hash of the spec we wrote, kept in an annotation, because the
//! apiserver fills in defaults and the stored spec never equals the applied one.

use std::time::Instant;

use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use crate::api::ModelPlacement;
use crate::dra::claim_template::{Alternative, TemplateError, claim_template};
use crate::dra::claims::PLACEMENT_LABEL;
use crate::names::hash_hex;

use super::claims::delete_exactly;
use super::owner::{made_for, non_blocking_owner};
use crate::controller::context::{Context, FIELD_MANAGER};

/// The annotation holding the hash of the spec the controller wrote.
pub use crate::names::keys::SPEC_HASH_ANNOTATION;

/// A template write that failed.
#[derive(Debug, thiserror::Error)]
pub enum TemplateWriteError {
    /// The alternatives make no valid template.
    #[error("ResourceClaimTemplate {name}: {source}")]
    Build {
        /// The template.
        name: String,
        /// What is wrong.
        #[source]
        source: TemplateError,
    },
    /// The apiserver refused or did not answer.
    #[error("ResourceClaimTemplate {name}: {source}")]
    Api {
        /// The template.
        name: String,
        /// What went wrong.
        #[source]
        source: kube::Error,
    },
    /// The placement has no uid yet (never the case for a stored object).
    #[error("the placement has no uid")]
    NoUid,
}

/// Makes the placement's template (named after it) list `alternatives`; writes only when
/// the spec changed or the template is missing.
pub async fn sync_template(
    ctx: &Context,
    placement: &ModelPlacement,
    alternatives: &[Alternative],
) -> Result<(), TemplateWriteError> {
    let name = placement.name_any();
    let namespace = placement.namespace().unwrap_or_default();
    let owner = non_blocking_owner(placement).ok_or(TemplateWriteError::NoUid)?;
    let mut template =
        claim_template(&namespace, &name, Some(owner), alternatives).map_err(|source| {
            TemplateWriteError::Build {
                name: name.clone(),
                source,
            }
        })?;
    let spec_text = serde_json::to_string(&template.spec).unwrap_or_default();
    let hash = hash_hex(&spec_text);
    template
        .labels_mut()
        .insert(PLACEMENT_LABEL.to_string(), name.clone());
    template
        .annotations_mut()
        .insert(SPEC_HASH_ANNOTATION.to_string(), hash.clone());
    let api: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing = api
        .get_opt(&name)
        .await
        .map_err(|source| failed(ctx, &name, source))?;
    if let Some(existing) = &existing {
        let same = existing.annotations().get(SPEC_HASH_ANNOTATION) == Some(&hash)
            && existing.labels().get(PLACEMENT_LABEL) == Some(&name)
            && existing.owner_references() == template.owner_references();
        if same {
            return Ok(());
        }
        delete(ctx, &api, existing).await?;
    }
    let writing = Instant::now();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&template),
    )
    .await
    .map_err(|source| failed(ctx, &name, source))?;
    ctx.metrics
        .wrote("resource_claim_template", writing.elapsed());
    tracing::info!(template = %name, %namespace, alternatives = alternatives.len(), "wrote ResourceClaimTemplate");
    Ok(())
}

/// Deletes the placement's template, if it has one we made (our label, owned by it).
pub async fn release_template(
    ctx: &Context,
    placement: &ModelPlacement,
) -> Result<(), TemplateWriteError> {
    let name = placement.name_any();
    let namespace = placement.namespace().unwrap_or_default();
    let api: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(existing) = api
        .get_opt(&name)
        .await
        .map_err(|source| failed(ctx, &name, source))?
    else {
        return Ok(());
    };
    let ours = placement
        .uid()
        .is_some_and(|uid| made_for(&existing, &name, &uid));
    if ours {
        delete(ctx, &api, &existing).await?;
    }
    Ok(())
}

async fn delete(
    ctx: &Context,
    api: &Api<ResourceClaimTemplate>,
    template: &ResourceClaimTemplate,
) -> Result<(), TemplateWriteError> {
    delete_exactly(api, template)
        .await
        .map_err(|source| failed(ctx, &template.name_any(), source))
}

fn failed(ctx: &Context, name: &str, source: kube::Error) -> TemplateWriteError {
    ctx.metrics.failed("resource_claim_template");
    TemplateWriteError::Api {
        name: name.to_string(),
        source,
    }
}
