//! The input bounds of a model description, in one leaf both the config reader and the
//! context scaling read.
//!
//! Upper bounds that no real model comes near; beyond them a value is a corrupt file (or a
//! hostile ModelPlacement). Every number the memory model multiplies is bounded by one of
//! these, which keeps every product far inside 64 bits (`docs/planner.md`, "Input bounds").

/// Layers (10,000).
pub const MAX_LAYERS: u64 = 10_000;
/// Hidden, intermediate, head and latent dimensions (4,194,304).
pub const MAX_DIM: u64 = 1 << 22;
/// Attention heads, KV heads, experts, experts per token, shared experts (65,536).
pub const MAX_HEADS: u64 = 1 << 16;
/// Vocabulary size (16,777,216).
pub const MAX_VOCAB: u64 = 1 << 24;
/// Context lengths and attention windows, in tokens (4,294,967,296).
pub const MAX_CONTEXT: u64 = 1 << 32;
