//! Two replicas continue one session through Redis; see the crate docs.
//!
//! ```sh
//! HAME_MODEL=openai:gpt-4o-mini OPENAI_API_KEY=sk-... \
//!   cargo run -p example-distributed -- --redis redis://127.0.0.1:6379/
//! ```

fn main() -> std::process::ExitCode {
    example_distributed::main_entry()
}
