//! The shape of the company file, derived from the config types themselves.
//!
//! Two fully-populated exemplar configs (one per agent kind) are serialized
//! and merged into a tree of known keys, so the unknown-key check and the
//! environment overrides can never drift from the structs serde reads.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::is_secret;
use super::validate::Problem;
use super::*;

/// What a key holds.
#[derive(Clone, Debug, PartialEq)]
enum Shape {
    Table(BTreeMap<String, Shape>),
    /// An array of tables: the merged keys of its elements.
    TableArray(BTreeMap<String, Shape>),
    Leaf(Leaf),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Leaf {
    String,
    Integer,
    Bool,
    StringArray,
    Other,
}

fn exemplar(agent: AgentConfig) -> Config {
    Config {
        node: NodeSection {
            labels: vec!["gpu".into()],
            allow_command_agents: Some(true),
            programs: Some(vec![ProgramRule {
                path: "/usr/bin/true".into(),
                args: vec!["x".into()],
                uses: vec![ProgramUse::Run],
            }]),
            agent_env: vec!["K".into()],
            instructions_dir: Some(PathBuf::from("i")),
            agent_user: Some("u".into()),
            ..NodeSection::default()
        },
        coordination: CoordinationSection::default(),
        stream: StreamSection {
            kind: StreamType::Nats,
            urls: vec!["nats://127.0.0.1:4222".into()],
            user: Some("u".into()),
            password: Some("p".into()),
            creds_file: Some(PathBuf::from("x.creds")),
            tls_ca_file: Some(PathBuf::from("ca.pem")),
            ..StreamSection::default()
        },
        company: CompanySection::default(),
        roles: vec![RoleConfig {
            handle: "h".into(),
            agent,
            placement: PlacementConfig {
                nodes: vec!["n".into()],
                labels: vec!["l".into()],
            },
            mcp: vec![McpServerConfig {
                url: Some("http://x".into()),
                env_from: vec!["K".into()],
                ..McpServerConfig::stdio("n", &["x"])
            }],
            approve: vec!["n.x".into()],
            approve_destructive: true,
            read_only: vec!["n.r".into()],
            a2a_to: vec!["h2".into()],
            approval_timeout_seconds: 1,
            budget: Some(BudgetConfig {
                tokens_per_day: Some(1),
                tokens_per_week: Some(1),
                tokens_per_month: Some(1),
            }),
        }],
        auth: AuthSection {
            users: vec![UserConfig {
                name: "n".into(),
                password_hash: "h".into(),
                role: AuthRole::Viewer,
            }],
            tokens: vec![TokenConfig {
                name: "n".into(),
                sha256: "h".into(),
                role: AuthRole::Viewer,
            }],
            trusted_proxies: vec!["127.0.0.1".into()],
            secure_cookies: Some(true),
        },
        logging: LoggingSection {
            file: Some(PathBuf::from("x.log")),
            ..LoggingSection::default()
        },
        memory: MemorySection::default(),
        maintenance: MaintenanceSection::default(),
        scheduler: SchedulerSection::default(),
        schedules: vec![ScheduleConfig {
            name: "n".into(),
            seat: "h".into(),
            cron: "0 * * * *".into(),
            kind: "task_assigned".into(),
            // Free JSON: a leaf, whatever it holds.
            body: serde_json::json!("any"),
        }],
        runs: RunsSection {
            allow: vec!["/usr/bin/true".into()],
        },
        metrics: MetricsSection::default(),
    }
}

fn shape_of(v: &toml::Value) -> Shape {
    match v {
        toml::Value::Table(t) => {
            Shape::Table(t.iter().map(|(k, v)| (k.clone(), shape_of(v))).collect())
        }
        toml::Value::Array(a) if a.iter().all(|e| e.is_table()) && !a.is_empty() => {
            let mut merged = BTreeMap::new();
            for e in a {
                if let Shape::Table(t) = shape_of(e) {
                    merge(&mut merged, t);
                }
            }
            Shape::TableArray(merged)
        }
        toml::Value::Array(_) => Shape::Leaf(Leaf::StringArray),
        toml::Value::String(_) => Shape::Leaf(Leaf::String),
        toml::Value::Integer(_) => Shape::Leaf(Leaf::Integer),
        toml::Value::Boolean(_) => Shape::Leaf(Leaf::Bool),
        _ => Shape::Leaf(Leaf::Other),
    }
}

fn merge(into: &mut BTreeMap<String, Shape>, from: BTreeMap<String, Shape>) {
    for (k, v) in from {
        match (into.get_mut(&k), v) {
            (Some(Shape::Table(a)), Shape::Table(b)) => merge(a, b),
            (Some(Shape::TableArray(a)), Shape::TableArray(b)) => merge(a, b),
            (Some(_), _) => {}
            (None, v) => {
                into.insert(k, v);
            }
        }
    }
}

fn known() -> BTreeMap<String, Shape> {
    let mut root = BTreeMap::new();
    for agent in [
        AgentConfig::Echo(EchoConfig::default()),
        AgentConfig::Command(CommandConfig::new(vec!["x".into()])),
        AgentConfig::Model(ModelConfig {
            api_key_env: Some("K".into()),
            instructions_file: Some(PathBuf::from("i.md")),
            ..ModelConfig::new("http://x/v1", "m")
        }),
    ] {
        let v = toml::Value::try_from(exemplar(agent)).expect("exemplar config serializes");
        if let Shape::Table(t) = shape_of(&v) {
            merge(&mut root, t);
        }
    }
    root
}

/// Every key a company file may hold, written as docs/config.md writes
/// it: `node.id`, `roles[].agent.rounds`, `auth.users[].name`. A table
/// whose keys are free-form (a role's `env`) is one key. The list the
/// unknown-key check reads, so the documentation check reads the truth.
pub fn key_paths() -> Vec<String> {
    let mut out = Vec::new();
    paths_under(&known(), "", &mut out);
    out
}

fn paths_under(shape: &BTreeMap<String, Shape>, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in shape {
        let here = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Shape::Table(inner) if !inner.is_empty() => paths_under(inner, &here, out),
            Shape::TableArray(inner) => paths_under(inner, &format!("{here}[]"), out),
            _ => out.push(here),
        }
    }
}

/// The closest valid key to `key` among `candidates`, if one is close.
pub(super) fn nearest<'a>(key: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|c| (strsim::damerau_levenshtein(key, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn short(v: &toml::Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(57).map(|(i, _)| i).unwrap_or(s.len())]
        )
    } else {
        s
    }
}

/// The walk stops looking once it has found this many unknown keys.
const UNKNOWN_KEYS_CAP: usize = 200;

fn walk(table: &toml::Table, shape: &BTreeMap<String, Shape>, path: &str, out: &mut Vec<Problem>) {
    for (k, v) in table {
        if out.len() >= UNKNOWN_KEYS_CAP {
            return;
        }
        let here = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match shape.get(k) {
            None => {
                let fix = match nearest(k, shape.keys().map(String::as_str)) {
                    Some(n) => format!("did you mean `{n}`?"),
                    None => format!(
                        "valid keys here: {}",
                        shape
                            .keys()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                out.push(Problem::new(&here, Some(short(v)), "unknown key", fix));
            }
            // A table with no known keys is free-form (a role's `env`).
            Some(Shape::Table(inner)) if inner.is_empty() => {}
            Some(Shape::Table(inner)) => {
                if let toml::Value::Table(t) = v {
                    walk(t, inner, &here, out);
                }
            }
            Some(Shape::TableArray(inner)) => {
                if let toml::Value::Array(items) = v {
                    for (i, item) in items.iter().enumerate() {
                        if let toml::Value::Table(t) = item {
                            walk(t, inner, &format!("{here}[{i}]"), out);
                        }
                    }
                }
            }
            Some(Shape::Leaf(_)) => {}
        }
    }
}

/// Every key in the file that the config does not know, with the nearest
/// valid key.
pub(super) fn unknown_keys(value: &toml::Table) -> Vec<Problem> {
    let mut out = Vec::new();
    walk(value, &known(), "", &mut out);
    out
}

/// Apply `CREWLET_SECTION__KEY=value` overrides onto the parsed file.
/// Lists take comma-separated values.
pub(super) fn apply_env(value: &mut toml::Table, env: &BTreeMap<String, String>) -> Vec<Problem> {
    let shape = known();
    let mut problems = Vec::new();
    for (var, raw) in env {
        let Some(rest) = var.strip_prefix("CREWLET_") else {
            continue;
        };
        let Some((section, key)) = rest.split_once("__") else {
            continue;
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        let leaf = match shape.get(&section) {
            Some(Shape::Table(t)) => match t.get(&key) {
                Some(Shape::Leaf(l)) => Some(*l),
                _ => None,
            },
            _ => None,
        };
        let Some(leaf) = leaf else {
            let all: Vec<String> = shape
                .iter()
                .filter_map(|(s, sh)| match sh {
                    Shape::Table(t) => Some(
                        t.iter()
                            .filter(|(_, v)| matches!(v, Shape::Leaf(_)))
                            .map(|(k, _)| {
                                format!("CREWLET_{}__{}", s.to_uppercase(), k.to_uppercase())
                            })
                            .collect::<Vec<_>>(),
                    ),
                    _ => None,
                })
                .flatten()
                .collect();
            let fix = match nearest(var, all.iter().map(String::as_str)) {
                Some(n) => format!("did you mean `{n}`?"),
                None => "overrides name a section and a key, e.g. CREWLET_STREAM__URLS".into(),
            };
            problems.push(Problem::new(var, None, "is not a config override", fix));
            continue;
        };
        let parsed = match leaf {
            Leaf::String | Leaf::Other => Ok(toml::Value::String(raw.clone())),
            Leaf::Integer => raw
                .trim()
                .parse::<i64>()
                .map(toml::Value::Integer)
                .map_err(|_| "must be a whole number"),
            Leaf::Bool => match raw.trim() {
                "true" => Ok(toml::Value::Boolean(true)),
                "false" => Ok(toml::Value::Boolean(false)),
                _ => Err("must be true or false"),
            },
            Leaf::StringArray => Ok(toml::Value::Array(
                raw.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| toml::Value::String(s.to_string()))
                    .collect(),
            )),
        };
        match parsed {
            Ok(v) => {
                let table = value
                    .entry(section.clone())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                if let toml::Value::Table(t) = table {
                    t.insert(key, v);
                }
            }
            Err(why) => {
                let shown = if is_secret(&key) {
                    REDACTED.to_string()
                } else {
                    raw.clone()
                };
                problems.push(Problem::new(
                    var,
                    Some(shown),
                    why,
                    format!("set {var} to a valid value for {section}.{key}"),
                ));
            }
        }
    }
    problems
}
