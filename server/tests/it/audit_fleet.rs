//! The fleet's audit log: each node keeps the actions taken through it, and
//! an audit read gathers every live node's, naming the nodes that did not
//! answer instead of leaving their actions silently out. On the twin store
//! and the in-process request registry (the NATS transport is the memory
//! reads', tested there; the two-node dashboard test covers it end to end).

use std::sync::Arc;
use std::time::Duration;

use crewlet::audit::{self, FleetAudit, audit_subject};
use crewlet::coord::{ClaimRequest, Coordinator, CoordinatorOptions, Store, TwinBackend};
use crewlet::memory::memread::{Scatter, TwinScatter};
use crewlet::tasks::Tasks;

const BUDGET: Duration = Duration::from_millis(300);

async fn pool(dir: &std::path::Path) -> sqlx::SqlitePool {
    crewlet::db::open(dir, &crewlet::db::MIGRATOR)
        .await
        .unwrap()
}

async fn present(store: &dyn Store, node: &str, owner: &str) {
    store
        .claim(ClaimRequest::new(format!("node:{node}"), owner, node))
        .await
        .unwrap();
}

struct Fixture {
    store: Arc<dyn Store>,
    scatter: Arc<TwinScatter>,
    tasks: Tasks,
    _dirs: Vec<tempfile::TempDir>,
}

impl Fixture {
    fn new() -> Fixture {
        let tasks = Tasks::new();
        let store: Arc<dyn Store> = Arc::new(Coordinator::new(
            TwinBackend::new(Duration::from_secs(30)),
            CoordinatorOptions {
                store_timeout: Duration::from_secs(2),
                view_idle: Duration::from_secs(60),
                tasks: tasks.clone(),
            },
        ));
        Fixture {
            store,
            scatter: Arc::new(TwinScatter::new()),
            tasks,
            _dirs: Vec::new(),
        }
    }

    /// A node's audit log with `actions` recorded through it, present in
    /// the roster; serving audit reads when `serve`.
    async fn node(&mut self, id: &str, actions: &[&str], serve: bool) -> Arc<FleetAudit> {
        let dir = tempfile::tempdir().unwrap();
        let pool = pool(dir.path()).await;
        self._dirs.push(dir);
        for a in actions {
            audit::record(&pool, "olivia", a, Some("alpha"), Some("why"), "ok")
                .await
                .unwrap();
        }
        let owner = format!("{id}:0001");
        present(&*self.store, id, &owner).await;
        let scatter: Arc<dyn Scatter> = self.scatter.clone();
        let a = Arc::new(FleetAudit::new(
            pool,
            self.store.clone(),
            scatter,
            id.to_string(),
            owner,
            BUDGET,
        ));
        if serve {
            a.serve(&self.tasks).await.unwrap();
        }
        a
    }
}

#[tokio::test]
async fn an_audit_read_lists_every_live_nodes_actions_each_naming_its_node() {
    let mut f = Fixture::new();
    let a = f.node("node-a", &["seat_pause", "seat_resume"], true).await;
    let _b = f.node("node-b", &["turn_stop"], true).await;
    let log = a.read(200).await.unwrap();
    assert_eq!(log.answered, ["node-a", "node-b"]);
    assert!(log.silent.is_empty(), "{:?}", log.silent);
    assert_eq!(log.roster_error, None);
    let mut got: Vec<_> = log
        .entries
        .iter()
        .map(|e| (e.node.clone().unwrap(), e.action.clone()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("node-a".to_string(), "seat_pause".to_string()),
            ("node-a".to_string(), "seat_resume".to_string()),
            ("node-b".to_string(), "turn_stop".to_string()),
        ]
    );
    // Within one second a node's own order stands: newest first.
    let on_a: Vec<_> = log
        .entries
        .iter()
        .filter(|e| e.node.as_deref() == Some("node-a"))
        .map(|e| e.action.as_str())
        .collect();
    assert_eq!(on_a, ["seat_resume", "seat_pause"]);
    f.tasks.shutdown().await;
}

#[tokio::test]
async fn a_live_node_that_does_not_answer_is_named_and_its_actions_are_not_guessed() {
    let mut f = Fixture::new();
    let a = f.node("node-a", &["seat_pause"], true).await;
    let _c = f.node("node-c", &["seat_resume"], false).await;
    // A node that listens and never answers.
    let _wedged = f
        .scatter
        .listen(&audit_subject("node-d:0001"))
        .await
        .unwrap();
    present(&*f.store, "node-d", "node-d:0001").await;
    let log = a.read(200).await.unwrap();
    assert_eq!(log.answered, ["node-a"]);
    let silent: Vec<_> = log
        .silent
        .iter()
        .map(|s| (s.node_id.as_str(), s.why.as_str()))
        .collect();
    assert_eq!(
        silent,
        [
            ("node-c", "nothing answers for it (it may be stopping)"),
            ("node-d", "it did not answer within 300ms"),
        ]
    );
    assert!(
        log.entries
            .iter()
            .all(|e| e.node.as_deref() == Some("node-a")),
        "{:?}",
        log.entries
    );
    f.tasks.shutdown().await;
}

#[tokio::test]
async fn a_malformed_audit_read_is_answered_with_an_error_not_a_crash() {
    let mut f = Fixture::new();
    let _b = f.node("node-b", &["seat_pause"], true).await;
    let answer = f
        .scatter
        .ask(
            &audit_subject("node-b:0001"),
            bytes::Bytes::from_static(b"{not json"),
            BUDGET,
        )
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["node_id"], "node-b");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("not an audit read request"),
        "{v}"
    );
    // And it goes on answering.
    let answer = f
        .scatter
        .ask(
            &audit_subject("node-b:0001"),
            bytes::Bytes::from_static(b"{\"limit\": 5}"),
            BUDGET,
        )
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["entries"][0]["action"], "seat_pause");
    f.tasks.shutdown().await;
}
