#![allow(clippy::unwrap_used)]

use super::*;
use crate::daily::InMemoryFiles;
use crate::test_support::at;
use crate::tokens::EstimateCounter;
use hame_core::ModelError;
use hame_core::test_support::{Reply, ScriptedModel};
use pretty_assertions::assert_eq;

fn setup(replies: Vec<Reply>) -> (Arc<InMemoryFiles>, ScriptedModel, Consolidator) {
    let files = Arc::new(InMemoryFiles::new());
    let model = ScriptedModel::new(replies);
    let c = Consolidator::new(
        files.clone(),
        Arc::new(model.clone()),
        Arc::new(EstimateCounter),
        ConsolidationOptions::default(),
    );
    (files, model, c)
}

#[test]
fn throttle() {
    let t = ThrottlePolicy::default();
    assert!(t.allows(None, at(1, 0)));
    assert!(!t.allows(Some(at(1, 0)), at(1, 29)));
    assert!(t.allows(Some(at(1, 0)), at(1, 30)));
    assert!(
        t.allows(Some(at(2, 0)), at(1, 0)),
        "a future last run (skew) allows"
    );
}

#[test]
fn validation() {
    let (_, _, c) = setup(vec![]);
    assert_eq!(c.validate("# Memory\n- a").unwrap(), "# Memory\n- a\n");
    assert_eq!(
        c.validate("```markdown\n# Memory\n- a\n```").unwrap(),
        "# Memory\n- a\n"
    );
    for bad in ["", "   ", "- a\n- b", "# Notes\n- a", "# Memory\n\n"] {
        assert!(
            matches!(c.validate(bad), Err(Error::UnusableOutput { .. })),
            "{bad:?} accepted"
        );
    }
    let huge = format!("# Memory\n{}", "- fact about things\n".repeat(2_000));
    assert!(matches!(
        c.validate(&huge),
        Err(Error::UnusableOutput { .. })
    ));
}

#[tokio::test]
async fn merges_only_new_log_text_and_keeps_a_backup() -> Result<()> {
    let (files, model, c) = setup(vec![
        Reply::text("# Memory\n## Preferences\n- Rust\n- Fridays"),
        Reply::text("# Memory\n## Preferences\n- Rust\n- Fridays\n- Tea"),
    ]);
    files
        .write_atomic("MEMORY.md", "# Memory\n- Rust\n")
        .await?;
    files.append("memory/2026-03-13.md", "- Fridays\n").await?;
    files
        .write_atomic("memory/archive/2026-01-01.md", "- old\n")
        .await?;
    files
        .write_atomic("memory/notes.md", "- not a log\n")
        .await?;

    let out = c.consolidate_if_due(at(9, 0)).await?;
    assert_eq!(
        out,
        ConsolidationOutcome::Updated {
            logs: vec!["memory/2026-03-13.md".into()],
            tokens: EstimateCounter.count("# Memory\n## Preferences\n- Rust\n- Fridays\n"),
            more: false
        }
    );
    let snap = files.snapshot();
    assert_eq!(
        snap["MEMORY.md"],
        "# Memory\n## Preferences\n- Rust\n- Fridays\n"
    );
    assert_eq!(snap[BACKUP_PATH], "# Memory\n- Rust\n");
    let prompt = model.requests()[0].messages[0].text_content();
    assert!(prompt.contains("### memory/2026-03-13.md\n- Fridays"));
    assert!(!prompt.contains("old"));
    assert!(!prompt.contains("not a log"));

    // Throttled within 30 minutes.
    files.append("memory/2026-03-14.md", "- Tea\n").await?;
    assert_eq!(
        c.consolidate_if_due(at(9, 10)).await?,
        ConsolidationOutcome::Throttled
    );

    // Later: only the new text is sent.
    files
        .append("memory/2026-03-13.md", "- Late fact\n")
        .await?;
    let out = c.consolidate_if_due(at(9, 45)).await?;
    assert!(matches!(out, ConsolidationOutcome::Updated { .. }));
    let prompt = model.requests()[1].messages[0].text_content();
    assert!(prompt.contains("### memory/2026-03-13.md\n- Late fact"));
    assert!(
        !prompt.contains("- Fridays\n\n"),
        "already merged text is not re-sent"
    );
    assert!(prompt.contains("### memory/2026-03-14.md\n- Tea"));

    // Nothing new: no model call.
    assert_eq!(
        c.consolidate(at(12, 0)).await?,
        ConsolidationOutcome::NothingNew
    );
    assert_eq!(model.requests().len(), 2);
    Ok(())
}

#[tokio::test]
async fn unusable_or_failed_answers_change_nothing() -> Result<()> {
    let (files, _, c) = setup(vec![
        Reply::text(""),
        Reply::text("Sorry, I cannot do that."),
        Reply::Fail(ModelError::Provider {
            status: 500,
            body: "boom".into(),
        }),
    ]);
    files
        .write_atomic("MEMORY.md", "# Memory\n- keep me\n")
        .await?;
    files.append("memory/2026-03-14.md", "- new\n").await?;
    let before = files.snapshot();
    for _ in 0..3 {
        assert!(c.consolidate(at(9, 0)).await.is_err());
        assert_eq!(files.snapshot(), before);
    }
    Ok(())
}
