//! The watchdog as a process: a node whose sweep loop blocks forever exits
//! with code 75, after one line on stderr, once the lease TTL has passed
//! (seed § The wedged node). A node stopped gracefully exits 0 (cli.rs).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_crewlet");

#[test]
fn a_node_whose_sweep_loop_blocks_forever_exits_75() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("crewlet.toml");
    let mut f = std::fs::File::create(&config).unwrap();
    write!(
        f,
        "[node]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n[coordination]\nlease_ttl_seconds = 3\nheartbeat_seconds = 1\nsweep_seconds = 1\n\n[[roles]]\nhandle = \"w\"\n\n[logging]\nstderr = false\nfile = \"{}\"\n",
        dir.path().join("data").display(),
        dir.path().join("node.log").display()
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .env("CREWLET_FAULT_WEDGE_SWEEP", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The exit is the condition; the deadline is generous (TTL 3 s).
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the wedged node did not exit");
        }
        std::thread::park_timeout(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(75), "stderr: {stderr}");
    // The one line goes straight to stderr even though logging.stderr = false.
    assert!(
        stderr.contains("crewlet watchdog: the sweep loop has not turned"),
        "{stderr}"
    );
    assert!(stderr.contains("Exiting with code 75"), "{stderr}");
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
    assert!(
        !log.contains("crewlet watchdog"),
        "the notice is not in logging.file"
    );
}
