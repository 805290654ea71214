//! Ordered device alternatives → a ResourceClaimTemplate with one prioritized-list request.
//!
//! The template has one request, [`REQUEST_NAME`], whose `firstAvailable` lists the
//! alternatives in the caller's order (the planner's): kube-scheduler allocates the first one
//! it can satisfy, and the allocation result names it as `accelerators/<subrequest>`. Each
//! subrequest uses the family DeviceClass of its driver ([`super::device_classes`]) and adds
//! a CEL selector that tests `device.driver` before reading the driver's product attribute or
//! memory capacity. A tensor-parallel group that must share a domain (a PCIe root, an NVLink
//! clique) gets a `matchAttribute` constraint scoped to its own subrequest.
//!
//! Limits are DRA's: at most 8 subrequests (`FirstAvailableDeviceRequestMaxSize`), names are
//! DNS labels, and a request's allocation has at most 32 results
//! (`AllocationResultsMaxSize`), so a count above 32 could never be allocated.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequirements, DeviceClaim, DeviceConstraint, DeviceRequest,
    DeviceSelector, DeviceSubRequest, ResourceClaimSpec, ResourceClaimTemplate,
    ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::device_classes::{attributes, capacity, family_class_name};
use super::drivers::known;
use super::slices::MAX_DEVICE_MEMORY;

/// The name of the template's one request, which pods and constraints refer to.
pub const REQUEST_NAME: &str = "accelerators";

/// Most subrequests a `firstAvailable` list may have (`FirstAvailableDeviceRequestMaxSize`).
pub const MAX_ALTERNATIVES: usize = 8;

/// Most devices one alternative may ask for: an allocation holds at most 32 results
/// (`AllocationResultsMaxSize`, kubernetes/api `resource/v1/types.go`). The apiserver takes a
/// larger count, but kube-scheduler 1.36 refuses to allocate it and the pod stays Pending.
pub const MAX_COUNT: u32 = 32;

/// Longest string attribute value DRA stores; a longer product name can never match.
const MAX_ATTRIBUTE_STRING: usize = 64;

/// One alternative: `count` devices of one driver, optionally of one product, with at least
/// some memory each, optionally all sharing one attribute's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alternative {
    /// The subrequest's name (a DNS label, unique in the list).
    pub name: String,
    /// The DRA driver (`gpu.nvidia.com`); must be a known one.
    pub driver: String,
    /// The value of the driver's product attribute (`NVIDIA H100 80GB HBM3`).
    pub product: Option<String>,
    /// Least memory per device, in bytes (the driver's memory capacity).
    pub min_memory_bytes: Option<u64>,
    /// How many devices (1 to [`MAX_COUNT`]).
    pub count: u32,
    /// A qualified attribute all `count` devices must share (`resource.kubernetes.io/pcieRoot`,
    /// `gpu.nvidia.com/...`); only applied when `count` > 1.
    pub same_domain_attribute: Option<String>,
    /// Bytes of each device's memory capacity to request (`capacity.requests`): a share of a
    /// device published shareable (the scheduler rounds it to the driver's policy and lets
    /// other claims share the rest), or all of it, so that no share lands beside a replica
    /// that holds the whole device. `None` asks for no amount (the policy's default).
    pub memory_request: Option<u64>,
    /// A partition profile (`3g.40gb`): the subrequest asks for one partition of that profile
    /// through the driver's partition DeviceClass instead of a whole device.
    pub partition_profile: Option<String>,
}

/// Why a template could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// No alternatives were given.
    #[error("a claim template needs at least one alternative")]
    NoAlternatives,
    /// More alternatives than DRA allows.
    #[error("{count} alternatives given; DRA allows at most {MAX_ALTERNATIVES}")]
    TooManyAlternatives {
        /// How many were given.
        count: usize,
    },
    /// A name is not what Kubernetes accepts.
    #[error("{what} {name:?} is invalid: {reason}")]
    BadName {
        /// Which name (`namespace`, `template name`, `alternative name`).
        what: &'static str,
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two alternatives share a name.
    #[error("alternative name {0:?} is used twice")]
    DuplicateName(String),
    /// The driver is not one we know (no family class, no attribute names).
    #[error("alternative {alternative:?}: unknown DRA driver {driver:?}")]
    UnknownDriver {
        /// The alternative.
        alternative: String,
        /// The driver.
        driver: String,
    },
    /// The count is 0 or too large.
    #[error("alternative {alternative:?}: count {count} is not between 1 and {MAX_COUNT}")]
    BadCount {
        /// The alternative.
        alternative: String,
        /// The count.
        count: u32,
    },
    /// A memory bound was asked of a driver that publishes no memory capacity.
    #[error("alternative {alternative:?}: driver {driver} publishes no memory capacity")]
    NoMemoryCapacity {
        /// The alternative.
        alternative: String,
        /// The driver.
        driver: String,
    },
    /// A product was asked of a driver that publishes no product-name attribute.
    #[error("alternative {alternative:?}: driver {driver} publishes no product-name attribute")]
    NoProductAttribute {
        /// The alternative.
        alternative: String,
        /// The driver.
        driver: String,
    },
    /// A memory request of 0 or beyond any device's memory.
    #[error("alternative {alternative:?}: memory request {bytes} is not between 1 and {max}")]
    BadMemoryRequest {
        /// The alternative.
        alternative: String,
        /// The bytes asked for.
        bytes: u64,
        /// The most a request may ask.
        max: u64,
    },
    /// A partition was asked of a driver whose partitions are not known.
    #[error("alternative {alternative:?}: driver {driver} publishes no partitions we know")]
    NoPartitions {
        /// The alternative.
        alternative: String,
        /// The driver.
        driver: String,
    },
    /// The product value could never match an attribute.
    #[error("alternative {alternative:?}: product {product:?} is invalid: {reason}")]
    BadProduct {
        /// The alternative.
        alternative: String,
        /// The product.
        product: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The same-domain attribute is not a qualified attribute name.
    #[error("alternative {alternative:?}: attribute {attribute:?} is invalid: {reason}")]
    BadAttribute {
        /// The alternative.
        alternative: String,
        /// The attribute.
        attribute: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The ResourceClaimTemplate `namespace/name` whose one request takes the first of
/// `alternatives` the scheduler can satisfy; owned by `owner` when given.
pub fn claim_template(
    namespace: &str,
    name: &str,
    owner: Option<OwnerReference>,
    alternatives: &[Alternative],
) -> Result<ResourceClaimTemplate, TemplateError> {
    check_name("namespace", namespace, dns_label)?;
    check_name("template name", name, dns_subdomain)?;
    if alternatives.is_empty() {
        return Err(TemplateError::NoAlternatives);
    }
    if alternatives.len() > MAX_ALTERNATIVES {
        return Err(TemplateError::TooManyAlternatives {
            count: alternatives.len(),
        });
    }
    let mut subrequests = Vec::with_capacity(alternatives.len());
    let mut constraints = Vec::new();
    for (i, alternative) in alternatives.iter().enumerate() {
        if alternatives[..i].iter().any(|a| a.name == alternative.name) {
            return Err(TemplateError::DuplicateName(alternative.name.clone()));
        }
        subrequests.push(subrequest(alternative)?);
        if let Some(constraint) = constraint(alternative)? {
            constraints.push(constraint);
        }
    }
    Ok(ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "hwaccel-operator".to_string(),
            )])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: ResourceClaimTemplateSpec {
            metadata: None,
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: REQUEST_NAME.to_string(),
                        first_available: Some(subrequests),
                        exactly: None,
                    }]),
                    constraints: (!constraints.is_empty()).then_some(constraints),
                    config: None,
                }),
            },
        },
    })
}

/// The subrequest for one alternative: its family class plus a driver-first selector.
fn subrequest(alternative: &Alternative) -> Result<DeviceSubRequest, TemplateError> {
    let label = &alternative.name;
    check_name("alternative name", label, dns_label)?;
    let driver = known(&alternative.driver).ok_or_else(|| TemplateError::UnknownDriver {
        alternative: label.clone(),
        driver: alternative.driver.clone(),
    })?;
    if alternative.count == 0 || alternative.count > MAX_COUNT {
        return Err(TemplateError::BadCount {
            alternative: label.clone(),
            count: alternative.count,
        });
    }
    let mut parts = vec![format!("device.driver == '{}'", driver.name)];
    if let Some(product) = &alternative.product {
        check_product(label, product)?;
        let attrs = attributes(driver.name);
        let key = driver
            .product
            .attribute()
            .ok_or_else(|| TemplateError::NoProductAttribute {
                alternative: label.clone(),
                driver: driver.name.to_string(),
            })?;
        parts.push(format!(
            "'{key}' in {attrs} && {attrs}.{key} == '{}'",
            cel_escape(product)
        ));
    }
    // The driver's memory capacity, for a floor or a request on it.
    let memory_key = || {
        driver
            .memory
            .ok_or_else(|| TemplateError::NoMemoryCapacity {
                alternative: label.clone(),
                driver: driver.name.to_string(),
            })
    };
    if let Some(bytes) = alternative.min_memory_bytes {
        let key = memory_key()?;
        let cap = capacity(driver.name);
        parts.push(format!(
            "'{key}' in {cap} && {cap}.{key}.compareTo(quantity('{bytes}')) >= 0"
        ));
    }
    let capacity = match alternative.memory_request {
        None => None,
        Some(bytes) => {
            let key = memory_key()?;
            if bytes == 0 || bytes > MAX_DEVICE_MEMORY {
                return Err(TemplateError::BadMemoryRequest {
                    alternative: label.clone(),
                    bytes,
                    max: MAX_DEVICE_MEMORY,
                });
            }
            Some(CapacityRequirements {
                requests: Some(BTreeMap::from([(
                    key.to_string(),
                    crate::api::quantity::bytes(bytes),
                )])),
            })
        }
    };
    let mut device_class_name = family_class_name(driver.family);
    if let Some(profile) = &alternative.partition_profile {
        let source = driver
            .partition
            .ok_or_else(|| TemplateError::NoPartitions {
                alternative: label.clone(),
                driver: driver.name.to_string(),
            })?;
        check_product(label, profile)?;
        let attrs = attributes(driver.name);
        let key = source.profile;
        parts.push(format!(
            "'{key}' in {attrs} && {attrs}.{key} == '{}'",
            cel_escape(profile)
        ));
        device_class_name = source.class.to_string();
    }
    Ok(DeviceSubRequest {
        name: label.clone(),
        device_class_name,
        capacity,
        selectors: Some(vec![DeviceSelector {
            cel: Some(CELDeviceSelector {
                expression: parts.join(" && "),
            }),
        }]),
        allocation_mode: Some("ExactCount".to_string()),
        count: Some(i64::from(alternative.count)),
        ..Default::default()
    })
}

/// The same-domain constraint of a multi-device alternative, scoped to its subrequest.
fn constraint(alternative: &Alternative) -> Result<Option<DeviceConstraint>, TemplateError> {
    let Some(attribute) = &alternative.same_domain_attribute else {
        return Ok(None);
    };
    check_attribute(attribute).map_err(|reason| TemplateError::BadAttribute {
        alternative: alternative.name.clone(),
        attribute: attribute.clone(),
        reason,
    })?;
    // One device is always in its own domain; a constraint would only shut out devices
    // that lack the attribute.
    if alternative.count < 2 {
        return Ok(None);
    }
    Ok(Some(DeviceConstraint {
        match_attribute: Some(attribute.clone()),
        requests: Some(vec![format!("{REQUEST_NAME}/{}", alternative.name)]),
        distinct_attribute: None,
    }))
}

fn check_name(
    what: &'static str,
    name: &str,
    rule: fn(&str) -> Result<(), &'static str>,
) -> Result<(), TemplateError> {
    rule(name).map_err(|reason| TemplateError::BadName {
        what,
        name: name.to_string(),
        reason,
    })
}

fn check_product(alternative: &str, product: &str) -> Result<(), TemplateError> {
    let reason = if product.is_empty() {
        Some("empty")
    } else if product.len() > MAX_ATTRIBUTE_STRING {
        Some("longer than the 64 characters a DRA attribute holds")
    } else if product.chars().any(char::is_control) {
        Some("contains control characters")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(TemplateError::BadProduct {
            alternative: alternative.to_string(),
            product: product.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// A CEL single-quoted string body: backslashes and quotes escaped.
fn cel_escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\'', "\\'")
}

/// RFC 1123 label: 1–63 lowercase alphanumerics or '-', alphanumeric at both ends.
fn dns_label(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 63 {
        return Err("must be 1 to 63 characters");
    }
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !name.chars().all(|c| ok_char(c) || c == '-') {
        return Err("only lowercase letters, digits and '-' are allowed");
    }
    if !name.starts_with(ok_char) || !name.ends_with(ok_char) {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters.
fn dns_subdomain(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("must be 1 to 253 characters");
    }
    name.split('.').try_for_each(dns_label)
}

/// A qualified DRA attribute name: `<DNS subdomain of at most 63>/<C identifier of at most
/// 32>`; the domain is required in constraints.
fn check_attribute(attribute: &str) -> Result<(), &'static str> {
    let (domain, ident) = attribute.split_once('/').ok_or("must be <domain>/<name>")?;
    if domain.len() > 63 {
        return Err("the domain must be at most 63 characters");
    }
    dns_subdomain(domain)?;
    let starts_ok = ident
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !starts_ok
        || ident.len() > 32
        || !ident.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err("the name must be a C identifier of at most 32 characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
