//! Every name a user meets is documented where the docs say it is: each
//! metric the node exports has exactly one row in a table of the documents
//! (docs/operations.md § Monitoring), and no row names a metric the node does
//! not export; each event the node emits is in docs/mail-and-turns.md
//! § Events; each key of the company file has exactly one row in
//! docs/config.md and each row names a key; each route of the node's
//! router has exactly one row in a table of the documents
//! (docs/http-and-cli.md § HTTP) and each row names a route.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The `crewlet_…` names quoted in `src` (a metric name is a string
/// literal in the product: a constant of server/src/metrics.rs, or a
/// family the scrape writes itself).
fn quoted_metric_names(src: &str) -> Vec<String> {
    let src = src.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = Vec::new();
    for piece in src.split("\"crewlet_").skip(1) {
        let name: String = piece
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.is_empty() && piece[name.len()..].starts_with('"') {
            out.push(format!("crewlet_{name}"));
        }
    }
    out
}

/// The backquoted words of a table row's first cell
/// (`` | `a`, `b` | … `` → `a`, `b`).
fn first_cell_words(row: &str) -> impl Iterator<Item = &str> {
    row.split('|')
        .nth(1)
        .unwrap_or_default()
        .split('`')
        .skip(1)
        .step_by(2)
}

/// The metrics a table row of `md` documents: the backquoted `crewlet_…`
/// names of a row's first cell (`| \`crewlet_turns_total{outcome}\` | …`).
fn documented_metrics(md: &str) -> Vec<String> {
    md.lines()
        .filter(|l| l.starts_with("| `crewlet_"))
        .flat_map(|l| {
            first_cell_words(l)
                .filter_map(|t| t.strip_prefix("crewlet_"))
                .map(|t| {
                    let name: String = t
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    format!("crewlet_{name}")
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn every_metric_the_node_exports_has_one_row_in_the_docs_and_every_row_a_metric() {
    let mut exported: Vec<String> = quoted_metric_names(&read("server/src/metrics.rs"));
    // The two families the scrape writes itself (`# TYPE name …`).
    let scrape = read("server/src/web/mod.rs");
    exported.extend(
        scrape
            .split("# TYPE ")
            .skip(1)
            .filter_map(|t| t.split_whitespace().next())
            .map(str::to_string),
    );
    exported.sort();
    exported.dedup();
    assert!(exported.len() > 30, "too few metrics read: {exported:?}");
    let mut rows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let docs = repo().join("docs");
    for e in std::fs::read_dir(&docs).expect("docs/") {
        let p = e.expect("an entry").path();
        if p.extension().and_then(|x| x.to_str()) != Some("md") {
            continue;
        }
        let md = std::fs::read_to_string(&p).expect("a document");
        for name in documented_metrics(&md) {
            rows.entry(name)
                .or_default()
                .push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    let undocumented: Vec<&String> = exported.iter().filter(|n| !rows.contains_key(*n)).collect();
    let unknown: Vec<&String> = rows.keys().filter(|n| !exported.contains(n)).collect();
    let twice: Vec<(&String, &Vec<String>)> = rows.iter().filter(|(_, w)| w.len() > 1).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty() && twice.is_empty(),
        "metrics with no row in docs/operations.md's table: {undocumented:?}; rows naming no metric the node exports: {unknown:?}; metrics with more than one row: {twice:?}"
    );
}

#[test]
fn every_event_the_node_emits_is_in_the_events_section() {
    let md = read("docs/mail-and-turns.md");
    let start = md
        .find("\n## Events\n")
        .expect("an Events section in docs/mail-and-turns.md");
    let rest = &md[start + 1..];
    let section = &rest[..rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3)];
    let missing: Vec<&&str> = app::live::EVENT_NAMES
        .iter()
        .filter(|n| !section.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "events not in docs/mail-and-turns.md § Events (add each with its fields): {missing:?}"
    );
}

#[test]
fn the_metric_reader_takes_every_name_of_a_rows_first_cell_and_only_it() {
    let md = "| `crewlet_a_total{outcome}`, `crewlet_b_seconds` | counter | see `crewlet_c` |\n\
              text `crewlet_d`\n| other | `crewlet_e` |";
    assert_eq!(
        documented_metrics(md),
        ["crewlet_a_total", "crewlet_b_seconds"]
    );
    assert_eq!(
        quoted_metric_names(
            "const A: &str = \"crewlet_x_total\"; // crewlet_\n#[cfg(test)] \"crewlet_t\""
        ),
        ["crewlet_x_total"]
    );
}

/// The keys docs/config.md's tables document, each with the rows' text:
/// a row's first cell names one or more keys in backquotes. A key with a
/// dot or `[]` is a full path (`roles[].agent.rounds`); a bare one is
/// taken in the table the cell names before it (`` `[[auth.users]]` `name` ``)
/// or else in its section's one table (`## `[node]`` → `node.id`).
fn documented_keys(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    for line in md.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            let tables: Vec<&str> = h
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|t| t.starts_with('['))
                .collect();
            section = match tables.as_slice() {
                [one] => Some(table_path(one)),
                _ => None,
            };
            continue;
        }
        if !line.starts_with("| `") {
            continue;
        }
        let mut table = section.clone();
        for token in first_cell_words(line) {
            if token.starts_with('[') {
                table = Some(table_path(token));
            } else if token.contains('.') || token.contains("[]") {
                out.push((token.to_string(), line.to_string()));
            } else if let Some(t) = &table {
                out.push((format!("{t}.{token}"), line.to_string()));
            }
        }
    }
    out
}

/// `[node]` → `node`, `[[auth.users]]` → `auth.users[]`.
fn table_path(header: &str) -> String {
    match header.strip_prefix("[[").and_then(|t| t.strip_suffix("]]")) {
        Some(array) => format!("{array}[]"),
        None => header.trim_matches(|c| c == '[' || c == ']').to_string(),
    }
}

/// Whether `word` stands in `text` as a word of its own.
fn names(text: &str, word: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| w == word)
}

#[test]
fn every_key_of_the_company_file_has_one_row_in_the_config_docs_and_every_row_a_key() {
    let keys = crewlet::config::schema::key_paths();
    assert!(keys.len() > 80, "too few keys read: {keys:?}");
    let rows = documented_keys(&read("docs/config.md"));
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for (k, _) in &rows {
        *count.entry(k.as_str()).or_default() += 1;
    }
    // A key is documented by its own row, or by the row of the table
    // holding it when that row names it (`roles[].budget`'s row names
    // `tokens_per_day`).
    let undocumented: Vec<&String> = keys
        .iter()
        .filter(|k| {
            !count.contains_key(k.as_str())
                && !rows.iter().any(|(row, text)| {
                    let inner = k
                        .strip_prefix(&format!("{row}."))
                        .or_else(|| k.strip_prefix(&format!("{row}[].")));
                    inner.is_some_and(|leaf| names(text, leaf.rsplit('.').next().unwrap_or(leaf)))
                })
        })
        .collect();
    let unknown: Vec<&&str> = count
        .keys()
        .filter(|row| {
            !keys.iter().any(|k| {
                k == *row
                    || k.starts_with(&format!("{row}."))
                    || k.starts_with(&format!("{row}[]."))
            })
        })
        .collect();
    let twice: Vec<(&&str, &usize)> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty() && twice.is_empty(),
        "company-file keys with no row in docs/config.md: {undocumented:?}; rows naming no key the node reads: {unknown:?}; keys with more than one row: {twice:?}"
    );
}

/// The routes the node's router serves, `METHOD /path`: each `.route(` of
/// server/src/web/mod.rs with the methods given to it before the next.
fn routed(src: &str, consts: &[(&str, &str)]) -> Vec<String> {
    let src = src.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = Vec::new();
    for piece in src.split(".route(").skip(1) {
        let piece = piece.split(".leptos_routes").next().unwrap_or(piece);
        let first = piece.trim_start();
        let path = match first.strip_prefix('"') {
            Some(rest) => rest.split('"').next().unwrap_or_default().to_string(),
            None => {
                let name: String = first
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                consts
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
                    .unwrap_or_else(|| panic!("a route path named by {name}, not a known constant"))
            }
        };
        for method in ["get", "post", "put", "patch", "delete"] {
            let called = piece.match_indices(&format!("{method}(")).any(|(i, _)| {
                i == 0 || !piece[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            });
            if called {
                out.push(format!("{} {path}", method.to_uppercase()));
            }
        }
    }
    out
}

/// The routes a table row of `md` documents: the backquoted
/// `METHOD /path` of a row's first cell, its query left out.
fn documented_routes(md: &str) -> Vec<String> {
    md.lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            first_cell_words(l)
                .filter(|t| {
                    ["GET /", "POST /", "PUT /", "PATCH /", "DELETE /"]
                        .iter()
                        .any(|m| t.starts_with(m))
                })
                .map(|t| t.split('?').next().unwrap_or(t).to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The dashboard's server functions, answered under one documented row
/// by the Leptos integration, not by a `.route(` of their own.
const SERVER_FUNCTIONS_ROW: &str = "POST /api/{fn}";

#[test]
fn every_route_the_node_serves_has_one_row_in_the_docs_and_every_row_a_route() {
    let auth = read("server/src/web/auth/gate.rs");
    let password_page = auth
        .split("pub const PASSWORD_PAGE: &str = \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("auth::PASSWORD_PAGE");
    let mut served = routed(
        &read("server/src/web/mod.rs"),
        &[("auth::PASSWORD_PAGE", password_page)],
    );
    served.sort();
    served.dedup();
    assert!(served.len() > 20, "too few routes read: {served:?}");
    let mut rows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in std::fs::read_dir(repo().join("docs")).expect("docs/") {
        let p = e.expect("an entry").path();
        if p.extension().and_then(|x| x.to_str()) != Some("md") {
            continue;
        }
        let md = std::fs::read_to_string(&p).expect("a document");
        for route in documented_routes(&md) {
            rows.entry(route)
                .or_default()
                .push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    let undocumented: Vec<&String> = served.iter().filter(|r| !rows.contains_key(*r)).collect();
    let unknown: Vec<&String> = rows
        .keys()
        .filter(|r| !served.contains(r) && r.as_str() != SERVER_FUNCTIONS_ROW)
        .collect();
    let twice: Vec<(&String, &Vec<String>)> = rows.iter().filter(|(_, w)| w.len() > 1).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty() && twice.is_empty(),
        "routes with no row in docs/http-and-cli.md § HTTP: {undocumented:?}; rows naming no route the node serves: {unknown:?}; routes with more than one row: {twice:?}"
    );
}

#[test]
fn the_key_and_route_readers_see_what_a_row_names_and_only_it() {
    let md = "## `[node]`\n| `id`, `labels` | x | see `other.key` |\n\
              ## `[auth]`\n| `[[auth.users]]` `name`, `role` | a person |\n| `secure_cookies` | y |\n\
              ## `[company]` and `[[roles]]`\n| `roles[].handle` | required |\n| `bare` | dropped |\n\
              text `node.id`\n";
    let keys: Vec<String> = documented_keys(md).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        [
            "node.id",
            "node.labels",
            "auth.users[].name",
            "auth.users[].role",
            "auth.secure_cookies",
            "roles[].handle"
        ]
    );
    assert!(names("{ nodes = [\"a\"], labels }", "nodes"));
    assert!(!names("nodes_seen", "nodes"));
    let src = r#"Router::new()
        .route("/", get(|| async { Redirect::to(auth::HOME) }))
        .route(auth::PASSWORD_PAGE, post(auth::change_password).layer(DefaultBodyLimit::max(1)))
        .route("/api/nodes/order", get(ranking::get_order).put(ranking::put_order))
        .route("/api/x", post(actions::budget_get))
        .leptos_routes_with_context(get(not_a_route))"#;
    assert_eq!(
        routed(src, &[("auth::PASSWORD_PAGE", "/account/password")]),
        [
            "GET /",
            "POST /account/password",
            "GET /api/nodes/order",
            "PUT /api/nodes/order",
            "POST /api/x"
        ]
    );
    assert_eq!(
        documented_routes(
            "| `GET /api/a?limit=N` | x |\n| `POST /login`, `POST /logout` | — |\n| see `GET /b` | y |"
        ),
        ["GET /api/a", "POST /login", "POST /logout"]
    );
}
