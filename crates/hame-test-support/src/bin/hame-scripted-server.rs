//! `hame-scripted-server [SCRIPT.json] [PORT] [-- COMMAND ARGS...]`: serves a script until
//! killed. Without a script file (or with `-` as its name) it serves the looping demo
//! script ([`hame_test_support::demo_reply`]): every request gets an answer.
//!
//! Prints `listening on http://127.0.0.1:PORT` on stdout once it accepts connections,
//! then the `export OPENAI_BASE_URL=...` line to paste into the shell that runs hame.
//!
//! With `-- COMMAND ARGS...` it prints nothing, runs the command with `OPENAI_BASE_URL`,
//! `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` pointing at itself, and
//! exits with the command's exit code when it ends.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;
use std::process::ExitCode;

use hame_test_support::{Script, ScriptedServer};

const USAGE: &str = "usage: hame-scripted-server [SCRIPT.json|-] [PORT] [-- COMMAND ARGS...]\n\
  SCRIPT.json is {\"steps\": [...], \"fallback\": {...}} or a bare array of steps;\n\
  without it (or with -) a looping demo script answers every request.\n\
  With -- COMMAND, runs it against the server (OPENAI_BASE_URL, OPENAI_API_KEY,\n\
  ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY set) and exits with its exit code.";

#[tokio::main]
async fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let command: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--")
        .map(|i| args.split_off(i).into_iter().skip(1).collect());
    if command.as_ref().is_some_and(Vec::is_empty) {
        eprintln!("no command after --\n{USAGE}");
        return ExitCode::from(2);
    }
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    // `hame-scripted-server PORT` (a number) serves the demo on that port.
    let (path, port_arg) = match args.first() {
        Some(a) if a.parse::<u16>().is_ok() => (None, Some(a.as_str())),
        Some(a) if a == "-" => (None, args.get(1).map(String::as_str)),
        Some(a) => (Some(a.as_str()), args.get(1).map(String::as_str)),
        None => (None, None),
    };
    let port: u16 = match port_arg.map(str::parse) {
        None => 0,
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            eprintln!(
                "invalid port {:?}: {e}\n{USAGE}",
                port_arg.unwrap_or_default()
            );
            return ExitCode::from(2);
        }
    };
    let script = match path {
        None => Script::default(),
        Some(path) => {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("cannot read script {path}: {e}\n{USAGE}");
                    return ExitCode::FAILURE;
                }
            };
            match Script::from_json(&text) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("invalid script {path}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let server = match ScriptedServer::start_on(script, port).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if path.is_none() {
        server.set_responder(hame_test_support::demo_reply);
    }
    let url = server.url();
    if let Some(command) = command {
        return run_command(&command, &url).await;
    }
    // The URL, then the line to paste into the shell that runs hame (OpenAI-compatible
    // clients want /v1); a reader that stops after the first line is no error.
    let _ = write!(
        std::io::stdout(),
        "listening on {url}\nexport OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY=scripted\n"
    );
    let _ = std::io::stdout().flush();
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("cannot wait for Ctrl-C: {e}");
    }
    drop(server);
    ExitCode::SUCCESS
}

/// Runs `command` against the server at `url`; its exit code (1 when it was killed by a
/// signal, 127 when it cannot be started).
async fn run_command(command: &[String], url: &str) -> ExitCode {
    let (program, args) = match command.split_first() {
        Some(split) => split,
        None => return ExitCode::from(2),
    };
    let status = tokio::process::Command::new(program)
        .args(args)
        .env("OPENAI_BASE_URL", format!("{url}/v1"))
        .env("OPENAI_API_KEY", "scripted")
        .env("ANTHROPIC_BASE_URL", url)
        .env("ANTHROPIC_API_KEY", "scripted")
        .status()
        .await;
    match status {
        Ok(s) => match s.code() {
            Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            None => ExitCode::FAILURE,
        },
        Err(e) => {
            eprintln!("cannot run {program}: {e}");
            ExitCode::from(127)
        }
    }
}
