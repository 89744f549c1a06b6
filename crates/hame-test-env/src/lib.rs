//! The one rule hame's tests, conformance suites and `xtask` use to read their environment.
//!
//! * [`ci`]: whether this run is CI. `CI` set to anything but an empty string, `0`,
//!   `false`, `no` or `off` (any case) is CI: `CI=true` (GitHub, GitLab), `CI=1` and
//!   `CI=yes` all count. Under CI a test that cannot reach a service it needs fails
//!   instead of skipping.
//! * [`service`]: the value of a `HAME_TEST_*` variable, or `None` after a loud `SKIPPED`
//!   line (a panic under CI).
//! * [`skip`]: the same choice for any other missing prerequisite (a Python venv, a
//!   browser, a binary).
//! * [`moto_s3_settings`] and [`git`]: set-up that several suites share (the moto S3
//!   server's object-store settings; git with a fixed identity).
//!
//! No dependencies, so every crate can use it as a dev-dependency (and `hame-state`'s
//! `conformance` feature as a normal one). See `docs/testing.md`.
//!
//! ```
//! // With HAME_TEST_NOTHING unset: `None` locally, a failure under CI.
//! if !hame_test_env::ci() {
//!     assert_eq!(hame_test_env::service("HAME_TEST_NOTHING", "example"), None);
//! }
//! ```

// Skipping loudly is the point of this crate.
#![allow(clippy::print_stderr)]

/// Whether `value` (of the `CI` variable) means CI.
pub fn ci_value(value: &str) -> bool {
    let v = value.trim();
    !(v.is_empty()
        || v == "0"
        || ["false", "no", "off"]
            .iter()
            .any(|f| v.eq_ignore_ascii_case(f)))
}

/// Whether this run is CI (`CI` set to a value [`ci_value`] accepts).
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| ci_value(&v))
}

/// A prerequisite is missing: under CI this panics with `why` (the test fails); otherwise
/// it prints `SKIPPED: <why>` to stderr and the caller returns.
///
/// # Panics
///
/// Under CI, always: a test must not go green by not running.
pub fn skip(why: impl std::fmt::Display) {
    assert!(
        !ci(),
        "{why} (CI is set: every test service must be available)"
    );
    eprintln!("SKIPPED: {why}");
}

/// The value of the test-service variable `var` (e.g. `HAME_TEST_REDIS_URL`), or `None`
/// after [`skip`] when it is unset or blank; `what` names the tests that did not run.
///
/// # Panics
///
/// Under CI when `var` is unset or blank.
pub fn service(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ => {
            skip(format_args!(
                "{var} is not set, so the {what} tests did not run; start the services with \
                 `cargo xtask services` and `eval \"$(cargo xtask env)\"`"
            ));
            None
        }
    }
}

/// Whether the Docker tests run (`HAME_TEST_DOCKER=1`); otherwise [`skip`].
///
/// # Panics
///
/// Under CI when `HAME_TEST_DOCKER` is not `1`.
pub fn docker(what: &str) -> bool {
    if std::env::var("HAME_TEST_DOCKER").is_ok_and(|v| v.trim() == "1") {
        return true;
    }
    skip(format_args!(
        "HAME_TEST_DOCKER is not set, so the {what} tests did not run"
    ));
    false
}

/// The object-store settings of the moto S3 server the tests start at `endpoint`
/// (`HAME_TEST_S3_ENDPOINT`): its fixed credentials, path-style requests over plain HTTP.
/// Give each to `ObjectStoreOptions::with`.
pub fn moto_s3_settings(endpoint: &str) -> [(&'static str, String); 6] {
    [
        ("aws_endpoint", endpoint.to_owned()),
        ("aws_access_key_id", "test".to_owned()),
        ("aws_secret_access_key", "test".to_owned()),
        ("aws_region", "us-east-1".to_owned()),
        ("aws_allow_http", "true".to_owned()),
        ("aws_virtual_hosted_style_request", "false".to_owned()),
    ]
}

/// Runs `git args` in `dir` with a fixed identity and no global configuration: its trimmed
/// stdout, or an error with its stderr.
pub fn git(dir: &std::path::Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .map_err(|e| format!("git {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::ci_value;

    #[test]
    fn every_common_spelling_of_ci_counts_and_the_off_values_do_not() {
        for on in ["true", "TRUE", "1", "yes", " true ", "anything"] {
            assert!(ci_value(on), "{on:?}");
        }
        for off in ["", " ", "0", "false", "False", "no", "off", "OFF"] {
            assert!(!ci_value(off), "{off:?}");
        }
    }
}
