//! Object key encoding of virtual paths: one path segment is one key segment, with the
//! bytes that object stores or local file names would misread percent-encoded.

use hame_fs::FsPath;

/// Whether an ASCII byte must be encoded (the set `object_store` itself refuses or
/// re-encodes in a path part, plus `%` so decoding is unambiguous).
fn must_encode(b: u8) -> bool {
    b.is_ascii_control()
        || matches!(
            b,
            b'/' | b'\\'
                | b'{'
                | b'}'
                | b'^'
                | b'%'
                | b'`'
                | b'['
                | b']'
                | b'"'
                | b'<'
                | b'>'
                | b'~'
                | b'#'
                | b'|'
                | b'*'
                | b'?'
        )
}

/// Encodes one segment. Non-ASCII UTF-8 is kept as is (keys stay readable).
pub(crate) fn encode_segment(seg: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(seg.len());
    for ch in seg.chars() {
        if ch.is_ascii() && must_encode(ch as u8) {
            let b = ch as u8;
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        } else {
            out.push(ch);
        }
    }
    out
}

/// Encodes a whole (non-root) path, segments joined with `/`.
pub(crate) fn encode_path(path: &FsPath) -> String {
    path.segments()
        .map(encode_segment)
        .collect::<Vec<_>>()
        .join("/")
}

/// Decodes one segment; `None` for malformed escapes or non-UTF-8 results (objects not
/// written by this crate).
pub(crate) fn decode_segment(seg: &str) -> Option<String> {
    let bytes = seg.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = seg.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn reserved_bytes_are_encoded() {
        assert_eq!(encode_segment("%2e%2e"), "%252e%252e");
        assert_eq!(encode_segment("~"), "%7E");
        assert_eq!(encode_segment("a#1"), "a%231");
        assert_eq!(encode_segment("ünï 文件.txt"), "ünï 文件.txt");
        assert_eq!(decode_segment("%252e"), Some("%2e".to_owned()));
        assert_eq!(decode_segment("%2"), None);
        assert_eq!(decode_segment("%zz"), None);
    }

    proptest! {
        #[test]
        fn segments_round_trip(seg in "[^/\\x00]{1,40}") {
            let enc = encode_segment(&seg);
            prop_assert!(!enc.contains('/'));
            prop_assert!(enc.bytes().all(|b| b >= 0x20 && b != 0x7f));
            prop_assert_eq!(decode_segment(&enc), Some(seg));
        }

        #[test]
        fn encoding_keeps_distinct_segments_distinct(a in "[^/]{1,12}", b in "[^/]{1,12}") {
            prop_assume!(a != b);
            prop_assert_ne!(encode_segment(&a), encode_segment(&b));
        }
    }
}
