//! The completion ledger against the coordination store, on the twin and
//! on a real nats-server: what one node records, a peer finds; a partial
//! overlap runs only the new trigger; both directions fail open.

mod support;

use std::sync::Arc;
use std::time::Duration;

use crewlet::coord::{
    Coordinator, CoordinatorOptions, MemoryBackend, NatsBackend, NatsOptions, Store,
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
        MemoryBackend::new(Duration::from_secs(45)),
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
