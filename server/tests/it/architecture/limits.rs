//! Limits on size, ratcheted: no product function over 70 lines and no
//! product file over 800 (a file's trailing `#[cfg(test)] mod tests` not
//! counted), except those over today, listed below with their length. A
//! listed one may shrink, never grow, and leaves the list once it is
//! under the limit; nothing new joins it. And the code map covers the
//! house both ways: every product file over 200 lines is named in
//! ARCHITECTURE.md. (`scripts/fn-lengths` prints the same measure.) The
//! functions answering `Result<_, String>` are ratcheted the same way.

use std::collections::BTreeMap;
use std::path::Path;

/// The longest a function may be, in lines from its signature to its
/// closing brace.
const FN_LIMIT: usize = 70;

/// The longest a product file may be, in lines.
const FILE_LIMIT: usize = 800;

/// The longest file the code map may leave out.
const UNMAPPED_LIMIT: usize = 200;

/// Functions over `FN_LIMIT` today: (file, function, lines). Shrink them;
/// take one out once it is under the limit.
#[rustfmt::skip]
const LONG_FUNCTIONS: &[(&str, &str, usize)] = &[
    ("app/src/components/layout.rs", "Layout", 82),
    ("app/src/pages/dead_letters.rs", "DeadLetterItem", 82),
    ("app/src/pages/events.rs", "EventFilters", 94),
    ("app/src/pages/events.rs", "EventsPage", 73),
    ("app/src/pages/nodes.rs", "Alarm", 88),
    ("app/src/pages/nodes.rs", "NodeRow", 96),
    ("app/src/pages/people.rs", "PeoplePage", 75),
    ("app/src/pages/people.rs", "PeopleTable", 78),
    ("app/src/view/timeline.rs", "timeline", 76),
    ("server/src/config/schema.rs", "apply_env", 87),
    ("server/src/config/schema.rs", "exemplar", 84),
    ("server/src/config/validate/mod.rs", "check_coordination", 78),
    ("server/src/config/validate/mod.rs", "check_stream", 95),
    ("server/src/config/validate/roles.rs", "check_mcp", 80),
    ("server/src/config/validate/roles.rs", "check_model", 82),
    ("server/src/config/validate/roles.rs", "check_roles", 100),
    ("server/src/config/validate/trust.rs", "check_child_env", 88),
    ("server/src/coord/protocol/claim.rs", "claim_atomic", 100),
    ("server/src/coord/protocol/claim.rs", "claim_inner", 95),
    ("server/src/coord/protocol/tenure.rs", "take_inner", 81),
    ("server/src/duty/mailboxes/retire.rs", "retire_under", 73),
    ("server/src/duty/mailboxes/mod.rs", "tick", 96),
    ("server/src/duty/scheduler.rs", "evaluate", 75),
    ("server/src/engine/echo.rs", "round", 92),
    ("server/src/engine/model.rs", "complete", 95),
    ("server/src/engine/model.rs", "round", 76),
    ("server/src/engine/runs.rs", "launch", 93),
    ("server/src/engine/runtime/approval_resume.rs", "approval_outcome", 95),
    ("server/src/engine/runtime/approval_resume.rs", "resume_approval", 75),
    ("server/src/engine/runtime/resume.rs", "claim_resume", 85),
    ("server/src/engine/runtime/run_recovery.rs", "recover_runs", 82),
    ("server/src/engine/tools.rs", "ask_approval", 73),
    ("server/src/engine/tools.rs", "run_detached", 86),
    ("server/src/engine/turn.rs", "run", 85),
    ("server/src/events.rs", "metric_updates", 99),
    ("server/src/node/start.rs", "start", 88),
    ("server/src/queue/attach.rs", "consume", 85),
    ("server/src/seat/engine/sweep.rs", "execute", 89),
    ("server/src/seat/host/claim.rs", "claim_with", 88),
    ("server/src/seat/host/release.rs", "release_locked", 93),
    ("server/src/seat/host/renew.rs", "renew_one", 89),
    ("server/src/seat/host/take.rs", "take_offer", 90),
    ("server/src/seat/placement.rs", "group_claims", 98),
    ("server/src/web/auth/forms.rs", "change_password", 81),
    ("server/src/web/auth/forms.rs", "login", 94),
    ("server/src/web/auth/gate.rs", "gate", 91),
    ("server/src/web/console/approvals.rs", "answer", 72),
    ("server/src/web/console/seat_actions.rs", "send_to_inbox", 93),
    ("server/src/web/mod.rs", "router", 97),
    ("server/src/web/nodes.rs", "alarms", 73),
    ("server/src/web/ownership.rs", "fleet_from_leases", 100),
    ("server/src/web/seats.rs", "seat_rows", 90),
];

/// Files over `FILE_LIMIT` today: (file, lines).
const LONG_FILES: &[(&str, usize)] = &[];

/// The longest impl block: one type's methods in one file.
const IMPL_LIMIT: usize = 400;

/// Impl blocks over `IMPL_LIMIT` today: (file, the block's first line,
/// lines). Split them along their seams; take one out once it is under.
#[rustfmt::skip]
const LONG_IMPLS: &[(&str, &str, usize)] = &[];

/// Each top-level impl block of `src`: (its first line, lines from it to
/// its closing brace at the start of a line).
fn impl_blocks(src: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if (l.starts_with("impl ") || l.starts_with("impl<"))
            && l.ends_with('{')
            && let Some(end) = lines[i + 1..].iter().position(|x| *x == "}")
        {
            out.push((l.to_string(), end + 2));
        }
    }
    out
}

/// The line with string and char literals and its comment taken out.
fn strip(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let (mut out, mut i, n) = (String::new(), 0, chars.len());
    while i < n {
        let c = chars[i];
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            break;
        }
        if c == '"' {
            i += 1;
            while i < n && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            continue;
        }
        let char_literal = c == '\'' && i + 2 < n && (chars[i + 2] == '\'' || chars[i + 1] == '\\');
        if char_literal {
            i = match chars[i + 2..].iter().position(|&x| x == '\'') {
                Some(j) => i + 2 + j + 1,
                None => n,
            };
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

/// The name of the function this line declares, if it declares one.
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    if let Some(r) = rest.strip_prefix("pub") {
        rest = match r.strip_prefix('(') {
            Some(inside) => inside[inside.find(')')? + 1..].trim_start(),
            None if r.starts_with(char::is_whitespace) => r.trim_start(),
            None => return None,
        };
    }
    for qualifier in ["async ", "const ", "unsafe "] {
        if let Some(r) = rest.strip_prefix(qualifier) {
            rest = r.trim_start();
        }
    }
    let r = rest.strip_prefix("fn ")?.trim_start();
    let end = r
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(r.len());
    (end > 0).then(|| &r[..end])
}

/// Every function in `src` with its length in lines (signature to closing
/// brace, braces counted outside literals and comments).
fn functions(src: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = src.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let (mut depth, mut opened) = (0i64, false);
        for (j, later) in lines.iter().enumerate().skip(i) {
            let s = strip(later);
            if !opened && s.contains(';') && !s.contains('{') {
                break; // a declaration without a body
            }
            depth += s.matches('{').count() as i64 - s.matches('}').count() as i64;
            opened = opened || s.contains('{');
            if opened && depth <= 0 {
                found.push((name.to_string(), j - i + 1));
                break;
            }
        }
    }
    found
}

/// Every product source file (`server/src`, `app/src`; no `tests.rs`),
/// from the repository root, with its text up to its test module.
fn product_files(repo: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![repo.join("server/src"), repo.join("app/src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read the source tree") {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let rust = p.extension().and_then(|x| x.to_str()) == Some("rs");
            if !rust || p.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let src = std::fs::read_to_string(&p).expect("read a source file");
            let product = match src.find("#[cfg(test)]\nmod tests") {
                Some(cut) => src[..cut].to_string(),
                None => src,
            };
            let rel = p.strip_prefix(repo).expect("under the repository");
            out.insert(rel.to_string_lossy().into_owned(), product);
        }
    }
    out
}

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What is wrong with `measured` (name → lines, only those over `limit`)
/// against the `listed` ratchet: new ones, grown ones, and listed ones
/// gone under the limit (to be taken out of the list).
fn ratchet(
    measured: &BTreeMap<String, usize>,
    listed: &BTreeMap<String, usize>,
    limit: usize,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for (name, &lines) in measured {
        match listed.get(name) {
            None => wrong.push(format!("{name}: {lines} lines, over {limit} (new)")),
            Some(&was) if lines > was => {
                wrong.push(format!("{name}: {lines} lines, grew from {was}"))
            }
            Some(_) => {}
        }
    }
    for (name, was) in listed {
        if !measured.contains_key(name) {
            wrong.push(format!(
                "{name}: listed at {was} lines, now at most {limit} or gone — take it out of the list"
            ));
        }
    }
    wrong
}

#[test]
fn no_function_grows_past_its_length_and_none_new_goes_over_seventy_lines() {
    let mut measured = BTreeMap::new();
    for (file, src) in product_files(&repo()) {
        for (name, lines) in functions(&src) {
            if lines > FN_LIMIT {
                let key = format!("{file} {name}");
                let longest = measured.entry(key).or_insert(0);
                *longest = lines.max(*longest);
            }
        }
    }
    let listed = LONG_FUNCTIONS
        .iter()
        .map(|(f, n, l)| (format!("{f} {n}"), *l))
        .collect();
    let wrong = ratchet(&measured, &listed, FN_LIMIT);
    assert!(
        wrong.is_empty(),
        "functions over {FN_LIMIT} lines (split them; a listed one may only shrink):\n{}\n\ntoday's list:\n{}",
        wrong.join("\n"),
        measured
            .iter()
            .map(|(k, l)| {
                let (f, n) = k.split_once(' ').unwrap_or_default();
                format!("    ({f:?}, {n:?}, {l}),")
            })
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn no_file_grows_past_its_length_and_none_new_goes_over_eight_hundred_lines() {
    let measured: BTreeMap<String, usize> = product_files(&repo())
        .into_iter()
        .map(|(f, src)| (f, src.lines().count()))
        .filter(|(_, l)| *l > FILE_LIMIT)
        .collect();
    let listed = LONG_FILES
        .iter()
        .map(|(f, l)| (f.to_string(), *l))
        .collect();
    let wrong = ratchet(&measured, &listed, FILE_LIMIT);
    assert!(
        wrong.is_empty(),
        "files over {FILE_LIMIT} lines (split them along their seams; a listed one may only shrink):\n{}\n\ntoday's list:\n{}",
        wrong.join("\n"),
        measured
            .iter()
            .map(|(f, l)| format!("    ({f:?}, {l}),"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn no_impl_block_grows_past_its_length_and_none_new_goes_over_four_hundred_lines() {
    let mut measured = BTreeMap::new();
    for (file, src) in product_files(&repo()) {
        for (head, lines) in impl_blocks(&src) {
            if lines > IMPL_LIMIT {
                let longest = measured.entry(format!("{file} {head}")).or_insert(0);
                *longest = lines.max(*longest);
            }
        }
    }
    let listed = LONG_IMPLS
        .iter()
        .map(|(f, h, l)| (format!("{f} {h}"), *l))
        .collect();
    let wrong = ratchet(&measured, &listed, IMPL_LIMIT);
    assert!(
        wrong.is_empty(),
        "impl blocks over {IMPL_LIMIT} lines (split the type's methods along their seams, one file each; a listed one may only shrink):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_impl_check_counts_a_block_from_its_first_line_to_its_closing_brace() {
    let src = "impl A {\n    fn a() {\n    }\n}\n\nimpl<T: X> Y for Z<T> {\n}\nfn f() {}\n";
    assert_eq!(
        impl_blocks(src),
        [
            ("impl A {".to_string(), 4),
            ("impl<T: X> Y for Z<T> {".to_string(), 2)
        ]
    );
}

#[test]
fn the_length_check_counts_from_signature_to_closing_brace_and_ignores_braces_in_literals() {
    let src = "pub(crate) async fn a(x: u8) -> u8 {\n    let s = \"{{ }\";\n    let c = '{';\n    // {\n    x\n}\nfn decl();\nconst fn b() {}\n";
    assert_eq!(functions(src), [("a".to_string(), 6), ("b".to_string(), 1)]);
    assert_eq!(declared_fn("    pub fn go<T>(t: T) {"), Some("go"));
    assert_eq!(declared_fn("    public fn no() {"), None);
    assert_eq!(declared_fn("let f = |x| x; // fn in a comment"), None);
    let listed = BTreeMap::from([("a".to_string(), 80), ("gone".to_string(), 75)]);
    let measured = BTreeMap::from([("a".to_string(), 81), ("new".to_string(), 71)]);
    let wrong = ratchet(&measured, &listed, 70);
    assert_eq!(wrong.len(), 3, "{wrong:?}");
    assert!(wrong[0].contains("grew from 80") && wrong[1].contains("(new)"));
    assert!(wrong[2].starts_with("gone: listed at 75"));
}

#[test]
fn every_product_file_over_two_hundred_lines_is_named_in_the_code_map() {
    let repo = repo();
    let map = std::fs::read_to_string(repo.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let named: Vec<String> = super::mapped_files(&map);
    // `app/src/pages/*` or `app/src/api/` names every file in it.
    let dirs: Vec<&str> = map
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|t| t.strip_suffix('*').or(Some(t)).filter(|d| d.ends_with('/')))
        .collect();
    let unmapped: Vec<String> = product_files(&repo)
        .into_iter()
        .filter(|(_, src)| src.lines().count() > UNMAPPED_LIMIT)
        .map(|(f, _)| f)
        .filter(|f| {
            let short = f
                .strip_prefix("server/src/")
                .or_else(|| f.strip_prefix("app/src/"))
                .unwrap_or(f);
            !named.iter().any(|n| n == f || n == short)
                && !dirs
                    .iter()
                    .any(|d| f.starts_with(d) || short.starts_with(d))
        })
        .collect();
    assert!(
        unmapped.is_empty(),
        "product files over {UNMAPPED_LIMIT} lines that ARCHITECTURE.md's code map does not name (add each where it belongs):\n{}",
        unmapped.join("\n")
    );
}

#[test]
fn anyhow_is_used_only_at_the_binarys_edge() {
    let users: Vec<String> = product_files(&repo())
        .into_iter()
        .filter(|(f, src)| f != "server/src/main.rs" && src.contains("anyhow"))
        .map(|(f, _)| f)
        .collect();
    assert!(
        users.is_empty(),
        "anyhow outside server/src/main.rs (the library's errors are thiserror types): {users:?}"
    );
}

/// Files whose functions answer `Result<_, String>` today, and how many:
/// none (the library's errors are `thiserror` types, the binary's edge
/// answers `anyhow`). A listed file may only shrink; no file joins the list.
#[rustfmt::skip]
const STRING_ERRORS: &[(&str, usize)] = &[];

/// How many functions in `src` answer `Result<_, String>` (the signature's
/// return read on one line, as rustfmt writes it).
fn string_errors(src: &str) -> usize {
    src.lines()
        .map(strip)
        .filter(|l| {
            l.split_once("-> Result<").is_some_and(|(_, ret)| {
                ret.trim_end()
                    .trim_end_matches('{')
                    .trim_end()
                    .ends_with(", String>")
            })
        })
        .count()
}

#[test]
fn no_file_answers_more_string_errors_than_it_did_and_none_new_answers_any() {
    let measured: BTreeMap<String, usize> = product_files(&repo())
        .into_iter()
        .map(|(f, src)| (f, string_errors(&src)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let listed = STRING_ERRORS
        .iter()
        .map(|(f, n)| (f.to_string(), *n))
        .collect();
    let wrong = ratchet(&measured, &listed, 0);
    assert!(
        wrong.is_empty(),
        "functions answering Result<_, String> (give the error a thiserror type; a listed file may only shrink; the counts read as functions, not lines):\n{}\n\ntoday's list:\n{}",
        wrong.join("\n"),
        measured
            .iter()
            .map(|(f, n)| format!("    ({f:?}, {n}),"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_string_error_check_reads_a_return_on_one_line_and_not_a_string_payload() {
    let src = "fn a() -> Result<(), String> {\n}\n    ) -> Result<[u64; 3], String> {\nfn b() -> Result<String, E> {}\nfn c() -> Option<String> {}\n// fn d() -> Result<(), String>\n";
    assert_eq!(string_errors(src), 2);
}
