//! What a company file may ask of the machine: drills, detached runs and
//! proxies, the environment a child program gets, and the node's own
//! policy on programs and addresses.

use super::*;

/// What the node trusts the payload with: drills only on a test node,
/// detached runs only of absolute paths, proxies as addresses.
pub(super) fn check_trust(c: &Config) -> Vec<Problem> {
    let mut out = Vec::new();
    for (i, r) in c.roles.iter().enumerate() {
        if let AgentConfig::Echo(e) = &r.agent
            && e.drills
            && c.node.environment != Environment::Test
        {
            out.push(Problem::new(
                &format!("roles[{i}].agent.drills"),
                Some("true".into()),
                "drills let mail break turns, start programs and forward mail: only a test node honours them",
                "remove `drills`, or set [node] environment = \"test\" on a node that runs tests only",
            ));
        }
    }
    if !c.node.command_agents_allowed(c.coordination.kind) {
        for (i, r) in c.roles.iter().enumerate() {
            if matches!(r.agent, AgentConfig::Command(_)) {
                out.push(Problem::new(
                    &format!("roles[{i}].agent.kind"),
                    q("command"),
                    "this node does not run command agents (a fleet node's default: a command agent runs a program of the company's choosing on every node)",
                    "set [node] allow_command_agents = true on each node that may run them",
                ));
            }
        }
    }
    out.extend(check_child_env(c));
    out.extend(check_node_policy(c));
    for (i, a) in c.runs.allow.iter().enumerate() {
        if !a.starts_with('/') || a.chars().any(char::is_control) {
            out.push(Problem::new(
                &format!("runs.allow[{i}]"),
                q(a),
                "must be an absolute path to a program",
                "give the program's full path, e.g. \"/usr/bin/git\" (`command -v git` prints it)",
            ));
        }
    }
    for (i, t) in c.auth.trusted_proxies.iter().enumerate() {
        if super::Network::parse(t).is_none() {
            out.push(Problem::new(
                &format!("auth.trusted_proxies[{i}]"),
                q(t),
                "is not an address or network",
                "write an address like \"127.0.0.1\" or a network like \"10.0.0.0/8\"",
            ));
        }
    }
    out
}

/// A child's variables (a command agent's, a tool server's, a model's
/// key): names only, never the node's own configuration passed through,
/// and only ones the node's `agent_env` hands over.
fn check_child_env(c: &Config) -> Vec<Problem> {
    let mut out = Vec::new();
    let env_name = |n: &str| {
        !n.is_empty()
            && n.len() <= 128
            && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !n.as_bytes()[0].is_ascii_digit()
    };
    let not_a_name = |key: String, value: Option<String>| {
        Problem::new(
            &key,
            value,
            "is not a variable name",
            "use letters, digits and `_`, not starting with a digit",
        )
    };
    // A child's variables (a command agent's, a tool server's): names
    // only, and never the node's own configuration passed through.
    let mut child_env =
        |at: String,
         env: &BTreeMap<String, String>,
         from: &mut dyn Iterator<Item = (String, &String)>| {
            for k in env.keys() {
                if !env_name(k) {
                    out.push(not_a_name(format!("{at}.env.{k}"), None));
                }
            }
            for (key, n) in from {
                if !env_name(n) {
                    out.push(not_a_name(format!("{at}.{key}"), q(n)));
                } else if n.starts_with("CREWLET_") {
                    out.push(Problem::new(
                        &format!("{at}.{key}"),
                        q(n),
                        "is the node's own configuration (its secrets among it), never an agent's",
                        "pass the agent what it needs under a name of its own",
                    ));
                } else if !c.node.agent_env.iter().any(|a| a == n) {
                    out.push(Problem::new(
                        &format!("{at}.{key}"),
                        q(n),
                        "is a variable of the node that its file does not hand to agents",
                        "list it in [node] agent_env on each node that may hand it over (docs/security.md § Security model)",
                    ));
                }
            }
        };
    for (i, r) in c.roles.iter().enumerate() {
        if let AgentConfig::Model(m) = &r.agent
            && let Some(k) = &m.api_key_env
        {
            let no_env = BTreeMap::new();
            child_env(
                format!("roles[{i}].agent"),
                &no_env,
                &mut std::iter::once(("api_key_env".to_string(), k)),
            );
        }
        if let AgentConfig::Command(cmd) = &r.agent {
            child_env(
                format!("roles[{i}].agent"),
                &cmd.env,
                &mut cmd
                    .env_from
                    .iter()
                    .enumerate()
                    .map(|(j, n)| (format!("env_from[{j}]"), n)),
            );
        }
        for (j, m) in r.mcp.iter().enumerate() {
            child_env(
                format!("roles[{i}].mcp[{j}]"),
                &m.env,
                &mut m
                    .env_from
                    .iter()
                    .enumerate()
                    .map(|(k, n)| (format!("env_from[{k}]"), n))
                    .chain(
                        m.headers_from
                            .iter()
                            .map(|(h, n)| (format!("headers_from.{h}"), n)),
                    ),
            );
        }
    }
    out
}

/// `[node]`'s rules over what runs and what is handed to agents, and each
/// role's `instructions_file` against the instructions directory.
fn check_node_policy(c: &Config) -> Vec<Problem> {
    let mut out = Vec::new();
    for (i, r) in c.node.programs.iter().flatten().enumerate() {
        let key = |k: &str| format!("node.programs[{i}].{k}");
        if !r.path.starts_with('/') || r.path.chars().any(char::is_control) {
            out.push(Problem::new(
                &key("path"),
                q(&r.path),
                "must be an absolute path to a program",
                "give the program's full path, e.g. \"/usr/bin/python3\" (`command -v python3` prints it)",
            ));
        }
        if r.uses.is_empty() {
            out.push(Problem::new(
                &key("uses"),
                Some("[]".into()),
                "allows the program for nothing",
                "list what it may be started as: \"command\", \"mcp\", \"run\" (or remove the key: command and mcp)",
            ));
        }
        for (j, a) in r.args.iter().enumerate() {
            let words: Vec<&str> = a.split_whitespace().collect();
            if words.iter().rev().skip(1).any(|w| *w == "**") {
                out.push(Problem::new(
                    &format!("node.programs[{i}].args[{j}]"),
                    q(a),
                    "`**` (any further arguments) may only be the last word",
                    "move `**` to the end, or use `*` for one argument",
                ));
            }
        }
    }
    for (i, n) in c.node.agent_env.iter().enumerate() {
        if n.starts_with("CREWLET_") {
            out.push(Problem::new(
                &format!("node.agent_env[{i}]"),
                q(n),
                "is the node's own configuration (its secrets among it), never an agent's",
                "remove it; pass the agent what it needs under a name of its own",
            ));
        }
    }
    let policy = AgentPolicy::of(c);
    for (i, r) in c.roles.iter().enumerate() {
        if let AgentConfig::Model(m) = &r.agent
            && let Some(f) = &m.instructions_file
            && let Err(e) = policy.instructions_lexical(f)
        {
            out.push(Problem::new(
                &format!("roles[{i}].agent.instructions_file"),
                q(&f.display().to_string()),
                e.to_string(),
                "name a file inside the node's instructions directory",
            ));
        }
    }
    out
}

/// Pure: is `url`'s host this machine (`localhost`, 127.0.0.0/8, `[::1]`)?
pub(crate) fn loopback_url(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
