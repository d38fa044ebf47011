//! What runs on a node: the node's own decision over every program a
//! company, an agent or mail can name (`[[node.programs]]`, docs/security.md
//! § Security model).
//!
//! A company names programs in three places: a command agent's `argv`, an
//! MCP server's stdio `command`, and — through its agents, at turn time —
//! `run_detached`'s `argv`. Each is judged here, by one rule set read from
//! the node's own file and never from an applied company: at apply time on
//! the applying node, again when a seat is established, and at the call.
//! The judgement is pure; finding a program on the node (its canonical
//! path) is a function the caller hands in.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a program is started as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgramUse {
    /// A command agent (`roles[].agent.argv`).
    Command,
    /// An MCP server over stdio (`roles[].mcp[].command`).
    Mcp,
    /// A detached run a turn asks for (`run_detached`'s `argv`).
    Run,
}

impl ProgramUse {
    /// How a person names it in a message.
    pub fn what(self) -> &'static str {
        match self {
            ProgramUse::Command => "command agent",
            ProgramUse::Mcp => "MCP tool server",
            ProgramUse::Run => "detached run",
        }
    }
}

fn default_uses() -> Vec<ProgramUse> {
    vec![ProgramUse::Command, ProgramUse::Mcp]
}

/// One `[[node.programs]]` rule: a program this node starts, with the
/// arguments it may be given and what for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramRule {
    /// The program's absolute path (symbolic links are followed: a company
    /// naming `python3` or `/usr/bin/python3` matches the file they lead
    /// to).
    pub path: String,
    /// Argument patterns, one of which the program's arguments must match
    /// (empty: any arguments). A pattern is words split on spaces, one per
    /// argument; `*` within a word matches any text of that one argument;
    /// a last word `**` matches any further arguments (none included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// What it may be started as: `command`, `mcp`, `run` (default
    /// `["command", "mcp"]`: a detached run, which an agent asks for at
    /// turn time, is allowed only where a rule says `run`).
    #[serde(default = "default_uses")]
    pub uses: Vec<ProgramUse>,
}

/// The node's rule set over programs, as its own file sets it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Programs {
    /// The rules; `None`: the file has no `[[node.programs]]`.
    pub rules: Option<Vec<ProgramRule>>,
    /// With no rules, command agents and stdio servers may be any program
    /// (a single node with `local` coordination, whose company is its
    /// admin's own); a fleet node starts none.
    pub permissive: bool,
    /// `[runs] allow`: programs a detached run may start with any
    /// arguments (argv[0] exactly).
    pub runs_allow: Vec<String>,
}

/// Pure: does `arg` match the word `pattern` (`*` any text)?
pub fn word_matches(pattern: &str, arg: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let a: Vec<char> = arg.chars().collect();
    // Iterative glob with one back-track point: the last `*`.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < a.len() {
        if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == a[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// Pure: do `args` match the argument pattern `pattern` (words split on
/// spaces, one per argument; a last `**` takes any further arguments)?
pub fn args_match(pattern: &str, args: &[String]) -> bool {
    let words: Vec<&str> = pattern.split_whitespace().collect();
    let (words, rest) = match words.split_last() {
        Some((&"**", init)) => (init, true),
        _ => (&words[..], false),
    };
    if args.len() < words.len() || (!rest && args.len() != words.len()) {
        return false;
    }
    words.iter().zip(args).all(|(w, a)| word_matches(w, a))
}

impl ProgramRule {
    /// Pure: does this rule let `program` (already found on the node as
    /// `found`) run as `use_` with `args`?
    fn admits(
        &self,
        use_: ProgramUse,
        found: &Path,
        args: &[String],
        find: &dyn Fn(&str) -> Option<PathBuf>,
    ) -> bool {
        let same = find(&self.path).as_deref() == Some(found) || Path::new(&self.path) == found;
        same && self.uses.contains(&use_)
            && (self.args.is_empty() || self.args.iter().any(|p| args_match(p, args)))
    }
}

impl Programs {
    /// Everything allowed: a test rig's policy.
    pub fn any() -> Programs {
        Programs {
            rules: None,
            permissive: true,
            runs_allow: Vec::new(),
        }
    }

    /// Pure: may `argv` be started as `use_` on this node? `find` says
    /// where a program named by a company is on the node (the canonical
    /// path), `None` when it is not there. `Err` says why not, naming the
    /// program and the key that would allow it.
    pub fn judge(
        &self,
        use_: ProgramUse,
        argv: &[String],
        find: &dyn Fn(&str) -> Option<PathBuf>,
    ) -> Result<(), ProgramRefused> {
        let Some((program, args)) = argv.split_first() else {
            return Err(ProgramRefused::Empty(use_.what()));
        };
        if use_ == ProgramUse::Run && self.runs_allow.iter().any(|a| a == program) {
            return Ok(());
        }
        let rules = match &self.rules {
            None if self.permissive && use_ != ProgramUse::Run => return Ok(()),
            None => &[][..],
            Some(r) => &r[..],
        };
        let shown = shown_argv(argv);
        let Some(found) = find(program) else {
            return Err(ProgramRefused::NotHere {
                what: use_.what(),
                shown,
                program: program.clone(),
            });
        };
        if rules.iter().any(|r| r.admits(use_, &found, args, find)) {
            return Ok(());
        }
        Err(ProgramRefused::NoRule(
            self.refusal(use_, rules, &shown, &found, find),
        ))
    }

    /// Pure: why `rules` let none of them start the program found at
    /// `found` as `use_`, as a person reads it.
    fn refusal(
        &self,
        use_: ProgramUse,
        rules: &[ProgramRule],
        shown: &str,
        found: &Path,
        find: &dyn Fn(&str) -> Option<PathBuf>,
    ) -> String {
        let for_it: Vec<&ProgramRule> = rules
            .iter()
            .filter(|r| find(&r.path).as_deref() == Some(found) || Path::new(&r.path) == found)
            .collect();
        let why = if rules.is_empty() {
            "this node's file lists no [[node.programs]]".to_string()
        } else if for_it.is_empty() {
            format!("[[node.programs]] has no rule for {}", found.display())
        } else if !for_it.iter().any(|r| r.uses.contains(&use_)) {
            format!(
                "the rule for {} does not list {:?} in `uses`",
                found.display(),
                use_name(use_)
            )
        } else {
            format!(
                "its arguments match none of the patterns in the rule for {} ({})",
                found.display(),
                for_it
                    .iter()
                    .flat_map(|r| r.args.iter())
                    .map(|a| format!("{a:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let runs = if use_ == ProgramUse::Run && !self.runs_allow.is_empty() {
            format!(
                ", and [runs] allow lists {} (argv[0] exactly)",
                self.runs_allow
                    .iter()
                    .map(|a| format!("{a:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            String::new()
        };
        format!(
            "the {} {shown} is not allowed on this node: {why}{runs}; a node decides what runs on it (add a [[node.programs]] rule to the node's own file)",
            use_.what()
        )
    }
}

/// Why a program a company names may not start on this node, as a person
/// reads it: the program, and the key of the node's own file that would
/// allow it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProgramRefused {
    #[error("the {0} names no program (it is empty)")]
    Empty(&'static str),
    #[error(
        "the {what} {shown} is not allowed on this node: {program:?} is not a program here, so no [[node.programs]] rule can allow it (give its absolute path, or install it)"
    )]
    NotHere {
        what: &'static str,
        shown: String,
        program: String,
    },
    /// No rule admits it: which rule came closest and why not.
    #[error("{0}")]
    NoRule(String),
}

fn use_name(u: ProgramUse) -> &'static str {
    match u {
        ProgramUse::Command => "command",
        ProgramUse::Mcp => "mcp",
        ProgramUse::Run => "run",
    }
}

/// An argv as a message shows it: quoted, the first 8 words, each clipped.
pub fn shown_argv(argv: &[String]) -> String {
    let mut words: Vec<String> = argv
        .iter()
        .take(8)
        .map(|w| {
            let clipped: String = w.chars().take(80).collect();
            if clipped.len() < w.len() {
                format!("{clipped}…")
            } else {
                clipped
            }
        })
        .collect();
    if argv.len() > 8 {
        words.push(format!("… ({} more)", argv.len() - 8));
    }
    format!("`{}`", words.join(" "))
}

/// Where `program` is on this node, as the node would start it for a child
/// whose `PATH` is `path`: a name with a `/` as it is, a bare name searched
/// on `path`; canonical (symbolic links followed), and only an executable
/// file. The edge the pure judgement is handed.
pub fn find_program(program: &str, path: Option<&str>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        let c = std::fs::canonicalize(p).ok()?;
        let m = std::fs::metadata(&c).ok()?;
        (m.is_file() && m.permissions().mode() & 0o111 != 0).then_some(c)
    };
    if program.is_empty() {
        return None;
    }
    if program.contains('/') {
        return executable(Path::new(program));
    }
    path?
        .split(':')
        .filter(|d| !d.is_empty())
        .find_map(|d| executable(&Path::new(d).join(program)))
}

/// [`find_program`] on the node's own `PATH` (the one its children get).
pub fn find_on_node(program: &str) -> Option<PathBuf> {
    find_program(program, std::env::var("PATH").ok().as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    /// A node where `python3` and `/usr/bin/python3` are one file, `git`
    /// is `/usr/bin/git`, and nothing else exists.
    fn find(p: &str) -> Option<PathBuf> {
        match p {
            "python3" | "/usr/bin/python3" | "/usr/bin/python3.11" => {
                Some(PathBuf::from("/usr/bin/python3.11"))
            }
            "git" | "/usr/bin/git" => Some(PathBuf::from("/usr/bin/git")),
            _ => None,
        }
    }

    fn rule(path: &str, args: &[&str], uses: &[ProgramUse]) -> ProgramRule {
        ProgramRule {
            path: path.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            uses: uses.to_vec(),
        }
    }

    fn fleet(rules: Vec<ProgramRule>) -> Programs {
        Programs {
            rules: Some(rules),
            permissive: false,
            runs_allow: Vec::new(),
        }
    }

    #[test]
    fn a_word_pattern_matches_within_one_argument_only() {
        assert!(word_matches("log", "log"));
        assert!(word_matches("--format=*", "--format=%H"));
        assert!(word_matches("*", ""));
        assert!(word_matches("a*b*c", "aXXbYYc"));
        assert!(!word_matches("a*b", "aXXc"));
        assert!(!word_matches("log", "logs"));
        assert!(args_match("log **", &argv(&["log"])));
        assert!(args_match("log **", &argv(&["log", "--oneline", "-5"])));
        assert!(args_match("", &argv(&[])));
        assert!(!args_match("", &argv(&["x"])));
        assert!(!args_match("status", &argv(&["status", "--porcelain"])));
        // The alias trick: `-c alias.x=!sh` is two arguments no pattern
        // for `status` or `log` takes.
        assert!(!args_match("log **", &argv(&["-c", "alias.x=!sh", "x"])));
    }

    #[test]
    fn a_single_local_node_with_no_rules_runs_what_its_company_names_but_no_detached_run() {
        let p = Programs {
            permissive: true,
            ..Programs::default()
        };
        assert!(
            p.judge(ProgramUse::Command, &argv(&["anything"]), &find)
                .is_ok()
        );
        assert!(
            p.judge(ProgramUse::Mcp, &argv(&["npx", "x"]), &find)
                .is_ok()
        );
        let e = p
            .judge(ProgramUse::Run, &argv(&["/usr/bin/git", "status"]), &find)
            .unwrap_err();
        assert!(e.to_string().contains("[[node.programs]]"), "{e}");
    }

    #[test]
    fn a_fleet_node_with_no_rules_starts_no_program_a_company_names() {
        let p = Programs::default();
        for u in [ProgramUse::Command, ProgramUse::Mcp, ProgramUse::Run] {
            let e = p
                .judge(u, &argv(&["python3", "-m", "x"]), &find)
                .unwrap_err();
            assert!(e.to_string().contains("not allowed on this node"), "{e}");
            assert!(e.to_string().contains(u.what()), "{e}");
        }
    }

    #[test]
    fn a_rule_names_the_file_a_program_resolves_to_whatever_the_company_calls_it() {
        let p = fleet(vec![rule("/usr/bin/python3", &[], &default_uses())]);
        for name in ["python3", "/usr/bin/python3", "/usr/bin/python3.11"] {
            assert!(
                p.judge(ProgramUse::Mcp, &argv(&[name, "-m", "srv"]), &find)
                    .is_ok(),
                "{name}"
            );
        }
        let e = p
            .judge(ProgramUse::Mcp, &argv(&["git", "status"]), &find)
            .unwrap_err();
        assert!(e.to_string().contains("no rule for /usr/bin/git"), "{e}");
        let e = p
            .judge(ProgramUse::Mcp, &argv(&["/proc/self/exe"]), &find)
            .unwrap_err();
        assert!(matches!(e, ProgramRefused::NotHere { .. }), "{e}");
        assert!(e.to_string().contains("is not a program here"), "{e}");
    }

    #[test]
    fn argument_patterns_and_uses_bound_what_a_rule_allows() {
        let p = fleet(vec![rule(
            "/usr/bin/git",
            &["status", "log **"],
            &[ProgramUse::Run],
        )]);
        assert!(
            p.judge(ProgramUse::Run, &argv(&["git", "status"]), &find)
                .is_ok()
        );
        assert!(
            p.judge(ProgramUse::Run, &argv(&["git", "log", "-5"]), &find)
                .is_ok()
        );
        let e = p
            .judge(
                ProgramUse::Run,
                &argv(&["git", "-c", "alias.x=!sh", "x"]),
                &find,
            )
            .unwrap_err();
        assert!(e.to_string().contains("match none of the patterns"), "{e}");
        let e = p
            .judge(ProgramUse::Command, &argv(&["git", "status"]), &find)
            .unwrap_err();
        assert!(e.to_string().contains("does not list \"command\""), "{e}");
    }

    #[test]
    fn runs_allow_still_admits_its_programs_exactly_with_any_arguments() {
        let p = Programs {
            runs_allow: vec!["/usr/bin/git".into()],
            ..Programs::default()
        };
        assert!(
            p.judge(ProgramUse::Run, &argv(&["/usr/bin/git", "x"]), &find)
                .is_ok()
        );
        assert!(
            p.judge(ProgramUse::Run, &argv(&["git", "x"]), &find)
                .is_err()
        );
        assert!(
            p.judge(ProgramUse::Mcp, &argv(&["/usr/bin/git"]), &find)
                .is_err()
        );
    }

    #[test]
    fn finding_a_program_follows_path_and_links_and_refuses_what_is_not_executable() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("tool");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        let plain = dir.path().join("notes.txt");
        std::fs::write(&plain, "x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = dir.path().join("alias");
        std::os::unix::fs::symlink(&bin, &link).unwrap();
        let path = dir.path().display().to_string();
        let canon = std::fs::canonicalize(&bin).unwrap();
        assert_eq!(find_program("tool", Some(&path)), Some(canon.clone()));
        assert_eq!(find_program("alias", Some(&path)), Some(canon.clone()));
        assert_eq!(find_program(link.to_str().unwrap(), None), Some(canon));
        assert_eq!(find_program("notes.txt", Some(&path)), None);
        assert_eq!(find_program("/proc/self/environ", None), None);
        assert_eq!(find_program("tool", None), None);
    }
}
