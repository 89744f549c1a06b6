//! The conformance suite every [`RunQueue`] backend runs.
//!
//! Each check uses a fresh agent id, so runs against a shared server never collide (a
//! claim only takes runs of its [`ClaimOptions::agent`]). Backends call
//! [`run_queue_tests!`](crate::run_queue_tests) to get one `#[tokio::test]` per check.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::{
    CancelOutcome, ClaimOptions, Decided, Decision, NewRun, RunEnd, RunFilter, RunQueue, RunStatus,
};
use crate::conformance::unique_agent;
use crate::error::{Error, Result};
use crate::key::StateKey;

fn fail(msg: impl Into<String>) -> Error {
    Error::Config(format!("run queue conformance: {}", msg.into()))
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(fail(format!($($msg)+)));
        }
    };
}

fn msg(agent: &str, user: Option<&str>, session: &str, text: &str) -> Result<NewRun> {
    NewRun::message(StateKey::new(agent, user, session)?, text, None)
}

fn opts(agent: &str, lapse: Duration) -> ClaimOptions {
    ClaimOptions::new(agent, "conformance", lapse)
}

const LONG: Duration = Duration::from_secs(60);

/// Ends a claimed run `completed` with the reply `r`.
async fn complete<Q: RunQueue + ?Sized>(q: &Q, claim: &super::Claim) -> Result<super::Run> {
    q.finish(
        claim,
        &RunEnd::Completed {
            reply: "r".into(),
            usage: serde_json::json!({}),
            verification: None,
        },
    )
    .await
}

/// Submit, get and list (newest first, scoped to agent, user and session).
pub async fn submit_get_list<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    let agent = unique_agent();
    let a = q.submit(msg(&agent, Some("u1"), "s1", "one")?).await?;
    ensure!(a.created, "a new run is created");
    ensure!(a.run.status == RunStatus::Queued, "a new run is queued");
    super::validate_run_id(&a.run.id)?;
    let b = q.submit(msg(&agent, Some("u1"), "s1", "two")?).await?;
    let c = q.submit(msg(&agent, Some("u1"), "s2", "three")?).await?;
    let other = q.submit(msg(&agent, Some("u2"), "s1", "theirs")?).await?;
    let anon = q.submit(msg(&agent, None, "s1", "anonymous")?).await?;
    ensure!(b.run.seq > a.run.seq, "seq grows with submission");
    let got = q.get(&a.run.id).await?;
    ensure!(
        got.as_ref() == Some(&a.run),
        "get returns the run as submitted: {got:?}"
    );
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let traced = q
        .submit(msg(&agent, Some("u3"), "s3", "traced")?.with_trace([
            ("traceparent".to_owned(), parent.to_owned()),
            ("tracestate".to_owned(), "k=v".to_owned()),
        ]))
        .await?;
    let got = q.get(&traced.run.id).await?;
    let trace = match got.as_ref().map(|r| &r.input) {
        Some(super::RunInput::Message { trace, .. }) => trace.clone(),
        _ => Default::default(),
    };
    ensure!(
        trace.get("traceparent").map(String::as_str) == Some(parent)
            && trace.get("tracestate").map(String::as_str) == Some("k=v"),
        "the submitter's trace context is kept with the run: {got:?}"
    );
    let ids = |runs: Vec<super::Run>| runs.into_iter().map(|r| r.id).collect::<Vec<_>>();
    ensure!(
        ids(q
            .list(RunFilter::new(&agent, Some("u1"), Some("s1"), 10))
            .await?)
            == vec![b.run.id.clone(), a.run.id.clone()],
        "the runs of a session, newest first"
    );
    ensure!(
        ids(q.list(RunFilter::new(&agent, Some("u1"), None, 10)).await?)
            == vec![c.run.id.clone(), b.run.id.clone(), a.run.id.clone()],
        "the runs of a user, newest first"
    );
    ensure!(
        ids(q.list(RunFilter::new(&agent, Some("u1"), None, 1)).await?) == vec![c.run.id.clone()],
        "the limit holds"
    );
    ensure!(
        ids(q.list(RunFilter::new(&agent, Some("u2"), None, 10)).await?)
            == vec![other.run.id.clone()],
        "another user's runs are theirs only"
    );
    ensure!(
        ids(q.list(RunFilter::new(&agent, None, None, 10)).await?) == vec![anon.run.id.clone()],
        "the anonymous tenant is a tenant of its own"
    );
    for hostile in [
        "../../etc/passwd",
        "run-",
        "",
        "run-0000",
        "RUN-00000000000000000000000000000000",
    ] {
        ensure!(
            q.get(hostile).await?.is_none(),
            "get({hostile:?}) names no run"
        );
        ensure!(
            q.cancel(hostile).await? == CancelOutcome::NotFound,
            "cancel({hostile:?}) names no run"
        );
    }
    ensure!(
        q.get("run-00000000000000000000000000000000")
            .await?
            .is_none(),
        "an unknown id names no run"
    );
    Ok(())
}

/// A subagent task run keeps the id chosen before its submit and its input whole (task,
/// parent session, inherited extras), and is claimed like any run of its session.
pub async fn subagent_task_runs<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    let agent = unique_agent();
    let mut inherit = std::collections::BTreeMap::new();
    inherit.insert("hame.plan_mode".to_owned(), serde_json::json!(true));
    let new = NewRun::subagent_task(
        StateKey::new(&agent, Some("u1"), "p@general-purpose-0123456789ab")?,
        "task-0123456789ab",
        "p",
        inherit,
    );
    let id = new.id.clone();
    let input = new.input.clone();
    let s = q.submit(new).await?;
    ensure!(
        s.created && s.run.id == id,
        "the run has the chosen id: {:?}",
        s.run
    );
    let got = q
        .get(&id)
        .await?
        .ok_or_else(|| fail("the task run is stored"))?;
    ensure!(
        got.input == input,
        "the input comes back whole: {:?}",
        got.input
    );
    let c = q
        .claim(&opts(&agent, LONG))
        .await?
        .ok_or_else(|| fail("the task run is claimable"))?;
    ensure!(
        c.run.id == id && c.run.input == input,
        "claimed whole: {:?}",
        c.run
    );
    complete(q, &c).await?;
    Ok(())
}

/// The same idempotency key from the same agent and user gives one run, also when 20
/// submits race; another user's key is another run.
pub async fn idempotency<Q: RunQueue + ?Sized>(q: Arc<Q>) -> Result<()> {
    let agent = unique_agent();
    let key = StateKey::new(&agent, Some("u1"), "s1")?;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (q, key) = (q.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            q.submit(NewRun::message(
                key,
                format!("try {i}"),
                Some("K-1".into()),
            )?)
            .await
        }));
    }
    let mut ids = HashSet::new();
    let mut created = 0;
    for t in tasks {
        let s = t.await.map_err(|e| fail(e.to_string()))??;
        created += usize::from(s.created);
        ids.insert(s.run.id);
    }
    ensure!(
        ids.len() == 1,
        "20 racing submits with one key made {} runs",
        ids.len()
    );
    ensure!(
        created == 1,
        "exactly one submit created the run, not {created}"
    );
    let theirs = q
        .submit(NewRun::message(
            StateKey::new(&agent, Some("u2"), "s1")?,
            "x",
            Some("K-1".into()),
        )?)
        .await?;
    ensure!(
        theirs.created && !ids.contains(&theirs.run.id),
        "another user's key is another run"
    );
    ensure!(
        q.list(RunFilter::new(&agent, Some("u1"), None, 100))
            .await?
            .len()
            == 1,
        "one run stored for the key"
    );
    Ok(())
}

/// Runs of one session are claimed one at a time, in order; other sessions in parallel;
/// only runs of the claim's agent.
pub async fn session_order<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    let agent = unique_agent();
    let other_agent = unique_agent();
    q.submit(msg(&other_agent, Some("u"), "s1", "not mine")?)
        .await?;
    let s1a = q.submit(msg(&agent, Some("u"), "s1", "a")?).await?.run;
    let s1b = q.submit(msg(&agent, Some("u"), "s1", "b")?).await?.run;
    let s2a = q.submit(msg(&agent, Some("u"), "s2", "c")?).await?.run;
    let o = opts(&agent, LONG);
    let c1 = q.claim(&o).await?.ok_or_else(|| fail("nothing claimed"))?;
    ensure!(c1.run.id == s1a.id, "the oldest run first");
    ensure!(
        c1.run.status == RunStatus::Running && c1.attempt == 1,
        "claimed: {c1:?}"
    );
    let c2 = q.claim(&o).await?.ok_or_else(|| fail("s2 not claimed"))?;
    ensure!(
        c2.run.id == s2a.id,
        "s1's second run waits; s2 runs in parallel"
    );
    ensure!(q.claim(&o).await?.is_none(), "nothing else is claimable");
    let done = q
        .finish(
            &c1,
            &RunEnd::Completed {
                reply: "A".into(),
                usage: serde_json::json!({"input_tokens": 1}),
                verification: None,
            },
        )
        .await?;
    ensure!(
        done.status == RunStatus::Completed && done.reply.as_deref() == Some("A"),
        "{done:?}"
    );
    let stored = q
        .get(&s1a.id)
        .await?
        .ok_or_else(|| fail("finished run gone"))?;
    ensure!(stored.status == RunStatus::Completed, "finished is stored");
    ensure!(
        stored.usage == Some(serde_json::json!({"input_tokens": 1})),
        "usage is stored"
    );
    let c3 = q
        .claim(&o)
        .await?
        .ok_or_else(|| fail("s1's next not claimed"))?;
    ensure!(c3.run.id == s1b.id, "then the session's next run");
    ensure!(
        q.finish(&c1, &RunEnd::Cancelled)
            .await
            .is_err_and(|e| matches!(e, Error::LeaseLost { .. })),
        "a finished run never changes again"
    );
    q.finish(
        &c2,
        &RunEnd::WaitingApproval(serde_json::json!([{"id": "x"}])),
    )
    .await?;
    q.finish(
        &c3,
        &RunEnd::Failed(super::RunError {
            code: "model_error".into(),
            message: "m".into(),
        }),
    )
    .await?;
    let failed = q.get(&s1b.id).await?.ok_or_else(|| fail("gone"))?;
    ensure!(
        failed.status == RunStatus::Failed && failed.error.is_some(),
        "{failed:?}"
    );
    let waiting = q.get(&s2a.id).await?.ok_or_else(|| fail("gone"))?;
    ensure!(
        waiting.status == RunStatus::WaitingApproval && waiting.approvals.is_some(),
        "{waiting:?}"
    );
    ensure!(q.claim(&o).await?.is_none(), "all done");
    Ok(())
}

/// A claim that is not heartbeated lapses and is reclaimed with a larger attempt; the old
/// claim can then neither heartbeat nor finish. A heartbeated claim is never reclaimed.
pub async fn lapse_and_reclaim<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    let agent = unique_agent();
    let run = q.submit(msg(&agent, Some("u"), "s", "m")?).await?.run;
    // Long enough that a heartbeat's write (an fsync on a loaded disk) never outlasts it.
    let short = opts(&agent, Duration::from_secs(2));
    let old = q.claim(&short).await?.ok_or_else(|| fail("not claimed"))?;
    // Heartbeats keep it.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let beat = q.heartbeat(&old).await?;
        ensure!(!beat.cancel_requested, "no cancel asked");
        ensure!(
            q.claim(&short).await?.is_none(),
            "a heartbeated claim is not reclaimed"
        );
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let new = q
        .claim(&short)
        .await?
        .ok_or_else(|| fail("a lapsed claim is reclaimed"))?;
    ensure!(new.run.id == run.id, "the same run");
    ensure!(
        new.attempt == old.attempt + 1,
        "a larger fence: {} after {}",
        new.attempt,
        old.attempt
    );
    ensure!(new.token != old.token, "a new token");
    ensure!(
        matches!(q.heartbeat(&old).await, Err(Error::LeaseLost { .. })),
        "the old owner's heartbeat is refused"
    );
    ensure!(
        matches!(
            q.finish(&old, &RunEnd::Cancelled).await,
            Err(Error::LeaseLost { .. })
        ),
        "the old owner's finish is refused"
    );
    let still = q.get(&run.id).await?.ok_or_else(|| fail("gone"))?;
    ensure!(
        still.status == RunStatus::Running && still.attempts == 2,
        "{still:?}"
    );
    q.heartbeat(&new).await?;
    complete(q, &new).await?;
    Ok(())
}

/// A dead worker's several claims are all taken over once they lapsed, one claim after the
/// other, not one lapse each.
pub async fn lapsed_claims_reclaimed_together<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    let agent = unique_agent();
    let lapse = Duration::from_secs(1);
    let dead = ClaimOptions::new(&agent, "dead", lapse);
    let mut ids = HashSet::new();
    for s in ["s1", "s2", "s3"] {
        ids.insert(q.submit(msg(&agent, Some("u"), s, "m")?).await?.run.id);
        q.claim(&dead).await?.ok_or_else(|| fail("not claimed"))?;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let alive = ClaimOptions::new(&agent, "alive", lapse);
    let mut taken = HashSet::new();
    for _ in 0..3 {
        let c = q.claim(&alive).await?.ok_or_else(|| {
            fail(format!(
                "only {} of 3 lapsed claims taken over",
                taken.len()
            ))
        })?;
        ensure!(c.attempt == 2, "a takeover: {c:?}");
        taken.insert(c.run.id);
    }
    ensure!(taken == ids, "the three runs were taken over");
    Ok(())
}

/// Cancel: a queued run ends at once and is never claimed; a running one is flagged, the
/// flag comes back in the next heartbeat; a finished one does not change.
pub async fn cancel<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    let agent = unique_agent();
    let queued = q.submit(msg(&agent, Some("u"), "s1", "q")?).await?.run;
    let running = q.submit(msg(&agent, Some("u"), "s2", "r")?).await?.run;
    let o = opts(&agent, LONG);
    let c = q.claim(&o).await?.ok_or_else(|| fail("not claimed"))?;
    // The oldest (s1) was claimed; swap roles so that `queued` is really queued.
    let (c, queued, running) = if c.run.id == queued.id {
        (c, running, queued)
    } else {
        (c, queued, running)
    };
    ensure!(c.run.id == running.id, "claimed the running one");
    match q.cancel(&queued.id).await? {
        CancelOutcome::Cancelled(r) => ensure!(
            r.status == RunStatus::Cancelled
                && r.error.as_ref().is_some_and(|e| e.code == "cancelled"),
            "{r:?}"
        ),
        other => {
            return Err(fail(format!(
                "a queued run is cancelled at once, got {other:?}"
            )));
        }
    }
    ensure!(
        q.claim(&o).await?.is_none(),
        "a cancelled run is never claimed"
    );
    match q.cancel(&running.id).await? {
        CancelOutcome::Requested(r) => ensure!(
            r.status == RunStatus::Running && r.cancel_requested,
            "{r:?}"
        ),
        other => return Err(fail(format!("a running run is flagged, got {other:?}"))),
    }
    ensure!(
        q.heartbeat(&c).await?.cancel_requested,
        "the heartbeat carries the cancel"
    );
    let ended = q.finish(&c, &RunEnd::Cancelled).await?;
    ensure!(ended.status == RunStatus::Cancelled, "{ended:?}");
    ensure!(
        matches!(q.cancel(&running.id).await?, CancelOutcome::Finished(_)),
        "a finished run is not cancelled again"
    );
    Ok(())
}

/// Retention: finished runs older than a time are deleted (with their idempotency keys),
/// at most the limit, oldest first; queued and running runs and other agents' runs stay.
pub async fn purge_finished<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    let agent = unique_agent();
    let other = unique_agent();
    let key = || StateKey::new(&agent, Some("u"), "s1");
    let done = q
        .submit(NewRun::message(key()?, "done", Some("K-done".into()))?)
        .await?
        .run;
    let o = opts(&agent, LONG);
    let c = q.claim(&o).await?.ok_or_else(|| fail("not claimed"))?;
    ensure!(c.run.id == done.id, "the first run is claimed");
    complete(q, &c).await?;
    let cancelled = q
        .submit(msg(&agent, Some("u"), "s2", "cancelled")?)
        .await?
        .run;
    q.cancel(&cancelled.id).await?;
    let running = q
        .submit(msg(&agent, Some("u"), "s3", "running")?)
        .await?
        .run;
    let held = q.claim(&o).await?.ok_or_else(|| fail("not claimed"))?;
    ensure!(held.run.id == running.id, "the running one is claimed");
    let queued = q.submit(msg(&agent, Some("u"), "s3", "queued")?).await?.run;
    // A run waiting for an approval is never purged, however old.
    let waiting = q
        .submit(msg(&agent, Some("u"), "s4", "waiting")?)
        .await?
        .run;
    let c = q.claim(&o).await?.ok_or_else(|| fail("not claimed"))?;
    ensure!(c.run.id == waiting.id, "the waiting one is claimed");
    q.finish(
        &c,
        &RunEnd::WaitingApproval(serde_json::json!([{"id": "a1"}])),
    )
    .await?;
    let theirs = q.submit(msg(&other, Some("u"), "s1", "theirs")?).await?.run;
    let c = q
        .claim(&opts(&other, LONG))
        .await?
        .ok_or_else(|| fail("not claimed"))?;
    q.finish(&c, &RunEnd::Cancelled).await?;
    // Nothing ended before an hour ago.
    let past = chrono::Utc::now() - chrono::TimeDelta::hours(1);
    ensure!(
        q.purge_finished(&agent, past, 100).await? == 0,
        "nothing is old enough"
    );
    // Everything that ended is older than a minute from now (clocks may differ a little).
    let future = chrono::Utc::now() + chrono::TimeDelta::minutes(1);
    ensure!(
        q.purge_finished(&agent, future, 1).await? == 1,
        "the limit holds"
    );
    ensure!(
        q.purge_finished(&agent, future, 100).await? == 1,
        "the other finished run goes next"
    );
    for gone in [&done.id, &cancelled.id] {
        ensure!(q.get(gone).await?.is_none(), "a purged run is gone");
    }
    for kept in [&running.id, &queued.id, &theirs.id, &waiting.id] {
        ensure!(q.get(kept).await?.is_some(), "{kept} is kept");
    }
    let listed: Vec<String> = q
        .list(RunFilter::new(&agent, Some("u"), None, 10))
        .await?
        .into_iter()
        .map(|r| r.id)
        .collect();
    ensure!(
        listed == vec![waiting.id.clone(), queued.id.clone(), running.id.clone()],
        "only the live runs are listed: {listed:?}"
    );
    let again = q
        .submit(NewRun::message(key()?, "again", Some("K-done".into()))?)
        .await?;
    ensure!(
        again.created && again.run.id != done.id,
        "a purged run's idempotency key makes a new run"
    );
    q.heartbeat(&held).await?;
    Ok(())
}

/// Submit and claim in one step: the new run of a free session is claimed at once (no
/// other claim gets it), that of a busy session waits in the queue, a repeated idempotency
/// key claims nothing, and a submit-claimed run whose claim lapsed is taken over like any.
pub async fn submit_claimed<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    let agent = unique_agent();
    let key = || StateKey::new(&agent, Some("u"), "s1");
    let short = opts(&agent, Duration::from_secs(2));
    let (first, mine) = q
        .submit_claimed(NewRun::message(key()?, "one", Some("K1".into()))?, &short)
        .await?;
    let mine = mine.ok_or_else(|| fail("the run of a free session is claimed at once"))?;
    ensure!(
        first.created && mine.run.id == first.run.id && mine.attempt == 1,
        "the new run, first attempt: {mine:?}"
    );
    ensure!(
        first.run.status == RunStatus::Running,
        "a claimed run is running: {:?}",
        first.run.status
    );
    ensure!(
        q.claim(&opts(&agent, LONG)).await?.is_none(),
        "no other claim takes a submit-claimed run"
    );
    let (again, none) = q
        .submit_claimed(NewRun::message(key()?, "one", Some("K1".into()))?, &short)
        .await?;
    ensure!(
        !again.created && again.run.id == first.run.id && none.is_none(),
        "a repeated key claims nothing"
    );
    let (second, none) = q
        .submit_claimed(msg(&agent, Some("u"), "s1", "two")?, &short)
        .await?;
    ensure!(
        second.created && second.run.status == RunStatus::Queued && none.is_none(),
        "the run of a busy session waits in the queue"
    );
    // Heartbeats keep it; once they stop, it is taken over.
    tokio::time::sleep(Duration::from_millis(700)).await;
    q.heartbeat(&mine).await?;
    ensure!(
        q.claim(&short).await?.is_none(),
        "a heartbeated claim is not taken over"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let taken = q
        .claim(&short)
        .await?
        .ok_or_else(|| fail("a lapsed submit-claimed run is taken over"))?;
    ensure!(
        taken.run.id == first.run.id && taken.attempt == 2,
        "the same run, a larger fence: {taken:?}"
    );
    ensure!(
        matches!(q.heartbeat(&mine).await, Err(Error::LeaseLost { .. })),
        "the old owner's heartbeat is refused"
    );
    q.finish(
        &taken,
        &RunEnd::Completed {
            reply: "r".into(),
            usage: serde_json::json!({}),
            verification: None,
        },
    )
    .await?;
    let next = q
        .claim(&opts(&agent, LONG))
        .await?
        .ok_or_else(|| fail("the session's next run is claimed"))?;
    ensure!(next.run.id == second.run.id, "in order");
    q.finish(&next, &RunEnd::Cancelled).await?;
    Ok(())
}

/// Every end is stored as finished (reply, usage, the gate's verdict, approvals, error),
/// read back the same by `get` and `list`, frees the session's next run, and is purged:
/// `unverified` (issue #33) like the others, `waiting_approval` never.
pub async fn every_end<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    let agent = unique_agent();
    let o = opts(&agent, LONG);
    let verdict = |status: &str| {
        serde_json::json!({"status": status, "extra_steps": 1, "evidence": [
            {"check": "tests", "outcome": if status == "verified" { "passed" } else { "failed" },
             "exit_code": 1, "detail": "expected exit code 0\nFAILED: één test"}]})
    };
    let ends = [
        RunEnd::Unverified {
            reply: "done, I think".into(),
            usage: serde_json::json!({"input_tokens": 3}),
            verification: verdict("unverified"),
        },
        RunEnd::Completed {
            reply: "done".into(),
            usage: serde_json::json!({"input_tokens": 2}),
            verification: Some(verdict("verified")),
        },
        RunEnd::Failed(super::RunError {
            code: "model_error".into(),
            message: "the model failed".into(),
        }),
    ];
    let mut finished = Vec::new();
    for end in &ends {
        // One session: each run is claimable only once the one before it ended.
        let submitted = q.submit(msg(&agent, Some("u"), "s1", "m")?).await?.run;
        let c = q.claim(&o).await?.ok_or_else(|| {
            fail(format!(
                "not claimed after a {} run",
                finished
                    .last()
                    .map_or("(none)", |r: &super::Run| r.status.as_str())
            ))
        })?;
        ensure!(
            c.run.id == submitted.id,
            "the session's next run is claimed"
        );
        let done = q.finish(&c, end).await?;
        let mut expected = c.run.clone();
        end.apply(&mut expected);
        ensure!(
            done.status == end.status()
                && done.status.is_finished()
                && done.reply == expected.reply
                && done.usage == expected.usage
                && done.verification == expected.verification
                && done.approvals == expected.approvals
                && done.error == expected.error,
            "stored as finished: {done:?}"
        );
        let got = q.get(&done.id).await?.ok_or_else(|| fail("gone"))?;
        ensure!(got == done, "get returns the run as finished: {got:?}");
        ensure!(
            matches!(q.cancel(&done.id).await?, CancelOutcome::Finished(_)),
            "a {} run cannot be cancelled",
            done.status
        );
        finished.push(done);
    }
    let unverified = &finished[0];
    ensure!(
        unverified.status == RunStatus::Unverified
            && unverified
                .verification
                .as_ref()
                .and_then(|v| v["evidence"][0]["detail"].as_str())
                == Some("expected exit code 0\nFAILED: één test"),
        "the failing evidence is kept: {unverified:?}"
    );
    let listed = q
        .list(RunFilter::new(&agent, Some("u"), Some("s1"), 10))
        .await?;
    ensure!(
        listed.iter().rev().eq(finished.iter()),
        "list returns them as finished, newest first: {listed:?}"
    );
    let future = chrono::Utc::now() + chrono::TimeDelta::minutes(1);
    ensure!(
        q.purge_finished(&agent, future, 100).await? == ends.len(),
        "every ended status is purged"
    );
    Ok(())
}

/// A run that waits for a decision holds its session: the session's later runs (submitted
/// or submitted-and-claimed) wait, other sessions run. A decision on one of its approvals
/// resumes it: recorded on the approval and claimed by the decider in one step (one more
/// attempt), once per approval even under racing decisions; a decision while the run is
/// queued or running changes nothing (`Busy`); an unknown or decided approval changes
/// nothing. A decided claim that lapses is taken over with its decisions; after the run
/// ends, the session's next run is claimable. Cancelling a waiting run releases the
/// session; such a run is never purged.
pub async fn approval_decisions<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    let agent = unique_agent();
    let key = |s: &str| StateKey::new(&agent, Some("u"), s);
    let o = opts(&agent, LONG);
    let first = q.submit(msg(&agent, Some("u"), "s1", "m1")?).await?.run;
    let c1 = q.claim(&o).await?.ok_or_else(|| fail("not claimed"))?;
    ensure!(c1.run.id == first.id, "the first run is claimed");
    ensure!(c1.run.decisions().is_empty(), "nothing decided yet");
    let approvals = serde_json::json!([
        {"id": "a1", "tool": "execute", "call_id": "c1"},
        {"id": "a2", "tool": "write_file", "call_id": "c2"}
    ]);
    let waiting = q
        .finish(&c1, &RunEnd::WaitingApproval(approvals.clone()))
        .await?;
    ensure!(
        waiting.status == RunStatus::WaitingApproval
            && waiting.status.is_finished()
            && waiting.status.holds_session()
            && waiting.approvals.as_ref() == Some(&approvals),
        "{waiting:?}"
    );
    let second = q.submit(msg(&agent, Some("u"), "s1", "m2")?).await?.run;
    let (third, none) = q
        .submit_claimed(msg(&agent, Some("u"), "s1", "m3")?, &o)
        .await?;
    ensure!(
        none.is_none() && third.run.status == RunStatus::Queued,
        "a submit-and-claim on a waiting session only queues: {third:?}"
    );
    let other = q.submit(msg(&agent, Some("u"), "s2", "x")?).await?.run;
    let c2 = q.claim(&o).await?.ok_or_else(|| fail("s2 not claimed"))?;
    ensure!(
        c2.run.id == other.id,
        "the waiting session's next run waits; another session runs: {c2:?}"
    );
    ensure!(
        q.claim(&o).await?.is_none(),
        "nothing of the waiting session is claimable"
    );
    let yes = serde_json::json!({"approve": true});
    ensure!(
        matches!(q.decide(&key("s1")?, &Decision::new("a9", yes.clone()), &o).await?,
            Decided::UnknownApproval(r) if r.id == first.id),
        "an unknown approval changes nothing"
    );
    ensure!(
        matches!(q.decide(&key("s2")?, &Decision::new("a1", yes.clone()), &o).await?,
            Decided::Busy(r) if r.id == other.id),
        "a session whose head runs is busy"
    );
    ensure!(
        matches!(
            q.decide(&key("s3")?, &Decision::new("a1", yes.clone()), &o)
                .await?,
            Decided::NoneWaiting
        ),
        "a session without runs waits for nothing"
    );
    complete(q, &c2).await?;
    let short = opts(&agent, Duration::from_secs(1));
    let Decided::Claimed(d1) = q
        .decide(&key("s1")?, &Decision::new("a1", yes.clone()), &short)
        .await?
    else {
        return Err(fail("a decision on a waiting run claims it"));
    };
    ensure!(
        d1.run.id == first.id
            && d1.run.status == RunStatus::Running
            && d1.attempt == c1.attempt + 1
            && d1.run.decisions() == vec![("a1".to_owned(), yes.clone())],
        "decided and claimed: {d1:?}"
    );
    let stored = q.get(&first.id).await?.ok_or_else(|| fail("gone"))?;
    ensure!(
        stored.status == RunStatus::Running && stored.decisions() == d1.run.decisions(),
        "the decision is stored with the run: {stored:?}"
    );
    ensure!(
        matches!(
            q.decide(&key("s1")?, &Decision::new("a2", yes.clone()), &o)
                .await?,
            Decided::Busy(_)
        ),
        "a decision while the run runs changes nothing"
    );
    ensure!(
        q.claim(&short).await?.is_none(),
        "a decided run's claim is live; the session's later runs wait"
    );
    // The decider dies: its claim lapses and a worker takes the run over with its decisions.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let taken = q
        .claim(&short)
        .await?
        .ok_or_else(|| fail("a lapsed decided claim is taken over"))?;
    ensure!(
        taken.run.id == first.id
            && taken.attempt == d1.attempt + 1
            && taken.run.decisions() == d1.run.decisions(),
        "taken over with its decisions: {taken:?}"
    );
    ensure!(
        matches!(
            q.finish(&d1, &RunEnd::Cancelled).await,
            Err(Error::LeaseLost { .. })
        ),
        "the dead decider's finish is refused"
    );
    // The resumed turn stops at the other call: it waits again, for that one only.
    let rest = serde_json::json!([{"id": "a2", "tool": "write_file", "call_id": "c2"}]);
    q.finish(&taken, &RunEnd::WaitingApproval(rest.clone()))
        .await?;
    ensure!(
        q.claim(&o).await?.is_none(),
        "waiting again, the session holds"
    );
    ensure!(
        matches!(
            q.decide(&key("s1")?, &Decision::new("a1", yes.clone()), &o)
                .await?,
            Decided::UnknownApproval(_)
        ),
        "a decided approval is not decided again"
    );
    // Two deciders race: one claims, the other finds the run busy.
    let no = serde_json::json!({"approve": false, "reason": "not that file"});
    let (s1, deny) = (key("s1")?, Decision::new("a2", no.clone()));
    let (da, db) = tokio::join!(q.decide(&s1, &deny, &o), q.decide(&s1, &deny, &o));
    let (da, db) = (da?, db?);
    let claims: Vec<&super::Claim> = [&da, &db]
        .into_iter()
        .filter_map(|d| match d {
            Decided::Claimed(c) => Some(c),
            _ => None,
        })
        .collect();
    ensure!(
        claims.len() == 1,
        "one of two racing decisions claims: {da:?} / {db:?}"
    );
    let d2 = claims[0].clone();
    ensure!(
        d2.run.decisions() == vec![("a2".to_owned(), no)],
        "this leg's decision only: {d2:?}"
    );
    let done = complete(q, &d2).await?;
    ensure!(
        done.status == RunStatus::Completed && done.reply.as_deref() == Some("r"),
        "{done:?}"
    );
    let next = q
        .claim(&o)
        .await?
        .ok_or_else(|| fail("after the decided run, the session's next run"))?;
    ensure!(next.run.id == second.id, "in order: {next:?}");
    complete(q, &next).await?;
    let next = q.claim(&o).await?.ok_or_else(|| fail("the third run"))?;
    ensure!(next.run.id == third.run.id, "in order: {next:?}");
    complete(q, &next).await?;
    // A waiting run that is cancelled releases its session; it is never purged waiting.
    let w = q.submit(msg(&agent, Some("u"), "s4", "w")?).await?.run;
    let c = q.claim(&o).await?.ok_or_else(|| fail("not claimed"))?;
    ensure!(c.run.id == w.id, "the s4 run is claimed");
    q.finish(&c, &RunEnd::WaitingApproval(rest)).await?;
    let after = q.submit(msg(&agent, Some("u"), "s4", "after")?).await?.run;
    let future = chrono::Utc::now() + chrono::TimeDelta::minutes(1);
    q.purge_finished(&agent, future, 100).await?;
    ensure!(
        q.get(&w.id)
            .await?
            .is_some_and(|r| r.status == RunStatus::WaitingApproval),
        "a waiting run is never purged"
    );
    ensure!(q.claim(&o).await?.is_none(), "s4 waits");
    match q.cancel(&w.id).await? {
        CancelOutcome::Cancelled(r) => ensure!(r.status == RunStatus::Cancelled, "{r:?}"),
        other => {
            return Err(fail(format!(
                "a waiting run is cancelled at once, got {other:?}"
            )));
        }
    }
    ensure!(
        matches!(q.decide(&key("s4")?, &Decision::new("a2", yes), &o).await?,
            Decided::Busy(r) if r.id == after.id),
        "a cancelled run takes no decision; the session's head is its next run"
    );
    let c = q
        .claim(&o)
        .await?
        .ok_or_else(|| fail("the cancel released the session"))?;
    ensure!(c.run.id == after.id, "{c:?}");
    Ok(())
}

/// Workers racing over many sessions: every run is claimed and finished exactly once, and
/// the runs of each session start in submission order, never overlapping.
pub async fn racing_workers<Q: RunQueue + ?Sized>(q: Arc<Q>) -> Result<()> {
    let agent = unique_agent();
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for i in 0..4 {
        for s in 0..5 {
            let session = format!("s{s}");
            let run = q
                .submit(msg(&agent, Some("u"), &session, &format!("{i}"))?)
                .await?
                .run;
            expected.entry(session).or_default().push(run.id);
        }
    }
    let running: Arc<std::sync::Mutex<HashSet<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (q, running) = (q.clone(), running.clone());
        let o = ClaimOptions::new(&agent, format!("w{w}"), LONG);
        tasks.push(tokio::spawn(async move {
            let mut order = Vec::new();
            let mut idle = 0;
            while idle < 20 {
                let Some(c) = q.claim(&o).await? else {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                idle = 0;
                let fresh = running
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(c.run.session.clone());
                if !fresh {
                    return Err(fail(format!("two runs of {} at once", c.run.session)));
                }
                order.push((c.run.session.clone(), c.run.id.clone()));
                tokio::time::sleep(Duration::from_millis(2)).await;
                running
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&c.run.session);
                q.finish(
                    &c,
                    &RunEnd::Completed {
                        reply: String::new(),
                        usage: serde_json::json!({}),
                        verification: None,
                    },
                )
                .await?;
            }
            Ok::<_, Error>(order)
        }));
    }
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    let mut total = 0;
    for t in tasks {
        for (session, id) in t.await.map_err(|e| fail(e.to_string()))?? {
            total += 1;
            seen.entry(session).or_default().push(id);
        }
    }
    ensure!(total == 20, "20 runs, {total} claims");
    // Each worker's list is in its own claim order; a session's runs finish before the next
    // is claimed, so sorting by seq must give the submission order: check via the store.
    for (session, ids) in &expected {
        let mut claimed = seen.remove(session).unwrap_or_default();
        claimed.sort();
        let mut want = ids.clone();
        want.sort();
        ensure!(claimed == want, "session {session}: every run claimed once");
        let runs = q
            .list(RunFilter::new(&agent, Some("u"), Some(session), 10))
            .await?;
        ensure!(
            runs.iter()
                .all(|r| r.status == RunStatus::Completed && r.attempts == 1),
            "every run completed in one attempt: {runs:?}"
        );
    }
    Ok(())
}

/// Submit-and-claims racing on one free session (requests of two replicas at once): one
/// of them claims its run, the others' runs wait in the queue — never two running runs
/// of one session.
pub async fn racing_submit_claims<Q: RunQueue + ?Sized>(q: Arc<Q>) -> Result<()> {
    let agent = unique_agent();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let q = q.clone();
        let agent = agent.clone();
        tasks.push(tokio::spawn(async move {
            let o = ClaimOptions::new(&agent, format!("w{i}"), LONG);
            q.submit_claimed(msg(&agent, Some("u"), "s", &format!("{i}"))?, &o)
                .await
        }));
    }
    let mut claims = 0;
    for t in tasks {
        let (submitted, claim) = t
            .await
            .map_err(|e| fail(format!("a submit panicked: {e}")))??;
        ensure!(submitted.created, "each submit stores a run");
        claims += usize::from(claim.is_some());
    }
    ensure!(claims == 1, "{claims} runs of one session claimed at once");
    let runs = q
        .list(RunFilter::new(&agent, Some("u"), Some("s"), 10))
        .await?;
    let running = runs
        .iter()
        .filter(|r| r.status == RunStatus::Running)
        .count();
    ensure!(running == 1, "one running run: {runs:?}");
    Ok(())
}

/// A worker waiting for work is woken by a submit, and by a finish (the session's next run
/// may be free), well before an idle worker's next look (1 s on PostgreSQL and Redis):
/// PostgreSQL's `NOTIFY`, sent with the statement; Redis' wake-up stream; MySQL looks every
/// 250 ms. One-host queues (JSON, memory) are not checked: their workers look every 100 ms
/// or live in the process.
pub async fn submit_and_finish_wake_a_waiting_worker<Q: RunQueue + ?Sized>(q: &Q) -> Result<()> {
    if !q.is_shared() {
        return Ok(());
    }
    let agent = unique_agent();
    // The first wait sets up what the backend listens with.
    q.wait_for_work(Duration::from_millis(50)).await?;
    let submitted = woken_by(q, async {
        q.submit(msg(&agent, Some("u"), "s1", "one")?).await?;
        Ok(())
    })
    .await?;
    ensure!(
        submitted < WOKEN_WITHIN,
        "a waiting worker was woken {submitted:?} after a submit"
    );
    let claim = q
        .claim(&opts(&agent, LONG))
        .await?
        .ok_or_else(|| fail("the submitted run is claimed"))?;
    let finished = woken_by(q, async { complete(q, &claim).await.map(|_| ()) }).await?;
    ensure!(
        finished < WOKEN_WITHIN,
        "a waiting worker was woken {finished:?} after a finish"
    );
    Ok(())
}

/// Well under an idle worker's look of 1 s (which comes 950 ms after the act began: it
/// begins 50 ms into the wait), with room for a loaded machine.
const WOKEN_WITHIN: Duration = Duration::from_millis(800);

/// How long after `act` began a worker waiting for work returned (waits that return before
/// it began are waited again, at most 10).
async fn woken_by<Q: RunQueue + ?Sized>(
    q: &Q,
    act: impl std::future::Future<Output = Result<()>>,
) -> Result<Duration> {
    let began = std::sync::OnceLock::new();
    let wait = async {
        for _ in 0..10 {
            q.wait_for_work(Duration::from_secs(5)).await?;
            if let Some(at) = began.get() {
                return Ok(std::time::Instant::elapsed(at));
            }
        }
        Err(fail("the wait never outlasted the act"))
    };
    let act = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = began.set(std::time::Instant::now());
        act.await
    };
    let (woken, acted) = tokio::join!(wait, act);
    acted?;
    woken
}

/// Generates one `#[tokio::test]` per check. `$make` is an async expression returning
/// `Result<Option<Arc<Q>>>`; `None` skips (service not configured).
#[macro_export]
macro_rules! run_queue_tests {
    ($make:expr) => {
        $crate::run_queue_tests!(@ref $make, submit_get_list, session_order, lapse_and_reclaim, lapsed_claims_reclaimed_together, cancel, purge_finished, submit_claimed, subagent_task_runs, every_end, approval_decisions, submit_and_finish_wake_a_waiting_worker);
        $crate::run_queue_tests!(@arc $make, idempotency, racing_workers, racing_submit_claims);
    };
    (@ref $make:expr, $($name:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() -> $crate::Result<()> {
                let Some(q) = $make.await? else { return Ok(()) };
                $crate::runs::conformance::$name(&*q).await
            }
        )+
    };
    (@arc $make:expr, $($name:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() -> $crate::Result<()> {
                let Some(q) = $make.await? else { return Ok(()) };
                $crate::runs::conformance::$name(q).await
            }
        )+
    };
}
