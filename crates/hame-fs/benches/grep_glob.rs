//! Grep and glob over a generated 10,000-file workspace (filled in below).
fn main() {}
