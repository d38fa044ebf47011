//! The seed's scale on this box (seed 000: "a hundred nodes claiming ten
//! thousand seats took the brokers out of quorum" — the reason for the
//! lease view and `seats_held`): a 3-server NATS JetStream cluster on
//! loopback, and fleets of nodes in this process, each with its own
//! connection, coordinator, presence, heartbeat and sweep — the real seat
//! engine — sharing one company of seats. The seats' mail is each node's
//! in-process twin queue: the cluster carries the coordination alone, which
//! is what the seed's fleet took out of quorum.
//!
//! For each fleet size: a cold start (every node started at once), a
//! steady state, a tenth of the nodes killed (crashed: nothing given
//! back), as many joining. Reported per size: the time to converge (every
//! seat held, no node above its share) and seats per node (most / fewest);
//! the coordination store's writes per second in the steady state against
//! (seats + nodes) ÷ heartbeat; the messages one node receives per sweep;
//! claim p50 / p99 during the cold start; the servers' CPU; whether any
//! server lost the meta leader or a stream its leader (sampled from each
//! server's monitoring endpoint every half second); and the dark time per
//! moved seat after the kill (crash → attached elsewhere) and on the join
//! (the two-phase handoff's dark time). Prints a table; asserts nothing.
//!
//! `./dev bench scale` (or `cargo bench -p server --bench scale`). Bounded
//! for a 2-core, 24 GiB machine: `CREWLET_SCALE_NODES` (default
//! `10,25,50,100`), `CREWLET_SCALE_SEATS` (10000) and
//! `CREWLET_SCALE_LIMIT_S` (300: how long any one phase may take before
//! the size is reported as not converging and the curve stops there).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crewlet::config::{PlacementConfig, RoleConfig};
use crewlet::coord::{Coordinator, CoordinatorOptions, NatsBackend, NatsOptions, Store};
use crewlet::events::{Event, EventBus};
use crewlet::node::company;
use crewlet::queue::twin::TwinQueue;
use crewlet::queue::{
    Delivery, Disposition, Handler, Queue, QueueSettings, handler_fn, log_events,
};
use crewlet::seat::engine::{EngineConfig, SeatEngine};
use crewlet::seat::host::{Fence, SeatContext, SeatHooks};
use crewlet::tasks::Tasks;

/// Lease TTL, heartbeat, sweep, claim limit and release limit as shipped
/// (the claim pace takes a node to its share of 10,000 seats within a few
/// passes, the give-back pace a joining tenth to its share).
const TTL: Duration = Duration::from_secs(45);
const HEARTBEAT: Duration = Duration::from_secs(15);
const SWEEP: Duration = Duration::from_secs(5);
const CLAIM_LIMIT: u32 = 4;
const RELEASE_LIMIT: u32 = 2;

/// Seats attached and idle: each answers nothing.
struct Idle;

#[async_trait::async_trait]
impl SeatHooks for Idle {
    fn inbox_handler(&self, _s: &SeatContext, _f: Fence) -> Arc<dyn Handler> {
        handler_fn(|_d: Delivery| async { Disposition::Ack })
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn roles(n: usize) -> Vec<RoleConfig> {
    (0..n)
        .map(|i| RoleConfig {
            handle: format!("seat-{i:05}"),
            placement: PlacementConfig::default(),
            ..Default::default()
        })
        .collect()
}

fn engine_cfg(id: &str) -> EngineConfig {
    EngineConfig {
        node_id: id.into(),
        owner: format!("{id}:scale"),
        labels: vec![],
        protocol: crewlet::config::protocol(),
        heartbeat: HEARTBEAT,
        sweep: SWEEP,
        claim_limit: CLAIM_LIMIT as usize,
        release_limit: RELEASE_LIMIT as usize,
        release_wait: HEARTBEAT,
        queue: QueueSettings::default(),
        handoff: Default::default(),
    }
}

async fn store_on(urls: &[String], name: &str) -> Arc<dyn Store> {
    let mut o = NatsOptions::new(urls.to_vec());
    o.lease_ttl = TTL;
    o.replicas = 3;
    o.name = name.to_string();
    let b = NatsBackend::connect(&o).await.expect("connect");
    Arc::new(Coordinator::new(b, CoordinatorOptions::default()))
}

/// One node of the fleet.
struct Node {
    id: String,
    engine: Arc<SeatEngine>,
    store: Arc<dyn Store>,
}

async fn node(urls: &[String], id: &str, seen: &Arc<Mutex<Seen>>) -> Node {
    let store = store_on(urls, &format!("crewlet-{id}")).await;
    let queue: Arc<dyn Queue> = Arc::new(TwinQueue::new(log_events()));
    let bus = EventBus::new(id, &format!("{id}:scale"));
    let mut rx = bus.subscribe();
    let seen = seen.clone();
    let node_id = id.to_string();
    tokio::spawn(async move {
        while let Ok(e) = rx.recv().await {
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .note(&node_id, &e.event);
        }
    });
    let tasks = Tasks::new();
    let first = company::active(&*store).await.unwrap().expect("company");
    let company_rx = company::follow(store.clone(), first, &tasks);
    let engine = SeatEngine::new(
        engine_cfg(id),
        store.clone(),
        queue,
        Arc::new(Idle),
        bus,
        company_rx,
        tasks,
    )
    .await
    .expect("engine");
    Node {
        id: id.to_string(),
        engine,
        store,
    }
}

/// What the fleet's events said, as they came.
#[derive(Default)]
struct Seen {
    /// Claim durations (ms) since the last take.
    claims: Vec<u64>,
    /// When each seat was last attached, and by which node.
    attached: BTreeMap<String, (Instant, String)>,
    /// Handoff dark times (ms) since the last take.
    handoff_dark: Vec<u64>,
}

impl Seen {
    fn note(&mut self, node: &str, e: &Event) {
        match e {
            Event::SeatClaimed { claim_ms, .. } => self.claims.push(*claim_ms),
            Event::SeatAttached { seat, .. } => {
                self.attached
                    .insert(seat.clone(), (Instant::now(), node.to_string()));
            }
            Event::SeatOfferTaken { dark_ms, .. } => self.handoff_dark.push(*dark_ms),
            _ => {}
        }
    }
}

/// The cluster's health as its monitoring endpoints said, sampled.
#[derive(Default)]
struct Health {
    /// The highest CPU (% of one core) each server reported.
    cpu_max: Vec<f64>,
    cpu_sum: Vec<f64>,
    samples: u64,
    /// Samples in which a server saw no meta leader.
    no_meta_leader: u64,
    /// Samples in which a replicated stream had no leader.
    no_stream_leader: u64,
    /// Meta leaders seen.
    meta_leaders: std::collections::BTreeSet<String>,
}

async fn sample(monitors: &[String], h: &Mutex<Health>) {
    let client = reqwest::Client::new();
    let mut cpus = Vec::new();
    let mut missing_meta = false;
    let mut missing_stream = false;
    let mut leaders = Vec::new();
    for m in monitors {
        let varz: serde_json::Value = match client.get(format!("{m}/varz")).send().await {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        cpus.push(varz["cpu"].as_f64().unwrap_or(0.0));
        let jsz: serde_json::Value = match client.get(format!("{m}/jsz?streams=true")).send().await
        {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        match jsz["meta_cluster"]["leader"].as_str() {
            Some(l) if !l.is_empty() => leaders.push(l.to_string()),
            _ => missing_meta = true,
        }
        for acc in jsz["account_details"].as_array().into_iter().flatten() {
            for s in acc["stream_detail"].as_array().into_iter().flatten() {
                if s["cluster"]["leader"].as_str().is_none_or(str::is_empty) {
                    missing_stream = true;
                }
            }
        }
    }
    let mut h = h.lock().unwrap_or_else(|e| e.into_inner());
    if h.cpu_max.len() < cpus.len() {
        h.cpu_max.resize(cpus.len(), 0.0);
        h.cpu_sum.resize(cpus.len(), 0.0);
    }
    for (i, c) in cpus.into_iter().enumerate() {
        h.cpu_max[i] = h.cpu_max[i].max(c);
        h.cpu_sum[i] += c;
    }
    h.samples += 1;
    h.no_meta_leader += u64::from(missing_meta);
    h.no_stream_leader += u64::from(missing_stream);
    h.meta_leaders.extend(leaders);
}

/// The coordination buckets' streams' last sequences summed: every write
/// the store took (each write is one stream message).
async fn store_writes(js: &async_nats::jetstream::Context) -> u64 {
    let mut total = 0;
    let mut names = js.stream_names();
    use futures::StreamExt;
    let mut kv = Vec::new();
    while let Some(Ok(n)) = names.next().await {
        if n.starts_with("KV_") {
            kv.push(n);
        }
    }
    for n in kv {
        if let Ok(mut s) = js.get_stream(&n).await
            && let Ok(i) = s.info().await
        {
            total += i.state.last_sequence;
        }
    }
    total
}

/// Messages the server sent the connection named `name` (its `/connz`).
async fn out_msgs(monitors: &[String], name: &str) -> u64 {
    let mut total = 0;
    for m in monitors {
        let body: serde_json::Value = match reqwest::get(format!("{m}/connz?limit=1024")).await {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => continue,
        };
        total += body["connections"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == name)
            .map(|c| c["out_msgs"].as_u64().unwrap_or(0))
            .sum::<u64>();
    }
    total
}

fn pct(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Wait until every seat is held by `nodes`, none above `share`; how long
/// it took, or `None` past `limit`.
async fn converge(nodes: &[Node], seats: usize, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    let share = seats.div_ceil(nodes.len().max(1));
    loop {
        let held: Vec<usize> = nodes.iter().map(|n| n.engine.host().held().len()).collect();
        if held.iter().sum::<usize>() == seats && held.iter().all(|h| *h <= share) {
            return Some(t0.elapsed());
        }
        if t0.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long until `node`'s live view of the lease bucket stops, waiting
/// up to its idle time and two heartbeats more (`None`: still running).
async fn view_stopped(node: &Node) -> Option<Duration> {
    let t0 = Instant::now();
    let deadline = crewlet::coord::view::DEFAULT_IDLE + HEARTBEAT * 2;
    while node.store.view_running() {
        if t0.elapsed() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Some(t0.elapsed())
}

fn spread(nodes: &[Node]) -> (usize, usize) {
    let held: Vec<usize> = nodes.iter().map(|n| n.engine.host().held().len()).collect();
    (
        held.iter().copied().max().unwrap_or(0),
        held.iter().copied().min().unwrap_or(0),
    )
}

/// One fleet size's figures.
struct Point {
    nodes: usize,
    seats: usize,
    cold: Option<Duration>,
    spread: (usize, usize),
    claim: (u64, u64, usize),
    writes_per_s: f64,
    writes_goal: f64,
    msgs_per_sweep: f64,
    /// How long after the cold start node 0's lease view stopped (`None`:
    /// still running at the deadline), and the renewals it makes a sweep.
    view_stopped: Option<Duration>,
    own_renewals_per_sweep: f64,
    cpu: String,
    quorum: String,
    killed: usize,
    after_kill: Option<Duration>,
    kill_dark: (u64, u64, usize),
    after_join: Option<Duration>,
    join_dark: (u64, u64, usize),
    rss_mib: f64,
}

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

async fn point(n: usize, seats: usize, limit: Duration) -> Point {
    // Servers as shipped: a 10,000-seat company revision (about 2 MB) is
    // kept in parts under the default 1 MiB payload limit.
    let cluster = support::nats::NatsCluster::start(3).await;
    let urls = cluster.urls();
    let monitors: Vec<String> = cluster.servers.iter().map(|s| s.monitor_url()).collect();
    let admin = store_on(&urls, "crewlet-apply").await;
    company::apply(&*admin, "scale", &roles(seats))
        .await
        .unwrap();
    let client = async_nats::connect(urls[0].as_str())
        .await
        .expect("connect");
    let js = async_nats::jetstream::new(client);

    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(node(&urls, &format!("n{i:03}"), &seen).await);
    }
    // The cluster's health, sampled for the whole run.
    let health = Arc::new(Mutex::new(Health::default()));
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (health, watching, monitors) = (health.clone(), watching.clone(), monitors.clone());
        tokio::spawn(async move {
            while watching.load(Ordering::Relaxed) {
                sample(&monitors, &health).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };

    // Cold start: every node at once.
    for node in &nodes {
        node.engine.start();
    }
    let cold = converge(&nodes, seats, limit).await;
    let spread_cold = spread(&nodes);
    let mut claims = std::mem::take(&mut seen.lock().unwrap_or_else(|e| e.into_inner()).claims);
    let claim = (pct(&mut claims, 0.5), pct(&mut claims, 0.99), claims.len());

    // Steady state, once node 0's live view of the lease bucket has
    // stopped (a minute after its last claim judged the gate, as
    // spec § Mixed-version fleets has it): three heartbeats.
    let view_stopped = view_stopped(&nodes[0]).await;
    let own_renewals_per_sweep =
        nodes[0].engine.host().held().len() as f64 * SWEEP.as_secs_f64() / HEARTBEAT.as_secs_f64();
    let window = HEARTBEAT * 3;
    let (w0, m0) = (
        store_writes(&js).await,
        out_msgs(&monitors, "crewlet-n000").await,
    );
    tokio::time::sleep(window).await;
    let (w1, m1) = (
        store_writes(&js).await,
        out_msgs(&monitors, "crewlet-n000").await,
    );
    let writes_per_s = (w1.saturating_sub(w0)) as f64 / window.as_secs_f64();
    let writes_goal = (seats + n) as f64 / HEARTBEAT.as_secs_f64();
    let msgs_per_sweep =
        (m1.saturating_sub(m0)) as f64 / (window.as_secs_f64() / SWEEP.as_secs_f64());
    let rss = rss_mib();

    // A tenth of the nodes crash (nothing given back).
    let killed = (n / 10).max(1);
    let gone: Vec<Node> = nodes.drain(..killed).collect();
    let orphans: Vec<String> = gone.iter().flat_map(|g| g.engine.host().held()).collect();
    let gone_ids: Vec<String> = gone.iter().map(|g| g.id.clone()).collect();
    let t_kill = Instant::now();
    for g in &gone {
        g.engine.crash().await;
    }
    let after_kill = converge(&nodes, seats, limit).await;
    let mut dark: Vec<u64> = {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        orphans
            .iter()
            .filter_map(|seat| s.attached.get(seat))
            .filter(|(at, by)| *at > t_kill && !gone_ids.contains(by))
            .map(|(at, _)| at.duration_since(t_kill).as_millis() as u64)
            .collect()
    };
    let kill_dark = (pct(&mut dark, 0.5), pct(&mut dark, 0.99), dark.len());

    // As many join.
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .handoff_dark
        .clear();
    let mut joined = Vec::new();
    for i in 0..killed {
        joined.push(node(&urls, &format!("j{i:03}"), &seen).await);
    }
    for j in &joined {
        j.engine.start();
    }
    nodes.extend(joined);
    let after_join = converge(&nodes, seats, limit).await;
    let mut hd = std::mem::take(&mut seen.lock().unwrap_or_else(|e| e.into_inner()).handoff_dark);
    let join_dark = (pct(&mut hd, 0.5), pct(&mut hd, 0.99), hd.len());

    watching.store(false, Ordering::Relaxed);
    let _ = watcher.await;
    for node in nodes.iter().chain(gone.iter()) {
        node.engine.crash().await;
    }
    let h = health.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = h
        .cpu_max
        .iter()
        .zip(&h.cpu_sum)
        .map(|(max, sum)| format!("{:.0}/{:.0}", sum / h.samples.max(1) as f64, max))
        .collect::<Vec<_>>()
        .join(", ");
    let quorum = if h.no_meta_leader == 0 && h.no_stream_leader == 0 && h.meta_leaders.len() <= 1 {
        format!("kept ({} samples)", h.samples)
    } else {
        format!(
            "LOST: {} samples without a meta leader, {} with a stream leaderless, meta leaders {:?}",
            h.no_meta_leader, h.no_stream_leader, h.meta_leaders
        )
    };
    Point {
        nodes: n,
        seats,
        cold,
        spread: spread_cold,
        claim,
        writes_per_s,
        writes_goal,
        msgs_per_sweep,
        view_stopped,
        own_renewals_per_sweep,
        cpu,
        quorum,
        killed,
        after_kill,
        kill_dark,
        after_join,
        join_dark,
        rss_mib: rss,
    }
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(
        || "not converged".into(),
        |d| format!("{:.1} s", d.as_secs_f64()),
    )
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let sizes: Vec<usize> = std::env::var("CREWLET_SCALE_NODES")
        .unwrap_or_else(|_| "10,25,50,100".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let seats = env_number("CREWLET_SCALE_SEATS", 10_000) as usize;
    let limit = Duration::from_secs(env_number("CREWLET_SCALE_LIMIT_S", 300));
    println!();
    println!(
        "| scale (3-server cluster on loopback; TTL {} s, heartbeat {} s, sweep {} s, claim limit {CLAIM_LIMIT}, release limit {RELEASE_LIMIT}) | measured | goal |",
        TTL.as_secs(),
        HEARTBEAT.as_secs(),
        SWEEP.as_secs()
    );
    println!("|---|---|---|");
    for n in sizes {
        let t = Instant::now();
        eprintln!("scale: {n} nodes, {seats} seats: starting");
        let p = point(n, seats, limit).await;
        eprintln!(
            "scale: {n} nodes done in {:.0} s (cold start {})",
            t.elapsed().as_secs_f64(),
            secs(p.cold)
        );
        // Each size's rows as soon as it is measured.
        rows(&p);
        if p.cold.is_none() || p.after_kill.is_none() {
            eprintln!("scale: {n} nodes did not converge within {limit:?}; the curve stops here");
            break;
        }
    }
}

fn rows(p: &Point) {
    use std::io::Write;
    let f = format!("{} nodes / {} seats", p.nodes, p.seats);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "| {f}: cold start, every seat held | {}; seats per node most {} / fewest {} | converges |",
        secs(p.cold),
        p.spread.0,
        p.spread.1
    );
    let _ = writeln!(
        out,
        "| {f}: claim during the cold start | p50 {} ms / p99 {} ms ({} claims) | — |",
        p.claim.0, p.claim.1, p.claim.2
    );
    let _ = writeln!(
        out,
        "| {f}: steady-state store writes | {:.0} /s against (seats + nodes) ÷ heartbeat = {:.0} /s (×{:.2}) | ≤ ×1.0 |",
        p.writes_per_s,
        p.writes_goal,
        p.writes_per_s / p.writes_goal.max(1.0)
    );
    let view = match p.view_stopped {
        Some(d) => format!(
            "its lease view stopped {:.0} s after the cold start",
            d.as_secs_f64()
        ),
        None => "its lease view still running".to_string(),
    };
    let _ = writeln!(
        out,
        "| {f}: messages one node receives per sweep (steady; {view}) | {:.1} | ≤ 2 × its {:.0} renewals + 50 = {:.0} |",
        p.msgs_per_sweep,
        p.own_renewals_per_sweep,
        2.0 * p.own_renewals_per_sweep + 50.0
    );
    let _ = writeln!(
        out,
        "| {f}: each server's CPU, mean/max % of one core; quorum | {}; {} | no stall |",
        p.cpu, p.quorum
    );
    let _ = writeln!(
        out,
        "| {f}: {} killed → every seat held again; dark time per moved seat | {}; p50 {} ms / p99 {} ms ({} seats) | ≈ TTL + sweep |",
        p.killed,
        secs(p.after_kill),
        p.kill_dark.0,
        p.kill_dark.1,
        p.kill_dark.2
    );
    let _ = writeln!(
        out,
        "| {f}: {} joining → shares even; handoff dark time per moved seat | {}; p50 {} ms / p99 {} ms ({} seats) | — |",
        p.killed,
        secs(p.after_join),
        p.join_dark.0,
        p.join_dark.1,
        p.join_dark.2
    );
    let _ = writeln!(
        out,
        "| {f}: this process's resident memory (every node) | {:.0} MiB | — |",
        p.rss_mib
    );
    let _ = out.flush();
}
