//! Cross-crate integration tests: one agent under concurrent load, the distributed example.
mod suite;
