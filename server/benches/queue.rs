//! The boot walk on NATS: creating the three mailboxes (inbox, control,
//! reflect) of every seat of a 1,000-seat company, as every node does
//! before it claims anything (seed spec § The unowned seat: 1.7 ms a seat).
//! Prints a table; asserts nothing about time.
//!
//! `cargo bench -p server --bench queue` (starts its own nats-server, its
//! store in the temp dir: `TMPDIR=/dev/shm` keeps it in memory, which
//! separates the server's cost from the disk's — each consumer create
//! writes the consumer's state to the store).
//!
//! The walks run in a task on the runtime's workers, where a node walks
//! (awaited on the `block_on` thread, every round trip would hop threads).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::Instant;

use crewlet::queue::jetstream::{JetStreamQueue, JetStreamSettings};
use crewlet::queue::{QueueSettings, boot_walk, log_events};

const SEATS: usize = 1_000;

#[tokio::main]
async fn main() {
    if let Err(e) = tokio::spawn(walks()).await {
        eprintln!("queue bench: the measuring task failed: {e}");
        std::process::exit(1);
    }
}

async fn walks() {
    let server = support::nats::NatsServer::start().await;
    let client = async_nats::connect(server.url()).await.expect("connect");
    let q = JetStreamQueue::new(client, JetStreamSettings::default(), log_events())
        .await
        .expect("streams");
    let handles: Vec<String> = (0..SEATS).map(|i| format!("seat-{i:05}")).collect();

    // The first walk creates 3 subscriptions a seat; the second finds them.
    let mut walks = Vec::new();
    for _ in 0..2 {
        let t = Instant::now();
        boot_walk(
            &q,
            handles.iter().map(String::as_str),
            QueueSettings::default(),
        )
        .await
        .expect("walk");
        walks.push(t.elapsed());
    }
    let (cold, warm) = (walks[0], walks[1]);

    let per = |d: std::time::Duration| d.as_secs_f64() * 1000.0 / SEATS as f64;
    println!();
    println!(
        "| boot walk, {SEATS} seats on NATS (single server, loopback) | total | per seat | goal |"
    );
    println!("|---|---|---|---|");
    println!(
        "| first walk (creates 3 subscriptions a seat) | {:.0} ms | {:.2} ms | ≤ 2 ms (seed: 1.7 ms) |",
        cold.as_secs_f64() * 1000.0,
        per(cold)
    );
    println!(
        "| second walk (every subscription exists: compare only) | {:.0} ms | {:.2} ms | — |",
        warm.as_secs_f64() * 1000.0,
        per(warm)
    );
}
