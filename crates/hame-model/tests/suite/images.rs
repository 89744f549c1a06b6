//! Images over the wire: each provider sends a user message's image inline, with the
//! block's exact bytes, and the reply comes back as usual.

use hame_core::{ImageBlock, Message};
use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

/// A 1x1 PNG, the bytes a user would attach.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

#[tokio::test]
async fn an_image_reaches_each_provider_inline() -> TestResult {
    for kind in BOTH {
        let server = ScriptedServer::start().await?;
        server.push(ScriptStep::text("A single pixel."));
        let model = default_model(kind, &server)?;
        let mut req = request("unused");
        req.messages = vec![Message::user_with_images(
            "What is in this image?",
            vec![ImageBlock {
                media_type: "image/png".into(),
                data: PNG.into(),
            }],
        )];
        let reply = assemble(&stream_events(model.as_ref(), req).await?);
        assert_eq!(reply.message.text_content(), "A single pixel.", "{kind:?}");
        let sent = &server.requests()[0].body["messages"];
        let expected = match kind {
            Kind::OpenAi => json!([
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in this image?"},
                    {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG}")}}
                ]}
            ]),
            Kind::Anthropic => json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in this image?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
                ]}
            ]),
        };
        assert_eq!(sent, &expected, "{kind:?}");
    }
    Ok(())
}
