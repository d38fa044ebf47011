//! Every `§` citation names a heading that exists (docs/README.md § Citing
//! the specification): in the code (`spec § Fencing`, `handoff § 8`,
//! `docs/config.md § [auth]`) and in the documents (a bare `§ Tools` names a
//! heading of the same document; ``[`agents.md`](agents.md) § Tools`` one of
//! that file). A heading renamed without its citations fails here, naming
//! each citation and where it stands.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The documents' headings, read once each.
#[derive(Default)]
struct Headings(BTreeMap<PathBuf, Vec<String>>);

impl Headings {
    fn of(&mut self, file: &Path) -> Option<&[String]> {
        if !self.0.contains_key(file) {
            let text = std::fs::read_to_string(file).ok()?;
            self.0.insert(file.to_path_buf(), headings(&text));
        }
        self.0.get(file).map(Vec::as_slice)
    }
}

/// The `#` headings of a Markdown text, outside fenced blocks.
fn headings(md: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in md.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let level = line.chars().take_while(|c| *c == '#').count();
        if !fenced && (1..=6).contains(&level) && line[level..].starts_with(' ') {
            out.push(line[level..].trim().to_string());
        }
    }
    out
}

/// A text with its line breaks (and, in code, the comment markers that
/// continue a comment) folded into spaces, so a citation wrapped over two
/// lines reads as one.
fn folded(text: &str, code: bool) -> String {
    text.lines()
        .map(|l| {
            let l = l.trim_start();
            if code {
                ["//!", "///", "//", "* ", "#"]
                    .iter()
                    .find_map(|m| l.strip_prefix(m))
                    .unwrap_or(l)
                    .trim_start()
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Who a citation names, from the words just before its `§`.
#[derive(Debug, PartialEq)]
enum Citer {
    /// A document by its path (from the repository root, or beside the
    /// citing document).
    File(String),
    /// No document named.
    Bare,
}

fn citer(before: &str) -> Citer {
    let before = before.trim_end();
    // A Markdown link: [`agents.md`](agents.md)
    if let Some(link) = before.strip_suffix(')')
        && let Some(at) = link.rfind("](")
        && link.ends_with(".md")
    {
        return Citer::File(link[at + 2..].to_string());
    }
    let word = before
        .rsplit(char::is_whitespace)
        .next()
        .unwrap_or_default()
        .trim_matches(|c| c == '`' || c == '(');
    match word {
        w if w.ends_with(".md") => Citer::File(w.to_string()),
        "spec" | "Spec" | "spec's" => Citer::File("docs/spec/seat-ownership.md".into()),
        "handoff" | "Handoff" => Citer::File("docs/spec/drivers-seat.md".into()),
        "README" => Citer::File("README.md".into()),
        _ => Citer::Bare,
    }
}

/// Whether `cited` (the text after a `§`) names one of `headings`: a
/// heading it begins with, a heading its first words begin (a citation
/// may name only the beginning of a longer heading), or a numbered
/// heading by its number. Backquotes do not count.
fn names_a_heading(cited: &str, headings: &[String]) -> bool {
    let plain = |s: &str| s.replace('`', "");
    // The words cited, up to where the sentence goes on.
    let raw = cited.strip_prefix('`').unwrap_or(cited);
    let first = raw
        .find([')', ';', ',', ':', '"', '(', '`'])
        .into_iter()
        .chain(raw.find(". "))
        .chain(raw.find(" —"))
        .chain(raw.find(" and §"))
        .min()
        .map_or(raw, |i| &raw[..i])
        .trim()
        .trim_end_matches('.');
    let cited = plain(cited);
    let at_word_end =
        |s: &str, i: usize| s[i..].chars().next().is_none_or(|c| !c.is_alphanumeric());
    let digits: String = cited.chars().take_while(char::is_ascii_digit).collect();
    headings.iter().map(|h| plain(h)).any(|h| {
        (cited.starts_with(&h) && at_word_end(&cited, h.len()))
            || (!first.is_empty() && h.starts_with(first) && at_word_end(&h, first.len()))
            || (!digits.is_empty() && h.starts_with(&format!("{digits}.")))
    })
}

/// The citations of one file that name no heading, each as
/// `file: § text (in target)`.
fn unresolved(repo: &Path, file: &Path, docs: &mut Headings) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    let code = file.extension().is_none_or(|e| e != "md");
    let text = folded(&text, code);
    let rel = file
        .strip_prefix(repo)
        .unwrap_or(file)
        .display()
        .to_string();
    let mut out = Vec::new();
    let mut previous: Option<(PathBuf, usize)> = None;
    for (i, _) in text.match_indices('§') {
        let start = text.floor_char_boundary(i.saturating_sub(80));
        let rest = text[i + '§'.len_utf8()..].trim_start();
        let cited: String = rest.chars().take_while(|c| *c != '§').take(120).collect();
        if cited.starts_with(['<', '…']) {
            continue;
        }
        let target = match citer(&text[start..i]) {
            Citer::File(f) => {
                let beside = file.parent().map(|d| d.join(&f));
                match beside.filter(|p| !code && p.is_file()) {
                    Some(p) => p,
                    None => repo.join(&f),
                }
            }
            Citer::Bare if !code => file.to_path_buf(),
            // A list of sections after one citation (`spec § A, § B`).
            Citer::Bare => match &previous {
                Some((t, at)) if i - at < 200 => t.clone(),
                _ => {
                    out.push(format!(
                        "{rel}: § {cited} (a bare § in code names no document)"
                    ));
                    continue;
                }
            },
        };
        previous = Some((target.clone(), i));
        let shown = target
            .strip_prefix(repo)
            .unwrap_or(&target)
            .display()
            .to_string();
        match docs.of(&target) {
            None => out.push(format!("{rel}: § {cited} (no document {shown})")),
            Some(h) if !names_a_heading(&cited, h) => {
                out.push(format!("{rel}: § {cited} (no such heading in {shown})"))
            }
            Some(_) => {}
        }
    }
    out
}

/// Every file that may cite: the documents, and the code's sources.
fn citing_files(repo: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "dev",
        ".ci/run",
        "server/demo/crewlet.toml",
        "docs/monitoring/crewlet-rules.yml",
    ]
    .iter()
    .map(|f| repo.join(f))
    .collect();
    let mut dirs: Vec<(PathBuf, &[&str])> = vec![(repo.join("docs"), &["md"])];
    for d in [
        "server/src",
        "server/tests",
        "server/benches",
        "app/src",
        "frontend/src",
    ] {
        dirs.push((repo.join(d), &["rs"]));
    }
    for d in ["end2end/tests", "end2end/lib", "end2end/bench"] {
        dirs.push((repo.join(d), &["mjs"]));
    }
    for d in ["scripts", "examples"] {
        dirs.push((repo.join(d), &["py"]));
    }
    while let Some((d, exts)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push((p, exts));
            } else if p.file_name().is_some_and(|n| n == "citations.rs") {
                // This check's own examples.
            } else if p
                .extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| exts.contains(&x))
            {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn every_section_citation_names_a_heading_that_exists() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut docs = Headings::default();
    let files = citing_files(&repo);
    assert!(files.len() > 100, "too few files read: {}", files.len());
    let bad: Vec<String> = files
        .iter()
        .flat_map(|f| unresolved(&repo, f, &mut docs))
        .collect();
    assert!(
        bad.is_empty(),
        "citations naming no heading (rename the citation with its heading: docs/README.md § Citing the specification):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_citation_check_sees_a_heading_that_is_gone_and_reads_each_form() {
    let h: Vec<String> = [
        "Fencing: what it protects, and what it cannot",
        "8. Overriding the order, and showing the work",
        "`[logging]`",
        "Tools",
    ]
    .map(String::from)
    .to_vec();
    assert!(names_a_heading(
        "Fencing: an undead seat's turn finishes",
        &h
    ));
    assert!(names_a_heading("Fencing). The rest", &h));
    assert!(names_a_heading("8, the force claim", &h));
    assert!(names_a_heading("[logging]) and so on", &h));
    assert!(names_a_heading("Tools, Approvals", &h));
    assert!(
        !names_a_heading("Fenced seats", &h),
        "a heading that is gone"
    );
    assert!(
        !names_a_heading("Toolbox", &h),
        "a word's beginning is no heading"
    );
    assert_eq!(
        citer("(spec "),
        Citer::File("docs/spec/seat-ownership.md".into())
    );
    assert_eq!(
        citer("the spec's "),
        Citer::File("docs/spec/seat-ownership.md".into())
    );
    assert_eq!(
        citer("see [`agents.md`](agents.md) "),
        Citer::File("agents.md".into())
    );
    assert_eq!(
        citer("(docs/config.md "),
        Citer::File("docs/config.md".into())
    );
    assert_eq!(citer("the order, "), Citer::Bare);
    let code = "/// a rule (spec § Fencing, § The\n/// completion ledger).";
    assert_eq!(
        folded(code, true),
        "a rule (spec § Fencing, § The completion ledger)."
    );
}
