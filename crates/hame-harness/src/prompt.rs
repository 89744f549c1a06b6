//! Assembly of the system prompt from workspace files. Pure: no I/O here.
//!
//! Order (stable parts first, so provider prompt caches can reuse the prefix):
//! 1. the builder's prompt;
//! 2. `AGENTS.md` (the user's override when present), in full;
//! 3. `knowledge/KNOWLEDGE.md` in full, then the list of the other files under `knowledge/`;
//! 4. additional context files, in the order given;
//! 5. `<available_skills>`: names and descriptions of the visible skills (changes only when
//!    the skills do);
//! 6. `MEMORY.md`, within its token budget (newest part kept);
//! 7. the session section (agent, date, session id, user id): the volatile part, last.

/// What goes into one system prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptParts {
    /// The builder's prompt.
    pub base: String,
    /// Content of `AGENTS.md`, if any.
    pub agents_md: Option<String>,
    /// Content of `knowledge/KNOWLEDGE.md`, if any.
    pub knowledge_md: Option<String>,
    /// Paths (workspace-relative) of other files under `knowledge/`, sorted.
    pub knowledge_files: Vec<String>,
    /// `knowledge/` holds more files than `knowledge_files` lists (the prompt says so).
    pub knowledge_more: bool,
    /// `(path, content)` of additional context files.
    pub additional: Vec<(String, String)>,
    /// The `<available_skills>` block (names and descriptions), if any skill is visible.
    pub skills: Option<String>,
    /// `MEMORY.md` after budgeting, and whether it was cut.
    pub memory: Option<BudgetedText>,
    /// Session facts.
    pub session: SessionInfo,
    /// The tools run in a sandbox: files and commands are inside a container at
    /// `/workspace` (the prompt says so and never names the host path).
    pub sandboxed: bool,
}

/// The volatile facts of the session section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionInfo {
    /// Agent name.
    pub agent: String,
    /// Today's date, `YYYY-MM-DD (Weekday)`.
    pub date: String,
    /// Session id.
    pub session_id: String,
    /// User id, if any.
    pub user_id: Option<String>,
}

/// A text cut to a token budget.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetedText {
    /// The kept text.
    pub text: String,
    /// Whether older content was dropped.
    pub truncated: bool,
}

/// Keeps the newest part of `text` (its end) within about `budget_tokens`, cutting at a
/// line boundary. `count` estimates the tokens of a string.
pub fn keep_newest(
    text: &str,
    budget_tokens: usize,
    count: &dyn Fn(&str) -> usize,
) -> BudgetedText {
    if count(text) <= budget_tokens {
        return BudgetedText {
            text: text.to_owned(),
            truncated: false,
        };
    }
    // Walk lines from the end, keeping whole lines while they fit.
    let mut kept: Vec<&str> = Vec::new();
    let mut used = 0usize;
    for line in text.lines().rev() {
        let cost = count(line) + 1;
        if used + cost > budget_tokens {
            break;
        }
        used += cost;
        kept.push(line);
    }
    kept.reverse();
    BudgetedText {
        text: kept.join("\n"),
        truncated: true,
    }
}

fn section(out: &mut String, tag: &str, attrs: &str, body: &str) {
    out.push_str(&format!("<{tag}{attrs}>\n"));
    out.push_str(body.trim_end());
    out.push_str(&format!("\n</{tag}>\n\n"));
}

/// Renders the system prompt.
pub fn render(parts: &PromptParts) -> String {
    let mut out = String::new();
    if !parts.base.trim().is_empty() {
        out.push_str(parts.base.trim());
        out.push_str("\n\n");
    }
    out.push_str(
        "# Workspace\nYour workspace holds your persona (AGENTS.md), curated memory (MEMORY.md), daily \
         memory logs (memory/), knowledge (knowledge/) and skills (skills/). Its files below are re-read \
         before every step. Paths are relative to the workspace root.\n\n",
    );
    if parts.sandboxed {
        out.push_str(
            "# Sandbox\nYou run sandboxed: every file tool and the execute tool work inside an isolated \
             container whose working directory is /workspace (relative paths are relative to it). It has \
             no network unless the operator enabled one. Its files are kept between calls of this session; \
             AGENTS.md, skills/, subagents/, knowledge/ and tools.json are copied in from the operator's \
             workspace at the start of every call (edits to them in the sandbox do not last).\n\n",
        );
    }
    if let Some(agents) = &parts.agents_md {
        section(&mut out, "agents_md", "", agents);
    }
    if parts.knowledge_md.is_some() || !parts.knowledge_files.is_empty() {
        let mut body = parts.knowledge_md.clone().unwrap_or_default();
        if !parts.knowledge_files.is_empty() {
            if !body.is_empty() {
                body.push_str("\n\n");
            }
            body.push_str("Knowledge files (read them with read_file when relevant):\n");
            for f in &parts.knowledge_files {
                body.push_str(&format!("- {f}\n"));
            }
            if parts.knowledge_more {
                body.push_str(&format!(
                    "(only the first {} are listed: list_files or glob_files under knowledge/ finds the others)\n",
                    parts.knowledge_files.len()
                ));
            }
        }
        section(&mut out, "knowledge", "", &body);
    }
    for (path, content) in &parts.additional {
        section(&mut out, "context", &format!(" path=\"{path}\""), content);
    }
    if let Some(skills) = &parts.skills {
        section(&mut out, "available_skills", "", skills);
    }
    if let Some(memory) = &parts.memory {
        let mut body = String::new();
        if memory.truncated {
            body.push_str(
                "(Older parts of MEMORY.md were left out to fit the budget; use memory_search to find them.)\n",
            );
        }
        body.push_str(&memory.text);
        section(&mut out, "memory_md", "", &body);
    }
    let s = &parts.session;
    out.push_str("# Session\n");
    out.push_str(&format!("- Agent: {}\n", s.agent));
    out.push_str(&format!("- Date: {}\n", s.date));
    out.push_str(&format!("- Session: {}\n", s.session_id));
    if let Some(u) = &s.user_id {
        out.push_str(&format!("- User: {u}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    #[test]
    fn keeps_newest_lines() {
        let text = "old one\nold two\nmid three\nnew four";
        let b = keep_newest(text, 6, &words);
        assert_eq!(
            b,
            BudgetedText {
                text: "mid three\nnew four".into(),
                truncated: true
            }
        );
        let all = keep_newest(text, 100, &words);
        assert!(!all.truncated);
        assert_eq!(all.text, text);
    }

    #[test]
    fn full_prompt_snapshot() {
        let parts = PromptParts {
            base: "You are a careful assistant.".into(),
            agents_md: Some("# Persona\nBe terse.\n".into()),
            knowledge_md: Some("Products: A, B.".into()),
            knowledge_files: vec![
                "knowledge/pricing.md".into(),
                "knowledge/faq/returns.md".into(),
            ],
            knowledge_more: false,
            additional: vec![("docs/extra.md".into(), "Extra context.".into())],
            skills: Some("- review: Review a patch.\n".into()),
            memory: Some(BudgetedText {
                text: "- user prefers metric units".into(),
                truncated: true,
            }),
            session: SessionInfo {
                agent: "hame".into(),
                date: "2026-11-30 (Monday)".into(),
                session_id: "s1".into(),
                user_id: Some("alice".into()),
            },
            sandboxed: false,
        };
        insta::assert_snapshot!(render(&parts));
    }

    #[test]
    fn a_cut_knowledge_list_says_so() {
        let parts = PromptParts {
            knowledge_files: vec!["knowledge/a.md".into()],
            knowledge_more: true,
            ..PromptParts::default()
        };
        let p = render(&parts);
        assert!(
            p.contains("- knowledge/a.md\n(only the first 1 are listed: list_files or glob_files under knowledge/ finds the others)"),
            "{p}"
        );
        let whole = PromptParts {
            knowledge_more: false,
            ..parts
        };
        assert!(!render(&whole).contains("only the first"));
    }

    #[test]
    fn sandboxed_prompt_names_the_sandbox_workspace_only() {
        let parts = PromptParts {
            sandboxed: true,
            ..PromptParts::default()
        };
        let p = render(&parts);
        assert!(p.contains("You run sandboxed"), "{p}");
        assert!(p.contains("/workspace"), "{p}");
        let plain = render(&PromptParts::default());
        assert!(!plain.contains("sandboxed"), "{plain}");
    }

    #[test]
    fn empty_workspace_still_has_session() {
        let parts = PromptParts {
            session: SessionInfo {
                agent: "a".into(),
                date: "d".into(),
                session_id: "s".into(),
                user_id: None,
            },
            ..PromptParts::default()
        };
        let p = render(&parts);
        assert!(p.ends_with("- Session: s\n"), "{p}");
        assert!(!p.contains("<agents_md>"));
    }
}
