//! Placeholder for shared-store backends.
