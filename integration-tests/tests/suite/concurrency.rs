//! One [`HarnessAgent`] instance under concurrent load: 8 calls at once over 4 sessions of
//! 2 users, through the real OpenAI client against the scripted server, on every state
//! backend. Calls on one session queue; each session ends up with its own messages only.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hame::{HarnessAgent, Message, Role, RuntimeContext};
use hame_test_support::{RecordedRequest, ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::common::{dialogue, env_for, service, unique};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SESSIONS: [(&str, &str); 4] = [
    ("alice", "s1"),
    ("alice", "s2"),
    ("bob", "s1"),
    ("bob", "s2"),
];
const CALLS_PER_SESSION: usize = 2;

/// The tag every message of a session carries: `alice/s1`.
fn tag(user: &str, session: &str) -> String {
    format!("{user}/{session}")
}

async fn eight_calls_over_four_sessions(state: &str) -> TestResult {
    let server = ScriptedServer::start().await?;
    let n = Arc::new(AtomicU64::new(0));
    server.set_responder(move |req: &RecordedRequest| {
        // Replies take 0–70 ms, in a scrambled order, so calls overlap and finish out of order.
        let k = n.fetch_add(1, Ordering::Relaxed);
        let asked = req.last_user_text().unwrap_or_default();
        ScriptStep::text(format!("re: {asked}")).with_delay(Duration::from_millis(k * 37 % 71))
    });
    let env = env_for(&server.base_url());
    let model_env = env.clone();
    let model = hame::model::open("openai:m", &move |k: &str| model_env.get(k))?;
    let dir = tempfile::tempdir()?;
    let agent = HarnessAgent::builder()
        .name(unique("conc"))
        .model(model)
        .workspace(dir.path().join("ws"))
        .state_store(hame::state::open(state).await?)
        .env(env)
        .build()?;

    let calls = SESSIONS
        .iter()
        .flat_map(|(user, session)| (0..CALLS_PER_SESSION).map(move |i| (*user, *session, i)));
    let outputs = futures::future::join_all(calls.map(|(user, session, i)| {
        let agent = agent.clone();
        async move {
            let ctx = RuntimeContext::new(session).with_user(user);
            let text = format!("{} #{i}", tag(user, session));
            let out = agent.call(Message::user(text.clone()), &ctx).await?;
            Ok::<_, hame::harness::Error>((text, out.reply.text_content()))
        }
    }))
    .await;
    for out in outputs {
        let (asked, reply) = out?;
        assert_eq!(reply, format!("re: {asked}"));
    }

    // No request ever mixed two sessions.
    let reqs = server.requests();
    assert_eq!(reqs.len(), SESSIONS.len() * CALLS_PER_SESSION);
    for r in &reqs {
        let texts = dialogue(&r.body);
        let tags: BTreeSet<&str> = texts
            .iter()
            .map(|t| {
                t.trim_start_matches("re: ")
                    .split(' ')
                    .next()
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(tags.len(), 1, "a request mixed sessions: {texts:?}");
    }
    // Each session's state holds its own calls only, each question followed by its reply.
    for (user, session) in SESSIONS {
        let ctx = RuntimeContext::new(session).with_user(user);
        let state = agent.state(&ctx).await?.ok_or("no state saved")?;
        let messages: Vec<(Role, String)> = state
            .messages
            .iter()
            .map(|m| (m.role, m.text_content()))
            .collect();
        assert_eq!(messages.len(), 2 * CALLS_PER_SESSION, "{messages:#?}");
        let mut asked = BTreeSet::new();
        for pair in messages.chunks(2) {
            assert_eq!(pair[0].0, Role::User);
            assert_eq!(pair[1], (Role::Assistant, format!("re: {}", pair[0].1)));
            asked.insert(pair[0].1.clone());
        }
        let expected: BTreeSet<String> = (0..CALLS_PER_SESSION)
            .map(|i| format!("{} #{i}", tag(user, session)))
            .collect();
        assert_eq!(asked, expected);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_serves_concurrent_sessions_on_a_json_state_dir() -> TestResult {
    let state = tempfile::tempdir()?;
    eight_calls_over_four_sessions(&state.path().to_string_lossy()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_serves_concurrent_sessions_in_memory() -> TestResult {
    eight_calls_over_four_sessions("memory://").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_serves_concurrent_sessions_on_redis() -> TestResult {
    let Some(url) = service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    eight_calls_over_four_sessions(&url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_serves_concurrent_sessions_on_postgres() -> TestResult {
    let Some(url) = service("HAME_TEST_POSTGRES_URL") else {
        return Ok(());
    };
    eight_calls_over_four_sessions(&url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_serves_concurrent_sessions_on_mysql() -> TestResult {
    let Some(url) = service("HAME_TEST_MYSQL_URL") else {
        return Ok(());
    };
    eight_calls_over_four_sessions(&url).await
}
