//! The model-facing tools.
