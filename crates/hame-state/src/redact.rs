//! Keeping store credentials out of messages: [`redact_url`] for showing a store URL, and
//! errors of connecting that are scrubbed of the URL's password before anyone sees them.

use std::fmt;
use std::ops::Range;

/// Where the password of `scheme://user:password@host…` stands in `url` (as written,
/// percent-encoded or not).
fn password_span(url: &str) -> Option<Range<usize>> {
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let authority = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    let at = authority.rfind('@')?;
    let colon = authority[..at].find(':')?;
    (colon + 1 < at).then(|| start + colon + 1..start + at)
}

fn password(url: &str) -> Option<&str> {
    password_span(url).map(|span| &url[span])
}

/// Decodes `%XX` escapes; anything malformed stays as it is.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                let v = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `url` with its password (if any) replaced by `***`, fit for logs and messages:
/// `postgres://app:s3cret@db/x` becomes `postgres://app:***@db/x`.
pub fn redact_url(url: &str) -> String {
    match password_span(url) {
        Some(span) => format!("{}***{}", &url[..span.start], &url[span.end..]),
        None => url.to_owned(),
    }
}

/// `text` with every appearance of `url`'s password (as written and percent-decoded)
/// replaced by `***`.
pub(crate) fn scrub(text: &str, url: &str) -> String {
    let Some(pw) = password(url) else {
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
