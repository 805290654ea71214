//! The ModelPlacement controller.
