//! The benchmark's workload, ported from `../shared/bench/peers/common/workload.py` and
//! `common/scripted.py` (byte for byte where it matters: the files, the user messages and
//! the model's decisions).

use std::path::Path;
use std::sync::LazyLock;

use hame::{ModelRequest, Role};
use serde_json::{Map, Value, json};

/// `AGENTS.md` of the workload (`workload.PERSONA`).
pub const PERSONA: &str = include_str!("persona.md");

const ACTIONS: [&str; 3] = ["read", "write", "grep"];
const READ_TOOLS: &[&str] = &["read_file", "Read", "view_text_file", "read"];
const WRITE_TOOLS: &[&str] = &["write_file", "Write", "write_text_file", "write"];
const GREP_TOOLS: &[&str] = &["grep", "Grep", "search_files", "search", "grep_files"];
const PATH_ARGS: &[&str] = &["file_path", "path", "filename", "file"];
const CONTENT_ARGS: &[&str] = &["content", "file_text", "text"];
const PATTERN_ARGS: &[&str] = &["pattern", "regex", "query"];
const SUMMARY_WORDS: &[&str] = &["summar", "compress", "compact", "continuation"];
const FINAL_FILLER: &str = " The requested step was carried out with the workspace tool, the \
result was checked against the persona rules in AGENTS.md, and nothing else needs doing for \
this turn.";

static MARK: LazyLock<Option<regex::Regex>> = LazyLock::new(|| {
    regex::Regex::new(r"\[bench turn=(\d+) root=([^\]\s]+)(?: sid=(\w+))?\]").ok()
});

fn note_body() -> String {
    "# Bench note\n\nThis note was written by the scripted benchmark model. It records that \
the agent completed a write step and keeps a short list of observations about the knowledge \
base (Zephyr, Quill, Harbor).\n"
        .repeat(3)
}

/// `workload.knowledge_text(80)`.
pub fn knowledge_text(lines: usize) -> String {
    let topics = [
        "Harbor",
        "scheduler",
        "gateway",
        "memory",
        "compaction",
        "sessions",
        "skills",
        "sandbox",
    ];
    let mut out = vec!["# Knowledge base: project Zephyr".to_owned(), String::new()];
    for i in 0..lines {
        let t = topics[i % topics.len()];
        out.push(format!(
            "- Fact {i:03}: Zephyr's {t} component, revision {}, handles case {} within {} ms \
             and stores its state under harbor/{t}/{i:03}.",
            i % 7,
            i * 37 % 101,
            5 + i % 40
        ));
    }
    out.join("\n") + "\n"
}

/// `workload.make_workspace`.
pub fn make_workspace(path: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(path)?;
    std::fs::write(path.join("AGENTS.md"), PERSONA)?;
    std::fs::write(path.join("knowledge.md"), knowledge_text(80))
}

/// `workload.user_message`.
pub fn user_message(turn: usize, root: &str, sid: Option<&str>) -> String {
    let action = ACTIONS[turn % 3];
    let marker = match sid {
        Some(s) => format!("[bench turn={turn} root={root} sid={s}]"),
        None => format!("[bench turn={turn} root={root}]"),
    };
    let ask = match action {
        "read" => "Please look up what the knowledge base says about the Harbor component.",
        "write" => "Please write a short note summarising what we found so far.",
        _ => "Please find every mention of Zephyr in the workspace.",
    };
    format!("{marker} {ask}")
}

/// What the scripted model answers.
pub struct Decision {
    pub kind: &'static str,
    pub text: String,
    pub call: Option<(String, Value)>,
}

/// The offered tools' schemas by name, borrowed from the request.
type Tools<'a> = std::collections::BTreeMap<&'a str, &'a Value>;

fn pick(names: &[&str], tools: &Tools<'_>) -> Option<String> {
    names
        .iter()
        .find(|n| tools.contains_key(**n))
        .map(|n| (*n).to_owned())
}

fn arg(candidates: &[&str], schema: &Value) -> String {
    let props = schema.get("properties").and_then(Value::as_object);
    match props {
        Some(p) if !p.is_empty() => candidates
            .iter()
            .find(|c| p.contains_key(**c))
            .map(|c| (*c).to_owned())
            .or_else(|| p.keys().next().cloned())
            .unwrap_or_else(|| candidates[0].to_owned()),
        _ => candidates[0].to_owned(),
    }
}

fn join(root: &str, name: &str) -> String {
    if root == "/" {
        format!("/{name}")
    } else {
        format!("{}/{name}", root.trim_end_matches('/'))
    }
}

fn tool_call_for(
    turn: usize,
    root: &str,
    tools: &Tools<'_>,
    sid: Option<&str>,
) -> Option<(String, Value)> {
    let mut action = ACTIONS[turn % 3];
    let mut name = match action {
        "write" => pick(WRITE_TOOLS, tools),
        "grep" => pick(GREP_TOOLS, tools),
        _ => pick(READ_TOOLS, tools),
    };
    if name.is_none() {
        action = "read";
        name = pick(READ_TOOLS, tools);
    }
    let name = name?;
    let null = Value::Null;
    let schema = tools.get(name.as_str()).copied().unwrap_or(&null);
    let mut args = Map::new();
    match action {
        "read" => {
            args.insert(arg(PATH_ARGS, schema), json!(join(root, "knowledge.md")));
        }
        "write" => {
            let file = match sid {
                Some(s) => format!("note-{s}-{turn}.md"),
                None => format!("note-{turn}.md"),
            };
            args.insert(arg(PATH_ARGS, schema), json!(join(root, &file)));
            args.insert(arg(CONTENT_ARGS, schema), json!(note_body()));
        }
        _ => {
            args.insert(arg(PATTERN_ARGS, schema), json!("Zephyr"));
            if let Some(props) = schema.get("properties").and_then(Value::as_object)
                && let Some(p) = PATH_ARGS.iter().find(|p| props.contains_key(**p))
            {
                args.insert((*p).to_owned(), json!(root));
            }
        }
    }
    Some((name, Value::Object(args)))
}

/// `scripted.decide` on a hame request (no forced tool choice: hame never forces one).
pub fn decide(request: &ModelRequest) -> Decision {
    let tools: Tools<'_> = request
        .tools
        .iter()
        .map(|t| (t.name.as_str(), &*t.parameters))
        .collect();
    let last3: String = request
        .messages
        .iter()
        .rev()
        .take(3)
        .map(|m| m.text_content())
        .collect::<Vec<_>>()
        .join("\n")
        .to_lowercase();
    let system = request.system.to_lowercase();
    let looks_summary = SUMMARY_WORDS.iter().any(|w| last3.contains(w));
    let text = |kind: &'static str, text: String| Decision {
        kind,
        text,
        call: None,
    };
    let Some(mark) = MARK.as_ref() else {
        return text("aux", "no marker regex".into());
    };
    let idx = request
        .messages
        .iter()
        .rposition(|m| m.role == Role::User && mark.is_match(&m.text_content()));
    if tools.is_empty() {
        let kind = if looks_summary || SUMMARY_WORDS.iter().any(|w| system.contains(w)) {
            "summary"
        } else {
            "aux"
        };
        return text(
            kind,
            "## Summary\nThe user ran scripted benchmark turns that read knowledge.md, wrote \
             note files and grepped for Zephyr. All turns completed; no open tasks."
                .into(),
        );
    }
    let Some(idx) = idx else {
        return text(
            "final_lost",
            format!("I no longer see the request in my context.{FINAL_FILLER}"),
        );
    };
    let content = request.messages[idx].text_content();
    let Some(caps) = mark.captures(&content) else {
        return text("final_lost", FINAL_FILLER.into());
    };
    let turn: usize = caps
        .get(1)
        .and_then(|m| m.as_str().parse().ok())
        .unwrap_or(0);
    let root = caps.get(2).map_or("/", |m| m.as_str()).to_owned();
    let sid = caps.get(3).map(|m| m.as_str().to_owned());
    let after = &request.messages[idx + 1..];
    let calls: usize = after
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| m.tool_calls().count())
        .sum();
    if calls == 0 {
        return match tool_call_for(turn, &root, &tools, sid.as_deref()) {
            Some(call) => Decision {
                kind: "tool",
                text: String::new(),
                call: Some(call),
            },
            None => text("final", "no usable file tool".into()),
        };
    }
    let answered = after.iter().position(|m| {
        m.role == Role::Assistant
            && m.tool_calls().next().is_none()
            && !m.text_content().trim().is_empty()
    });
    if let Some(a) = answered
        && after[a + 1..].iter().any(|m| m.role == Role::User)
    {
        return text("aux", format!("Nothing to update.{FINAL_FILLER}"));
    }
    text(
        "final",
        format!("Turn {turn} done ({}).{FINAL_FILLER}", ACTIONS[turn % 3]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_files_match_the_python_workload() {
        assert_eq!(
            user_message(4, "/", Some("s3")),
            "[bench turn=4 root=/ sid=s3] Please write a short note summarising what we found so far."
        );
        let k = knowledge_text(80);
        assert_eq!(k.lines().count(), 82);
        assert!(k.contains("- Fact 079: Zephyr's sandbox component, revision 2, handles case 95 within 44 ms and stores its state under harbor/sandbox/079."));
        assert!(PERSONA.starts_with("# AGENTS.md: persona for the benchmark agent"));
    }
}
