//! Every class of config error, as a person would meet it.

use std::collections::BTreeMap;

use super::*;

const HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$GxeuxUyKBT7Ilc1oMyFh1F3BEGZ0/pOWv6jDMO7fNI8";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse("crewlet.toml", text, &BTreeMap::new())
}

fn problems(text: &str) -> Vec<Problem> {
    match parse(text) {
        Ok(_) => panic!("expected the config to be refused:\n{text}"),
        Err(e) => {
            let p = e.problems().to_vec();
            assert!(!p.is_empty(), "expected problems, got {e}");
            p
        }
    }
}

fn one(text: &str, key: &str) -> Problem {
    let p = problems(text);
    p.iter()
        .find(|p| p.key == key)
        .cloned()
        .unwrap_or_else(|| panic!("no problem for {key} in {p:?}"))
}

#[test]
fn empty_file_gives_documented_defaults() {
    let c = parse("").unwrap();
    assert_eq!(c.node.id, "node-0");
    assert_eq!(c.node.listen, "127.0.0.1:3000");
    assert_eq!(c.coordination.kind, CoordinationType::Local);
    assert_eq!(c.coordination.lease_ttl_seconds, 45);
    assert_eq!(c.coordination.heartbeat_seconds, 15);
    assert_eq!(c.coordination.sweep_seconds, 5);
    assert_eq!(c.coordination.claim_limit, 4);
    assert_eq!(c.coordination.release_limit, 2);
    assert_eq!(c.coordination.store_timeout_ms, 2000);
    assert_eq!(c.stream.kind, StreamType::Local);
    assert_eq!(c.logging.format, LogFormat::Pretty);
    assert!(c.logging.stderr);
}

#[test]
fn the_demo_company_file_is_valid() {
    let text = include_str!("../../demo/crewlet.toml");
    let c = parse(text).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.roles.len() >= 3, "the demo company has several seats");
}

#[test]
fn unknown_key_is_refused_with_path_and_nearest_key() {
    let p = one(
        "[coordination]\nlease_ttl_secnds = 30\n",
        "coordination.lease_ttl_secnds",
    );
    assert_eq!(p.problem, "unknown key");
    assert!(p.fix.contains("`lease_ttl_seconds`"), "{p}");
    assert_eq!(p.value.as_deref(), Some("30"));
}

#[test]
fn unknown_key_inside_a_role_names_its_index() {
    let p = one(
        "[[roles]]\nhandle = \"a\"\n[[roles]]\nhandle = \"b\"\nplacment = {}\n",
        "roles[1].placment",
    );
    assert!(p.fix.contains("`placement`"), "{p}");
}

#[test]
fn unknown_section_lists_nearest() {
    let p = one("[loging]\nformat = \"json\"\n", "loging");
    assert!(p.fix.contains("`logging`"), "{p}");
}

#[test]
fn wrong_type_names_the_key_path() {
    let p = one(
        "[coordination]\nlease_ttl_seconds = \"soon\"\n",
        "coordination.lease_ttl_seconds",
    );
    assert!(p.problem.contains("invalid type"), "{p}");
}

#[test]
fn unknown_enum_value_lists_the_valid_ones() {
    let p = one("[coordination]\ntype = \"etcd\"\n", "coordination.type");
    assert!(
        p.problem.contains("local") && p.problem.contains("embedded-kv"),
        "{p}"
    );
}

#[test]
fn handles_must_be_unique() {
    let p = one(
        "[[roles]]\nhandle = \"a\"\n[[roles]]\nhandle = \"a\"\n",
        "roles[1].handle",
    );
    assert!(p.problem.contains("earlier role"), "{p}");
}

#[test]
fn handles_must_be_nats_subject_safe() {
    for bad in ["a.b", "a b", "a*", "a>", ""] {
        let text = format!("[[roles]]\nhandle = {bad:?}\n");
        let p = one(&text, "roles[0].handle");
        assert_eq!(p.value, Some(format!("{bad:?}")), "{p}");
    }
}

#[test]
fn heartbeat_must_be_at_most_a_third_of_the_ttl() {
    let p = one(
        "[coordination]\nlease_ttl_seconds = 30\nheartbeat_seconds = 11\n",
        "coordination.heartbeat_seconds",
    );
    assert_eq!(p.value.as_deref(), Some("11"));
    assert!(p.fix.contains("at most 10"), "{p}");
    parse("[coordination]\nlease_ttl_seconds = 30\nheartbeat_seconds = 10\n").unwrap();
}

#[test]
fn sweep_must_be_shorter_than_the_ttl() {
    let p = one(
        "[coordination]\nlease_ttl_seconds = 9\nheartbeat_seconds = 3\nsweep_seconds = 9\n",
        "coordination.sweep_seconds",
    );
    assert_eq!(p.value.as_deref(), Some("9"));
}

#[test]
fn the_delivery_budget_and_ack_window_are_configurable_and_range_checked() {
    let c = parse("").unwrap();
    assert_eq!(
        (c.stream.max_deliveries, c.stream.ack_wait_seconds),
        (25, 30)
    );
    let c = parse("[stream]\nmax_deliveries = 5\nack_wait_seconds = 60\n").unwrap();
    assert_eq!(
        (c.stream.max_deliveries, c.stream.ack_wait_seconds),
        (5, 60)
    );
    one("[stream]\nmax_deliveries = 0\n", "stream.max_deliveries");
    one(
        "[stream]\nack_wait_seconds = 0\n",
        "stream.ack_wait_seconds",
    );
}

#[test]
fn a_failed_turns_retry_delay_defaults_to_one_second_doubling_to_a_minute_and_is_range_checked() {
    let c = parse("").unwrap();
    assert_eq!(
        (
            c.stream.retry_delay_seconds,
            c.stream.retry_delay_max_seconds
        ),
        (1, 60)
    );
    let c = parse("[stream]\nretry_delay_seconds = 0\nretry_delay_max_seconds = 0\n").unwrap();
    assert_eq!(c.stream.retry_delay_max_seconds, 0, "0 and 0: at once");
    one(
        "[stream]\nretry_delay_seconds = 3601\nretry_delay_max_seconds = 4000\n",
        "stream.retry_delay_seconds",
    );
    let p = one(
        "[stream]\nretry_delay_seconds = 30\nretry_delay_max_seconds = 10\n",
        "stream.retry_delay_max_seconds",
    );
    assert!(p.fix.contains("30 or more"), "{}", p.fix);
}

#[test]
fn numbers_are_range_checked() {
    one(
        "[coordination]\nclaim_limit = 0\n",
        "coordination.claim_limit",
    );
    one(
        "[coordination]\nrelease_limit = 0\n",
        "coordination.release_limit",
    );
    one(
        "[coordination]\nstore_timeout_ms = 1\n",
        "coordination.store_timeout_ms",
    );
    one(
        "[coordination]\nlease_ttl_seconds = 1\nheartbeat_seconds = 1\nsweep_seconds = 1\n",
        "coordination.lease_ttl_seconds",
    );
}

#[test]
fn local_coordination_beside_nats_stream_is_refused_naming_embedded_kv() {
    let p = one(
        "[stream]\ntype = \"nats\"\nurls = [\"nats://127.0.0.1:4222\"]\n",
        "coordination.type",
    );
    assert!(p.fix.contains("embedded-kv"), "{p}");
}

#[test]
fn embedded_kv_beside_local_stream_is_refused() {
    let p = one(
        "[coordination]\ntype = \"embedded-kv\"\n",
        "coordination.type",
    );
    assert!(p.fix.contains("stream.type = \"nats\""), "{p}");
}

#[test]
fn one_write_claims_are_refused_on_a_fleet_and_taken_on_a_single_node() {
    let p = one(
        "[coordination]\ntype = \"embedded-kv\"\natomic_claim = true\n[stream]\ntype = \"nats\"\nurls = [\"nats://127.0.0.1:4222\"]\n",
        "coordination.atomic_claim",
    );
    assert_eq!(p.value.as_deref(), Some("true"));
    assert!(p.problem.contains("restarts after a crash"), "{p}");
    assert!(p.fix.contains("remove it"), "{p}");
    let c = parse("[coordination]\natomic_claim = true\n").expect("local takes it");
    assert!(c.coordination.atomic_claim);
}

#[test]
fn a_fleet_pairing_is_accepted() {
    let c = parse(
        "[coordination]\ntype = \"embedded-kv\"\n[stream]\ntype = \"nats\"\nurls = [\"nats://127.0.0.1:4222\"]\n",
    )
    .unwrap();
    assert_eq!(c.coordination.kind, CoordinationType::EmbeddedKv);
}

#[test]
fn nats_stream_needs_urls_that_are_nats_urls() {
    one(
        "[coordination]\ntype = \"embedded-kv\"\n[stream]\ntype = \"nats\"\n",
        "stream.urls",
    );
    one(
        "[coordination]\ntype = \"embedded-kv\"\n[stream]\ntype = \"nats\"\nurls = [\"http://x\"]\n",
        "stream.urls[0]",
    );
}

#[test]
fn user_without_password_is_refused() {
    one(
        "[coordination]\ntype = \"embedded-kv\"\n[stream]\ntype = \"nats\"\nurls = [\"nats://h:4222\"]\nuser = \"u\"\n",
        "stream.password",
    );
}

#[test]
fn env_overrides_set_the_nats_url_and_secrets() {
    let env: BTreeMap<String, String> = [
        ("CREWLET_STREAM__URLS", "nats://a:4222, nats://b:4222"),
        ("CREWLET_STREAM__USER", "crewlet"),
        ("CREWLET_STREAM__PASSWORD", "s3cret"),
        ("CREWLET_COORDINATION__LEASE_TTL_SECONDS", "60"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let c = Config::parse(
        "f.toml",
        "[coordination]\ntype = \"embedded-kv\"\n[stream]\ntype = \"nats\"\n",
        &env,
    )
    .unwrap();
    assert_eq!(c.stream.urls, vec!["nats://a:4222", "nats://b:4222"]);
    assert_eq!(c.stream.password.as_deref(), Some("s3cret"));
    assert_eq!(c.coordination.lease_ttl_seconds, 60);
    assert!(!c.redacted_toml().contains("s3cret"));
}

#[test]
fn env_override_of_an_unknown_key_is_refused_with_nearest() {
    let env: BTreeMap<String, String> =
        [("CREWLET_STREAM__URL".to_string(), "nats://a".to_string())]
            .into_iter()
            .collect();
    let e = Config::parse("f.toml", "", &env).unwrap_err();
    let p = &e.problems()[0];
    assert_eq!(p.key, "CREWLET_STREAM__URL");
    assert!(p.fix.contains("CREWLET_STREAM__URLS"), "{p}");
}

#[test]
fn env_override_with_a_bad_number_names_the_variable() {
    let env: BTreeMap<String, String> = [(
        "CREWLET_COORDINATION__SWEEP_SECONDS".to_string(),
        "fast".to_string(),
    )]
    .into_iter()
    .collect();
    let e = Config::parse("f.toml", "", &env).unwrap_err();
    assert_eq!(e.problems()[0].key, "CREWLET_COORDINATION__SWEEP_SECONDS");
    assert_eq!(e.problems()[0].value.as_deref(), Some("fast"));
}

#[test]
fn password_hash_must_be_argon2_and_is_never_echoed() {
    let text =
        "[[auth.users]]\nname = \"alice\"\npassword_hash = \"hunter2\"\nrole = \"operator\"\n";
    let p = one(text, "auth.users[0].password_hash");
    assert_eq!(p.value.as_deref(), Some(REDACTED));
    assert!(!parse(text).unwrap_err().to_string().contains("hunter2"));
    let ok = format!(
        "[[auth.users]]\nname = \"alice\"\npassword_hash = \"{HASH}\"\nrole = \"operator\"\n"
    );
    parse(&ok).unwrap();
}

#[test]
fn user_role_must_be_viewer_operator_or_admin() {
    let text =
        format!("[[auth.users]]\nname = \"a\"\npassword_hash = \"{HASH}\"\nrole = \"root\"\n");
    let p = one(&text, "auth.users[0].role");
    assert!(
        p.problem.contains("viewer")
            && p.problem.contains("operator")
            && p.problem.contains("admin"),
        "{p}"
    );
    let admin =
        format!("[[auth.users]]\nname = \"a\"\npassword_hash = \"{HASH}\"\nrole = \"admin\"\n");
    assert_eq!(parse(&admin).unwrap().auth.users[0].role, AuthRole::Admin);
}

#[test]
fn token_digest_must_be_sha256_hex() {
    one(
        "[[auth.tokens]]\nname = \"mon\"\nsha256 = \"abc\"\nrole = \"viewer\"\n",
        "auth.tokens[0].sha256",
    );
}

#[test]
fn errors_name_the_file() {
    let e = parse("[node]\nid = \"a.b\"\n").unwrap_err();
    let s = e.to_string();
    assert!(s.starts_with("crewlet.toml:"), "{s}");
    assert!(s.contains("`node.id` = \"a.b\""), "{s}");
}

#[test]
fn syntax_errors_name_the_file() {
    let e = parse("[node\nid = 1").unwrap_err();
    assert!(matches!(e, ConfigError::Syntax { .. }));
    assert!(e.to_string().starts_with("crewlet.toml: not valid TOML"));
}

#[test]
fn every_problem_is_reported_not_just_the_first() {
    let p = problems("[node]\nid = \"a b\"\nlisten = \"nowhere\"\n");
    assert!(p.len() >= 2, "{p:?}");
}

#[test]
fn redacted_toml_hides_every_secret() {
    let text = format!(
        "[[auth.users]]\nname = \"a\"\npassword_hash = \"{HASH}\"\nrole = \"operator\"\n[[auth.tokens]]\nname = \"t\"\nsha256 = \"{}\"\nrole = \"viewer\"\n",
        "ab".repeat(32)
    );
    let c = parse(&text).unwrap();
    let shown = c.redacted_toml();
    assert!(!shown.contains(HASH));
    assert!(!shown.contains(&"ab".repeat(32)));
    assert!(shown.contains(REDACTED));
    // What is printed parses back as a config of the same shape.
    let back: toml::Table = shown.parse().unwrap();
    assert!(back.contains_key("auth"));
}

#[test]
fn echo_settings_parse_and_a_turn_needs_a_round() {
    let c = parse(
        "[[roles]]\nhandle = \"a\"\nagent = { kind = \"echo\", rounds = 3, round_delay_ms = 10, fail_round = 2, fail = \"after_outside\" }\n",
    )
    .unwrap();
    assert_eq!(
        c.roles[0].agent,
        AgentConfig::Echo(EchoConfig {
            rounds: 3,
            round_delay_ms: 10,
            fail_round: 2,
            fail: EchoFailure::AfterOutside,
            drills: false,
        })
    );
    let p = one(
        "[[roles]]\nhandle = \"a\"\nagent = { kind = \"echo\", rounds = 0 }\n",
        "roles[0].agent.rounds",
    );
    assert_eq!(p.value.as_deref(), Some("0"));
    let p = one(
        "[[roles]]\nhandle = \"a\"\nagent = { kind = \"echo\", rounds = 2, fail_round = 3 }\n",
        "roles[0].agent.fail_round",
    );
    assert!(p.fix.contains("1 to 2"), "{p:?}");
}

#[test]
fn command_settings_have_documented_defaults_and_unknown_ones_are_refused() {
    let c = parse("[[roles]]\nhandle = \"a\"\nagent = { kind = \"command\", argv = [\"python3\", \"a.py\"] }\n")
        .unwrap();
    assert_eq!(
        c.roles[0].agent,
        AgentConfig::Command(CommandConfig {
            env: Default::default(),
            env_from: vec![],
            argv: vec!["python3".into(), "a.py".into()],
            stop_wait_ms: 2000,
            round_timeout_seconds: 600,
        })
    );
    problems(
        "[[roles]]\nhandle = \"a\"\nagent = { kind = \"command\", argv = [\"x\"], stop_wait = 1 }\n",
    );
}

#[test]
fn schedules_name_a_seat_a_cron_expression_and_a_unique_name() {
    let c = parse(
        "[[roles]]\nhandle = \"a\"\n[[schedules]]\nname = \"daily\"\nseat = \"a\"\ncron = \"0 9 * * 1-5\"\n",
    )
    .unwrap();
    assert_eq!(c.schedules[0].kind, "task_assigned");
    let p = one(
        "[[roles]]\nhandle = \"a\"\n[[schedules]]\nname = \"daily\"\nseat = \"b\"\ncron = \"0 9 * * *\"\n",
        "schedules[0].seat",
    );
    assert_eq!(p.value.as_deref(), Some("\"b\""));
    let p = one(
        "[[roles]]\nhandle = \"a\"\n[[schedules]]\nname = \"daily\"\nseat = \"a\"\ncron = \"every day\"\n",
        "schedules[0].cron",
    );
    assert!(p.problem.contains("not a cron expression"), "{p:?}");
    one(
        "[[roles]]\nhandle = \"a\"\n[[schedules]]\nname = \"d\"\nseat = \"a\"\ncron = \"0 * * * *\"\n[[schedules]]\nname = \"d\"\nseat = \"a\"\ncron = \"0 * * * *\"\n",
        "schedules[1].name",
    );
}

#[test]
fn zero_durations_for_duties_are_refused_naming_the_key() {
    one(
        "[maintenance]\nevery_seconds = 0\n",
        "maintenance.every_seconds",
    );
    one("[scheduler]\ntick_seconds = 0\n", "scheduler.tick_seconds");
    one("[memory]\nflush_seconds = 0\n", "memory.flush_seconds");
    one("[memory]\nvector_model = \"m\"\n", "memory.vector_dims");
}

#[test]
fn the_fault_protocol_is_only_ever_a_lower_one() {
    use super::{PROTOCOL, fault_protocol};
    assert_eq!(fault_protocol(None), PROTOCOL);
    assert_eq!(fault_protocol(Some("3")), 3);
    assert_eq!(fault_protocol(Some(" 1 ")), 1);
    for ignored in ["0", "4", "5", "x", ""] {
        assert_eq!(fault_protocol(Some(ignored)), PROTOCOL, "{ignored:?}");
    }
}

#[test]
fn drills_are_refused_outside_a_test_node() {
    let p = one(
        "[[roles]]\nhandle = \"a\"\nagent = { kind = \"echo\", drills = true }\n",
        "roles[0].agent.drills",
    );
    assert!(p.fix.contains("environment = \"test\""), "{p}");
    let c = parse(
        "[node]\nenvironment = \"test\"\n[[roles]]\nhandle = \"a\"\nagent = { kind = \"echo\", drills = true }\n",
    )
    .unwrap();
    assert!(crate::config::AgentPolicy::of(&c).drills);
    assert!(!crate::config::AgentPolicy::of(&parse("").unwrap()).drills);
}

#[test]
fn detached_runs_allow_only_absolute_paths_from_the_nodes_own_file() {
    use crate::config::ProgramUse;
    let p = one("[runs]\nallow = [\"git\"]\n", "runs.allow[0]");
    assert!(p.fix.contains("/usr/bin/git"), "{p}");
    let find = |_: &str| None;
    let c = parse("[runs]\nallow = [\"/usr/bin/git\"]\n").unwrap();
    let programs = crate::config::AgentPolicy::of(&c).programs;
    let argv = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(
        programs
            .judge(ProgramUse::Run, &argv(&["/usr/bin/git", "status"]), &find)
            .is_ok()
    );
    let refused = programs
        .judge(ProgramUse::Run, &argv(&["/bin/sh"]), &find)
        .unwrap_err();
    assert!(refused.to_string().contains("detached run"), "{refused}");
    let none = crate::config::AgentPolicy::of(&parse("").unwrap())
        .programs
        .judge(ProgramUse::Run, &argv(&["/bin/sh"]), &find)
        .unwrap_err();
    assert!(
        none.to_string().contains("[[node.programs]]") && none.to_string().contains("detached run"),
        "{none}"
    );
}

#[test]
fn node_program_rules_are_absolute_paths_with_uses_and_a_last_double_star() {
    let p = one(
        "[[node.programs]]\npath = \"python3\"\n",
        "node.programs[0].path",
    );
    assert!(p.fix.contains("/usr/bin/python3"), "{p}");
    one(
        "[[node.programs]]\npath = \"/usr/bin/git\"\nuses = []\n",
        "node.programs[0].uses",
    );
    one(
        "[[node.programs]]\npath = \"/usr/bin/git\"\nargs = [\"** status\"]\n",
        "node.programs[0].args[0]",
    );
    let p = parse("[[node.programs]]\npath = \"/usr/bin/git\"\nuses = [\"sudo\"]\n").unwrap_err();
    assert!(p.to_string().contains("node.programs[0].uses"), "{p}");
    let c = parse(
        "[[node.programs]]\npath = \"/usr/bin/git\"\nargs = [\"status\", \"log **\"]\nuses = [\"run\"]\n",
    )
    .unwrap();
    let rules = c.node.programs.clone().unwrap();
    assert_eq!(rules[0].uses, vec![crate::config::ProgramUse::Run]);
    let c = parse("[[node.programs]]\npath = \"/usr/bin/python3\"\n").unwrap();
    assert_eq!(
        c.node.programs.unwrap()[0].uses,
        vec![
            crate::config::ProgramUse::Command,
            crate::config::ProgramUse::Mcp
        ],
        "a detached run is never allowed by default"
    );
}

#[test]
fn a_company_file_names_only_node_variables_its_node_hands_to_agents() {
    let role = "[[roles]]\nhandle = \"h\"\nagent = { kind = \"model\", base_url = \"https://api.example.com/v1\", model = \"m\", api_key_env = \"AWS_SECRET_ACCESS_KEY\" }\n";
    let p = one(role, "roles[0].agent.api_key_env");
    assert!(p.fix.contains("agent_env"), "{p}");
    parse(&format!(
        "[node]\nagent_env = [\"AWS_SECRET_ACCESS_KEY\"]\n{role}"
    ))
    .unwrap();
    let mcp = "[[roles]]\nhandle = \"h\"\nmcp = [{ name = \"s\", url = \"https://x.example/mcp\", headers_from = { Authorization = \"DATABASE_URL\" } }]\n";
    one(mcp, "roles[0].mcp[0].headers_from.Authorization");
    one(
        "[node]\nagent_env = [\"CREWLET_STREAM__PASSWORD\"]\n",
        "node.agent_env[0]",
    );
}

#[test]
fn an_instructions_file_outside_the_nodes_instructions_directory_is_refused() {
    let role = |f: &str| {
        format!(
            "[node]\ndata_dir = \"/var/lib/crewlet\"\n[[roles]]\nhandle = \"h\"\nagent = {{ kind = \"model\", base_url = \"https://api.example.com/v1\", model = \"m\", instructions_file = \"{f}\" }}\n"
        )
    };
    for bad in [
        "/proc/self/environ",
        "../nats.creds",
        "/var/lib/crewlet/crewlet.db",
    ] {
        let p = one(&role(bad), "roles[0].agent.instructions_file");
        assert!(p.problem.contains("outside"), "{bad}: {p}");
    }
    parse(&role("help-desk.md")).unwrap();
    parse(&role("/var/lib/crewlet/instructions/help-desk.md")).unwrap();
}

#[test]
fn a_fleet_node_runs_no_command_agent_unless_its_file_allows_them() {
    let fleet = "[coordination]\ntype = \"embedded-kv\"\n[stream]\ntype = \"nats\"\nurls = [\"nats://127.0.0.1:4222\"]\n";
    let role = "[[roles]]\nhandle = \"a\"\nagent = { kind = \"command\", argv = [\"python3\", \"a.py\"] }\n";
    let p = one(&format!("{fleet}{role}"), "roles[0].agent.kind");
    assert!(p.fix.contains("allow_command_agents = true"), "{p}");
    let allowed = parse(&format!(
        "[node]\nallow_command_agents = true\n{fleet}{role}"
    ))
    .unwrap();
    assert!(crate::config::AgentPolicy::of(&allowed).command_agents);
    // One node with local coordination runs them by default.
    assert!(crate::config::AgentPolicy::of(&parse(role).unwrap()).command_agents);
    let refused = parse(&format!("[node]\nallow_command_agents = false\n{role}")).unwrap_err();
    assert!(!refused.problems().is_empty());
}

#[test]
fn a_company_past_the_caps_is_refused_and_the_message_lists_a_bounded_number_of_problems() {
    let mut text = String::new();
    for i in 0..(crate::config::MAX_ROLES + 1) {
        text.push_str(&format!("[[roles]]\nhandle = \"r{i}\"\n"));
    }
    let e = parse(&text).unwrap_err();
    assert!(e.problems().iter().any(|p| p.key == "roles"), "{e}");
    let mut unknown = String::from("[node]\n");
    for i in 0..5000 {
        unknown.push_str(&format!("k{i} = 1\n"));
    }
    let e = parse(&unknown).unwrap_err();
    let shown = e.to_string();
    assert!(
        shown.lines().count() <= crate::config::PROBLEMS_SHOWN + 3,
        "{} lines",
        shown.lines().count()
    );
    assert!(shown.contains("more"), "says how many more: {shown}");
}

#[test]
fn trusted_proxies_must_be_addresses_or_networks() {
    let p = one(
        "[auth]\ntrusted_proxies = [\"proxy.local\"]\n",
        "auth.trusted_proxies[0]",
    );
    assert!(p.fix.contains("10.0.0.0/8"), "{p}");
    assert!(parse("[auth]\ntrusted_proxies = [\"127.0.0.1\", \"10.0.0.0/8\"]\n").is_ok());
}

#[test]
fn cookies_are_secure_by_default_unless_the_node_listens_on_loopback() {
    let c = parse("").unwrap();
    assert!(!c.auth.secure_cookies(&c.node));
    let c = parse("[node]\nlisten = \"0.0.0.0:3000\"\n").unwrap();
    assert!(c.auth.secure_cookies(&c.node));
    let c = parse("[node]\nlisten = \"0.0.0.0:3000\"\n[auth]\nsecure_cookies = false\n").unwrap();
    assert!(!c.auth.secure_cookies(&c.node));
}

#[test]
fn a_command_agents_env_takes_variable_names_and_never_passes_the_nodes_own() {
    let role = |agent: &str| {
        format!(
            "[node]\nagent_env = [\"GITHUB_TOKEN\"]\n[[roles]]\nhandle = \"a\"\nagent = {agent}\n"
        )
    };
    let c = parse(&role(
        "{ kind = \"command\", argv = [\"x\"], env = { MODE = \"prod\" }, env_from = [\"GITHUB_TOKEN\"] }",
    ))
    .unwrap();
    let AgentConfig::Command(cmd) = &c.roles[0].agent else {
        panic!("a command agent");
    };
    let env = cmd.child_env("a", "n", &|k| match k {
        "GITHUB_TOKEN" => Some("t".into()),
        "PATH" => Some("/bin".into()),
        "SECRET" => Some("s".into()),
        _ => None,
    });
    assert_eq!(
        env.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "CREWLET_NODE",
            "CREWLET_SEAT",
            "GITHUB_TOKEN",
            "MODE",
            "PATH"
        ]
    );
    one(
        &role("{ kind = \"command\", argv = [\"x\"], env = { \"BAD-NAME\" = \"v\" } }"),
        "roles[0].agent.env.BAD-NAME",
    );
    let p = one(
        &role("{ kind = \"command\", argv = [\"x\"], env_from = [\"CREWLET_STREAM__PASSWORD\"] }"),
        "roles[0].agent.env_from[0]",
    );
    assert!(p.problem.contains("node's own"), "{p}");
}

#[test]
fn a_roles_tool_servers_are_checked_by_name_transport_and_url() {
    let ok = parse(
        r#"
[node]
agent_env = ["GITHUB_TOKEN", "SEARCH_TOKEN"]

[[roles]]
handle = "ops"
mcp = [
  { name = "fs", command = ["mcp-server-filesystem", "/srv/work"], env = { A = "1" }, env_from = ["GITHUB_TOKEN"], call_timeout_seconds = 60 },
  { name = "search", url = "http://127.0.0.1:8811/mcp", headers_from = { Authorization = "SEARCH_TOKEN" } },
]
"#,
    )
    .expect("a role with a stdio and an HTTP tool server");
    assert_eq!(ok.roles[0].mcp.len(), 2);
    assert_eq!(ok.roles[0].mcp[1].call_timeout_seconds, 60, "the default");
    let dup = one(
        r#"
[[roles]]
handle = "ops"
mcp = [{ name = "fs", command = ["a"] }, { name = "fs", command = ["b"] }]
"#,
        "roles[0].mcp[1].name",
    );
    assert!(dup.problem.contains("earlier tool server"), "{dup:?}");
    let none = one(
        "[[roles]]\nhandle = \"ops\"\nmcp = [{ name = \"fs\" }]\n",
        "roles[0].mcp[0].command",
    );
    assert!(none.fix.contains("command ="), "{none:?}");
    let url = one(
        "[[roles]]\nhandle = \"ops\"\nmcp = [{ name = \"s\", url = \"ftp://x/mcp\" }]\n",
        "roles[0].mcp[0].url",
    );
    assert_eq!(url.value.as_deref(), Some("\"ftp://x/mcp\""));
    let both = one(
        "[[roles]]\nhandle = \"ops\"\nmcp = [{ name = \"s\", command = [\"a\"], url = \"http://x/mcp\" }]\n",
        "roles[0].mcp[0].url",
    );
    assert!(both.problem.contains("not both"), "{both:?}");
    let name = one(
        "[[roles]]\nhandle = \"ops\"\nmcp = [{ name = \"f.s\", command = [\"a\"] }]\n",
        "roles[0].mcp[0].name",
    );
    assert!(name.problem.contains("tools are named"), "{name:?}");
    let own = one(
        "[[roles]]\nhandle = \"ops\"\nmcp = [{ name = \"s\", url = \"http://x/mcp\", headers_from = { Authorization = \"CREWLET_AUTH__TOKEN\" } }]\n",
        "roles[0].mcp[0].headers_from.Authorization",
    );
    assert!(own.problem.contains("never an agent's"), "{own:?}");
    let unknown = problems(
        "[[roles]]\nhandle = \"ops\"\nmcp = [{ name = \"s\", command = [\"a\"], cmd = 1 }]\n",
    );
    assert!(unknown.iter().any(|p| p.key.contains("mcp")), "{unknown:?}");
}

#[test]
fn a_roles_approvals_name_its_own_tool_servers_and_wait_a_bounded_time() {
    let ok = parse(
        r#"
[node]
agent_env = ["GITHUB_TOKEN", "SEARCH_TOKEN"]

[[roles]]
handle = "ops"
mcp = [{ name = "fs", command = ["a"] }, { name = "git", command = ["b"] }]
approve = ["fs.write_file", "git.*", "*"]
approve_destructive = true
approval_timeout_seconds = 600
"#,
    )
    .expect("a role whose approvals name its servers");
    assert_eq!(ok.roles[0].approve.len(), 3);
    assert!(ok.roles[0].approve_destructive);
    let plain = parse("[[roles]]\nhandle = \"ops\"\n").unwrap();
    assert_eq!(
        plain.roles[0].approval_timeout_seconds,
        crate::config::DEFAULT_APPROVAL_TIMEOUT_SECONDS,
        "an hour unless the role says"
    );
    let stranger = one(
        "[[roles]]\nhandle = \"ops\"\nmcp = [{ name = \"fs\", command = [\"a\"] }]\napprove = [\"gh.create_issue\"]\n",
        "roles[0].approve[0]",
    );
    assert!(
        stranger.problem.contains("\"gh\"") && stranger.problem.contains("the role has fs"),
        "{stranger:?}"
    );
    let bare = one(
        "[[roles]]\nhandle = \"ops\"\nmcp = [{ name = \"fs\", command = [\"a\"] }]\napprove = [\"write_file\"]\n",
        "roles[0].approve[0]",
    );
    assert!(bare.fix.contains("fs.write_file"), "{bare:?}");
    // The built-ins that reach outside are named by their own names.
    let built_ins = parse(
        "[[roles]]\nhandle = \"ops\"\napprove = [\"run_detached\", \"a2a_message\", \"post_outbox\"]\n",
    )
    .expect("a role approving its outbound built-ins");
    assert_eq!(built_ins.roles[0].approve.len(), 3);
    let inward = one(
        "[[roles]]\nhandle = \"ops\"\napprove = [\"diary_write\"]\n",
        "roles[0].approve[0]",
    );
    assert!(inward.problem.contains("run_detached"), "{inward:?}");
    one(
        "[[roles]]\nhandle = \"ops\"\nread_only = [\"run_detached\"]\n",
        "roles[0].read_only[0]",
    );
    let forever = one(
        "[[roles]]\nhandle = \"ops\"\napproval_timeout_seconds = 0\n",
        "roles[0].approval_timeout_seconds",
    );
    assert!(
        forever.problem.contains("between 1 and 604800"),
        "{forever:?}"
    );
}

#[test]
fn a_model_agent_names_an_http_endpoint_a_model_and_the_variable_holding_its_key() {
    let ok = parse(
        r#"
[node]
agent_env = ["OPENAI_API_KEY"]

[[roles]]
handle = "desk"
agent = { kind = "model", base_url = "http://127.0.0.1:11434/v1", model = "llama3.2", api_key_env = "OPENAI_API_KEY", instructions = "Answer the help desk.", max_rounds = 6 }
"#,
    )
    .expect("a model seat");
    let crate::config::AgentConfig::Model(m) = &ok.roles[0].agent else {
        panic!("a model agent");
    };
    assert_eq!(m.max_rounds, 6);
    assert_eq!(m.max_output_tokens, 1024, "the default");
    assert_eq!(m.request_timeout_seconds, 120, "the default");
    let url = one(
        "[[roles]]\nhandle = \"d\"\nagent = { kind = \"model\", base_url = \"api.openai.com\", model = \"m\" }\n",
        "roles[0].agent.base_url",
    );
    assert!(url.fix.contains("https://api.openai.com/v1"), "{url:?}");
    let model = one(
        "[[roles]]\nhandle = \"d\"\nagent = { kind = \"model\", base_url = \"http://x/v1\", model = \" \" }\n",
        "roles[0].agent.model",
    );
    assert!(model.problem.contains("names no model"), "{model:?}");
    let both = one(
        "[[roles]]\nhandle = \"d\"\nagent = { kind = \"model\", base_url = \"http://x/v1\", model = \"m\", instructions = \"a\", instructions_file = \"b.md\" }\n",
        "roles[0].agent.instructions_file",
    );
    assert!(both.problem.contains("not both"), "{both:?}");
    let own = one(
        "[[roles]]\nhandle = \"d\"\nagent = { kind = \"model\", base_url = \"http://x/v1\", model = \"m\", api_key_env = \"CREWLET_AUTH__TOKEN\" }\n",
        "roles[0].agent.api_key_env",
    );
    assert!(own.problem.contains("never an agent's"), "{own:?}");
    let hot = one(
        "[[roles]]\nhandle = \"d\"\nagent = { kind = \"model\", base_url = \"http://x/v1\", model = \"m\", temperature = 3.5 }\n",
        "roles[0].agent.temperature",
    );
    assert!(hot.problem.contains("between 0 and 2"), "{hot:?}");
    let rounds = one(
        "[[roles]]\nhandle = \"d\"\nagent = { kind = \"model\", base_url = \"http://x/v1\", model = \"m\", max_rounds = 0 }\n",
        "roles[0].agent.max_rounds",
    );
    assert!(rounds.problem.contains("between 1 and 60"), "{rounds:?}");
    let stray = problems(
        "[[roles]]\nhandle = \"d\"\nagent = { kind = \"model\", base_url = \"http://x/v1\", model = \"m\", api_key = \"sk-1\" }\n",
    );
    assert!(stray.iter().any(|p| p.key.contains("api_key")), "{stray:?}");
}

#[test]
fn a_budget_caps_a_model_seat_on_the_companys_clock() {
    let ok = parse(
        r#"
[company]
name = "Acme"
timezone = "Europe/Berlin"

[[roles]]
handle = "desk"
agent = { kind = "model", base_url = "http://x/v1", model = "m" }
budget = { tokens_per_day = 1000, tokens_per_month = 20000 }
"#,
    )
    .expect("a capped model seat");
    assert_eq!(ok.company.timezone, "Europe/Berlin");
    let b = ok.roles[0].budget.clone().unwrap();
    assert_eq!((b.tokens_per_day, b.tokens_per_week), (Some(1000), None));
    assert_eq!(parse("").unwrap().company.timezone, "UTC", "the default");
    let tz = one(
        "[company]\ntimezone = \"Mars/Olympus\"\n",
        "company.timezone",
    );
    assert!(tz.fix.contains("Europe/Berlin"), "{tz:?}");
    let echo = one(
        "[[roles]]\nhandle = \"e\"\nbudget = { tokens_per_day = 5 }\n",
        "roles[0].budget",
    );
    assert!(echo.problem.contains("spends none"), "{echo:?}");
    let zero = one(
        "[[roles]]\nhandle = \"d\"\nagent = { kind = \"model\", base_url = \"http://x/v1\", model = \"m\" }\nbudget = { tokens_per_week = 0 }\n",
        "roles[0].budget.tokens_per_week",
    );
    assert!(zero.problem.contains("for good"), "{zero:?}");
}

#[test]
fn per_seat_series_are_on_for_up_to_200_seats_by_default_and_switchable() {
    assert_eq!(parse("").unwrap().metrics.seat_series_limit, 200);
    let off = parse("[metrics]\nseat_series_limit = 0\n").unwrap();
    assert_eq!(off.metrics.seat_series_limit, 0);
    let p = one(
        "[metrics]\nseat_series_limt = 10\n",
        "metrics.seat_series_limt",
    );
    assert!(p.fix.contains("`seat_series_limit`"), "{p}");
}

#[test]
fn check_redacts_child_variables_and_passwords_in_urls() {
    let c = parse(
        "[node]\nagent_env = [\"PYTHONPATH\"]\n[[roles]]\nhandle = \"h\"\nagent = { kind = \"command\", argv = [\"x\"], env = { API_KEY = \"sk-live-123\" } }\nmcp = [{ name = \"s\", url = \"https://bob:hunter2@mcp.example/x\", env = { T = \"tok-456\" } }]\n",
    )
    .unwrap();
    let shown = c.redacted_toml();
    for secret in ["sk-live-123", "tok-456", "hunter2", "bob"] {
        assert!(!shown.contains(secret), "{secret} in:\n{shown}");
    }
    assert!(
        shown.contains("https://<redacted>@mcp.example/x"),
        "{shown}"
    );
    assert_eq!(
        crate::config::redact_userinfo("nats://u:p@h:4222"),
        "nats://<redacted>@h:4222"
    );
    assert_eq!(
        crate::config::redact_userinfo("https://h/a@b"),
        "https://h/a@b"
    );
}

#[test]
fn a_model_key_goes_off_this_machine_only_over_https() {
    let role = |url: &str| {
        format!(
            "[node]\nagent_env = [\"K\"]\n[[roles]]\nhandle = \"h\"\nagent = {{ kind = \"model\", base_url = \"{url}\", model = \"m\", api_key_env = \"K\" }}\n"
        )
    };
    let p = one(
        &role("http://models.example.com/v1"),
        "roles[0].agent.base_url",
    );
    assert!(p.problem.contains("in the clear"), "{p}");
    one(
        &role("http://127.0.0.1.evil.example/v1"),
        "roles[0].agent.base_url",
    );
    for ok in [
        "https://models.example.com/v1",
        "http://127.0.0.1:11434/v1",
        "http://localhost:8080/v1",
        "http://[::1]:8080/v1",
    ] {
        parse(&role(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn a2a_to_names_other_seats_of_the_company() {
    let roles = |a2a: &str| {
        format!("[[roles]]\nhandle = \"desk\"\na2a_to = {a2a}\n[[roles]]\nhandle = \"billing\"\n")
    };
    parse(&roles("[\"billing\"]")).unwrap();
    parse(&roles("[\"*\"]")).unwrap();
    let p = one(&roles("[\"desk\"]"), "roles[0].a2a_to[0]");
    assert!(p.problem.contains("itself"), "{p}");
    one(&roles("[\"nobody\"]"), "roles[0].a2a_to[0]");
}

#[test]
fn a_config_printed_for_debugging_shows_no_password() {
    let c = parse(
        "[stream]\ntype = \"nats\"\nurls = [\"nats://u:url-secret@127.0.0.1:4222\"]\nuser = \"node\"\npassword = \"stream-secret\"\n[coordination]\ntype = \"embedded-kv\"\n",
    )
    .unwrap();
    let shown = format!("{c:?}");
    assert!(!shown.contains("stream-secret"), "{shown}");
    assert!(!shown.contains("url-secret"), "{shown}");
}
