//! Test harness shared by the integration suites: real servers started on
//! free loopback ports and stopped on drop, and waiting on a condition with
//! a deadline (never a bare sleep standing in for one).
//!
//! Nothing here mocks anything: `nats` spawns the real `nats-server`.

#![allow(dead_code)]

pub mod duty_faults;
pub mod faulty;
pub mod http_node;
pub mod nats;
pub mod process;
pub mod provider;
pub mod run_faults;
pub mod stranded;

use std::future::Future;
use std::time::Duration;

/// Each named test runs twice, as `twin::name` on the in-process twins and
/// `nats::name` on a real `nats-server`: the suite's `async fn name(f)` is
/// given `Fleet::new(Kind::Twin)` or `Fleet::new(Kind::Nats)` (the suite's
/// own `Fleet` and `Kind`), on a multi-threaded runtime with a real clock —
/// SQLite work and child processes run on worker threads, and a paused
/// clock would jump past leases while they do. `paused_twin;` first runs
/// the twin half on tokio's paused clock instead (suites with no SQLite in
/// the way); `make twin_fn, nats_fn;` first builds the fixture with those
/// functions instead, on the default runtime.
#[allow(unused_macros)]
macro_rules! both {
    (@emit [$twin:meta] [$nats:meta] $twin_fx:expr, $nats_fx:expr; $($name:ident),*) => {
        mod twin {
            $(
                #[$twin]
                async fn $name() {
                    super::$name($twin_fx).await;
                }
            )*
        }
        mod nats {
            $(
                #[$nats]
                async fn $name() {
                    super::$name($nats_fx).await;
                }
            )*
        }
    };
    (paused_twin; $($name:ident),* $(,)?) => {
        both!(@emit
            [tokio::test(start_paused = true)]
            [tokio::test(flavor = "multi_thread", worker_threads = 2)]
            super::Fleet::new(super::Kind::Twin).await,
            super::Fleet::new(super::Kind::Nats).await;
            $($name),*);
    };
    (make $twin_fn:ident, $nats_fn:ident; $($name:ident),* $(,)?) => {
        both!(@emit [tokio::test] [tokio::test]
            super::$twin_fn().await, super::$nats_fn().await;
            $($name),*);
    };
    ($($name:ident),* $(,)?) => {
        both!(@emit
            [tokio::test(flavor = "multi_thread", worker_threads = 2)]
            [tokio::test(flavor = "multi_thread", worker_threads = 2)]
            super::Fleet::new(super::Kind::Twin).await,
            super::Fleet::new(super::Kind::Nats).await;
            $($name),*);
    };
}

/// A free TCP port on 127.0.0.1 (bound, then released for the server),
/// never one this test process or another test process on the machine
/// holds: two tests running at once are never given the same port.
///
/// A port is held for the life of the process that drew it, by a lock on
/// a file named after it in the machine's temporary directory
/// (`crewlet-test-ports/{port}`); the kernel lets the lock go when the
/// process ends, however it ends. Without it a port was checked free in
/// one process while another had handed it to a server that was down or
/// not yet started: soak seed 12010's node could not start on a port the
/// suite beside it had drawn ("Address already in use", two start
/// violations).
///
/// The port is drawn below the kernel's ephemeral range, never from it:
/// a node that is down (killed, rolling) keeps its port in its config, and
/// an ephemeral port is the one the kernel hands to the next outgoing
/// connection of any process — a soak's node once found its port taken
/// that way and could not start again.
pub fn free_port() -> u16 {
    use rand::Rng;
    static HELD: std::sync::Mutex<Vec<(u16, Option<std::fs::File>)>> =
        std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("crewlet-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    let (low, high) = ports_outside_ephemeral_range();
    let mut rng = rand::thread_rng();
    loop {
        let port = rng.gen_range(low..high);
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        if held.iter().any(|(p, _)| *p == port) {
            continue;
        }
        let lock = match hold_port_file(&dir, port) {
            PortFile::Held(f) => Some(f),
            PortFile::HeldElsewhere => continue,
            // No shared directory to coordinate through: this process's
            // own list and the bind below are all there is.
            PortFile::Unavailable => None,
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        held.push((port, lock));
        return port;
    }
}

enum PortFile {
    Held(std::fs::File),
    HeldElsewhere,
    Unavailable,
}

/// Take the lock on `dir/{port}`, unless another process holds it.
fn hold_port_file(dir: &std::path::Path, port: u16) -> PortFile {
    let file = match std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    {
        Ok(f) => f,
        Err(_) => return PortFile::Unavailable,
    };
    match file.try_lock() {
        Ok(()) => PortFile::Held(file),
        Err(std::fs::TryLockError::WouldBlock) => PortFile::HeldElsewhere,
        Err(std::fs::TryLockError::Error(_)) => PortFile::Unavailable,
    }
}

/// What [`free_port`] promises across processes: a port one test process
/// drew is refused to every other while the first lives. A second open of
/// the port's lock file is, to the kernel, what another process's open is.
#[test]
fn a_port_one_test_process_holds_is_never_given_to_another() {
    let port = free_port();
    let dir = std::env::temp_dir().join("crewlet-test-ports");
    assert!(
        matches!(hold_port_file(&dir, port), PortFile::HeldElsewhere),
        "port {port} was drawn by this process, yet its lock file could be taken again"
    );
    assert_ne!(
        free_port(),
        port,
        "the same process was given port {port} twice"
    );
}

/// The ports [`free_port`] draws from: the 10,000 below the start of the
/// kernel's ephemeral range (Linux's is 32768–60999 unless changed).
fn ports_outside_ephemeral_range() -> (u16, u16) {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let high = first_ephemeral.max(11_024);
    (high - 10_000, high)
}

/// Poll `cond` every `every` until it returns `Some`, or panic naming
/// `what` once `deadline` has passed.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, every: Duration, cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll_until(deadline, every, cond).await {
        Some(v) => v,
        None => panic!("timed out after {deadline:?} waiting for {what}"),
    }
}

/// [`wait_for`] that answers `None` at the deadline instead of failing
/// (for a caller that tries something else then).
pub async fn poll_until<T, F, Fut>(deadline: Duration, every: Duration, mut cond: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let until = std::time::Instant::now() + deadline;
    loop {
        if let Some(v) = cond().await {
            return Some(v);
        }
        if std::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}
pub mod turnfleet;

/// The entries of a dashboard `audit_log` answer (`{"entries": [...],
/// "answered": [...], ...}`), each checked to name the node it was taken
/// through.
pub fn audit_entries(v: serde_json::Value) -> Vec<serde_json::Value> {
    let entries = v["entries"]
        .as_array()
        .expect("an audit log has entries")
        .clone();
    assert!(
        v["answered"].as_array().is_some_and(|a| !a.is_empty()),
        "the audit log names the nodes it gathered from: {v}"
    );
    for e in &entries {
        assert!(e["node"].as_str().is_some_and(|n| !n.is_empty()), "{e}");
    }
    entries
}
