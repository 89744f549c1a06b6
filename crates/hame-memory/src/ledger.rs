//! [`TokenLedger`]: incremental context bookkeeping. The token count of each message is
//! computed once and kept with the state (checked by a cheap fingerprint, so a message
//! rewritten in place is counted again), and a provider's reported prompt tokens replace
//! the estimate for the part of the conversation they covered. A reasoning step then
//! counts only the messages that joined since the last one, not the whole conversation.

use hame_core::{AgentState, ContentBlock, Message};
use serde::{Deserialize, Serialize};

use crate::tokens::{TokenCounter, message_tokens};

/// Key of the ledger in [`AgentState::extensions`].
pub const LEDGER_KEY: &str = "context";

/// Per-message token counts and the last reported prompt size of one session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenLedger {
    /// `[fingerprint, tokens]` per message, aligned with `state.messages`.
    #[serde(default)]
    counts: Vec<(u32, u64)>,
    /// The prompt tokens a provider reported for a request, and what it covered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reported: Option<Reported>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Reported {
    /// Messages the request carried.
    messages: usize,
    /// Fingerprint of those messages, so a rewrite (compaction) invalidates it.
    prefix: u32,
    /// Prompt tokens the provider counted (system prompt and tools included).
    input_tokens: u64,
}

fn mix(h: u32, v: u64) -> u32 {
    // FNV-1a over the 8 bytes of `v`.
    let mut h = h;
    for b in v.to_le_bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// A cheap fingerprint of a message: role, block kinds, string lengths and a few bytes of
/// each string. O(blocks), not O(characters).
pub fn fingerprint(message: &Message) -> u32 {
    let mut h = mix(0x811c_9dc5, message.role as u64);
    let s = |h: u32, t: &str| {
        let head = t
            .as_bytes()
            .iter()
            .take(8)
            .fold(0u64, |a, b| (a << 8) | u64::from(*b));
        let tail = t
            .as_bytes()
            .iter()
            .rev()
            .take(8)
            .fold(0u64, |a, b| (a << 8) | u64::from(*b));
        mix(mix(mix(h, t.len() as u64), head), tail)
    };
    for b in &message.content {
        h = match b {
            ContentBlock::Text { text } => s(mix(h, 1), text),
            ContentBlock::Reasoning { text, .. } => s(mix(h, 2), text),
            ContentBlock::ToolCall(c) => s(s(s(mix(h, 3), &c.id), &c.name), &c.arguments),
            ContentBlock::ToolResult(r) => {
                s(s(mix(h, 4 + u64::from(r.is_error)), &r.id), &r.content)
            }
            ContentBlock::Image(i) => s(s(mix(h, 6), &i.media_type), &i.data),
        };
    }
    h
}

impl TokenLedger {
    /// The ledger stored in `state` (empty when absent or unreadable).
    pub fn load(state: &AgentState) -> Self {
        state.extension(LEDGER_KEY).unwrap_or_default()
    }

    /// Stores the ledger in `state`.
    pub fn store(&self, state: &mut AgentState) {
        if let Err(e) = state.set_extension(LEDGER_KEY, self) {
            tracing::debug!(error = %e, "token ledger not stored");
        }
    }

    /// Brings the counts in step with `messages` (counting only new or changed messages)
    /// and returns their sum.
    pub fn messages_tokens(&mut self, counter: &dyn TokenCounter, messages: &[Message]) -> u64 {
        self.counts.truncate(messages.len());
        let mut total = 0;
        for (i, m) in messages.iter().enumerate() {
            let fp = fingerprint(m);
            let tokens = match self.counts.get(i) {
                Some((f, t)) if *f == fp => *t,
                _ => {
                    let t = message_tokens(counter, m);
                    if i < self.counts.len() {
                        self.counts[i] = (fp, t);
                    } else {
                        self.counts.push((fp, t));
                    }
                    t
                }
            };
            total += tokens;
        }
        total
    }

    /// The fingerprint of a run of messages, from theirs.
    fn prefix(fingerprints: impl Iterator<Item = u32>) -> u32 {
        fingerprints.fold(0x811c_9dc5, |h, fp| mix(h, u64::from(fp)))
    }

    /// Records the prompt tokens a provider reported for a request that carried
    /// `messages`.
    pub fn record_usage(&mut self, messages: &[Message], input_tokens: u64) {
        if input_tokens == 0 {
            return;
        }
        self.reported = Some(Reported {
            messages: messages.len(),
            prefix: Self::prefix(messages.iter().map(fingerprint)),
            input_tokens,
        });
    }

    /// Estimated prompt tokens of a request with `messages` and `fixed` tokens of system
    /// prompt and tools: the provider's reported count for the part it covered plus the
    /// counts of what joined since, else `fixed` plus every message's count.
    pub fn estimate(
        &mut self,
        counter: &dyn TokenCounter,
        messages: &[Message],
        fixed: u64,
    ) -> u64 {
        let all = self.messages_tokens(counter, messages);
        // `counts` is now aligned with `messages`: its fingerprints are theirs, so the
        // reported prefix is checked without fingerprinting the messages again.
        if let Some(r) = &self.reported
            && r.messages <= self.counts.len()
            && Self::prefix(self.counts[..r.messages].iter().map(|(fp, _)| *fp)) == r.prefix
        {
            let since: u64 = self.counts[r.messages..].iter().map(|(_, t)| *t).sum();
            return r.input_tokens + since;
        }
        fixed + all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::EstimateCounter;
    use pretty_assertions::assert_eq;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts how much text it was asked to count.
    #[derive(Debug, Default)]
    struct Metered(AtomicU64);
    impl TokenCounter for Metered {
        fn name(&self) -> &str {
            "metered"
        }
        fn count(&self, text: &str) -> u64 {
            self.0.fetch_add(text.len() as u64, Ordering::Relaxed);
            EstimateCounter.count(text)
        }
    }

    #[test]
    fn only_new_or_changed_messages_are_counted() {
        let c = Metered::default();
        let mut msgs: Vec<Message> = (0..50)
            .map(|i| Message::user(format!("message {i} ").repeat(20)))
            .collect();
        let mut ledger = TokenLedger::default();
        let first = ledger.messages_tokens(&c, &msgs);
        let after_first = c.0.load(Ordering::Relaxed);
        assert_eq!(
            first,
            crate::tokens::messages_tokens(&EstimateCounter, &msgs)
        );
        msgs.push(Message::assistant("short"));
        let second = ledger.messages_tokens(&c, &msgs);
        // Only "short" was counted again.
        assert_eq!(c.0.load(Ordering::Relaxed) - after_first, 5);
        assert_eq!(
            second,
            crate::tokens::messages_tokens(&EstimateCounter, &msgs)
        );
        // A message rewritten in place is counted again.
        msgs[3] = Message::user("rewritten");
        assert_eq!(
            ledger.messages_tokens(&c, &msgs),
            crate::tokens::messages_tokens(&EstimateCounter, &msgs)
        );
    }

    #[test]
    fn reported_usage_replaces_the_estimate_until_the_prefix_changes() {
        let c = EstimateCounter;
        let mut msgs = vec![Message::user("hello there"), Message::assistant("hi")];
        let mut ledger = TokenLedger::default();
        ledger.record_usage(&msgs[..1], 1000);
        let since = crate::tokens::message_tokens(&c, &msgs[1]);
        assert_eq!(ledger.estimate(&c, &msgs, 7), 1000 + since);
        // Survives a round trip through the state.
        let mut state = AgentState::default();
        ledger.store(&mut state);
        let mut back = TokenLedger::load(&state);
        assert_eq!(back.estimate(&c, &msgs, 7), 1000 + since);
        // A compaction rewrote the head: back to the estimate.
        msgs[0] = Message::user("summary");
        let all = crate::tokens::messages_tokens(&c, &msgs);
        assert_eq!(back.estimate(&c, &msgs, 7), 7 + all);
    }
}
