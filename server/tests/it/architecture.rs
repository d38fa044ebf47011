//! The house stays the way ARCHITECTURE.md draws it: no import cycle among
//! the product's modules, no module using one of a higher layer, and no
//! task spawned outside `tasks.rs`. Reads every file under `server/src`
//! (test modules and comments left out), resolves each `crate::…` and
//! `super::…` path to the module that owns it, and fails naming the
//! modules of any cycle, each upward edge and each raw spawn.
//! (`scripts/import-cycles` prints the same graph's cycles from a shell.)
//! And every section citation in the code and the documents names a
//! heading that exists (`citations`); functions and files stay under their
//! limits, the long ones of today only shrinking (`limits`); every blocking
//! thread is awaited where it starts; one word keeps one meaning (`words`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod citations;
mod limits;
mod words;

/// Module path (`seat::sweep`) → its source file.
fn modules(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read the source tree") {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            if p.extension().and_then(|x| x.to_str()) != Some("rs") {
                continue;
            }
            let rel = p.strip_prefix(root).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            if parts.last().map(String::as_str) == Some("tests") {
                continue;
            }
            out.insert(parts.join("::"), p);
        }
    }
    out
}

/// The source with its test module and its comments taken out.
fn product_source(p: &Path) -> String {
    let src = std::fs::read_to_string(p).expect("read a source file");
    let src = match src.find("#[cfg(test)]\nmod tests") {
        Some(i) => &src[..i],
        None => &src[..],
    };
    src.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path the source names after `crate::` or `super::`, as written
/// (`seat::sweep::SeatEngine`), with the members of a `{…}` group each
/// joined to its base.
fn paths(src: &str, parent: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (kw, rest) in src
        .match_indices("crate::")
        .map(|(i, _)| ("crate", &src[i + 7..]))
        .chain(
            src.match_indices("super::")
                .map(|(i, _)| ("super", &src[i + 7..])),
        )
    {
        let word: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let word = word.trim_end_matches(':');
        let base = if kw == "crate" || parent.is_empty() {
            word.to_string()
        } else {
            format!("{parent}::{word}")
        };
        out.push(base.clone());
        let after = &rest[word.len()..];
        if let Some(group) = after.strip_prefix("::{") {
            let body: String = group.chars().take_while(|c| *c != ';').collect();
            for part in body.split(',') {
                let name = part
                    .trim()
                    .split(" as ")
                    .next()
                    .unwrap_or_default()
                    .split("::{")
                    .next()
                    .unwrap_or_default()
                    .trim_matches(|c: char| c == '{' || c == '}' || c.is_whitespace());
                if !name.is_empty() && name != "self" {
                    out.push(format!("{base}::{name}"));
                }
            }
        }
    }
    out
}

/// The module that owns `path` (the longest module prefix).
fn owner<'a>(path: &str, mods: &'a BTreeMap<String, PathBuf>) -> Option<&'a str> {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len()).rev().find_map(|i| {
        mods.get_key_value(&segs[..i].join("::"))
            .map(|(k, _)| k.as_str())
    })
}

fn graph(mods: &BTreeMap<String, PathBuf>) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, p) in mods {
        let parent = m.rsplit_once("::").map(|(a, _)| a).unwrap_or("");
        let entry = g.entry(m.clone()).or_default();
        for path in paths(&product_source(p), parent) {
            if let Some(o) = owner(&path, mods)
                && o != m
                && !m.starts_with(&format!("{o}::"))
                && !o.starts_with(&format!("{m}::"))
            {
                entry.insert(o.to_string());
            }
        }
    }
    g
}

/// The strongly connected components with more than one module.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Kosaraju: order by finish time, then walk the reversed graph.
    fn finish(
        v: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(v.to_string()) {
            return;
        }
        for w in g.get(v).into_iter().flatten() {
            finish(w, g, seen, order);
        }
        order.push(v.to_string());
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for v in g.keys() {
        finish(v, g, &mut seen, &mut order);
    }
    let mut rev: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (v, ws) in g {
        for w in ws {
            rev.entry(w.clone()).or_default().insert(v.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for v in order.iter().rev() {
        if assigned.contains(v) {
            continue;
        }
        let mut comp = Vec::new();
        let mut stack = vec![v.clone()];
        while let Some(x) = stack.pop() {
            if !assigned.insert(x.clone()) {
                continue;
            }
            comp.push(x.clone());
            for w in rev.get(&x).into_iter().flatten() {
                stack.push(w.clone());
            }
        }
        if comp.len() > 1 {
            comp.sort();
            out.push(comp);
        }
    }
    out
}

#[test]
fn no_import_cycle_among_the_products_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&root);
    assert!(mods.len() > 30, "the source tree was not found at {root:?}");
    let g = graph(&mods);
    let found = cycles(&g);
    assert!(
        found.is_empty(),
        "import cycles (each a set of modules that import one another, ARCHITECTURE.md § Layers): {found:#?}"
    );
}

/// ARCHITECTURE.md § Layers: each top-level module's layer (the crate
/// root, `lib.rs` and `main.rs`, above them all).
const LAYERS: &[(&str, u8)] = &[
    ("tasks", 0),
    ("watchdog", 0),
    ("clock", 0),
    ("identity", 0),
    ("config", 0),
    ("logging", 0),
    ("db", 0),
    ("metrics", 0),
    ("jetstream_api", 0),
    ("coord", 1),
    ("queue", 1),
    ("events", 1),
    ("audit", 1),
    ("scatter", 1),
    ("company", 1),
    ("trends", 1),
    ("memory", 2),
    ("seat", 2),
    ("engine", 3),
    ("duty", 3),
    ("web", 4),
    ("node", 4),
    ("", 5),
];

fn layer(module: &str) -> Option<u8> {
    let root = module.split("::").next().unwrap_or_default();
    LAYERS.iter().find(|(m, _)| *m == root).map(|(_, l)| *l)
}

#[test]
fn every_module_uses_only_its_own_layer_and_those_below() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&root);
    let unplaced: Vec<&String> = mods.keys().filter(|m| layer(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "modules with no layer (add them to ARCHITECTURE.md § Layers and LAYERS): {unplaced:?}"
    );
    let up: Vec<String> = graph(&mods)
        .iter()
        .flat_map(|(a, bs)| bs.iter().map(move |b| (a, b)))
        .filter(|(a, b)| layer(b) > layer(a))
        .map(|(a, b)| {
            format!(
                "{a} (L{}) uses {b} (L{})",
                layer(a).unwrap(),
                layer(b).unwrap()
            )
        })
        .collect();
    assert!(up.is_empty(), "edges pointing up a layer: {up:#?}");
}

#[test]
fn the_cycle_check_sees_a_cycle_when_there_is_one() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    g.entry("d".into()).or_default().insert("a".into());
    assert_eq!(cycles(&g), vec![vec!["a", "b", "c"]]);
    let src = "use crate::seat::{placement::plan, sweep};\nuse super::kv::Backend;";
    assert_eq!(
        paths(src, "coord"),
        [
            "seat",
            "seat::placement::plan",
            "seat::sweep",
            "coord::kv::Backend"
        ]
    );
}

/// The lines of `src` that spawn an async task without `tasks.rs`: a raw
/// `tokio::spawn`, `tokio::task::spawn`, or a task tracker of its own.
fn raw_spawns(src: &str) -> Vec<String> {
    src.lines()
        .filter(|l| {
            l.contains("tokio::spawn")
                || l.contains("task::spawn(")
                || l.contains("task::spawn_local")
                || l.contains("TaskTracker")
        })
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn every_task_is_spawned_through_tasks_rs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&root);
    let raw: Vec<String> = mods
        .iter()
        .filter(|(m, _)| m.as_str() != "tasks")
        .flat_map(|(m, p)| {
            raw_spawns(&product_source(p))
                .into_iter()
                .map(move |l| format!("{m}: {l}"))
        })
        .collect();
    assert!(
        raw.is_empty(),
        "tasks spawned outside tasks.rs (use Tasks::spawn, Tasks::spawn_owned or tasks::spawn_held): {raw:#?}"
    );
}

#[test]
fn the_spawn_check_sees_a_raw_spawn() {
    let src = "let t = tokio::spawn(async {});\nlet u = tasks.spawn(\"x\", f);\nlet v = TaskTracker::new();";
    assert_eq!(
        raw_spawns(src),
        [
            "let t = tokio::spawn(async {});",
            "let v = TaskTracker::new();"
        ]
    );
}

/// The lines of `src` that start blocking work nobody waits for: a
/// `spawn_blocking(…)` whose call is not followed at once by `.await` (the
/// caller owns the thread's work and its result, so a node stopping never
/// leaves a detached thread writing behind it).
fn unawaited_blocking(src: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = src;
    while let Some(at) = rest.find("spawn_blocking(") {
        let open = at + "spawn_blocking".len();
        let mut depth = 0usize;
        let mut close = None;
        for (i, c) in rest[open..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(open + i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = close.unwrap_or(rest.len());
        if !rest[end..].trim_start().starts_with(".await") {
            let line_start = rest[..at].rfind('\n').map_or(0, |n| n + 1);
            let line_end = rest[at..].find('\n').map_or(rest.len(), |n| at + n);
            found.push(rest[line_start..line_end].trim().to_string());
        }
        rest = &rest[end..];
    }
    found
}

#[test]
fn every_blocking_thread_is_awaited_by_the_task_that_started_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let loose: Vec<String> = modules(&root)
        .iter()
        .flat_map(|(m, p)| {
            unawaited_blocking(&product_source(p))
                .into_iter()
                .map(move |l| format!("{m}: {l}"))
        })
        .collect();
    assert!(
        loose.is_empty(),
        "spawn_blocking not awaited where it is started (await its handle, or make it a task with Tasks::spawn): {loose:#?}"
    );
}

#[test]
fn the_blocking_check_sees_a_thread_nobody_awaits() {
    let src = "let a = tokio::task::spawn_blocking(move || f(g(1)))\n    .await;\nlet h = tokio::task::spawn_blocking(move || { f(2) });\nlet b = spawn_blocking(|| 3).await;";
    assert_eq!(
        unawaited_blocking(src),
        ["let h = tokio::task::spawn_blocking(move || { f(2) });"]
    );
}

/// Pairs within one layer that must still not meet (ARCHITECTURE.md §
/// Invariants): a holder read asks the `Holdings` trait, never the seat layer.
const APART: &[(&str, &str)] = &[("memory", "seat")];

#[test]
fn memory_never_uses_the_seat_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&modules(&root));
    let root_of = |m: &str| m.split("::").next().unwrap_or_default().to_string();
    let crossing: Vec<String> = g
        .iter()
        .flat_map(|(a, bs)| bs.iter().map(move |b| (a, b)))
        .filter(|(a, b)| APART.contains(&(root_of(a).as_str(), root_of(b).as_str())))
        .map(|(a, b)| format!("{a} uses {b}"))
        .collect();
    assert!(crossing.is_empty(), "{crossing:#?}");
}

/// Every source file `ARCHITECTURE.md` names (a backquoted path ending in
/// `.rs`, from the repository root, `server/src` or `app/src`).
fn mapped_files(map: &str) -> Vec<String> {
    map.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.ends_with(".rs") && !t.contains('*') && !t.contains(' '))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_file_the_code_map_names_exists_and_every_module_says_what_it_owns() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let map = std::fs::read_to_string(repo.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let files = mapped_files(&map);
    assert!(
        files.len() > 30,
        "the code map names too few files: {files:?}"
    );
    let missing: Vec<&String> = files
        .iter()
        .filter(|f| {
            !["", "server/src", "app/src", "server/tests"]
                .iter()
                .any(|base| repo.join(base).join(f).is_file())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names files that do not exist: {missing:?}"
    );
    let root = repo.join("server/src");
    let headless: Vec<String> = modules(&root)
        .into_iter()
        .filter(|(_, p)| {
            !std::fs::read_to_string(p)
                .map(|s| s.starts_with("//!"))
                .unwrap_or(false)
        })
        .map(|(m, _)| m)
        .collect();
    assert!(
        headless.is_empty(),
        "modules with no `//!` header saying what they own: {headless:?}"
    );
}

#[test]
fn the_map_check_reads_backquoted_source_paths() {
    assert_eq!(
        mapped_files("| lease | `coord/lease.rs` (pure), `Store`, `app/src/pages/*`, `x.rs` |"),
        ["coord/lease.rs", "x.rs"]
    );
}
