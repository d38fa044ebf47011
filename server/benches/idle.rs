//! What an idle fleet costs its broker: three nodes (the `crewlet` binary,
//! shipped settings) holding 1,000 idle echo seats each on one nats-server,
//! read once every seat is held and each node's lease view has had its
//! minute to stop. Rows: messages into the broker a second per idle seat
//! (goal ≤ 0.3), the nats-server's CPU (goal ≤ 5 % of one core), and the
//! nodes' CPU together. Run: `./dev bench idle` (release build); the server
//! is the default one (`NATS_SERVER`, else Debian's).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::nats::NatsServer;
use support::process::NodeProcess;

const NODES: usize = 3;
const SEATS_PER_NODE: usize = 1_000;
/// How long the steady state is read.
const WINDOW: Duration = Duration::from_secs(30);
/// A node's lease view stops a minute after its last claim judged the
/// gate; the read begins once that has passed for the last claim.
const SETTLE: Duration = Duration::from_secs(75);

/// One node's company file: every seat of the fleet, on `nats`.
fn config(id: &str, nats: &NatsServer) -> String {
    let roles: String = (0..NODES * SEATS_PER_NODE)
        .map(|i| format!("[[roles]]\nhandle = \"idle-{i:04}\"\nagent = {{ kind = \"echo\" }}\n\n"))
        .collect();
    format!(
        "[node]\nid = \"{id}\"\nlisten = \"{{listen}}\"\ndata_dir = \"{{data}}\"\n\n\
         [coordination]\ntype = \"embedded-kv\"\n\n\
         [stream]\ntype = \"nats\"\nurls = [\"{}\"]\n\n\
         [logging]\nformat = \"json\"\n\n{roles}",
        nats.url()
    )
}

/// CPU ticks (user + system) `pid` has used.
fn ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 12th and 13th of them.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|w| w.parse().unwrap_or(0))
        .collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

/// The broker's count of messages it took in from its clients.
async fn in_msgs(nats: &NatsServer) -> u64 {
    let v: serde_json::Value = reqwest::get(format!("{}/varz", nats.monitor_url()))
        .await
        .expect("varz")
        .json()
        .await
        .expect("varz json");
    v["in_msgs"].as_u64().unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let nats = NatsServer::start().await;
    let server_pid = nats.pid().expect("the nats-server's pid");
    let started = Instant::now();
    let nodes: Vec<NodeProcess> = (0..NODES)
        .map(|i| NodeProcess::start(&config(&format!("idle-{i}"), &nats)))
        .collect();
    for n in &nodes {
        n.healthy(Duration::from_secs(120)).await;
    }
    eprintln!(
        "idle: {NODES} nodes started; waiting for {} seats held…",
        NODES * SEATS_PER_NODE
    );
    support::wait_for(
        "every seat held",
        Duration::from_secs(600),
        Duration::from_secs(1),
        || async {
            let mut held = 0;
            for n in &nodes {
                held += n.seats().await.len();
            }
            (held == NODES * SEATS_PER_NODE).then_some(())
        },
    )
    .await;
    let held_after = started.elapsed();
    eprintln!(
        "idle: every seat held after {:.0} s; letting the lease views stop ({} s)…",
        held_after.as_secs_f64(),
        SETTLE.as_secs()
    );
    tokio::time::sleep(SETTLE).await;
    let pids: Vec<u32> = nodes.iter().map(NodeProcess::pid).collect();
    let (m0, s0, n0) = (
        in_msgs(&nats).await,
        ticks(server_pid),
        pids.iter().map(|p| ticks(*p)).sum::<u64>(),
    );
    let t0 = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let (m1, s1, n1) = (
        in_msgs(&nats).await,
        ticks(server_pid),
        pids.iter().map(|p| ticks(*p)).sum::<u64>(),
    );
    let wall = t0.elapsed().as_secs_f64();
    // SAFETY: sysconf only reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let seats = (NODES * SEATS_PER_NODE) as f64;
    let per_seat = (m1 - m0) as f64 / wall / seats;
    let server_cpu = (s1 - s0) as f64 / hz / wall * 100.0;
    let nodes_cpu = (n1 - n0) as f64 / hz / wall * 100.0;
    println!();
    println!(
        "| an idle fleet on one nats-server ({} nodes × {} idle echo seats, shipped settings; every seat held after {:.0} s, read {:.0} s from {:.0} s later) | measured | baseline (same run) | goal |",
        NODES,
        SEATS_PER_NODE,
        held_after.as_secs_f64(),
        wall,
        SETTLE.as_secs_f64()
    );
    println!("|---|---|---|---|");
    println!(
        "| messages into the broker a second per idle seat | {per_seat:.3} ({:.0} /s) | a renewal every heartbeat: {:.3} | ≤ 0.3 |",
        (m1 - m0) as f64 / wall,
        1.0 / 15.0
    );
    println!("| the nats-server's CPU | {server_cpu:.1} % of one core | — | ≤ 5 % |");
    println!("| the {NODES} nodes' CPU together | {nodes_cpu:.1} % of one core | — | — |");
    drop(nodes);
}
