#![allow(clippy::print_stderr)]
//! End-to-end tests of the `hame` binary against the scripted model server over HTTP.
mod suite;
