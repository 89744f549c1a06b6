//! Base URLs: parsing (a bad URL is a config error, found when the client is built),
//! joining the provider's path, and the credential-free form named in messages and logs.

use hame_core::ModelError;
use hame_core::secrets::is_secret_param;
use reqwest::Url;

/// Parses a configured base URL; `var` names where it came from (`OPENAI_BASE_URL`).
///
/// # Errors
/// [`ModelError::Config`] for anything that cannot work: not a URL, an invalid port, a
/// scheme other than `http`/`https`. The message names `var` and shows the URL without
/// credentials.
pub(crate) fn parse_base_url(raw: &str, var: &str) -> Result<Url, ModelError> {
    let raw = raw.trim();
    let shown = redact_str(raw);
    let url = Url::parse(raw).map_err(|e| {
        ModelError::Config(format!(
            "{var} is not a valid URL ({shown:?}: {e}); expected http://HOST[:PORT][/PATH]"
        ))
    })?;
    if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
        return Err(ModelError::Config(format!(
            "{var} must be an http:// or https:// URL with a host (got {shown:?})"
        )));
    }
    Ok(url)
}

/// `base` with `segments` appended to its path (its query is kept).
pub(crate) fn join(base: &Url, segments: &[&str]) -> Url {
    let mut url = base.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    url
}

/// The URL as named in messages: user and password replaced by `***`, secret-looking query
/// values replaced by `***`, no fragment, no trailing `/`.
pub(crate) fn redact(url: &Url) -> String {
    let mut u = url.clone();
    if !u.username().is_empty() || u.password().is_some() {
        // Both only fail for URLs without a host, which `parse_base_url` rejects.
        let _ = u.set_password(None);
        let _ = u.set_username("***");
    }
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let v = if is_secret_param(&k) {
                    "***".to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.set_fragment(None);
    let s = String::from(u);
    match s.strip_suffix('/') {
        Some(trimmed) if !trimmed.ends_with('/') => trimmed.to_owned(),
        _ => s,
    }
}

/// [`redact`] for text that may not parse: the user-info part (up to the last `@` of the
/// authority) and any query are replaced by `***`.
pub(crate) fn redact_str(raw: &str) -> String {
    if let Ok(url) = Url::parse(raw)
        && url.has_host()
    {
        return redact(&url);
    }
    let (scheme, rest) = match raw.find("://") {
        Some(i) => raw.split_at(i + 3),
        None => ("", raw),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rfind('@') {
        Some(at) => format!("***{}", &authority[at..]),
        None => authority.to_owned(),
    };
    let tail = match tail.find('?') {
        Some(q) => format!("{}?***", &tail[..q]),
        None => tail.to_owned(),
    };
    format!("{scheme}{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn redaction_hides_credentials() {
        assert_eq!(
            redact(&url("http://user:s3cret@127.0.0.1:8000/v1")),
            "http://***@127.0.0.1:8000/v1"
        );
        assert_eq!(
            redact(&url("http://127.0.0.1:8000/")),
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            redact(&url("https://h/v1?api-version=2024&api_key=s3cret#frag")),
            "https://h/v1?api-version=2024&api_key=***"
        );
        for raw in [
            "http://user:s3cret@127.0.0.1:99999/v1",
            "user:s3cret@127.0.0.1:8000/v1",
            "ftp://u:s3cret@h/x",
            "http://h:99999/v1?token=s3cret",
        ] {
            let shown = redact_str(raw);
            assert!(!shown.contains("s3cret"), "{raw} -> {shown}");
        }
        assert_eq!(
            redact_str("http://user:s3cret@127.0.0.1:99999/v1"),
            "http://***@127.0.0.1:99999/v1"
        );
        assert_eq!(redact_str("localhost:8000"), "localhost:8000");
    }

    #[test]
    fn bad_urls_are_config_errors_naming_the_variable() {
        for (raw, fragment) in [
            ("http://127.0.0.1:99999/v1", "invalid port number"),
            ("127.0.0.1:8000/v1", "not a valid URL"),
            ("localhost:8000/v1", "must be an http:// or https:// URL"),
            ("", "not a valid URL"),
            ("http://u:s3cret@h:70000", "invalid port number"),
        ] {
            match parse_base_url(raw, "OPENAI_BASE_URL") {
                Err(ModelError::Config(m)) => {
                    assert!(m.starts_with("OPENAI_BASE_URL "), "{m}");
                    assert!(m.contains(fragment), "{raw}: {m}");
                    assert!(!m.contains("s3cret"), "{m}");
                }
                other => panic!("{raw}: {other:?}"),
            }
        }
        assert!(parse_base_url(" https://api.openai.com/v1 ", "X").is_ok());
    }

    #[test]
    fn join_appends_to_the_path() {
        let j = |b: &str, s: &[&str]| join(&url(b), s).to_string();
        assert_eq!(
            j("http://h:1/v1", &["chat", "completions"]),
            "http://h:1/v1/chat/completions"
        );
        assert_eq!(j("http://h:1/v1/", &["messages"]), "http://h:1/v1/messages");
        assert_eq!(
            j("http://h:1", &["v1", "messages"]),
            "http://h:1/v1/messages"
        );
        assert_eq!(
            j(
                "https://h/openai/v1?api-version=1",
                &["chat", "completions"]
            ),
            "https://h/openai/v1/chat/completions?api-version=1"
        );
    }
}
