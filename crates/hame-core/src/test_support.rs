//! An in-process model double for unit tests (feature `test-support`).
//!
//! End-to-end tests must not use it: they run the real HTTP clients against the scripted
//! server of `hame-test-support`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::message::{ToolCall, Usage};
use crate::model::{
    Model, ModelError, ModelEvent, ModelInfo, ModelRequest, ModelStream, StopReason,
};

/// One scripted answer.
#[derive(Debug)]
pub enum Reply {
    /// Stream these events.
    Events(Vec<ModelEvent>),
    /// Fail with this error.
    Fail(ModelError),
}

impl Reply {
    /// A text answer.
    pub fn text(text: &str) -> Self {
        Reply::Events(vec![
            ModelEvent::TextDelta(text.to_owned()),
            ModelEvent::Usage(Usage {
                input_tokens: 10,
                output_tokens: 5,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
            }),
            ModelEvent::Stop(StopReason::EndTurn),
        ])
    }

    /// An answer that calls tools.
    pub fn tools(calls: &[ToolCall]) -> Self {
        let mut ev = Vec::new();
        for (index, c) in calls.iter().enumerate() {
            ev.push(ModelEvent::ToolCallStart {
                index,
                id: c.id.clone(),
                name: c.name.clone(),
            });
            ev.push(ModelEvent::ToolCallDelta {
                index,
                arguments: c.arguments.clone(),
            });
        }
        ev.push(ModelEvent::Stop(StopReason::ToolUse));
        Reply::Events(ev)
    }
}

/// A model that answers from a script and records every request.
#[derive(Debug, Clone, Default)]
pub struct ScriptedModel {
    script: Arc<Mutex<VecDeque<Reply>>>,
    requests: Arc<Mutex<Vec<ModelRequest>>>,
}

impl ScriptedModel {
    /// A model that will give these replies in order.
    pub fn new(replies: impl IntoIterator<Item = Reply>) -> Self {
        Self {
            script: Arc::new(Mutex::new(replies.into_iter().collect())),
            requests: Arc::default(),
        }
    }

    /// Adds a reply at the end of the script.
    pub fn push(&self, reply: Reply) {
        if let Ok(mut s) = self.script.lock() {
            s.push_back(reply);
        }
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

#[async_trait]
impl Model for ScriptedModel {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "scripted".into(),
            model: "scripted".into(),
            context_window: 128_000,
        }
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        if let Ok(mut r) = self.requests.lock() {
            r.push(request);
        }
        let next = self.script.lock().ok().and_then(|mut s| s.pop_front());
        match next {
            Some(Reply::Events(ev)) => Ok(Box::pin(futures::stream::iter(ev.into_iter().map(Ok)))),
            Some(Reply::Fail(e)) => Err(e),
            None => Err(ModelError::InvalidResponse(
                "the script has no more replies".into(),
            )),
        }
    }
}
