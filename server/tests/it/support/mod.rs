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
/// never one this test process has handed out before: two tests running
/// at once are never given the same port by a kernel that reuses it.
///
/// The port is drawn below the kernel's ephemeral range, never from it:
/// a node that is down (killed, rolling) keeps its port in its config, and
/// an ephemeral port is the one the kernel hands to the next outgoing
/// connection of any process — a soak's node once found its port taken
/// that way and could not start again.
pub fn free_port() -> u16 {
    use rand::Rng;
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let (low, high) = ports_outside_ephemeral_range();
    let mut rng = rand::thread_rng();
    loop {
        let port = rng.gen_range(low..high);
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.contains(&port) || std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        given.push(port);
        return port;
    }
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
