//! A seat's memory replay on a 3-server cluster reads up to the stream
//! leader's last row, whichever member serves the replay's consumer.
//!
//! Found by the chaos harness: a seat handed back gracefully flushed its
//! rows (acknowledged by a quorum) while a cluster member had just
//! restarted; the next holder's replay read through a consumer served by
//! that member, which had not caught up, took its "nothing pending" for the
//! end, and the handed-over rows were missing from the new holder.

mod support;

use std::time::Duration;

use crewlet::memory::MemoryStore;
use crewlet::memory::changelog::{self, Changelog, NatsChangelog};

async fn store(dir: &std::path::Path) -> MemoryStore {
    let pool = crewlet::db::open(dir, &crewlet::db::MIGRATOR)
        .await
        .unwrap();
    MemoryStore::new(pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_read_from_a_member_behind_left_a_handoffs_rows_behind() {
    let mut cluster = support::nats::NatsCluster::start(3).await;
    let client = async_nats::connect(cluster.urls()).await.unwrap();
    let log = NatsChangelog::new(client.clone(), 3, Duration::from_secs(2))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let giver = store(dir.path()).await;
    for i in 0..20 {
        giver
            .diary_write("s", &format!("before {i}"), None)
            .await
            .unwrap();
    }
    changelog::flush(&giver, &log, "s").await.unwrap();

    // A member of the changelog's stream goes down, and comes back while
    // the rest of the seat's rows are flushed — the hand-back's last flush.
    let js = async_nats::jetstream::new(client.clone());
    let leader = cluster.leader_of(&js, "CREWLET_MEMORY").await.unwrap();
    let behind = (leader + 1) % 3;
    cluster.servers[behind].kill();
    for i in 0..200 {
        giver
            .diary_write("s", &format!("handed over {i}"), None)
            .await
            .unwrap();
    }
    changelog::flush(&giver, &log, "s").await.unwrap();
    cluster.servers[behind].restart().await;

    // Replays right away, through the member that is catching up and
    // through the others: each has every row.
    let near = async_nats::connect(cluster.servers[behind].url())
        .await
        .unwrap();
    let near_log = NatsChangelog::new(near, 3, Duration::from_secs(2))
        .await
        .unwrap();
    for attempt in 0..10 {
        for (which, l) in [("the restarted member", &near_log), ("any member", &log)] {
            let rows = l.replay("s").await.unwrap();
            assert_eq!(
                rows.len(),
                220,
                "replay {attempt} through {which} read {} rows",
                rows.len()
            );
        }
    }
}
