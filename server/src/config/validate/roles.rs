//! The `[[roles]]` rules: handles, agents and placement, a model agent's
//! endpoint and bounds, approval patterns, and each role's MCP tool
//! servers.

use std::collections::HashSet;

use super::*;

/// `[[roles]]`: handles, agents, placement.
pub(super) fn check_roles(c: &Config, p: &mut Report<'_>) {
    let mut seen = HashSet::new();
    for (i, r) in c.roles.iter().enumerate() {
        let key = format!("roles[{i}].handle");
        if !is_subject_safe(&r.handle) {
            p(
                &key,
                q(&r.handle),
                "a handle must be 1–64 letters, digits, `-` or `_` (it names NATS subjects and consumers)",
                "use a handle like \"support-agent\"".into(),
            );
        } else if !seen.insert(r.handle.as_str()) {
            p(
                &key,
                q(&r.handle),
                "is used by an earlier role",
                "give every role its own handle".into(),
            );
        }
        if let AgentConfig::Command(c) = &r.agent
            && (c.argv.is_empty() || c.argv[0].trim().is_empty())
        {
            p(
                &format!("roles[{i}].agent.argv"),
                Some("[]".into()),
                "a command agent needs a program to run",
                "set argv = [\"python3\", \"agent.py\"]".into(),
            );
        }
        if let AgentConfig::Echo(e) = &r.agent
            && e.rounds == 0
        {
            p(
                &format!("roles[{i}].agent.rounds"),
                Some("0".into()),
                "a turn has at least one round",
                "set rounds = 1 (or leave it out)".into(),
            );
        }
        if let AgentConfig::Echo(e) = &r.agent
            && e.fail_round > e.rounds
        {
            p(
                &format!("roles[{i}].agent.fail_round"),
                Some(e.fail_round.to_string()),
                "is past the turn's last round, so it would never fail",
                format!("use a round from 1 to {} (or 0 for never)", e.rounds),
            );
        }
        for (j, n) in r.placement.nodes.iter().enumerate() {
            if !is_subject_safe(n) {
                p(
                    &format!("roles[{i}].placement.nodes[{j}]"),
                    q(n),
                    "is not a valid node id",
                    "name node ids as in [node] id".into(),
                );
            }
        }
        for (j, l) in r.placement.labels.iter().enumerate() {
            if l.trim().is_empty() || l.chars().any(char::is_whitespace) {
                p(
                    &format!("roles[{i}].placement.labels[{j}]"),
                    q(l),
                    "a label must be non-empty and contain no spaces",
                    "write labels as in [node] labels".into(),
                );
            }
        }
        check_mcp(i, r, p);
        check_approvals(i, r, p);
        if let AgentConfig::Model(m) = &r.agent {
            check_model(i, m, p);
        }
        if let Some(b) = &r.budget {
            if !matches!(r.agent, AgentConfig::Model(_)) {
                p(
                    &format!("roles[{i}].budget"),
                    None,
                    "caps a model agent's tokens, and this role's agent spends none",
                    "remove the budget, or give the role agent = { kind = \"model\", … }".into(),
                );
            }
            for (k, v) in [
                ("tokens_per_day", b.tokens_per_day),
                ("tokens_per_week", b.tokens_per_week),
                ("tokens_per_month", b.tokens_per_month),
            ] {
                if v == Some(0) {
                    p(
                        &format!("roles[{i}].budget.{k}"),
                        Some("0".into()),
                        "a cap of 0 would hold the seat for good",
                        "give at least 1, or leave the cap out for none".into(),
                    );
                }
            }
        }
    }
}

/// `[[roles]] agent = { kind = "model", … }`: an http(s) endpoint, a
/// model, one source of instructions, bounded rounds, tokens, temperature
/// and wait.
fn check_model(i: usize, m: &crate::config::ModelConfig, p: &mut Report<'_>) {
    let key = |k: &str| format!("roles[{i}].agent.{k}");
    let u = m.base_url.as_str();
    if !(u.starts_with("http://") || u.starts_with("https://"))
        || u.contains(char::is_whitespace)
        || u.trim_start_matches("https://")
            .trim_start_matches("http://")
            .is_empty()
    {
        p(
            &key("base_url"),
            q(u),
            "is not an http:// or https:// address",
            "write it as \"https://api.openai.com/v1\" or \"http://127.0.0.1:11434/v1\" (Ollama)"
                .into(),
        );
    }
    if m.api_key_env.is_some() && u.starts_with("http://") && !loopback_url(u) {
        p(
            &key("base_url"),
            q(u),
            "would send the key in the clear: a key goes off this machine only over https",
            "use the endpoint's https:// address (http:// is for a server on 127.0.0.1 or localhost)"
                .into(),
        );
    }
    if m.model.trim().is_empty() {
        p(
            &key("model"),
            q(&m.model),
            "names no model",
            "name the endpoint's model, e.g. \"gpt-4o-mini\" or \"llama3.2\"".into(),
        );
    }
    if !m.instructions.trim().is_empty() && m.instructions_file.is_some() {
        p(
            &key("instructions_file"),
            m.instructions_file
                .as_ref()
                .map(|f| format!("{:?}", f.display().to_string())),
            "the instructions are either written here or read from a file, not both",
            "keep one of instructions and instructions_file".into(),
        );
    }
    // At most 60 completions: with the round that posts the answer, a
    // turn stays inside the engine's 64 rounds.
    let bounded: [(&str, u64, u64, u64, &str); 3] = [
        ("max_rounds", u64::from(m.max_rounds), 1, 60, "8"),
        (
            "max_output_tokens",
            u64::from(m.max_output_tokens),
            1,
            1_000_000,
            "1024",
        ),
        (
            "request_timeout_seconds",
            m.request_timeout_seconds,
            1,
            3600,
            "120",
        ),
    ];
    for (k, v, lo, hi, default) in bounded {
        if !(lo..=hi).contains(&v) {
            p(
                &key(k),
                Some(v.to_string()),
                &format!("must be between {lo} and {hi}"),
                format!("the default is {default}"),
            );
        }
    }
    if !(0.0..=2.0).contains(&m.temperature) {
        p(
            &key("temperature"),
            Some(m.temperature.to_string()),
            "must be between 0 and 2",
            "the default is 0".into(),
        );
    }
}

/// `[[roles]] approve`, `approval_timeout_seconds`: each pattern names a
/// tool server of the role (`fs.write_file`, `git.*`), is `*`, or (in
/// `approve`) names a built-in that reaches outside; the wait is bounded.
fn check_approvals(i: usize, r: &crate::config::RoleConfig, p: &mut Report<'_>) {
    let lists = r
        .approve
        .iter()
        .enumerate()
        .map(|(j, x)| ("approve", j, x))
        .chain(
            r.read_only
                .iter()
                .enumerate()
                .map(|(j, x)| ("read_only", j, x)),
        );
    for (list, j, pattern) in lists {
        let server = pattern.split_once('.').map(|(s, _)| s);
        let known = server.is_some_and(|s| r.mcp.iter().any(|m| m.name == s));
        let tool_ok = pattern
            .split_once('.')
            .is_some_and(|(_, t)| !t.is_empty() && !t.chars().any(char::is_whitespace));
        let built_in =
            list == "approve" && crate::config::APPROVABLE_BUILT_INS.contains(&pattern.as_str());
        if pattern == "*" || (known && tool_ok) || built_in {
            continue;
        }
        let names: Vec<&str> = r.mcp.iter().map(|m| m.name.as_str()).collect();
        let why = match server {
            Some(s) if !known => format!(
                "names no tool server of this role ({s:?}; the role has {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
            _ if list == "approve" => "is not a tool's full name (`server.tool`), a server's every tool (`server.*`), `*`, or a built-in tool that reaches outside (post_outbox, a2a_message, run_detached)".into(),
            _ => "is not a tool's full name (`server.tool`), a server's every tool (`server.*`) or `*`".into(),
        };
        let fix = if list == "approve" {
            "write it as \"fs.write_file\", \"fs.*\", \"*\" or \"run_detached\""
        } else {
            "write it as \"fs.write_file\", \"fs.*\" or \"*\""
        };
        p(
            &format!("roles[{i}].{list}[{j}]"),
            q(pattern),
            &why,
            fix.into(),
        );
    }
    if !(1..=7 * 24 * 3600).contains(&r.approval_timeout_seconds) {
        p(
            &format!("roles[{i}].approval_timeout_seconds"),
            Some(r.approval_timeout_seconds.to_string()),
            "must be between 1 and 604800 (a week)",
            format!(
                "the default is {}",
                crate::config::DEFAULT_APPROVAL_TIMEOUT_SECONDS
            ),
        );
    }
}

/// `[[roles]] mcp`: each server named once, a name fit for a tool name,
/// exactly one of `command` and `url`, a program to run, an http(s) URL,
/// bounded timeouts.
fn check_mcp(i: usize, r: &crate::config::RoleConfig, p: &mut Report<'_>) {
    let mut names = HashSet::new();
    for (j, m) in r.mcp.iter().enumerate() {
        let key = |k: &str| format!("roles[{i}].mcp[{j}].{k}");
        if !is_subject_safe(&m.name) {
            p(
                &key("name"),
                q(&m.name),
                "a tool server's name must be 1–64 letters, digits, `-` or `_` (its tools are named `{name}.{tool}`)",
                "name it like \"fs\" or \"search\"".into(),
            );
        } else if !names.insert(m.name.as_str()) {
            p(
                &key("name"),
                q(&m.name),
                "is used by an earlier tool server of this role",
                "give every tool server of a role its own name".into(),
            );
        }
        match (m.command.is_empty(), &m.url) {
            (true, None) => p(
                &key("command"),
                Some("[]".into()),
                "a tool server needs a program to run (`command`) or an address (`url`)",
                "set command = [\"mcp-server-time\"] or url = \"http://127.0.0.1:8811/mcp\"".into(),
            ),
            (false, Some(u)) => p(
                &key("url"),
                q(u),
                "a tool server is either a child (`command`) or a shared server (`url`), not both",
                "keep one of the two".into(),
            ),
            (false, None) if m.command[0].trim().is_empty() => p(
                &key("command"),
                q(&m.command[0]),
                "the program to run is empty",
                "name the program first, then its arguments".into(),
            ),
            (true, Some(u))
                if !(u.starts_with("http://") || u.starts_with("https://"))
                    || u.contains(char::is_whitespace)
                    || u.trim_start_matches("https://")
                        .trim_start_matches("http://")
                        .is_empty() =>
            {
                p(
                    &key("url"),
                    q(u),
                    "is not an http:// or https:// address",
                    "write it as \"http://127.0.0.1:8811/mcp\"".into(),
                )
            }
            _ => {}
        }
        if m.url.is_none() && !m.headers_from.is_empty() {
            p(
                &key("headers_from"),
                None,
                "headers are sent only to a `url` server",
                "remove headers_from, or give the server a url".into(),
            );
        }
        if !(1..=3600).contains(&m.call_timeout_seconds) {
            p(
                &key("call_timeout_seconds"),
                Some(m.call_timeout_seconds.to_string()),
                "must be between 1 and 3600",
                "the default is 60".into(),
            );
        }
        if !(1..=600).contains(&m.start_timeout_seconds) {
            p(
                &key("start_timeout_seconds"),
                Some(m.start_timeout_seconds.to_string()),
                "must be between 1 and 600",
                "the default is 20".into(),
            );
        }
    }
}
