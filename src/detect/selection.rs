//! Which backends run: `--backends all`, `--backends nvidia,amd`, or `--backends all,-vulkan`.
//! The names are the registry's ([`backends::REGISTRY`]).

use std::collections::BTreeSet;
use std::str::FromStr;

use super::backends;

/// A set of enabled backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSelection {
    enabled: BTreeSet<&'static str>,
}

impl Default for BackendSelection {
    fn default() -> Self {
        Self::all()
    }
}

/// A selection naming a backend that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend {name:?}; known backends: {}", known_names())]
pub struct SelectionError {
    /// The unknown name.
    pub name: String,
}

/// The registered backend names, comma-separated, for the error message.
fn known_names() -> String {
    backends::names().collect::<Vec<_>>().join(", ")
}

impl BackendSelection {
    /// Every backend.
    pub fn all() -> Self {
        Self {
            enabled: backends::names().collect(),
        }
    }

    /// True when the named backend is enabled.
    pub fn includes(&self, name: &str) -> bool {
        self.enabled.contains(name)
    }

    /// The enabled backend names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.enabled.iter().copied()
    }
}

impl FromStr for BackendSelection {
    type Err = SelectionError;

    /// Parses a comma-separated list. Plain names enable, `-name` disables, `all` enables
    /// everything; a list of only exclusions starts from `all`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let items: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .collect();
        let only_exclusions = items.iter().all(|item| item.starts_with('-'));
        let mut enabled = if only_exclusions {
            Self::all().enabled
        } else {
            BTreeSet::new()
        };
        for item in items {
            let (remove, name) = match item.strip_prefix('-') {
                Some(name) => (true, name),
                None => (false, item),
            };
            if name == "all" {
                if remove {
                    enabled.clear();
                } else {
                    enabled.extend(backends::names());
                }
                continue;
            }
            let known = backends::lookup(name).ok_or_else(|| SelectionError {
                name: name.to_string(),
            })?;
            if remove {
                enabled.remove(known);
            } else {
                enabled.insert(known);
            }
        }
        Ok(Self { enabled })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_exclusions() {
        let only: BackendSelection = "nvidia, amd".parse().unwrap();
        assert!(only.includes("nvidia") && only.includes("amd") && !only.includes("cpu"));
        let without: BackendSelection = "-vulkan".parse().unwrap();
        assert!(without.includes("nvidia") && !without.includes("vulkan"));
        let all_but: BackendSelection = "all,-pci".parse().unwrap();
        assert!(!all_but.includes("pci") && all_but.includes("cpu"));
        assert!("nvidai".parse::<BackendSelection>().is_err());
    }
}
