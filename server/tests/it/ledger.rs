//! The completion ledger against the coordination store, on the twin and
//! on a real nats-server: what one node records, a peer finds; a partial
//! overlap runs only the new trigger; both directions fail open.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use crewlet::coord::{
    Coordinator, CoordinatorOptions, NatsBackend, NatsOptions, Store, TwinBackend,
};
use crewlet::engine::envelope::Envelope;
use crewlet::engine::ledger::{self, SkipReason};

fn t(id: &str, kind: &str, message_id: Option<&str>) -> Envelope {
    Envelope {
        id: id.into(),
        kind: kind.into(),
        body: serde_json::Value::Null,
        thread: None,
        message_id: message_id.map(str::to_string),
        from: None,
        sent_at: None,
    }
}

async fn nats_store(server: &support::nats::NatsServer) -> Arc<dyn Store> {
    let mut o = NatsOptions::new(vec![server.url()]);
    o.store_timeout = Duration::from_millis(500);
    let b = NatsBackend::connect(&o).await.unwrap();
    Arc::new(Coordinator::new(
        b,
        CoordinatorOptions {
            store_timeout: Duration::from_millis(500),
            ..CoordinatorOptions::default()
        },
    ))
}

async fn a_redelivery_on_a_peer_skips_what_finished_and_runs_only_the_new_trigger(
    node_a: Arc<dyn Store>,
    node_b: Arc<dyn Store>,
) {
    // Node a ran A+B and recorded them (with the chat message its turn
    // answered in the thread), then died before acking.
    let ran = [t("A", "task_assigned", None), t("B", "a2a_message", None)];
    let written = ledger::record(&*node_a, "seat1", &ran, &["chat-9".into()], "turn-1").await;
    assert_eq!(written, 3);
    // The redelivery lands on b, merged with C and with the waiting message.
    let partition = [
        t("A", "task_assigned", None),
        t("B", "a2a_message", None),
        t("C", "task_assigned", None),
        t("W", "external_notification", Some("chat-9")),
    ];
    let (done, answered, readable) = ledger::read(&*node_b, "seat1", &partition).await;
    assert!(readable);
    let s = ledger::screen(&partition, &done, &answered);
    assert_eq!(
        s.run.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["C"]
    );
    let reasons: Vec<(&str, SkipReason)> = s
        .skipped
        .iter()
        .map(|(e, r)| (e.id.as_str(), r.clone()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("A", SkipReason::AlreadyDone),
            ("B", SkipReason::AlreadyDone),
            ("W", SkipReason::AnsweredInThread)
        ]
    );
    // Another seat acting on the same trigger has its own completion.
    let (other, _, _) = ledger::read(&*node_b, "seat2", &partition).await;
    assert!(other.is_empty());
    // Recording twice is harmless.
    assert_eq!(
        ledger::record(&*node_b, "seat1", &ran, &[], "turn-2").await,
        2
    );
}

#[tokio::test]
async fn twin_a_redelivery_skips_what_finished_and_runs_only_the_new_trigger() {
    let store: Arc<dyn Store> = Arc::new(Coordinator::new(
        TwinBackend::new(Duration::from_secs(45)),
        CoordinatorOptions::default(),
    ));
    a_redelivery_on_a_peer_skips_what_finished_and_runs_only_the_new_trigger(store.clone(), store)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_redelivery_on_a_peer_skips_what_finished_and_runs_only_the_new_trigger() {
    let server = support::nats::NatsServer::start().await;
    let a = nats_store(&server).await;
    let b = nats_store(&server).await;
    a_redelivery_on_a_peer_skips_what_finished_and_runs_only_the_new_trigger(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_ledger_fails_open_in_both_directions() {
    let mut server = support::nats::NatsServer::start().await;
    let store = nats_store(&server).await;
    ledger::record(
        &*store,
        "s",
        &[t("A", "task_assigned", None)],
        &[],
        "turn-1",
    )
    .await;
    server.kill();
    let partition = [t("A", "task_assigned", None)];
    // Unreadable: run it (the only safe answer), and say it was unreadable.
    let (done, answered, readable) = ledger::read(&*store, "s", &partition).await;
    assert!(!readable);
    let s = ledger::screen(&partition, &done, &answered);
    assert_eq!(s.run.len(), 1, "an unreadable ledger runs the turn");
    // Unwritable: nothing panics, nothing is claimed written.
    let written = ledger::record(
        &*store,
        "s",
        &[t("B", "task_assigned", None)],
        &[],
        "turn-2",
    )
    .await;
    assert_eq!(written, 0);
}

/// Found by the chaos harness: a restart of the ledger's NATS leader lost a
/// turn's completion record (one attempt, failed open) and its ack with
/// it, so the redelivery ran the trigger a second time on the seat's next
/// holder. The record is now tried again for as long as the delivery's ack
/// window lasts: a store silent for a while (SIGSTOP: open sockets,
/// nothing answers, every call ends at its timeout) still gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_record_lost_to_a_leader_election_ran_the_trigger_twice() {
    let server = support::nats::NatsServer::start().await;
    let store = nats_store(&server).await;
    let pid = server.pid().unwrap() as i32;
    // SAFETY: kill(2) on the nats-server this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            ledger::record_within(
                &*store,
                "s",
                &[t("A", "task_assigned", None)],
                &[],
                "turn-1",
                Duration::from_secs(30),
            )
            .await
        })
    };
    // The fault: two seconds of silence (four store timeouts).
    tokio::time::sleep(Duration::from_secs(2)).await;
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert_eq!(
        writer.await.unwrap(),
        1,
        "the record landed once the store answered"
    );
    let (done, _, readable) = ledger::read(&*store, "s", &[t("A", "task_assigned", None)]).await;
    assert!(readable);
    assert!(done.contains("A"), "a redelivery finds the work done");
}
