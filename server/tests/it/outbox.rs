//! The outbox on both backends: an effect is kept once per identity, and
//! on NATS a post that meets a stream with no leader is tried again until
//! it lands (found by the chaos harness: a restart of NATS lost effects
//! whose turns the ledger then recorded as done).

use crate::support;

use std::time::Duration;

use crewlet::engine::outbox::{Effect, NatsOutbox, Outbox, TwinOutbox};

fn effect(seat: &str, turn: &str) -> Effect {
    Effect {
        work_key: Some("w1".into()),
        trigger_ids: vec!["evt-1".into()],
        seat: seat.into(),
        node: "n".into(),
        incarnation: "n:1".into(),
        epoch: 1,
        turn_id: turn.into(),
        kind: "post_outbox".into(),
        body: serde_json::json!({"text": "hello"}),
        at: None,
    }
}

async fn the_same_effect_posted_twice_is_kept_once(outbox: &dyn Outbox) {
    // A re-run of the same work posts under the same identity.
    outbox
        .post(&effect("s", "turn-1"), "effect-a")
        .await
        .unwrap();
    outbox
        .post(&effect("s", "turn-2"), "effect-a")
        .await
        .unwrap();
    outbox
        .post(&effect("s", "turn-2"), "effect-b")
        .await
        .unwrap();
    let kept = outbox.read(Some("s")).await.unwrap();
    let turns: Vec<&str> = kept.iter().map(|e| e.turn_id.as_str()).collect();
    assert_eq!(turns, ["turn-1", "turn-2"], "one effect per identity");
}

#[tokio::test]
async fn twin_the_same_effect_posted_twice_is_kept_once() {
    the_same_effect_posted_twice_is_kept_once(&TwinOutbox::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_the_same_effect_posted_twice_is_kept_once() {
    let server = support::nats::NatsServer::start().await;
    let client = async_nats::connect(server.url()).await.unwrap();
    let outbox = NatsOutbox::new(client, 1, Duration::from_secs(2))
        .await
        .unwrap();
    the_same_effect_posted_twice_is_kept_once(&outbox).await;
}

/// The server stops answering (SIGSTOP: open sockets, no answers — a
/// stream between leaders looks the same) while a turn posts its effect.
/// One attempt failed, the turn finished, the ledger recorded it done and
/// the effect was never shipped. The post is tried again, under the same
/// identity, until the server answers: the effect lands, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_posted_during_a_leader_election_was_lost() {
    let server = support::nats::NatsServer::start().await;
    let client = async_nats::connect(server.url()).await.unwrap();
    let outbox = std::sync::Arc::new(
        NatsOutbox::new(client, 1, Duration::from_millis(500))
            .await
            .unwrap(),
    );
    let pid = server.pid().unwrap() as i32;
    // SAFETY: kill(2) on the nats-server this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let post = {
        let outbox = outbox.clone();
        tokio::spawn(async move { outbox.post(&effect("s", "turn-1"), "effect-a").await })
    };
    // The fault: two seconds of silence, four post timeouts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    unsafe { libc::kill(pid, libc::SIGCONT) };
    post.await
        .unwrap()
        .expect("the post lands once the server answers");
    let kept = outbox.read(Some("s")).await.unwrap();
    assert_eq!(
        kept.len(),
        1,
        "every attempt carried one identity: {kept:?}"
    );
}
