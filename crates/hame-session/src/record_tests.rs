#![allow(clippy::unwrap_used)]

use chrono::TimeZone;
use hame_core::Message;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::*;

fn record(seq: u64, text: &str) -> LogRecord {
    let time = Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, 5).unwrap();
    LogRecord::new(seq, time, "c1", Message::user(text))
}

fn encode(records: &[LogRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        serde_json::to_writer(&mut out, r).unwrap();
        out.push(b'\n');
    }
    out
}

#[test]
fn blank_and_damaged_lines_are_skipped() {
    let mut data = encode(&[record(0, "a")]);
    data.extend_from_slice(b"\n  \n{\"seq\":\n");
    data.extend_from_slice(&encode(&[record(1, "b")]));
    data.extend_from_slice(b"{\"v\":1,\"se");
    let parsed = parse_log(&data);
    assert_eq!(parsed.records, vec![record(0, "a"), record(1, "b")]);
    assert_eq!((parsed.skipped_lines, parsed.torn_tail), (1, true));
    assert_eq!(last_record(&data), Some(record(1, "b")));
}

#[test]
fn older_lines_without_version_still_parse() {
    let line = br#"{"seq":3,"time":"2025-01-02T03:04:05Z","call_id":"c","role":"user","message":{"role":"user","content":[]}}"#;
    let parsed = parse_log(line);
    assert_eq!(parsed.records.len(), 1);
    assert_eq!((parsed.records[0].v, parsed.records[0].seq), (1, 3));
}

proptest! {
    #[test]
    fn records_round_trip(texts in proptest::collection::vec(".*", 0..20)) {
        let records: Vec<LogRecord> =
            texts.iter().enumerate().map(|(i, t)| record(i as u64, t)).collect();
        let parsed = parse_log(&encode(&records));
        prop_assert_eq!(parsed.records, records.clone());
        prop_assert_eq!(parsed.skipped_lines, 0);
        prop_assert_eq!(last_record(&encode(&records)), records.last().cloned());
    }

    /// A crash can cut the file at any byte: what is left parses to a prefix of the records,
    /// losing at most the one being written, and never fails.
    #[test]
    fn any_torn_write_loses_at_most_the_last_record(
        texts in proptest::collection::vec("[a-zé😀 \\n\"]{0,12}", 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let records: Vec<LogRecord> =
            texts.iter().enumerate().map(|(i, t)| record(i as u64, t)).collect();
        let data = encode(&records);
        let at = cut.index(data.len() + 1);
        let parsed = parse_log(&data[..at]);
        let complete = data[..at].iter().filter(|b| **b == b'\n').count();
        prop_assert!(parsed.records.len() == complete || parsed.records.len() == complete + 1);
        prop_assert_eq!(&parsed.records[..], &records[..parsed.records.len()]);
        prop_assert_eq!(parsed.skipped_lines, 0);
        prop_assert_eq!(last_record(&data[..at]), parsed.records.last().cloned());
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let parsed = parse_log(&data);
        let has_brace = data.contains(&b'{');
        prop_assert!(parsed.records.is_empty() || has_brace);
        let _ = last_record(&data);
    }
}

proptest! {
    /// An append encodes through the borrowed record: the bytes must be those of the owned
    /// one, which is what readers parse.
    #[test]
    fn the_borrowed_record_encodes_as_the_owned_one(
        seq in any::<u64>(),
        millis in 0i64..4_000_000_000_000,
        call in "[a-z0-9-]{0,12}",
        text in ".{0,40}",
        with_usage in any::<bool>(),
    ) {
        let time = Utc.timestamp_millis_opt(millis).unwrap();
        let mut message = if with_usage { Message::assistant(&text) } else { Message::user(&text) };
        if with_usage {
            message.usage = Some(hame_core::Usage { input_tokens: 3, output_tokens: 4, cached_input_tokens: 1, cache_write_input_tokens: 2 });
        }
        let owned = serde_json::to_vec(&LogRecord::new(seq, time, &call, message.clone())).unwrap();
        let borrowed = serde_json::to_vec(&LogRecordRef::new(seq, time, &call, &message)).unwrap();
        prop_assert_eq!(&owned, &borrowed);
        // And what is written reads back as the record it was made from.
        let parsed: LogRecord = serde_json::from_slice(&borrowed).unwrap();
        prop_assert_eq!(parsed, LogRecord::new(seq, time, &call, message));
    }
}
