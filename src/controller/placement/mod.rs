//! The placement loop: one reconcile per ModelPlacement, *dereference → validate → build →
//! apply → status*. A thin driver that reads the watch caches and writes to the apiserver,
//! around a pure [`core`] that decides.
//!
//! | module | job |
//! |---|---|
//! | [`core`] | the pure placement core: decide, ledger, build, desired status, claims |
//! | [`reconcile`] | one reconcile: the steps in order, the finalizer, the backoff |
//! | [`dereference`] | what a decision reads, from the watch caches |
//! | [`apply`] | placement labels onto Nodes by server-side apply |
//! | [`claims`] | the ResourceClaims of a `spec.allocation: claims` plan |
//! | [`prune`] | the prune pass: holdings of placements that no longer exist are freed |
//! | [`owner`] | what ties a placement's claims and template to it: owner reference, ownership test |
//! | [`pod_health`] | the pods a plan's claims are reserved for, read for their device health |
//! | [`conformance`] | the pods that run a plan (its claims' and its labelled ones), read for conformance |
//! | [`claim_template`] | the ResourceClaimTemplate of a `spec.allocation: claimTemplate` plan |
//! | [`run`] | the loop's run: ledger rebuild, the Controller, label repair, prune pass |
//! | [`status`] | the status subresource and Events |

pub mod apply;
pub mod claim_template;
pub mod claims;
pub mod conformance;
pub mod core;
pub mod dereference;
pub mod owner;
pub mod pod_health;
pub mod prune;
pub mod reconcile;
#[cfg(test)]
pub(crate) mod reconcile_tests;
pub mod run;
pub mod status;
