//! Tool-server benchmarks: prints a table, asserts nothing.
//! `cargo bench -p server --bench tools` (docs/testing.md § Benchmarks).
//!
//! Rows: what a seat's MCP servers add to taking it — from the node's
//! `seat_claimed` to its `seat_attached` (the acquire hook: the tool
//! servers first, then memory hydration, then the subscriptions) for a
//! seat whose role starts the filesystem server (node), the time server
//! (Python), and both, each beside a seat with none taken in the same
//! round; p50 and max over `CREWLET_BENCH_TOOL_RUNS` rounds (default 5),
//! each round a company revision with fresh seats (the last round's given
//! back). The first round starts each server cold; later ones find their
//! files in the page cache, as a node that has run them before does.
//!
//! The servers come from `./dev bench`, which installs them as `./dev test`
//! does (`CREWLET_MCP_FILESYSTEM`, `CREWLET_MCP_TIME`); without them the
//! rows say why they were skipped.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crewlet::config::{Config, McpServerConfig, RoleConfig};
use crewlet::events::Event;
use crewlet::node;

fn which(program: &str) -> Option<String> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The kinds of seat measured: a name, and its tool servers.
fn kinds(fs: &str, time: &str, dir: &str, node: &str) -> Vec<(&'static str, Vec<McpServerConfig>)> {
    let filesystem = McpServerConfig::stdio("fs", &[node, fs, dir]);
    let mut clock = McpServerConfig::stdio("time", &["python3", "-m", "mcp_server_time"]);
    clock.env.insert("PYTHONPATH".into(), time.to_string());
    vec![
        ("none", vec![]),
        ("filesystem", vec![filesystem.clone()]),
        ("time", vec![clock.clone()]),
        ("filesystem + time", vec![filesystem, clock]),
    ]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("| figure | measured | baseline (same round) | goal |");
    println!("|---|---|---|---|");
    let (Ok(fs), Ok(time), Some(node_bin)) = (
        std::env::var("CREWLET_MCP_FILESYSTEM"),
        std::env::var("CREWLET_MCP_TIME"),
        which("node"),
    ) else {
        println!(
            "| acquire with MCP servers | skipped: CREWLET_MCP_FILESYSTEM, CREWLET_MCP_TIME or node missing (./dev bench installs them) | — | — |"
        );
        return;
    };
    let runs: usize = std::env::var("CREWLET_BENCH_TOOL_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().expect("a scratch folder");
    let work = std::fs::canonicalize(dir.path()).expect("its real path");
    let text = format!(
        "[node]\nid = \"bench-tools\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n[company]\nname = \"Bench company\"\n",
        work.join("data").display()
    );
    let config = Config::parse("bench.toml", &text, &BTreeMap::new()).expect("config");
    let running = node::start(config).await.expect("the node starts");
    let mut events = running.engine.events().subscribe();
    let store = running.engine.store().clone();
    let kinds = kinds(&fs, &time, work.to_str().expect("utf-8"), &node_bin);
    let mut took: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..runs {
        let roles: Vec<RoleConfig> = kinds
            .iter()
            .enumerate()
            .map(|(k, (_, mcp))| RoleConfig {
                handle: format!("r{round}-k{k}"),
                mcp: mcp.clone(),
                ..Default::default()
            })
            .collect();
        crewlet::company::apply(&*store, "Bench company", &roles)
            .await
            .expect("the company applies");
        let mut claimed: BTreeMap<String, Instant> = BTreeMap::new();
        let mut attached = 0;
        let deadline = Instant::now() + Duration::from_secs(120);
        while attached < roles.len() && Instant::now() < deadline {
            let Ok(Ok(e)) = tokio::time::timeout(Duration::from_secs(5), events.recv()).await
            else {
                continue;
            };
            match e.event {
                Event::SeatClaimed { seat, .. } => {
                    claimed.insert(seat, Instant::now());
                }
                Event::SeatAttached { seat, .. } => {
                    if let (Some(at), Some(k)) = (
                        claimed.get(&seat),
                        seat.rsplit_once("-k")
                            .and_then(|(_, k)| k.parse::<usize>().ok()),
                    ) && seat.starts_with(&format!("r{round}-"))
                    {
                        took.entry(kinds[k].0)
                            .or_default()
                            .push(at.elapsed().as_secs_f64() * 1000.0);
                        attached += 1;
                    }
                }
                _ => {}
            }
        }
        eprintln!(
            "round {}: {attached} of {} seats attached",
            round + 1,
            roles.len()
        );
    }
    let mut none = took.remove("none").unwrap_or_default();
    let base = format!(
        "p50 {:.2} ms / max {:.2} ms, no tool servers ({} seats)",
        pct(&mut none.clone(), 0.5),
        pct(&mut none, 1.0),
        runs
    );
    for (name, _) in kinds.iter().skip(1) {
        let mut v = took.remove(name).unwrap_or_default();
        let n = v.len();
        println!(
            "| acquire (claimed → attached), {name} server{} | p50 {:.0} ms / max {:.0} ms ({n} seats) | {base} | — |",
            if name.contains('+') { "s" } else { "" },
            pct(&mut v.clone(), 0.5),
            pct(&mut v, 1.0),
        );
    }
    running.shutdown().await.expect("the node stops");
}
