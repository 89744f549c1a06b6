//! Scoring done in Rust, shared by every index: all of [`InMemoryIndex`]'s searches and the
//! substring (CJK) searches of [`SqliteIndex`] and `PgIndex`, so that the three rank,
//! highlight and order those hits the same way.
//!
//! [`InMemoryIndex`]: super::InMemoryIndex
//! [`SqliteIndex`]: crate::SqliteIndex

use super::{Hit, Query, QueryMode, Term, highlight, is_cjk, words_of};

/// Whether `words` contains the term's words in order, the last one as a prefix if asked.
fn words_match(words: &[String], term: &Term) -> usize {
    let n = term.words.len();
    if n == 0 || words.len() < n {
        return 0;
    }
    let mut count = 0;
    for start in 0..=(words.len() - n) {
        let ok = term.words.iter().enumerate().all(|(k, w)| {
            let got = &words[start + k];
            if k == n - 1 && term.prefix {
                got.starts_with(w.as_str())
            } else {
                got == w
            }
        });
        if ok {
            count += 1;
        }
    }
    count
}

/// Scores a row for a query: occurrences per term, normalised by line length.
/// Returns how many terms matched and the score.
fn score_row(text: &str, query: &Query) -> (usize, f64) {
    let mut matched = 0;
    let mut occurrences = 0usize;
    match query.mode {
        QueryMode::Words => {
            let words = words_of(text);
            for t in &query.terms {
                let c = words_match(&words, t);
                if c > 0 {
                    matched += 1;
                    occurrences += c;
                }
            }
        }
        QueryMode::Trigram | QueryMode::Scan => {
            if !text.chars().any(is_cjk) {
                return (0, 0.0);
            }
            let lower = text.to_lowercase();
            for t in &query.terms {
                let c = lower.matches(t.text.as_str()).count();
                if c > 0 {
                    matched += 1;
                    occurrences += c;
                }
            }
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let score = occurrences as f64 / (1.0 + text.chars().count() as f64 / 40.0);
    (matched, score)
}

/// The needles to highlight for a query.
fn needles(query: &Query) -> Vec<String> {
    match query.mode {
        QueryMode::Words => query.terms.iter().flat_map(|t| t.words.clone()).collect(),
        _ => query.terms.iter().map(|t| t.text.clone()).collect(),
    }
}

/// Sorts hits best first, then by path and line, and cuts to `limit`.
fn rank(mut hits: Vec<Hit>, limit: usize) -> Vec<Hit> {
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.path.cmp(&b.path))
            .then_with(|| a.line.cmp(&b.line))
    });
    hits.truncate(limit);
    hits
}

/// Scores candidate rows `(path, line, text)` against `query` and returns the best `limit`
/// as highlighted hits: the rows that match every term or, when none does, the rows that
/// match any term (the AND→OR fallback of the contract). Rows matching no term are dropped.
pub(crate) fn rank_rows<P, T>(
    rows: impl IntoIterator<Item = (P, u32, T)>,
    query: &Query,
    limit: usize,
) -> Vec<Hit>
where
    P: Into<String>,
    T: AsRef<str>,
{
    let needles = needles(query);
    let mut all = Vec::new();
    let mut any = Vec::new();
    for (path, line, text) in rows {
        let text = text.as_ref();
        let (matched, score) = score_row(text, query);
        if matched == 0 {
            continue;
        }
        let hit = Hit {
            path: path.into(),
            line,
            snippet: highlight(text, &needles),
            score,
        };
        if matched == query.terms.len() {
            all.push(hit);
        } else {
            any.push(hit);
        }
    }
    rank(if all.is_empty() { any } else { all }, limit)
}
