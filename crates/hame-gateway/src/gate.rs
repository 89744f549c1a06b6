//! The per-(agent, user, session) turn gate: turns of one session run one at a time in
//! arrival order, different sessions in parallel; past the bound a message is refused.
//!
//! Each turn takes its place synchronously, under the table's lock, by swapping its own
//! "done" signal into the session's tail and keeping the previous one: it starts when its
//! predecessor's signal fires (or is dropped). So the order is the order in which requests
//! reached the gate, whatever order the tasks are later polled in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Past this many idle entries, the table drops those with no turn in flight.
const PRUNE_PAST: usize = 65_536;

#[derive(Debug, Default)]
struct Slot {
    /// Turns of this session in flight (running + waiting).
    inflight: AtomicUsize,
    /// The "done" signal of the last turn that entered.
    tail: Mutex<Option<oneshot::Receiver<()>>>,
}

/// The table of gates.
#[derive(Debug)]
pub(crate) struct Gates {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Turns that may wait behind the running one.
    queue_bound: usize,
    /// Turns waiting (not running) over all sessions.
    waiting: Arc<AtomicUsize>,
}

/// A place in a session's queue; dropping it (the turn ended or never ran) lets the next
/// turn go.
#[derive(Debug)]
pub(crate) struct Ticket {
    slot: Arc<Slot>,
    previous: Option<oneshot::Receiver<()>>,
    done: Option<oneshot::Sender<()>>,
    waiting: Arc<AtomicUsize>,
    counted_waiting: bool,
}

impl Gates {
    pub(crate) fn new(queue_bound: usize) -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            queue_bound,
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Turns waiting over all sessions (the queue-depth gauge).
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Sessions the table knows.
    pub(crate) fn len(&self) -> usize {
        self.slots.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Takes a place behind the session's last turn, or `None` when `queue_bound` turns wait
    /// already.
    pub(crate) fn enter(&self, key: &str) -> Option<Ticket> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if slots.len() > PRUNE_PAST {
            slots.retain(|_, s| s.inflight.load(Ordering::SeqCst) > 0);
        }
        let slot = slots.entry(key.to_owned()).or_default().clone();
        let before = slot.inflight.load(Ordering::SeqCst);
        if before > self.queue_bound {
            return None;
        }
        slot.inflight.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        let previous = slot
            .tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(rx);
        // The table's lock is held until here, so places are taken in arrival order.
        drop(slots);
        let counted_waiting = before > 0;
        if counted_waiting {
            self.waiting.fetch_add(1, Ordering::Relaxed);
        }
        Some(Ticket {
            slot,
            previous,
            done: Some(tx),
            waiting: self.waiting.clone(),
            counted_waiting,
        })
    }
}

impl Ticket {
    /// Waits until every turn that entered before this one has ended.
    pub(crate) async fn ready(&mut self) {
        // Cancel-safe: the receiver stays until it fired.
        if let Some(prev) = self.previous.as_mut() {
            // A dropped sender means the same: that turn is over.
            let _ = prev.await;
            self.previous = None;
        }
        if self.counted_waiting {
            self.counted_waiting = false;
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.counted_waiting {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        self.slot.inflight.fetch_sub(1, Ordering::SeqCst);
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_of_one_session_run_in_arrival_order_and_the_queue_is_bounded() {
        let gates = Gates::new(1);
        let first = gates.enter("s");
        let second = gates.enter("s");
        assert!(first.is_some() && second.is_some());
        // One runs, one waits: a third is refused.
        assert!(gates.enter("s").is_none());
        // Another session is not affected.
        assert!(gates.enter("other").is_some());
        let (Some(mut first), Some(mut second)) = (first, second) else {
            return;
        };
        first.ready().await;
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), second.ready());
        assert!(
            waited.await.is_err(),
            "the second turn must wait for the first"
        );
        drop(first);
        second.ready().await;
        assert_eq!(gates.waiting(), 0);
        drop(second);
        assert!(gates.enter("s").is_some());
    }
}
