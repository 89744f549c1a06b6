//! The `example-distributed` program, built here so its integration test can run it.

fn main() -> std::process::ExitCode {
    example_distributed::main_entry()
}
