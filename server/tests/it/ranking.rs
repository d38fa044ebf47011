//! The person-ordered node ranking in the coordination store (handoff § 8),
//! on both backends: the in-process twin and JetStream KV on a real
//! nats-server. Each node here is its own store handle on the one store, as
//! a fleet's nodes are; the promise is that they all rank the fleet the same
//! way — after a save, and after a node joins that never read the order.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use crewlet::coord::{
    Claim, ClaimRequest, Coordinator, CoordinatorOptions, Lease, NatsBackend, NatsOptions, Release,
    Store, TwinBackend,
};
use crewlet::seat::ranking::{self, RankingError};
use crewlet::tasks::Tasks;
use futures::future::BoxFuture;
use support::nats::NatsServer;

/// Long enough that no presence lease lapses during a test.
const TTL: Duration = Duration::from_secs(30);

type MakeStore = Arc<dyn Fn() -> BoxFuture<'static, Arc<dyn Store>> + Send + Sync>;

/// One store, and a way to open another node's handle on it.
struct Fx {
    make: MakeStore,
    _server: Option<Arc<NatsServer>>,
}

impl Fx {
    async fn node(&self) -> Arc<dyn Store> {
        (self.make)().await
    }
}

fn options() -> CoordinatorOptions {
    CoordinatorOptions {
        store_timeout: Duration::from_secs(5),
        view_idle: Duration::from_secs(5),
        tasks: Tasks::new(),
    }
}

async fn twin() -> Fx {
    let backend = TwinBackend::new(TTL);
    Fx {
        make: Arc::new(move || {
            let b = backend.clone();
            Box::pin(async move { Arc::new(Coordinator::new(b, options())) as Arc<dyn Store> })
        }),
        _server: None,
    }
}

async fn nats() -> Fx {
    let server = Arc::new(NatsServer::start().await);
    let url = server.url();
    Fx {
        make: Arc::new(move || {
            let url = url.clone();
            Box::pin(async move {
                let mut o = NatsOptions::new(vec![url]);
                o.lease_ttl = TTL;
                o.store_timeout = Duration::from_secs(5);
                let backend = NatsBackend::connect(&o)
                    .await
                    .expect("connect to nats-server");
                Arc::new(Coordinator::new(backend, options())) as Arc<dyn Store>
            })
        }),
        _server: Some(server),
    }
}

both!(
    make twin, nats;
        the_order_is_the_same_on_every_node_after_a_save_and_after_a_node_joins_with_a_stale_view,
    a_save_against_a_stale_revision_is_refused_and_changes_nothing,
    a_node_that_leaves_is_dropped_and_the_others_keep_their_places,
    a_repeated_or_empty_node_id_is_refused_before_anything_is_written,
    with_no_saved_order_every_node_ranks_by_first_seen,
    a_restarted_node_keeps_its_first_seen_place_with_no_saved_order,
);

/// Node `id` comes up: its presence lease, claimed through `store`, and
/// its first-seen time kept (as a node's heartbeat keeps it).
async fn presence(store: &dyn Store, id: &str) -> Lease {
    let owner = format!("{id}:0001");
    match store
        .claim(ClaimRequest::new(format!("node:{id}"), owner, id))
        .await
    {
        Ok(Claim::Won(l)) => {
            ranking::remember(store, id, l.acquired_at).await.unwrap();
            l
        }
        other => panic!("node {id}'s presence was not claimed: {other:?}"),
    }
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

async fn effective(store: &dyn Store) -> Vec<String> {
    ranking::effective(store)
        .await
        .expect("the effective order")
}

async fn the_order_is_the_same_on_every_node_after_a_save_and_after_a_node_joins_with_a_stale_view(
    f: Fx,
) {
    let a = f.node().await;
    let b = f.node().await;
    presence(&*a, "node-a").await;
    presence(&*b, "node-b").await;
    presence(&*a, "node-c").await;

    // A person drags node-c to the top and saves through node-a's handle.
    let rev = ranking::save(&*a, ids(&["node-c", "node-a", "node-b"]), "olivia", None)
        .await
        .expect("the first save");
    let (saved, at) = ranking::read(&*b)
        .await
        .unwrap()
        .expect("node-b reads the saved order");
    assert_eq!(at, rev);
    assert_eq!(saved.nodes, ids(&["node-c", "node-a", "node-b"]));
    assert_eq!(saved.set_by, "olivia");
    assert!(
        time::OffsetDateTime::parse(
            &saved.set_at,
            &time::format_description::well_known::Rfc3339
        )
        .is_ok(),
        "set_at is RFC 3339: {}",
        saved.set_at
    );
    let want = ids(&["node-c", "node-a", "node-b"]);
    assert_eq!(effective(&*a).await, want);
    assert_eq!(effective(&*b).await, want);

    // Two nodes join that the saved order never heard of, the later one
    // with the smaller id; each is a fresh handle that never read the order.
    let z = f.node().await;
    presence(&*z, "node-z").await;
    let d = f.node().await;
    presence(&*d, "node-d").await;
    let want = ids(&["node-c", "node-a", "node-b", "node-z", "node-d"]);
    for (who, s) in [("a", &a), ("b", &b), ("z", &z), ("d", &d)] {
        assert_eq!(effective(&**s).await, want, "as node-{who} ranks it");
    }

    // The newcomer, acting on its stale view (no saved order), cannot
    // overwrite the fleet's order.
    let e = ranking::save(&*d, ids(&["node-d"]), "victor", None)
        .await
        .unwrap_err();
    assert!(
        matches!(e, RankingError::Conflict { expected: None, current: Some(c) } if c == rev),
        "{e}"
    );
    assert_eq!(effective(&*a).await, want);
}

async fn a_save_against_a_stale_revision_is_refused_and_changes_nothing(f: Fx) {
    let a = f.node().await;
    let b = f.node().await;
    presence(&*a, "node-a").await;
    presence(&*b, "node-b").await;
    let first = ranking::save(&*a, ids(&["node-a", "node-b"]), "olivia", None)
        .await
        .unwrap();
    // Both read revision `first`; node-a's person saves first.
    let second = ranking::save(&*a, ids(&["node-b", "node-a"]), "olivia", Some(first))
        .await
        .unwrap();
    assert!(second > first);
    let e = ranking::save(&*b, ids(&["node-a", "node-b"]), "oscar", Some(first))
        .await
        .unwrap_err();
    match &e {
        RankingError::Conflict { expected, current } => {
            assert_eq!(*expected, Some(first));
            assert_eq!(*current, Some(second));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(e.to_string().contains("reload"), "{e}");
    let (saved, rev) = ranking::read(&*b).await.unwrap().unwrap();
    assert_eq!(
        (saved.nodes, saved.set_by, rev),
        (ids(&["node-b", "node-a"]), "olivia".into(), second)
    );
    // Saving again against what is there now works.
    ranking::save(&*b, ids(&["node-a", "node-b"]), "oscar", Some(second))
        .await
        .expect("a save against the current revision");
    assert_eq!(effective(&*a).await, ids(&["node-a", "node-b"]));
}

async fn a_node_that_leaves_is_dropped_and_the_others_keep_their_places(f: Fx) {
    let a = f.node().await;
    let lease_a = presence(&*a, "node-a").await;
    presence(&*a, "node-b").await;
    presence(&*a, "node-c").await;
    ranking::save(&*a, ids(&["node-b", "node-a", "node-c"]), "olivia", None)
        .await
        .unwrap();
    assert_eq!(
        a.release(&lease_a, "node-a:0001").await.unwrap(),
        Release::Released
    );
    let other = f.node().await;
    assert_eq!(effective(&*other).await, ids(&["node-b", "node-c"]));
    // It comes back: it keeps its saved place.
    presence(&*a, "node-a").await;
    assert_eq!(
        effective(&*other).await,
        ids(&["node-b", "node-a", "node-c"])
    );
}

async fn a_repeated_or_empty_node_id_is_refused_before_anything_is_written(f: Fx) {
    let a = f.node().await;
    let e = ranking::save(&*a, ids(&["node-a", "node-b", "node-a"]), "olivia", None)
        .await
        .unwrap_err();
    assert!(
        matches!(e, RankingError::Duplicate(ref n) if n == "node-a"),
        "{e}"
    );
    let e = ranking::save(&*a, ids(&["node-a", ""]), "olivia", None)
        .await
        .unwrap_err();
    assert!(matches!(e, RankingError::EmptyNode(2)), "{e}");
    assert!(
        ranking::read(&*a).await.unwrap().is_none(),
        "nothing written"
    );
}

async fn with_no_saved_order_every_node_ranks_by_first_seen(f: Fx) {
    let a = f.node().await;
    let b = f.node().await;
    presence(&*b, "node-z").await;
    presence(&*a, "node-a").await;
    assert!(ranking::read(&*a).await.unwrap().is_none());
    assert_eq!(effective(&*a).await, ids(&["node-z", "node-a"]));
    assert_eq!(effective(&*b).await, ids(&["node-z", "node-a"]));
}

/// handoff § 2: the order is chronological and stable — a node that
/// restarts (its presence given up, then claimed again, later) keeps its
/// place; it does not drop to the end as its new presence lease's time
/// would put it.
async fn a_restarted_node_keeps_its_first_seen_place_with_no_saved_order(f: Fx) {
    let a = f.node().await;
    let b = f.node().await;
    let z = presence(&*b, "node-z").await;
    let first = presence(&*a, "node-a").await;
    assert_eq!(effective(&*a).await, ids(&["node-z", "node-a"]));
    assert!(matches!(
        b.release(&z, &z.owner).await,
        Ok(Release::Released)
    ));
    let again = presence(&*b, "node-z").await;
    assert!(
        again.acquired_at > first.acquired_at,
        "the restarted node's presence is the newest lease"
    );
    assert_eq!(effective(&*a).await, ids(&["node-z", "node-a"]));
    assert_eq!(effective(&*b).await, ids(&["node-z", "node-a"]));
}
