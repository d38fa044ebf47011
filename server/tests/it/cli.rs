//! The `crewlet` binary as a user runs it: `check` exit codes and output,
//! `run` refusing a bad file, and a clean exit 0 on SIGTERM.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_crewlet");

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn check_prints_the_effective_config_redacted_and_exits_0() {
    let f = file(
        "[stream]\ntype = \"nats\"\nurls = [\"nats://127.0.0.1:4222\"]\n[coordination]\ntype = \"embedded-kv\"\n",
    );
    let out = Command::new(BIN)
        .args(["check", "--config"])
        .arg(f.path())
        .env("CREWLET_STREAM__USER", "crewlet")
        .env("CREWLET_STREAM__PASSWORD", "very-secret-pw")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("lease_ttl_seconds = 45"), "{stdout}");
    assert!(stdout.contains("user = \"crewlet\""), "{stdout}");
    assert!(!stdout.contains("very-secret-pw"), "{stdout}");
    assert!(stdout.contains("<redacted>"), "{stdout}");
}

#[test]
fn check_refuses_an_invalid_file_with_exit_2_naming_file_key_and_fix() {
    let f = file("[coordination]\nlease_ttl_secnds = 30\n");
    let out = Command::new(BIN)
        .args(["check", "--config"])
        .arg(f.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&f.path().display().to_string()), "{stderr}");
    assert!(stderr.contains("coordination.lease_ttl_secnds"), "{stderr}");
    assert!(stderr.contains("lease_ttl_seconds"), "{stderr}");
}

#[test]
fn check_of_a_missing_file_exits_2() {
    let out = Command::new(BIN)
        .args(["check", "--config", "/nonexistent/crewlet.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the company file"));
}

#[test]
fn run_refuses_an_invalid_file_with_exit_2() {
    let f = file("[node]\nid = \"has space\"\n");
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(f.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("node.id"));
}

#[test]
fn every_subcommand_has_help() {
    for sub in [
        &["--help"][..],
        &["run", "--help"],
        &["check", "--help"],
        &["hash-password", "--help"],
    ] {
        let out = Command::new(BIN).args(sub).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{sub:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage"),
            "{sub:?}"
        );
    }
}

#[test]
fn hash_password_prints_an_argon2_phc_string() {
    let mut child = Command::new(BIN)
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"s3cret\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let hash = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    assert!(!hash.contains("s3cret"));
}

#[test]
fn run_serves_then_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let f = file(&format!(
        "[node]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[logging]\nformat = \"json\"\n",
        dir.path().join("data").display()
    ));
    let mut child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(f.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (with a deadline) for the "node started" line.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut started = false;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            started |= line.contains("node started");
            seen.push(line);
            if started {
                break;
            }
        }
    }
    assert!(started, "the node did not start: {seen:#?}");
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the node did not stop on SIGTERM"
        );
        std::thread::park_timeout(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
}
