//! A placement's identity, `namespace/name`: the key every loop and metric names a placement
//! by (the ledger's holdings, the fleet's per-placement gauges).

/// A placement's identity: namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PlacementKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl PlacementKey {
    /// The key of `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for PlacementKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
