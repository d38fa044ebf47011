//! One word, one meaning (ARCHITECTURE.md § Words): every type the section
//! names exists in the product, the names it retired appear nowhere in the
//! code or the documents, and a field or binding typed `engine` holds one of
//! the two engines the section names.

use std::path::{Path, PathBuf};

/// Names the Words rule retired, each with the name that replaced it.
const RETIRED: &[(&str, &str)] = &[
    ("LocalStore", "TwinCoordinator"),
    ("NatsStore", "NatsCoordinator"),
    ("RosterMemory", "LastRoster"),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// The text of ARCHITECTURE.md § Words, up to the next heading.
fn words_section(map: &str) -> &str {
    let start = map
        .find("\n## Words\n")
        .expect("ARCHITECTURE.md has § Words");
    let body = &map[start + "\n## Words\n".len()..];
    &body[..body.find("\n## ").unwrap_or(body.len())]
}

/// Backquoted type-like names (`SeatEngine`, `TwinBackend`) in `text`.
fn type_names(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| {
            w.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && w.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .map(str::to_string)
        .collect()
}

/// Every `.rs` and `.md` file under `dir`, `target` and `node_modules` left out.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target"
                && name != "node_modules"
                && !name.to_string_lossy().starts_with('.')
            {
                files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs" || x == "md") {
            out.push(p);
        }
    }
}

/// Whether `src` defines the type `name` (a struct, enum, trait or alias).
fn defines(src: &str, name: &str) -> bool {
    ["struct", "enum", "trait", "type"].iter().any(|kw| {
        src.match_indices(&format!("{kw} {name}")).any(|(i, m)| {
            let after = src[i + m.len()..].chars().next();
            !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

#[test]
fn every_type_the_words_name_exists_in_the_product() {
    let map = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let names = type_names(words_section(&map));
    assert!(
        names.len() >= 5,
        "the Words section names its types: {names:?}"
    );
    let mut sources = Vec::new();
    files(&repo().join("server/src"), &mut sources);
    files(&repo().join("app/src"), &mut sources);
    let text: String = sources
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let missing: Vec<&String> = names.iter().filter(|n| !defines(&text, n)).collect();
    assert!(
        missing.is_empty(),
        "the Words section of ARCHITECTURE.md names types the product does not define: {missing:?}"
    );
}

#[test]
fn no_retired_name_is_left_in_the_code_or_the_documents() {
    let mut all = Vec::new();
    for dir in ["server", "app", "docs", "frontend", "end2end"] {
        files(&repo().join(dir), &mut all);
    }
    all.push(repo().join("README.md"));
    all.push(repo().join("ARCHITECTURE.md"));
    // This file lists them; `file!()` is from the workspace root.
    let me = repo().join(file!());
    let mut found = Vec::new();
    for p in all.iter().filter(|p| **p != me) {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        for (old, new) in RETIRED {
            if text.contains(old) {
                found.push(format!("{}: {old} (now {new})", p.display()));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}

/// The lines of `src` with a field or parameter named `engine` whose type
/// is neither engine (`engine: Arc<dyn Holdings>` reads as the seat layer
/// and is not).
fn engine_misnamed(src: &str) -> Vec<String> {
    src.lines()
        .filter(|l| {
            l.split("engine: ").skip(1).any(|ty| {
                let first = ty.chars().next();
                // A type starts upper-case or with `&`; a value (`engine:
                // engine.clone()`) is a struct literal's field.
                (first.is_some_and(|c| c.is_ascii_uppercase()) || first == Some('&'))
                    && !ty.contains("SeatEngine")
                    && !ty.contains("TurnEngine")
            })
        })
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn a_field_named_engine_holds_one_of_the_two_engines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = super::modules(&root);
    let wrong: Vec<String> = mods
        .iter()
        .flat_map(|(m, p)| {
            engine_misnamed(&super::product_source(p))
                .into_iter()
                .map(move |l| format!("{m}: {l}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "name the field for what it holds: {wrong:#?}"
    );
}

#[test]
fn the_words_checks_see_a_misnamed_engine_and_a_missing_type() {
    assert_eq!(
        engine_misnamed(
            "    engine: Arc<dyn Holdings>,\n    engine: Weak<TurnEngine>,\n    engine: engine.clone(),"
        ),
        ["engine: Arc<dyn Holdings>,"]
    );
    assert!(defines("pub struct SeatEngine {", "SeatEngine"));
    assert!(!defines("pub struct SeatEngineX {", "SeatEngine"));
    assert_eq!(
        type_names("- *engine*: `SeatEngine` and `seat/engine/` and `TurnEngine`"),
        ["SeatEngine", "TurnEngine"]
    );
}
