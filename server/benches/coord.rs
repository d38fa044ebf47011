//! Coordination store benchmark: prints a table, asserts nothing.
//!
//! Run: `cargo bench -p server --bench coord`. Starts its own nats-servers
//! (single server, loopback, one per scenario) and measures, each row beside
//! its baseline in one run:
//! - claim and renew latency p50/p99 with 10 vs 10,000 leases held;
//! - the protocol-floor question ("is any live presence or seat lease held
//!   at a lower protocol?") answered from the live view, with 10 vs 10,000
//!   leases held;
//! - the primitives a claim is made of (one compare-and-set write, one read
//!   from the leader), for scale;
//! - the same on the in-process twin;
//! - where the server allows it (JetStream API level 2: nats-server 2.12
//!   and later), the claim, renew and floor rows again with every claim one
//!   atomic batch (`coordination.atomic_claim`), beside the three-write rows.
//!
//! The 10 and the 10,000 scenario are sampled alternately, one sample each
//! in turn, so whatever else the machine is doing weighs on both alike.
//!
//! Every row is measured from a task spawned on the runtime's workers, which
//! is where a node makes its claims (the placement sweep, the renewal loop
//! and the HTTP handlers are all spawned tasks). One extra row measures the
//! same claim awaited on the runtime's `block_on` thread instead: the
//! client's connection task runs on a worker, so every round trip there
//! pays a hop between threads.
//!
//! Goal (issue 3): claim p50 ≤ 0.5 ms on single-server loopback, and every
//! row flat (10,000 / 10 ratio ≤ 1.2).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use crewlet::coord::{
    Backend, BucketId, Claim, ClaimRequest, Coordinator, CoordinatorOptions, Lease, NatsBackend,
    NatsOptions, Renewal, Store, TwinBackend,
};
use crewlet::tasks::Tasks;
use support::nats::NatsServer;

const SAMPLES: usize = 1000;
const OWNER: &str = "bench-node:00000001";
const HELD: [usize; 2] = [10, 10_000];

struct Row {
    op: String,
    held: usize,
    p50: Duration,
    p99: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn row(op: String, held: usize, mut samples: Vec<Duration>) -> Row {
    samples.sort();
    Row {
        op,
        held,
        p50: percentile(&samples, 0.50),
        p99: percentile(&samples, 0.99),
    }
}

fn options() -> CoordinatorOptions {
    CoordinatorOptions {
        store_timeout: Duration::from_secs(5),
        view_idle: Duration::from_secs(60),
        tasks: Tasks::new(),
    }
}

async fn claim<B: Backend>(
    store: &Coordinator<B>,
    resource: &str,
    protocol: u32,
) -> Result<Lease, String> {
    let req = ClaimRequest::new(resource, OWNER, "bench-node").with_protocol(protocol);
    match store.claim(req).await {
        Ok(Claim::Won(l)) => Ok(l),
        other => Err(format!("claim {resource}: {other:?}")),
    }
}

/// One store holding `held` leases (one of them a presence lease at a
/// lower protocol, so the floor has something to find).
struct Scenario<B: Backend> {
    held: usize,
    store: Coordinator<B>,
    leases: Vec<Lease>,
    _server: Option<NatsServer>,
}

async fn fill<B: Backend>(
    store: Coordinator<B>,
    held: usize,
    server: Option<NatsServer>,
) -> Result<Scenario<B>, String> {
    claim(&store, "node:old-node", 3).await?;
    let mut leases = Vec::with_capacity(held);
    for i in 0..held.saturating_sub(1) {
        leases.push(claim(&store, &format!("seat:held{i:05}"), 4).await?);
    }
    Ok(Scenario {
        held,
        store,
        leases,
        _server: server,
    })
}

async fn nats_scenario(held: usize) -> Result<Scenario<NatsBackend>, String> {
    nats_scenario_with(held, false)
        .await?
        .ok_or_else(|| "no store".to_string())
}

/// A NATS scenario; with `atomic`, `None` when the server has no atomic
/// batch (API level below 2).
async fn nats_scenario_with(
    held: usize,
    atomic: bool,
) -> Result<Option<Scenario<NatsBackend>>, String> {
    let server = NatsServer::start().await;
    let mut o = NatsOptions::new(vec![server.url()]);
    o.lease_ttl = Duration::from_secs(600);
    o.store_timeout = Duration::from_secs(5);
    o.atomic_claim = atomic;
    let backend = NatsBackend::connect(&o).await.map_err(|e| e.to_string())?;
    if atomic && !backend.atomic() {
        return Ok(None);
    }
    fill(Coordinator::new(backend, options()), held, Some(server))
        .await
        .map(Some)
}

async fn twin_scenario(held: usize) -> Result<Scenario<TwinBackend>, String> {
    let backend = TwinBackend::new(Duration::from_secs(600));
    fill(Coordinator::new(backend, options()), held, None).await
}

/// Claim, renew and floor rows for both scenarios, sampled alternately.
async fn measure<B: Backend>(
    tag: &str,
    sc: &mut [Scenario<B>],
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    let mut claims = vec![Vec::with_capacity(SAMPLES); sc.len()];
    let mut renews = vec![Vec::with_capacity(SAMPLES); sc.len()];
    let mut floors = vec![Vec::with_capacity(SAMPLES); sc.len()];
    let mut cold = vec![Duration::ZERO; sc.len()];

    for i in 0..SAMPLES {
        for (j, s) in sc.iter_mut().enumerate() {
            let t = Instant::now();
            let l = claim(&s.store, &format!("seat:m{i:05}"), 4).await?;
            claims[j].push(t.elapsed());
            // Given back, so the held count stays what the row says.
            s.store
                .release(&l, OWNER)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    for i in 0..SAMPLES {
        for (j, s) in sc.iter_mut().enumerate() {
            let idx = i % s.leases.len().max(1);
            let Some(lease) = s.leases.get(idx) else {
                continue;
            };
            let t = Instant::now();
            let r = s.store.renew(lease, OWNER, None).await;
            renews[j].push(t.elapsed());
            match r {
                Renewal::Renewed(l) => s.leases[idx] = l,
                other => return Err(format!("renew: {other:?}")),
            }
        }
    }
    for (j, s) in sc.iter().enumerate() {
        let t = Instant::now();
        let floor = s.store.protocol_floor(4).await.map_err(|e| e.to_string())?;
        cold[j] = t.elapsed();
        if floor != Some(3) {
            return Err(format!("the floor should be 3, read {floor:?}"));
        }
    }
    for _ in 0..SAMPLES {
        for (j, s) in sc.iter().enumerate() {
            let t = Instant::now();
            s.store.protocol_floor(4).await.map_err(|e| e.to_string())?;
            floors[j].push(t.elapsed());
        }
    }
    for (j, s) in sc.iter().enumerate() {
        rows.push(row(
            format!("{tag} claim"),
            s.held,
            std::mem::take(&mut claims[j]),
        ));
        rows.push(row(
            format!("{tag} renew"),
            s.held,
            std::mem::take(&mut renews[j]),
        ));
        rows.push(row(
            format!("{tag} protocol floor (live view)"),
            s.held,
            std::mem::take(&mut floors[j]),
        ));
        rows.push(Row {
            op: format!("{tag} protocol floor, view cold start (once)"),
            held: s.held,
            p50: cold[j],
            p99: cold[j],
        });
    }
    Ok(())
}

/// The primitives a claim is made of, on the same servers: one
/// compare-and-set write, and one read from the leader.
async fn baseline(sc: &[Scenario<NatsBackend>], rows: &mut Vec<Row>) -> Result<(), String> {
    let key = "seat:baseline";
    let mut revs = Vec::new();
    for s in sc {
        let w = s
            .store
            .backend()
            .create(BucketId::Leases, key, Bytes::from_static(b"{}"))
            .await
            .map_err(|e| format!("{e:?}"))?;
        revs.push(w.revision);
    }
    let mut writes = vec![Vec::with_capacity(SAMPLES); sc.len()];
    let mut reads = vec![Vec::with_capacity(SAMPLES); sc.len()];
    for _ in 0..SAMPLES {
        for (j, s) in sc.iter().enumerate() {
            let be = s.store.backend();
            let t = Instant::now();
            revs[j] = be
                .update(BucketId::Leases, key, Bytes::from_static(b"{}"), revs[j])
                .await
                .map_err(|e| format!("{e:?}"))?
                .revision;
            writes[j].push(t.elapsed());
            let t = Instant::now();
            be.get(BucketId::Leases, key)
                .await
                .map_err(|e| e.to_string())?;
            reads[j].push(t.elapsed());
        }
    }
    for (j, s) in sc.iter().enumerate() {
        let w = std::mem::take(&mut writes[j]);
        let r = std::mem::take(&mut reads[j]);
        rows.push(row("nats baseline: one CAS write".into(), s.held, w));
        rows.push(row("nats baseline: one leader read".into(), s.held, r));
    }
    Ok(())
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

async fn run(rows: &mut Vec<Row>) -> Result<(), String> {
    let mut nats = Vec::new();
    for held in HELD {
        nats.push(nats_scenario(held).await?);
    }
    measure("nats", &mut nats, rows).await?;
    baseline(&nats, rows).await?;
    drop(nats);
    let mut atomic = Vec::new();
    for held in HELD {
        if let Some(sc) = nats_scenario_with(held, true).await? {
            atomic.push(sc);
        }
    }
    if atomic.is_empty() {
        println!(
            "atomic claim rows: not measured ({} has no atomic batch: JetStream API level 2, \
             nats-server 2.12 or later)",
            support::nats::version_words()
        );
    } else {
        measure("nats atomic", &mut atomic, rows).await?;
    }
    drop(atomic);
    let mut twin = Vec::new();
    for held in HELD {
        twin.push(twin_scenario(held).await?);
    }
    measure("twin", &mut twin, rows).await
}

/// The claim row again, awaited on the thread that called `block_on`
/// rather than on a worker (10 leases held).
async fn claims_off_the_workers(rows: &mut Vec<Row>) -> Result<(), String> {
    let sc = nats_scenario(HELD[0]).await?;
    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let t = Instant::now();
        let l = claim(&sc.store, &format!("seat:b{i:05}"), 4).await?;
        samples.push(t.elapsed());
        sc.store
            .release(&l, OWNER)
            .await
            .map_err(|e| e.to_string())?;
    }
    rows.push(row(
        "nats claim, awaited on the block_on thread (a thread hop per round trip)".into(),
        sc.held,
        samples,
    ));
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let measured = tokio::spawn(async {
        let mut rows = Vec::new();
        run(&mut rows).await.map(|()| rows)
    })
    .await;
    let mut rows = match measured {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => {
            eprintln!("coord bench: {e}");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("coord bench: the measuring task failed: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = claims_off_the_workers(&mut rows).await {
        eprintln!("coord bench: {e}");
        std::process::exit(1);
    }

    println!(
        "\ncoordination store on one {} (loopback) and on the in-process twin; \
         {SAMPLES} samples per row, the 10 and 10,000 scenarios sampled alternately. A claim \
         is 3 writes + 2 reads in 3 round trips (the counter reads ride beside the first \
         write, the timestamp read right behind the token write); an atomic claim is 3 reads \
         in one round trip, then one batch of 2 writes with the timestamp read behind it; a \
         renewal is 1 write + 1 pipelined read, counted from the clock's bounds when that \
         read was answered first. Measured from a task on the runtime's workers, as a node \
         claims.\n",
        support::nats::version_words()
    );
    println!("| op | leases held | p50 µs | p99 µs | p50 ratio 10,000/10 |");
    println!("|---|---:|---:|---:|---:|");
    rows.sort_by_key(|r| {
        (
            !r.op.starts_with("nats"),
            r.op.contains("baseline"),
            r.op.contains("cold"),
            r.op.clone(),
            r.held,
        )
    });
    for r in &rows {
        let base = rows.iter().find(|b| b.op == r.op && b.held == HELD[0]);
        let ratio = match base {
            Some(b) if r.held != HELD[0] && !b.p50.is_zero() => {
                format!("{:.2}", r.p50.as_secs_f64() / b.p50.as_secs_f64())
            }
            _ => String::new(),
        };
        println!(
            "| {} | {} | {} | {} | {} |",
            r.op,
            r.held,
            us(r.p50),
            us(r.p99),
            ratio
        );
    }
}
