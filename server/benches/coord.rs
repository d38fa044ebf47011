//! Coordination store benchmark: prints a table, asserts nothing.
//!
//! Run: `cargo bench -p server --bench coord`. Starts its own nats-server
//! (one per row group, single server, loopback) and measures, each beside
//! its baseline in one run:
//! - claim and renew latency p50/p99 with 10 vs 10,000 leases held;
//! - the protocol-floor question ("is any live presence or seat lease held
//!   at a lower protocol?") answered from the live view, with 10 vs 10,000
//!   leases held.
//!
//! Goal (issue 3): claim p50 ≤ 0.5 ms on single-server loopback, and every
//! row flat (10,000 / 10 ratio ≤ 1.2).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use crewlet::coord::{
    Backend, BucketId, Claim, ClaimRequest, Coordinator, CoordinatorOptions, Lease, LocalStore,
    MemoryBackend, NatsBackend, NatsOptions, Renewal, Store,
};
use crewlet::tasks::Tasks;
use support::nats::NatsServer;

const SAMPLES: usize = 1000;
const OWNER: &str = "bench-node:00000001";

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

async fn claim(store: &impl Store, resource: &str, protocol: u32) -> Result<Lease, String> {
    match store
        .claim(ClaimRequest::new(resource, OWNER, "bench-node").with_protocol(protocol))
        .await
    {
        Ok(Claim::Won(l)) => Ok(l),
        other => Err(format!("claim {resource}: {other:?}")),
    }
}

/// Hold `held` leases, then measure claims, renewals and the floor.
async fn measure(
    store: &impl Store,
    held: usize,
    rows: &mut Vec<Row>,
    tag: &'static str,
) -> Result<(), String> {
    let mut leases = Vec::with_capacity(held);
    // One presence lease at a lower protocol, so the floor has something to find.
    claim(store, "node:old-node", 3).await?;
    for i in 0..held.saturating_sub(1) {
        leases.push(claim(store, &format!("seat:held{i:05}"), 4).await?);
    }

    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let r = format!("seat:m{i:05}");
        let t = Instant::now();
        let l = claim(store, &r, 4).await?;
        samples.push(t.elapsed());
        // Give it back so the held count stays what the row says.
        store.release(&l, OWNER).await.map_err(|e| e.to_string())?;
    }
    rows.push(row(label(tag, "claim"), held, samples));

    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let Some(idx) = (!leases.is_empty()).then(|| i % leases.len()) else {
            break;
        };
        let t = Instant::now();
        let r = store.renew(&leases[idx], OWNER, None).await;
        samples.push(t.elapsed());
        match r {
            Renewal::Renewed(l) => leases[idx] = l,
            other => return Err(format!("renew: {other:?}")),
        }
    }
    rows.push(row(label(tag, "renew"), held, samples));

    let t = Instant::now();
    let floor = store.protocol_floor(4).await.map_err(|e| e.to_string())?;
    rows.push(Row {
        op: label(tag, "floor, view cold start"),
        held,
        p50: t.elapsed(),
        p99: t.elapsed(),
    });
    if floor != Some(3) {
        return Err(format!("the floor should be 3, read {floor:?}"));
    }
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let t = Instant::now();
        store.protocol_floor(4).await.map_err(|e| e.to_string())?;
        samples.push(t.elapsed());
    }
    rows.push(row(label(tag, "protocol floor (live view)"), held, samples));
    Ok(())
}

fn label(tag: &str, op: &str) -> String {
    format!("{tag} {op}")
}

async fn nats_rows(held: usize, rows: &mut Vec<Row>) -> Result<(), String> {
    let server = NatsServer::start().await;
    let mut o = NatsOptions::new(vec![server.url()]);
    o.lease_ttl = Duration::from_secs(600);
    o.store_timeout = Duration::from_secs(5);
    let backend = NatsBackend::connect(&o).await.map_err(|e| e.to_string())?;
    let store = Coordinator::new(backend, options());
    measure(&store, held, rows, "nats").await?;
    baseline(store.backend(), held, rows).await
}

/// The primitives a claim is made of, on the same server: one
/// compare-and-set write, and one read from the leader.
async fn baseline(be: &NatsBackend, held: usize, rows: &mut Vec<Row>) -> Result<(), String> {
    let key = "seat:baseline";
    let mut rev = be
        .create(BucketId::Leases, key, Bytes::from_static(b"{}"))
        .await
        .map_err(|e| format!("{e:?}"))?
        .revision;
    let mut writes = Vec::with_capacity(SAMPLES);
    let mut reads = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let t = Instant::now();
        rev = be
            .update(BucketId::Leases, key, Bytes::from_static(b"{}"), rev)
            .await
            .map_err(|e| format!("{e:?}"))?
            .revision;
        writes.push(t.elapsed());
        let t = Instant::now();
        be.get(BucketId::Leases, key)
            .await
            .map_err(|e| e.to_string())?;
        reads.push(t.elapsed());
    }
    rows.push(row(label("nats", "baseline: one CAS write"), held, writes));
    rows.push(row(label("nats", "baseline: one leader read"), held, reads));
    Ok(())
}

async fn twin_rows(held: usize, rows: &mut Vec<Row>) -> Result<(), String> {
    let store: LocalStore =
        Coordinator::new(MemoryBackend::new(Duration::from_secs(600)), options());
    measure(&store, held, rows, "twin").await
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut rows = Vec::new();
    for held in [10, 10_000] {
        if let Err(e) = nats_rows(held, &mut rows).await {
            eprintln!("nats with {held} held: {e}");
            std::process::exit(1);
        }
    }
    for held in [10, 10_000] {
        if let Err(e) = twin_rows(held, &mut rows).await {
            eprintln!("twin with {held} held: {e}");
            std::process::exit(1);
        }
    }

    println!(
        "\ncoordination store on one nats-server 2.9 (loopback) and on the in-process twin; \
         {SAMPLES} samples per row. A claim is 3 writes + 2 reads in 3 round trips (the \
         counter read rides beside the first write, the timestamp read right behind the \
         token write); a renewal is 1 write + 1 pipelined read.\n"
    );
    println!("| op | leases held | p50 µs | p99 µs | p50 ratio 10,000/10 |");
    println!("|---|---:|---:|---:|---:|");
    rows.sort_by_key(|r| {
        (
            !r.op.starts_with("nats"),
            r.op.contains("baseline"),
            r.op.clone(),
            r.held,
        )
    });
    for r in &rows {
        let base = rows.iter().find(|b| b.op == r.op && b.held == 10);
        let ratio = match base {
            Some(b) if r.held != 10 && !b.p50.is_zero() => {
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
