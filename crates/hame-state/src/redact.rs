//! Keeping store credentials out of messages: errors of connecting that are scrubbed of the
//! URL's password before anyone sees them. Showing a store URL (`redact_url`) and finding
//! its password are `hame_core::secrets`'s, shared with the model clients and the CLI.

use std::fmt;

use hame_core::secrets::{percent_decode, url_password};

/// `text` with every appearance of `url`'s password (as written and percent-decoded)
/// replaced by `***`.
pub(crate) fn scrub(text: &str, url: &str) -> String {
    let Some(pw) = url_password(url) else {
        return text.to_owned();
    };
    let decoded = percent_decode(pw);
    let mut out = text.replace(pw, "***");
    if !decoded.is_empty() {
        out = out.replace(&decoded, "***");
    }
    out
}

/// A backend failure while connecting to a store URL: the cause's whole chain as text,
/// scrubbed of the URL's password. The original error is dropped, so neither its
/// `Display` nor its `Debug` (which may show connection options) can leak the password.
pub(crate) struct Scrubbed(String);

impl Scrubbed {
    pub(crate) fn new(source: &(dyn std::error::Error + 'static), url: &str) -> Self {
        let mut text = source.to_string();
        let mut next = source.source();
        while let Some(cause) = next {
            let more = cause.to_string();
            if !text.contains(&more) {
                text.push_str(": ");
                text.push_str(&more);
            }
            next = cause.source();
        }
        Self(scrub(&text, url))
    }
}

impl fmt::Display for Scrubbed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Scrubbed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl std::error::Error for Scrubbed {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact_url;

    #[test]
    fn redacts_the_password_only() {
        for (url, want) in [
            (
                "postgres://app:s3cret@db:5432/x",
                "postgres://app:***@db:5432/x",
            ),
            (
                "redis://:hunter2@127.0.0.1:6379/0",
                "redis://:***@127.0.0.1:6379/0",
            ),
            (
                "mysql://u:p%40ss@h/db?ssl=true",
                "mysql://u:***@h/db?ssl=true",
            ),
            ("rediss://user:a@b@host/", "rediss://user:***@host/"),
            ("postgres://app@db/x", "postgres://app@db/x"),
            ("redis://127.0.0.1/", "redis://127.0.0.1/"),
            ("/var/lib/hame/state", "/var/lib/hame/state"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn scrubs_encoded_and_decoded_passwords() {
        let url = "mysql://u:p%40ss%2Fw@h/db";
        assert_eq!(
            scrub("auth failed for p@ss/w (p%40ss%2Fw)", url),
            "auth failed for *** (***)"
        );
        assert_eq!(scrub("nothing to hide", "redis://h/"), "nothing to hide");
    }

    #[test]
    fn scrubbed_errors_keep_the_chain_but_not_the_password() {
        let inner = std::io::Error::other("tried hunter2");
        let outer = crate::Error::io("x", inner);
        let s = Scrubbed::new(&outer, "redis://:hunter2@h/");
        let text = format!("{s} {s:?}");
        assert!(
            text.contains("tried ***") && !text.contains("hunter2"),
            "{text}"
        );
    }
}
