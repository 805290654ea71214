//! A driver's pool, as DRA's consumer rules read it: per `(driver, pool)` only the highest
//! `pool.generation` counts, and only once all `resourceSliceCount` slices of it are seen.
//! Both the device reader ([`super::slices`]) and the counter reader ([`super::counters`])
//! start here, so neither imports the other.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::ResourceSlice;

/// A pool claiming more slices than this is treated as malformed (DRA has no hard limit,
/// but one node's pool never needs thousands).
const MAX_SLICES_PER_POOL: i64 = 4096;

/// The slices of a pool's highest generation when all of them are present, else `None`
/// with a note. Slices are told apart by object name, so a file listing one twice does not
/// complete a pool.
pub(super) fn complete_generation<'a>(
    driver: &str,
    pool: &str,
    slices: &[&'a ResourceSlice],
    notes: &mut Vec<String>,
) -> Option<Vec<&'a ResourceSlice>> {
    let generation = slices.iter().map(|s| s.spec.pool.generation).max()?;
    let current: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.pool.generation == generation)
        .copied()
        .collect();
    let expected = current
        .iter()
        .map(|s| s.spec.pool.resource_slice_count)
        .max()
        .unwrap_or(0);
    if !(1..=MAX_SLICES_PER_POOL).contains(&expected) {
        notes.push(format!(
            "pool {driver}/{pool}: resourceSliceCount {expected} is not usable, pool skipped"
        ));
        return None;
    }
    let mut names = BTreeSet::new();
    let distinct: Vec<&ResourceSlice> = current
        .into_iter()
        .filter(|s| names.insert(s.metadata.name.clone().unwrap_or_default()))
        .collect();
    let seen = i64::try_from(distinct.len()).unwrap_or(i64::MAX);
    if seen < expected {
        notes.push(format!(
            "pool {driver}/{pool}: {seen} of {expected} slices of generation {generation} seen, \
             pool skipped until it is complete"
        ));
        return None;
    }
    Some(distinct)
}
