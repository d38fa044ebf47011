//! A seat's memory replay on a 3-server cluster reads up to the stream
//! leader's last row, whichever member serves the replay's consumer.
//!
//! Found by the chaos harness: a seat handed back gracefully flushed its
//! rows (acknowledged by a quorum) while a cluster member had just
//! restarted; the next holder's replay read through a consumer served by
//! that member, which had not caught up, took its "nothing pending" for the
//! end, and the handed-over rows were missing from the new holder.

use crate::support;

use std::time::Duration;

use crewlet::memory::MemoryStore;
use crewlet::memory::changelog::{self, Changelog, NatsChangelog};

async fn store(dir: &std::path::Path) -> MemoryStore {
    let pool = crewlet::db::open(dir, &crewlet::db::MIGRATOR)
        .await
        .unwrap();
    MemoryStore::new(pool)
}

/// The changelog read through `member` alone, once it answers for the
/// stream: a member restarted into the cluster answers only after its
/// routes are back (under load, seconds after it serves clients); its
/// copy of the stream may still be catching up — what the replays race.
async fn through_member(member: &support::nats::NatsServer) -> NatsChangelog {
    let near = async_nats::connect(member.url()).await.unwrap();
    support::wait_for(
        "the restarted member to answer for CREWLET_MEMORY",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let near = near.clone();
            async move {
                NatsChangelog::new(near, 3, Duration::from_secs(2))
                    .await
                    .ok()
            }
        },
    )
    .await
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
    let near_log = through_member(&cluster.servers[behind]).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_through_a_member_catching_up_while_rows_keep_coming_has_every_row() {
    // A member misses a flush, comes back, and more rows are flushed while
    // it catches up; replays through it start at once and see every row.
    // (The chaos soak's seed 1039 — a hydration missing one episode with
    // later rows present — was not reproduced this way; the completion
    // from the leader that answers it is tested below.)
    let mut cluster = support::nats::NatsCluster::start(3).await;
    let client = async_nats::connect(cluster.urls()).await.unwrap();
    let log = NatsChangelog::new(client.clone(), 3, Duration::from_secs(2))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let giver = store(dir.path()).await;
    let js = async_nats::jetstream::new(client.clone());
    let mut written = 0;
    for round in 0..3 {
        let leader = cluster.leader_of(&js, "CREWLET_MEMORY").await.unwrap();
        let behind = (leader + 1) % 3;
        cluster.servers[behind].kill();
        for i in 0..150 {
            giver
                .diary_write("s", &format!("missed {round}.{i}"), None)
                .await
                .unwrap();
            written += 1;
        }
        changelog::flush(&giver, &log, "s").await.unwrap();
        cluster.servers[behind].restart().await;
        let near_log = through_member(&cluster.servers[behind]).await;
        for i in 0..30 {
            giver
                .diary_write("s", &format!("while catching up {round}.{i}"), None)
                .await
                .unwrap();
            written += 1;
            changelog::flush(&giver, &log, "s").await.unwrap();
            let rows = near_log.replay("s").await.unwrap();
            assert_eq!(
                rows.len(),
                written,
                "round {round}, replay {i} through the member catching up"
            );
        }
    }
}

#[tokio::test]
async fn a_replay_that_skipped_rows_is_completed_from_the_streams_leader() {
    let server = support::nats::NatsServer::start().await;
    let client = async_nats::connect(server.url()).await.unwrap();
    let log = NatsChangelog::new(client, 1, Duration::from_secs(2))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let giver = store(dir.path()).await;
    for i in 0..10 {
        giver
            .diary_write("s", &format!("row {i}"), None)
            .await
            .unwrap();
    }
    giver
        .diary_write("other", "another seat's row", None)
        .await
        .unwrap();
    changelog::flush(&giver, &log, "s").await.unwrap();
    changelog::flush(&giver, &log, "other").await.unwrap();
    let all = log.replay("s").await.unwrap();
    assert_eq!(all.len(), 10);
    // A consumer that skipped two rows in the middle and the last one.
    let skipped: Vec<_> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| ![3, 4, 9].contains(i))
        .map(|(_, r)| r.clone())
        .collect();
    let completed = log.complete("s", skipped).await.unwrap();
    let mut got: Vec<_> = completed.iter().map(|r| r.id.clone()).collect();
    let mut want: Vec<_> = all.iter().map(|r| r.id.clone()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "every row of the seat, none of another seat's");
}
