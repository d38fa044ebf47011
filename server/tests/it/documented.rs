//! Every name a user meets is documented where the docs say it is: each
//! metric the node exports has exactly one row in a table of the documents
//! (docs/operations.md § Monitoring), and no row names a metric the node does
//! not export; each event the node emits is in docs/mail-and-turns.md
//! § Events.

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

/// The metrics a table row of `md` documents: the backquoted `crewlet_…`
/// names of a row's first cell (`| \`crewlet_turns_total{outcome}\` | …`).
fn documented_metrics(md: &str) -> Vec<String> {
    md.lines()
        .filter(|l| l.starts_with("| `crewlet_"))
        .flat_map(|l| {
            let cell = l.split('|').nth(1).unwrap_or_default();
            cell.split('`')
                .skip(1)
                .step_by(2)
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
