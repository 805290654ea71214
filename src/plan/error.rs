//! Everything that makes a planning request unanswerable, as opposed to answerable with "it
//! does not fit". Each variant's message names the input at fault and, where it can, the fix.

use std::path::PathBuf;

/// Bad input to the planner: the CLI maps every variant to exit code 1.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// `--model` named neither a preset nor an existing file.
    #[error("unknown model {name:?}: not a preset and not a file{hint}")]
    UnknownModel {
        /// What the user typed.
        name: String,
        /// `; did you mean ...?` or a pointer to the preset list, already formatted.
        hint: String,
    },
    /// A ModelPlacement's preset key that names no preset.
    #[error("unknown model preset {name:?}{hint}")]
    UnknownPreset {
        /// The key.
        name: String,
        /// `; did you mean ...?` or a pointer to the preset list, already formatted.
        hint: String,
    },
    /// An inline model config that cannot be decoded as JSON (malformed, or nested too deep).
    #[error("{origin}: cannot be read as JSON: {reason}")]
    UnreadableConfig {
        /// Where the config came from (`spec.model.huggingFaceConfig`).
        origin: String,
        /// The decoder's message.
        reason: String,
    },
    /// A model config (config.json or a preset) lacks a field or holds an impossible value.
    #[error("invalid model config {origin}: {reason}")]
    InvalidConfig {
        /// The file or preset the config came from.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A bare parameter count that does not parse or is out of range.
    #[error(
        "invalid parameter count {0:?}: expected a positive number with an optional K/M/B/T suffix, e.g. 70B or 8e9"
    )]
    InvalidParamCount(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// An inventory file that is neither a detection report nor a node list.
    #[error("invalid inventory {path}: {reason}")]
    InvalidInventory {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A `--hardware` shorthand that does not parse.
    #[error("invalid --hardware {spec:?}: {reason}")]
    InvalidHardware {
        /// The shorthand.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The inventory holds no accelerator the planner can use.
    #[error("no usable accelerators: {0}")]
    NoDevices(String),
    /// A constraint that no hardware could ever satisfy (zero context, utilisation above 1...).
    #[error("invalid constraint: {0}")]
    InvalidConstraint(String),
}

/// The planner's result type.
pub type Result<T> = std::result::Result<T, PlanError>;

impl PlanError {
    /// Shorthand for [`PlanError::InvalidConfig`].
    pub fn config(origin: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            origin: origin.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`PlanError::InvalidConstraint`].
    pub fn constraint(reason: impl Into<String>) -> Self {
        Self::InvalidConstraint(reason.into())
    }
}
