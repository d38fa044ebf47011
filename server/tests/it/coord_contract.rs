//! The coordination store contract: one suite, run against both backends —
//! the in-process twin (under tokio's paused clock) and JetStream KV on a
//! real nats-server started by the harness.
//!
//! Each `contract!` test is an async fn over a [`Fx`]; the macro runs it once
//! per backend, so a behaviour one backend has and the other lacks fails
//! here. Tests are named after the promise they keep (spec § The lease,
//! § Mixed-version fleets, § Single node). NATS-only tests (TTL adoption, an
//! unreachable store, the 3-server cluster) follow the suite.
//!
//! Nothing waits on a bare sleep: `eventually` polls a condition against a
//! deadline (on the twin the paused clock jumps to each poll).

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crewlet::coord::{
    Backend, BucketId, Claim, ClaimRequest, ClaimStep, ConnectionState, Coordinator,
    CoordinatorOptions, Event, Fault, HoldPoint, KvError, Lease, LeaseState, Metadata, NatsBackend,
    NatsCoordinator, NatsOptions, Offer, Release, Renewal, StateBucket, Store, StoreError,
    StoreTime, TwinBackend,
};
use crewlet::tasks::Tasks;
use futures::StreamExt;
use futures::future::BoxFuture;
use support::nats::{NatsCluster, NatsServer};
use tokio::sync::Notify;

/// The lease TTL every suite store runs on: short, because NATS waits it out in real time.
const TTL: Duration = Duration::from_secs(2);
/// How long a polled condition gets.
const DEADLINE: Duration = Duration::from_secs(30);

type MakeStore<B> =
    Arc<dyn Fn(CoordinatorOptions) -> BoxFuture<'static, Coordinator<B>> + Send + Sync>;

/// A store under test, a way to make its peers (other nodes on the same
/// store), and whatever keeps its server alive.
struct Fx<B: Backend> {
    store: Coordinator<B>,
    make: MakeStore<B>,
    /// Where `store` claims atomically: a peer on the same store that
    /// claims in three writes.
    three_writes: Option<MakeStore<B>>,
    view_idle: Duration,
    _server: Option<Arc<NatsServer>>,
}

fn options(view_idle: Duration) -> CoordinatorOptions {
    CoordinatorOptions {
        store_timeout: Duration::from_secs(2),
        view_idle,
        tasks: Tasks::new(),
    }
}

async fn twin() -> Fx<TwinBackend> {
    twin_with(false).await
}

/// The twin, claiming atomically when `atomic`.
async fn twin_with(atomic: bool) -> Fx<TwinBackend> {
    let backend = TwinBackend::new(TTL);
    let view_idle = Duration::from_secs(60);
    let maker = |atomic: bool| -> MakeStore<TwinBackend> {
        let backend = backend.clone();
        Arc::new(move |opts| {
            let b = backend.clone().with_atomic_claims(atomic);
            Box::pin(async move { Coordinator::new(b, opts) })
        })
    };
    let make = maker(atomic);
    Fx {
        store: make(options(view_idle)).await,
        make,
        three_writes: atomic.then(|| maker(false)),
        view_idle,
        _server: None,
    }
}

fn nats_options(urls: Vec<String>) -> NatsOptions {
    let mut o = NatsOptions::new(urls);
    o.lease_ttl = TTL;
    o.store_timeout = Duration::from_secs(2);
    o
}

async fn nats_store(urls: Vec<String>, opts: CoordinatorOptions) -> NatsCoordinator {
    nats_store_with(urls, opts, false).await
}

async fn nats_store_with(
    urls: Vec<String>,
    opts: CoordinatorOptions,
    atomic: bool,
) -> NatsCoordinator {
    let mut o = nats_options(urls);
    o.atomic_claim = atomic;
    let backend = NatsBackend::connect(&o)
        .await
        .expect("connect to nats-server");
    Coordinator::new(backend, opts)
}

async fn nats() -> Fx<NatsBackend> {
    nats_with(false).await
}

async fn nats_with(atomic: bool) -> Fx<NatsBackend> {
    let server = Arc::new(NatsServer::start().await);
    let view_idle = Duration::from_secs(1);
    let maker = |atomic: bool| -> MakeStore<NatsBackend> {
        let url = server.url();
        Arc::new(move |opts| {
            let url = url.clone();
            Box::pin(async move { nats_store_with(vec![url], opts, atomic).await })
        })
    };
    let make = maker(atomic);
    Fx {
        store: make(options(view_idle)).await,
        make,
        three_writes: atomic.then(|| maker(false)),
        view_idle,
        _server: Some(server),
    }
}

/// A NATS store claiming atomically, or `None` (said so on the terminal)
/// on a server below JetStream API level 2, which has no atomic batch.
async fn nats_atomic(test: &str) -> Option<Fx<NatsBackend>> {
    let fx = nats_with(true).await;
    if fx.store.backend().atomic() {
        Some(fx)
    } else {
        support::nats::skip(
            test,
            "atomic claims need JetStream API level 2 (nats-server 2.12 or later); \
             this server takes claims in three writes",
        );
        None
    }
}

impl<B: Backend> Fx<B> {
    /// Another node on the same store.
    async fn peer(&self) -> Coordinator<B> {
        (self.make)(options(self.view_idle)).await
    }

    /// Another node on the same store that claims in three writes.
    async fn three_write_peer(&self) -> Coordinator<B> {
        let make = self.three_writes.as_ref().expect("an atomic fixture");
        make(options(self.view_idle)).await
    }

    async fn peer_with_timeout(&self, t: Duration) -> Coordinator<B> {
        let mut o = options(self.view_idle);
        o.store_timeout = t;
        (self.make)(o).await
    }

    /// Until the store's clock reads at least `t`.
    async fn until(&self, t: StoreTime) {
        until_on(&self.store, t).await
    }

    /// Until `lease` has lapsed on the store's clock — by the store's own
    /// record of the tenure too: a renewal's holder counts from a lower
    /// bound on its write's stamp, so the store's expiry may come a little
    /// after the one the holder was told (never before).
    async fn lapse(&self, lease: &Lease) {
        lapse_on(&self.store, lease).await
    }

    /// Until the key `resource` has aged out of the leases bucket.
    async fn aged_out(&self, resource: &str) {
        let s = self.store.clone();
        eventually("the lapsed key to age out", || {
            let s = s.clone();
            async move {
                s.backend()
                    .get(BucketId::Leases, resource)
                    .await
                    .is_ok_and(|e| e.is_none())
            }
        })
        .await;
    }
}

/// Poll `cond` until it holds; the clock is tokio's, so on the twin the
/// paused clock moves to each poll.
async fn eventually<F, Fut>(what: &str, cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_within(DEADLINE, what, cond).await
}

async fn eventually_within<F, Fut>(deadline: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + deadline;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < until,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Until `store`'s clock reads at least `t`.
async fn until_on<B: Backend>(store: &Coordinator<B>, t: StoreTime) {
    let s = store.clone();
    eventually("the store clock to pass a lease's expiry", || {
        let s = s.clone();
        async move { s.now().await.is_ok_and(|n| n >= t) }
    })
    .await;
}

/// Until `lease` has lapsed for `store`, the node about to claim it: on
/// its own clock and by its read of the tenure. Each node's clock is a
/// lower bound on the server's, as close as the quickest answer it has had
/// allows, so one node can see a lease lapsed while another, whose answers
/// came slower, still reads it held (a loaded `./dev test`: a peer claimed the moment the test's own
/// store saw the lapse, and found the lease held).
async fn lapse_on<B: Backend>(store: &Coordinator<B>, lease: &Lease) {
    until_on(store, lease.expires_at).await;
    let s = store.clone();
    let (resource, owner, epoch) = (lease.resource.clone(), lease.owner.clone(), lease.epoch);
    eventually("the store's record of the tenure to lapse", || {
        let (s, resource, owner) = (s.clone(), resource.clone(), owner.clone());
        async move {
            match s.lease(&resource).await {
                Ok(Some(cur)) => !(cur.owner == owner && cur.epoch == epoch),
                Ok(None) => true,
                Err(_) => false,
            }
        }
    })
    .await;
}

fn req(resource: &str, owner: &str) -> ClaimRequest {
    let node = owner.split(':').next().unwrap_or(owner).to_string();
    ClaimRequest::new(resource, owner, node)
}

async fn won(store: &impl Store, r: ClaimRequest) -> Lease {
    match store.claim(r).await {
        Ok(Claim::Won(l)) => l,
        other => panic!("expected the claim to win, got {other:?}"),
    }
}

async fn held_by(store: &impl Store, r: ClaimRequest) -> Lease {
    match store.claim(r).await {
        Ok(Claim::HeldBy(l)) => l,
        other => panic!("expected the claim to find a holder, got {other:?}"),
    }
}

async fn renewed(store: &impl Store, l: &Lease, owner: &str) -> Lease {
    match store.renew(l, owner, None).await {
        Renewal::Renewed(l) => l,
        other => panic!("expected a renewal, got {other:?}"),
    }
}

const A: &str = "node-a:0000000a";
const A2: &str = "node-a:000000a2";
const B: &str = "node-b:0000000b";

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod twin {
            $(
                #[tokio::test(start_paused = true)]
                async fn $name() {
                    super::$name(super::twin().await).await;
                }
            )*
        }
        mod nats {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::nats().await).await;
                }
            )*
        }
    };
}

contract!(
    claim_mints_epoch_one_for_a_fresh_resource,
    held_resource_reports_its_holder_and_mints_nothing,
    live_lease_is_renewed_not_claimed_again_by_its_owner,
    two_incarnations_of_one_node_cannot_renew_each_others_lease,
    epoch_is_monotonic_across_key_expiry,
    epoch_is_monotonic_across_release,
    lapsed_lease_cannot_be_renewed,
    lapsed_lease_reacquire_bumps_epoch_for_same_owner,
    renewal_never_restamps_acquired_at,
    acquired_at_moves_exactly_when_the_epoch_does,
    renewal_replaces_presence_metadata,
    release_is_only_by_the_owner_of_that_tenure,
    claim_failing_after_its_record_leaves_nothing_held,
    claim_failing_after_the_counter_leaves_nothing_held_and_the_gap_is_harmless,
    committed_tenure_is_never_given_back,
    lost_record_answer_is_reread_before_retrying,
    lost_counter_answer_is_reread_not_minted_twice,
    lost_token_answer_is_reread,
    caller_that_gave_up_mid_claim_gives_its_record_back,
    give_back_never_takes_a_sibling_claim,
    refused_give_back_leaves_the_record_to_lapse,
    list_by_prefix_returns_live_leases_of_that_kind,
    a_lease_renewed_while_a_list_reads_is_still_listed,
    lapsed_leases_leave_the_list_without_any_event,
    view_is_level_with_the_last_write,
    view_judges_liveness_from_expires_at,
    view_stops_after_it_goes_unused,
    protocol_floor_counts_presence_and_seat_leases_never_duties,
    protocol_floor_ignores_lapsed_leases,
    a_gated_claim_judges_the_protocol_gate_only_once_its_seat_reads_free,
    duty_leases_have_their_own_ttl_and_bucket,
    lease_ttl_in_force_is_exposed,
    state_buckets_are_compare_and_set,
    state_entries_and_watch_by_prefix,
    a_company_too_large_for_one_message_is_applied_in_parts_and_a_peer_reads_it_whole,
    a_company_revision_missing_a_part_is_unreadable_not_half_read,
    a_company_revision_with_an_altered_part_is_unreadable,
    kv_trap_create_after_delete_has_exactly_one_winner,
    kv_trap_wrong_last_sequence_after_delete,
    kv_trap_create_after_expiry,
    concurrent_updates_at_one_revision_have_exactly_one_winner,
    ledger_record_written_by_one_node_is_found_by_a_peer,
    removal_markers_are_listed_and_purged_through_their_own_revision,
    keys_outside_the_grammar_are_refused_with_a_typed_error,
    offered_lease_is_taken_with_the_next_epoch_while_the_giver_still_holds,
    a_renewal_keeps_a_standing_offer_and_a_take_reads_past_it,
    a_withdrawn_offer_is_never_taken_and_the_giver_holds_on,
    an_offer_is_taken_only_by_the_node_it_names,
    an_offer_on_a_lapsed_lease_is_never_taken,
    a_take_that_lands_after_the_offered_lease_lapsed_takes_nothing,
    the_last_holders_node_id_outlives_its_lapsed_lease,
);

/// The suite's claim, renewal, release, list, view and handoff promises
/// again with every claim one atomic batch (`coordination.atomic_claim`):
/// on the twin, and on a server of JetStream API level 2 or later (said
/// skipped on an older one). The three-write claim's fault tests have no
/// counterpart here: an atomic claim has no half-done state to give back.
/// The company file takes the key on `local` only: on NATS the epoch key
/// kept with `Nats-TTL: never` does not survive a server's restart after a
/// crash (docs/nats.md), which no test here does.
macro_rules! atomic_contract {
    ($($name:ident),* $(,)?) => {
        mod atomic {
            mod twin {
                $(
                    #[tokio::test(start_paused = true)]
                    async fn $name() {
                        super::super::$name(super::super::twin_with(true).await).await;
                    }
                )*
            }
            mod nats {
                $(
                    #[tokio::test]
                    async fn $name() {
                        if let Some(fx) = super::super::nats_atomic(stringify!($name)).await {
                            super::super::$name(fx).await;
                        }
                    }
                )*
            }
        }
    };
}

atomic_contract!(
    claim_mints_epoch_one_for_a_fresh_resource,
    held_resource_reports_its_holder_and_mints_nothing,
    live_lease_is_renewed_not_claimed_again_by_its_owner,
    two_incarnations_of_one_node_cannot_renew_each_others_lease,
    epoch_is_monotonic_across_key_expiry,
    epoch_is_monotonic_across_release,
    lapsed_lease_cannot_be_renewed,
    lapsed_lease_reacquire_bumps_epoch_for_same_owner,
    renewal_never_restamps_acquired_at,
    acquired_at_moves_exactly_when_the_epoch_does,
    renewal_replaces_presence_metadata,
    release_is_only_by_the_owner_of_that_tenure,
    list_by_prefix_returns_live_leases_of_that_kind,
    lapsed_leases_leave_the_list_without_any_event,
    view_is_level_with_the_last_write,
    view_judges_liveness_from_expires_at,
    protocol_floor_counts_presence_and_seat_leases_never_duties,
    protocol_floor_ignores_lapsed_leases,
    a_gated_claim_judges_the_protocol_gate_only_once_its_seat_reads_free,
    offered_lease_is_taken_with_the_next_epoch_while_the_giver_still_holds,
    a_withdrawn_offer_is_never_taken_and_the_giver_holds_on,
    an_offer_on_a_lapsed_lease_is_never_taken,
    a_take_that_lands_after_the_offered_lease_lapsed_takes_nothing,
    the_last_holders_node_id_outlives_its_lapsed_lease,
    an_atomic_claim_race_has_one_winner_and_mints_one_epoch,
    a_lost_batch_answer_is_reread_not_minted_twice,
    epochs_stay_monotonic_between_the_two_claim_paths,
);

/// Several nodes claim one fresh seat at once, atomically: one wins, with
/// epoch 1; the others are told who holds it; one epoch was minted.
async fn an_atomic_claim_race_has_one_winner_and_mints_one_epoch<B: Backend>(fx: Fx<B>) {
    let mut stores = vec![fx.store.clone()];
    for _ in 0..3 {
        stores.push(fx.peer().await);
    }
    let owners = [
        "node-a:0000000a",
        "node-b:0000000b",
        "node-c:0000000c",
        "node-d:0000000d",
    ];
    let claims = futures::future::join_all(
        stores
            .iter()
            .zip(owners)
            .map(|(s, o)| s.claim(req("seat:alice", o))),
    )
    .await;
    let won: Vec<&Lease> = claims
        .iter()
        .filter_map(|c| match c {
            Ok(Claim::Won(l)) => Some(l),
            _ => None,
        })
        .collect();
    assert_eq!(won.len(), 1, "exactly one claim wins: {claims:?}");
    assert_eq!(won[0].epoch, 1);
    for c in &claims {
        match c {
            Ok(Claim::Won(_)) => {}
            Ok(Claim::HeldBy(l)) => assert_eq!(l.owner, won[0].owner, "the loser names the winner"),
            other => panic!("a losing claim is told who holds it, got {other:?}"),
        }
    }
    assert_eq!(fx.store.epoch("seat:alice").await.expect("epoch"), 1);
}

/// The batch lands and its answer is lost: the claim reads again, finds
/// its own tenure, and mints nothing more.
async fn a_lost_batch_answer_is_reread_not_minted_twice<B: Backend>(fx: Fx<B>) {
    fx.store.inject(Fault::LoseAnswer(ClaimStep::Batch));
    let l = won(&fx.store, req("seat:alice", A)).await;
    assert_eq!((l.owner.as_str(), l.epoch), (A, 1));
    assert_eq!(fx.store.epoch("seat:alice").await.expect("epoch"), 1);
    let read = fx
        .store
        .lease("seat:alice")
        .await
        .expect("read")
        .expect("held");
    assert_eq!(
        (read.owner.as_str(), read.epoch, read.revision),
        (A, 1, l.revision)
    );
}

/// A fleet moving between the claim paths (a server upgraded under it,
/// `atomic_claim` switched on or off) never mints an epoch twice: each
/// path reads the other's counter.
async fn epochs_stay_monotonic_between_the_two_claim_paths<B: Backend>(fx: Fx<B>) {
    let three = fx.three_write_peer().await;
    let mut last = 0;
    for (store, owner) in [(&fx.store, A), (&three, B), (&fx.store, A), (&three, B)] {
        let l = won(store, req("seat:alice", owner)).await;
        assert_eq!(l.epoch, last + 1, "{owner} claims after epoch {last}");
        last = l.epoch;
        assert_eq!(fx.store.epoch("seat:alice").await.expect("epoch"), last);
        assert_eq!(three.epoch("seat:alice").await.expect("epoch"), last);
        let holder = owner.split(':').next().unwrap_or_default().to_string();
        assert_eq!(
            fx.store
                .holders("seat:")
                .await
                .expect("holders")
                .get("seat:alice"),
            Some(&holder),
            "the last holder is the one that minted the highest epoch"
        );
        fx.lapse(&l).await;
    }
    // And across the lease key's expiry: the epoch key is kept.
    fx.aged_out("seat:alice").await;
    let l = won(&fx.store, req("seat:alice", A)).await;
    assert_eq!(l.epoch, last + 1);
}

/// The `preferred` hint kept beside the epoch: a lapsed lease does not
/// take it away, the next claim or take replaces it.
async fn the_last_holders_node_id_outlives_its_lapsed_lease<B: Backend>(fx: Fx<B>) {
    let l = won(&fx.store, req("seat:alice", A)).await;
    won(&fx.store, req("seat:bob", B)).await;
    won(&fx.store, req("node:node-a", A)).await;
    fx.lapse(&l).await;
    fx.aged_out(&l.resource).await;
    let peer = fx.peer().await;
    let holders = peer.holders("seat:").await.expect("holders");
    assert_eq!(
        holders,
        std::collections::BTreeMap::from([
            ("seat:alice".to_string(), "node-a".to_string()),
            ("seat:bob".to_string(), "node-b".to_string()),
        ]),
        "only seats, each naming its last holder's node id, lapsed or not"
    );
    // A new incarnation of another node claims it: the hint follows.
    won(&peer, req("seat:alice", B)).await;
    assert_eq!(
        fx.store
            .holders("seat:")
            .await
            .expect("holders")
            .get("seat:alice"),
        Some(&"node-b".to_string())
    );
}

fn offer_to(to: &str, id: &str, at: StoreTime) -> Offer {
    Offer {
        to: to.into(),
        id: id.into(),
        quiesced_at: at,
    }
}

async fn offered(store: &impl Store, l: &Lease, owner: &str, o: Option<Offer>) -> Lease {
    match store.offer(l, owner, o).await {
        Renewal::Renewed(l) => l,
        other => panic!("expected the offer to be written, got {other:?}"),
    }
}

async fn offered_lease_is_taken_with_the_next_epoch_while_the_giver_still_holds<B: Backend>(
    fx: Fx<B>,
) {
    let peer = fx.peer().await;
    let a = won(&fx.store, req("seat:alice", A)).await;
    let now = fx.store.now().await.expect("now");
    let a = offered(&fx.store, &a, A, Some(offer_to("node-b", "o1", now))).await;
    assert_eq!(a.offer.as_ref().map(|o| o.to.as_str()), Some("node-b"));
    // The giver still holds it, offer and all, in everyone's eyes.
    let seen = peer.lease("seat:alice").await.expect("read").expect("held");
    assert_eq!((seen.owner.as_str(), seen.epoch), (A, a.epoch));
    assert_eq!(seen.offer, a.offer);
    let b = match peer
        .take("seat:alice", "o1", B, "node-b", crewlet::config::PROTOCOL)
        .await
    {
        Ok(Claim::Won(l)) => l,
        other => panic!("expected the take to win, got {other:?}"),
    };
    assert_eq!(b.owner, B);
    assert_eq!(
        b.epoch,
        a.epoch + 1,
        "the take is the successor's assertion"
    );
    assert_eq!(b.preferred, "node-b");
    assert!(b.offer.is_none());
    assert!(b.acquired_at >= a.acquired_at, "a new tenure, a new since");
    assert_eq!(fx.store.epoch("seat:alice").await.expect("epoch"), b.epoch);
    // The giver's tenure is over: it can neither renew nor release it.
    assert_eq!(fx.store.renew(&a, A, None).await, Renewal::Lost);
    assert_eq!(
        fx.store.release(&a, A).await.expect("release"),
        Release::NotHeld
    );
    let now_held = fx
        .store
        .lease("seat:alice")
        .await
        .expect("read")
        .expect("held");
    assert_eq!((now_held.owner.as_str(), now_held.epoch), (B, b.epoch));
    renewed(&peer, &b, B).await;
}

async fn a_renewal_keeps_a_standing_offer_and_a_take_reads_past_it<B: Backend>(fx: Fx<B>) {
    let peer = fx.peer().await;
    let a = won(&fx.store, req("seat:alice", A)).await;
    let now = fx.store.now().await.expect("now");
    let a = offered(&fx.store, &a, A, Some(offer_to("node-b", "o1", now))).await;
    let a2 = renewed(&fx.store, &a, A).await;
    assert_ne!(a2.revision, a.revision);
    assert_eq!(a2.offer, a.offer, "a renewal keeps the offer");
    match peer
        .take("seat:alice", "o1", B, "node-b", crewlet::config::PROTOCOL)
        .await
    {
        Ok(Claim::Won(l)) => assert_eq!(l.epoch, a.epoch + 1),
        other => panic!("expected the take to win, got {other:?}"),
    }
}

async fn a_withdrawn_offer_is_never_taken_and_the_giver_holds_on<B: Backend>(fx: Fx<B>) {
    let peer = fx.peer().await;
    let a = won(&fx.store, req("seat:alice", A)).await;
    let now = fx.store.now().await.expect("now");
    let a = offered(&fx.store, &a, A, Some(offer_to("node-b", "o1", now))).await;
    let a = offered(&fx.store, &a, A, None).await;
    assert!(a.offer.is_none());
    match peer
        .take("seat:alice", "o1", B, "node-b", crewlet::config::PROTOCOL)
        .await
    {
        Ok(Claim::HeldBy(l)) => assert_eq!((l.owner.as_str(), l.epoch), (A, a.epoch)),
        other => panic!("expected the take to find the giver, got {other:?}"),
    }
    // A stale notice of an earlier offer does not take a new one either.
    let a = offered(&fx.store, &a, A, Some(offer_to("node-b", "o2", now))).await;
    assert!(matches!(
        peer.take("seat:alice", "o1", B, "node-b", crewlet::config::PROTOCOL)
            .await,
        Ok(Claim::HeldBy(_))
    ));
    let a = renewed(&fx.store, &a, A).await;
    assert_eq!(fx.store.epoch("seat:alice").await.expect("epoch"), a.epoch);
}

async fn an_offer_is_taken_only_by_the_node_it_names<B: Backend>(fx: Fx<B>) {
    let peer = fx.peer().await;
    let a = won(&fx.store, req("seat:alice", A)).await;
    let now = fx.store.now().await.expect("now");
    offered(&fx.store, &a, A, Some(offer_to("node-b", "o1", now))).await;
    match peer
        .take(
            "seat:alice",
            "o1",
            "node-c:0000000c",
            "node-c",
            crewlet::config::PROTOCOL,
        )
        .await
    {
        Ok(Claim::HeldBy(l)) => assert_eq!(l.owner, A),
        other => panic!("expected the take to be refused, got {other:?}"),
    }
}

async fn an_offer_on_a_lapsed_lease_is_never_taken<B: Backend>(fx: Fx<B>) {
    let peer = fx.peer().await;
    let a = won(&fx.store, req("seat:alice", A)).await;
    let now = fx.store.now().await.expect("now");
    let a = offered(&fx.store, &a, A, Some(offer_to("node-b", "o1", now))).await;
    let stored = fx
        .store
        .lease("seat:alice")
        .await
        .expect("read")
        .expect("held");
    assert!(
        a.expires_at <= stored.expires_at,
        "the holder is never told its tenure outlasts the store's"
    );
    fx.lapse(&a).await;
    assert!(
        peer.take("seat:alice", "o1", B, "node-b", crewlet::config::PROTOCOL)
            .await
            .is_err(),
        "a lapsed lease is claimed, never taken"
    );
    let b = won(&peer, req("seat:alice", B)).await;
    assert!(b.epoch > a.epoch);
}

/// A take judged the offered lease live by this node's clock, and its
/// write landed after the tenure lapsed: it takes nothing (a lapsed lease
/// is never taken, only claimed) and leaves nothing behind; the seat is
/// then claimed with a later epoch.
async fn a_take_that_lands_after_the_offered_lease_lapsed_takes_nothing<B: Backend>(fx: Fx<B>) {
    let peer = fx.peer_with_timeout(Duration::from_secs(25)).await;
    let a = won(&fx.store, req("seat:alice", A)).await;
    let now = fx.store.now().await.expect("now");
    let a = offered(&fx.store, &a, A, Some(offer_to("node-b", "o1", now))).await;
    let read = Arc::new(Notify::new());
    let go = Arc::new(Notify::new());
    peer.inject(Fault::Hold {
        at: HoldPoint::Take,
        read: read.clone(),
        go: go.clone(),
    });
    let taking = {
        let p = peer.clone();
        tokio::spawn(async move {
            p.take("seat:alice", "o1", B, "node-b", crewlet::config::PROTOCOL)
                .await
        })
    };
    read.notified().await;
    fx.lapse(&a).await;
    go.notify_one();
    let took = taking.await.expect("the take task");
    assert!(took.is_err(), "a take stamped after the lapse: {took:?}");
    assert_eq!(
        fx.store.lease("seat:alice").await.expect("read"),
        None,
        "the late take's write is taken back"
    );
    let b = won(&peer, req("seat:alice", B)).await;
    assert!(b.epoch > a.epoch);
}

async fn claim_mints_epoch_one_for_a_fresh_resource<B: Backend>(fx: Fx<B>) {
    let s = &fx.store;
    let before = s.now().await.expect("now");
    let l = won(s, req("seat:alice", A)).await;
    assert_eq!(
        (l.resource.as_str(), l.owner.as_str(), l.epoch, l.state),
        ("seat:alice", A, 1, LeaseState::Held)
    );
    assert_eq!(
        (l.preferred.as_str(), l.protocol),
        ("node-a", crewlet::config::PROTOCOL)
    );
    assert!(
        l.acquired_at >= before,
        "acquired_at is the store's stamp on the winning write"
    );
    assert_eq!(l.expires_at, l.acquired_at.plus(TTL));
    assert_eq!(s.epoch("seat:alice").await.expect("epoch"), 1);
    let read = s.lease("seat:alice").await.expect("read").expect("held");
    assert_eq!(
        (
            read.owner.as_str(),
            read.epoch,
            read.acquired_at,
            read.expires_at
        ),
        (A, 1, l.acquired_at, l.expires_at)
    );
}

async fn held_resource_reports_its_holder_and_mints_nothing<B: Backend>(fx: Fx<B>) {
    let peer = fx.peer().await;
    let l = won(&fx.store, req("seat:alice", A)).await;
    let h = held_by(&peer, req("seat:alice", B)).await;
    assert_eq!(
        (h.owner.as_str(), h.epoch, h.state),
        (A, l.epoch, LeaseState::Held)
    );
    assert_eq!(
        peer.epoch("seat:alice").await.expect("epoch"),
        1,
        "a refused claim mints no epoch"
    );
}

async fn live_lease_is_renewed_not_claimed_again_by_its_owner<B: Backend>(fx: Fx<B>) {
    let l = won(&fx.store, req("seat:alice", A)).await;
    let h = held_by(&fx.store, req("seat:alice", A)).await;
    assert_eq!((h.owner.as_str(), h.epoch), (A, l.epoch));
    renewed(&fx.store, &l, A).await;
}

async fn two_incarnations_of_one_node_cannot_renew_each_others_lease<B: Backend>(fx: Fx<B>) {
    let restarted = fx.peer().await;
    let l = won(&fx.store, req("seat:alice", A)).await;
    // The same node id, booted again: a different owner.
    let h = held_by(&restarted, req("seat:alice", A2)).await;
    assert_eq!(restarted.renew(&h, A2, None).await, Renewal::Lost);
    assert_eq!(
        restarted.release(&h, A2).await.expect("release"),
        Release::NotHeld
    );
    let l2 = renewed(&fx.store, &l, A).await;
    assert_eq!((l2.owner.as_str(), l2.epoch), (A, 1));
}

async fn epoch_is_monotonic_across_key_expiry<B: Backend>(fx: Fx<B>) {
    let l = won(&fx.store, req("seat:alice", A)).await;
    fx.lapse(&l).await;
    // The key itself ages out of the bucket (no event, no tombstone).
    fx.aged_out(&l.resource).await;
    let next = won(&fx.peer().await, req("seat:alice", B)).await;
    assert_eq!(
        next.epoch, 2,
        "the counter lives apart from the record and survives its expiry"
    );
}

async fn epoch_is_monotonic_across_release<B: Backend>(fx: Fx<B>) {
    let peer = fx.peer().await;
    let mut last = 0;
    for (store, owner) in [(&fx.store, A), (&peer, B), (&fx.store, A)] {
        let l = won(store, req("seat:alice", owner)).await;
        assert_eq!(l.epoch, last + 1);
        last = l.epoch;
        assert_eq!(
            store.release(&l, owner).await.expect("release"),
            Release::Released
        );
    }
    assert_eq!(fx.store.lease("seat:alice").await.expect("read"), None);
}

async fn lapsed_lease_cannot_be_renewed<B: Backend>(fx: Fx<B>) {
    let l = won(&fx.store, req("seat:alice", A)).await;
    fx.lapse(&l).await;
    assert_eq!(fx.store.renew(&l, A, None).await, Renewal::Lost);
    assert_eq!(fx.store.lease("seat:alice").await.expect("read"), None);
}

async fn lapsed_lease_reacquire_bumps_epoch_for_same_owner<B: Backend>(fx: Fx<B>) {
    let l = won(&fx.store, req("seat:alice", A)).await;
    fx.lapse(&l).await;
    let again = won(&fx.store, req("seat:alice", A)).await;
    assert_eq!(again.owner, A);
    assert!(
        again.epoch > l.epoch,
        "the same owner is fenced against its own past self"
    );
    assert!(again.acquired_at > l.acquired_at);
}

async fn renewal_never_restamps_acquired_at<B: Backend>(fx: Fx<B>) {
    let l = won(&fx.store, req("seat:alice", A)).await;
    fx.until(l.acquired_at.plus(Duration::from_millis(300)))
        .await;
    let r1 = renewed(&fx.store, &l, A).await;
    fx.until(l.acquired_at.plus(Duration::from_millis(600)))
        .await;
    let r2 = renewed(&fx.store, &r1, A).await;
    for r in [&r1, &r2] {
        assert_eq!(
            (r.epoch, r.acquired_at),
            (l.epoch, l.acquired_at),
            "a renewal carries acquired_at unchanged"
        );
    }
    assert!(
        r1.expires_at > l.expires_at && r2.expires_at >= r1.expires_at,
        "and moves expires_at"
    );
    assert_ne!(r1.revision, l.revision);
    let read = fx
        .store
        .lease("seat:alice")
        .await
        .expect("read")
        .expect("held");
    assert_eq!(read.acquired_at, l.acquired_at);
}

async fn acquired_at_moves_exactly_when_the_epoch_does<B: Backend>(fx: Fx<B>) {
    let l = won(&fx.store, req("seat:alice", A)).await;
    fx.until(l.acquired_at.plus(Duration::from_millis(100)))
        .await;
    let r = renewed(&fx.store, &l, A).await;
    assert_eq!(r.acquired_at, l.acquired_at);
    fx.store.release(&r, A).await.expect("release");
    let next = won(&fx.store, req("seat:alice", A)).await;
    assert_eq!(next.epoch, l.epoch + 1);
    assert!(next.acquired_at > l.acquired_at);
}

async fn renewal_replaces_presence_metadata<B: Backend>(fx: Fx<B>) {
    let mut m = Metadata::new();
    m.insert("seats_held".into(), 1.into());
    m.insert("labels".into(), serde_json::json!(["gpu"]));
    let l = won(&fx.store, req("node:node-a", A).with_metadata(m)).await;
    assert_eq!(l.metadata.get("seats_held"), Some(&serde_json::json!(1)));
    let mut m2 = Metadata::new();
    m2.insert("seats_held".into(), 2.into());
    m2.insert("draining".into(), true.into());
    let r = match fx.store.renew(&l, A, Some(m2.clone())).await {
        Renewal::Renewed(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.metadata, m2);
    let kept = renewed(&fx.store, &r, A).await;
    assert_eq!(
        kept.metadata, m2,
        "a renewal without metadata keeps the record's"
    );
    let seen = fx
        .peer()
        .await
        .lease("node:node-a")
        .await
        .expect("read")
        .expect("live");
    assert_eq!(seen.metadata, m2);
}

async fn release_is_only_by_the_owner_of_that_tenure<B: Backend>(fx: Fx<B>) {
    let peer = fx.peer().await;
    let l = won(&fx.store, req("seat:alice", A)).await;
    assert_eq!(
        peer.release(&l, B).await.expect("release"),
        Release::NotHeld,
        "not B's tenure"
    );
    lapse_on(&peer, &l).await;
    let lb = won(&peer, req("seat:alice", B)).await;
    assert_eq!(
        fx.store.release(&l, A).await.expect("release"),
        Release::NotHeld,
        "A's tenure is over"
    );
    let still = fx
        .store
        .lease("seat:alice")
        .await
        .expect("read")
        .expect("B holds it");
    assert_eq!((still.owner.as_str(), still.epoch), (B, lb.epoch));
    assert_eq!(
        peer.release(&lb, B).await.expect("release"),
        Release::Released
    );
    assert_eq!(peer.lease("seat:alice").await.expect("read"), None);
}

async fn claim_failing_after_its_record_leaves_nothing_held<B: Backend>(fx: Fx<B>) {
    fx.store.inject(Fault::FailAfter(ClaimStep::Record));
    let err = fx
        .store
        .claim(req("seat:alice", A))
        .await
        .expect_err("injected");
    assert_eq!(err, StoreError::Injected(ClaimStep::Record));
    assert_eq!(
        fx.store.lease("seat:alice").await.expect("read"),
        None,
        "its record was given back"
    );
    let l = won(&fx.peer().await, req("seat:alice", B)).await;
    assert_eq!(l.epoch, 1);
}

async fn claim_failing_after_the_counter_leaves_nothing_held_and_the_gap_is_harmless<B: Backend>(
    fx: Fx<B>,
) {
    fx.store.inject(Fault::FailAfter(ClaimStep::Counter));
    fx.store
        .claim(req("seat:alice", A))
        .await
        .expect_err("injected");
    assert_eq!(fx.store.lease("seat:alice").await.expect("read"), None);
    assert_eq!(
        fx.store.epoch("seat:alice").await.expect("epoch"),
        1,
        "the failed claim advanced the counter"
    );
    let l = won(&fx.peer().await, req("seat:alice", B)).await;
    assert_eq!(l.epoch, 2, "a gap, harmlessly");
}

async fn committed_tenure_is_never_given_back<B: Backend>(fx: Fx<B>) {
    fx.store.inject(Fault::FailAfter(ClaimStep::Token));
    fx.store
        .claim(req("seat:alice", A))
        .await
        .expect_err("injected");
    let l = fx
        .store
        .lease("seat:alice")
        .await
        .expect("read")
        .expect("the committed tenure stands");
    assert_eq!(
        (l.owner.as_str(), l.epoch, l.state),
        (A, 1, LeaseState::Held)
    );
}

async fn lost_record_answer_is_reread_before_retrying<B: Backend>(fx: Fx<B>) {
    fx.store.inject(Fault::LoseAnswer(ClaimStep::Record));
    let l = won(&fx.store, req("seat:alice", A)).await;
    assert_eq!(l.epoch, 1);
    assert_eq!(fx.store.epoch("seat:alice").await.expect("epoch"), 1);
}

async fn lost_counter_answer_is_reread_not_minted_twice<B: Backend>(fx: Fx<B>) {
    won(&fx.store, req("seat:bob", A)).await;
    fx.store.inject(Fault::LoseAnswer(ClaimStep::Counter));
    let l = won(&fx.store, req("seat:alice", A)).await;
    assert_eq!(l.epoch, 1);
    assert_eq!(
        fx.store.epoch("seat:alice").await.expect("epoch"),
        1,
        "the landed write was recognised, not repeated"
    );
}

async fn lost_token_answer_is_reread<B: Backend>(fx: Fx<B>) {
    fx.store.inject(Fault::LoseAnswer(ClaimStep::Token));
    let l = won(&fx.store, req("seat:alice", A)).await;
    assert_eq!((l.epoch, l.state), (1, LeaseState::Held));
    renewed(&fx.store, &l, A).await;
}

async fn caller_that_gave_up_mid_claim_gives_its_record_back<B: Backend>(fx: Fx<B>) {
    let resume = Arc::new(Notify::new());
    fx.store.inject(Fault::HoldAfter(ClaimStep::Record, resume));
    let s = fx.store.clone();
    let claim = fx.store.claim(req("seat:alice", A));
    let record_written = async {
        eventually("the claiming record", || {
            let s = s.clone();
            async move {
                s.lease("seat:alice")
                    .await
                    .is_ok_and(|l| l.is_some_and(|l| l.state == LeaseState::Claiming))
            }
        })
        .await
    };
    tokio::select! {
        r = claim => panic!("the held claim finished: {r:?}"),
        _ = record_written => {} // the caller gives up: the claim's future is dropped here
    }
    let peer = fx.peer().await;
    let p = peer.clone();
    eventually("the record to be given back", || {
        let p = p.clone();
        async move { p.lease("seat:alice").await.is_ok_and(|l| l.is_none()) }
    })
    .await;
    let l = won(&peer, req("seat:alice", B)).await;
    assert_eq!(l.epoch, 1);
}

async fn give_back_never_takes_a_sibling_claim<B: Backend>(fx: Fx<B>) {
    let slow = fx.peer_with_timeout(Duration::from_secs(25)).await;
    let resume = Arc::new(Notify::new());
    slow.inject(Fault::HoldAfter(ClaimStep::Record, resume.clone()));
    let task = tokio::spawn({
        let slow = slow.clone();
        async move { slow.claim(req("seat:alice", A)).await }
    });
    let s = fx.store.clone();
    let stuck = eventually_lease(&s, "seat:alice", |l| l.state == LeaseState::Claiming).await;
    fx.lapse(&stuck).await;
    let b = won(&fx.store, req("seat:alice", B)).await;
    resume.notify_one();
    let r = task.await.expect("join");
    assert_eq!(r, Err(StoreError::Injected(ClaimStep::Record)));
    let still = fx
        .store
        .lease("seat:alice")
        .await
        .expect("read")
        .expect("B's tenure stands");
    assert_eq!(
        (still.owner.as_str(), still.epoch, still.revision),
        (B, b.epoch, b.revision)
    );
}

async fn eventually_lease<B: Backend>(
    s: &Coordinator<B>,
    resource: &str,
    pred: impl Fn(&Lease) -> bool,
) -> Lease {
    let until = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Ok(Some(l)) = s.lease(resource).await
            && pred(&l)
        {
            return l;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out waiting for the lease on {resource}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn refused_give_back_leaves_the_record_to_lapse<B: Backend>(fx: Fx<B>) {
    fx.store.inject(Fault::FailAfter(ClaimStep::Counter));
    fx.store.inject(Fault::RefuseGiveBack);
    fx.store
        .claim(req("seat:alice", A))
        .await
        .expect_err("injected");
    let peer = fx.peer().await;
    let h = held_by(&peer, req("seat:alice", B)).await;
    assert_eq!(
        (h.owner.as_str(), h.state),
        (A, LeaseState::Claiming),
        "read as a sibling claim until it lapses"
    );
    lapse_on(&peer, &h).await;
    let l = won(&peer, req("seat:alice", B)).await;
    assert_eq!(l.epoch, 2);
}

async fn list_by_prefix_returns_live_leases_of_that_kind<B: Backend>(fx: Fx<B>) {
    let s = &fx.store;
    for r in ["seat:alice", "seat:bob", "node:node-a"] {
        won(s, req(r, A)).await;
    }
    won(
        s,
        req("worker:scheduler", A).with_ttl(Duration::from_secs(30)),
    )
    .await;
    let names = |v: Vec<Lease>| v.into_iter().map(|l| l.resource).collect::<Vec<_>>();
    assert_eq!(
        names(s.list("seat:").await.expect("list")),
        ["seat:alice", "seat:bob"]
    );
    assert_eq!(names(s.list("node:").await.expect("list")), ["node:node-a"]);
    assert_eq!(
        names(s.list("worker:").await.expect("list")),
        ["worker:scheduler"]
    );
    assert_eq!(
        names(s.list("seat:al").await.expect("list")),
        ["seat:alice"]
    );
    assert_eq!(s.list("").await.expect("list").len(), 4);
    assert_eq!(s.list("mailbox:").await.expect("list"), []);
}

/// A list sees every live lease even when one is renewed between the
/// moment the list read its scope's last revision and the moment its watch
/// began: the renewal lands past that revision (and the renewed key's older
/// message is gone), so a list that stopped at the revision it first read
/// left the lease out — a draining node once found no live successor so.
async fn a_lease_renewed_while_a_list_reads_is_still_listed<B: Backend>(fx: Fx<B>) {
    let s = &fx.store;
    let a = won(s, req("node:node-a", A)).await;
    won(s, req("node:node-b", B)).await;
    let read = Arc::new(Notify::new());
    let go = Arc::new(Notify::new());
    fx.store.inject(Fault::Hold {
        at: HoldPoint::Scan,
        read: read.clone(),
        go: go.clone(),
    });
    let listing = {
        let s = s.clone();
        tokio::spawn(async move { s.list("node:").await })
    };
    read.notified().await;
    // node-a's record was written first; renewed now, it is the newest.
    renewed(s, &a, A).await;
    go.notify_one();
    let names: Vec<String> = listing
        .await
        .expect("the list task")
        .expect("list")
        .into_iter()
        .map(|l| l.resource)
        .collect();
    assert_eq!(names, ["node:node-a", "node:node-b"]);
}

async fn lapsed_leases_leave_the_list_without_any_event<B: Backend>(fx: Fx<B>) {
    let a = won(&fx.store, req("seat:alice", A)).await;
    fx.until(a.acquired_at.plus(TTL / 2)).await;
    let b = won(&fx.store, req("seat:bob", A)).await;
    fx.lapse(&a).await;
    let live: Vec<String> = fx
        .store
        .list("seat:")
        .await
        .expect("list")
        .into_iter()
        .map(|l| l.resource)
        .collect();
    if fx.store.now().await.expect("now") < b.expires_at {
        assert_eq!(live, ["seat:bob"]);
    } else {
        assert!(!live.contains(&"seat:alice".to_string()));
    }
}

async fn view_is_level_with_the_last_write<B: Backend>(fx: Fx<B>) {
    let peer = fx.peer().await;
    assert_eq!(fx.store.view("seat:").await.expect("view"), []);
    let l = won(&peer, req("seat:alice", B)).await;
    let seen = fx.store.view("seat:").await.expect("view");
    assert_eq!(
        seen.len(),
        1,
        "a write just acknowledged elsewhere is in the answer"
    );
    assert_eq!((seen[0].owner.as_str(), seen[0].epoch), (B, l.epoch));
    peer.release(&l, B).await.expect("release");
    assert_eq!(fx.store.view("seat:").await.expect("view"), []);
    for i in 0..50 {
        won(&peer, req(&format!("seat:s{i:02}"), B)).await;
    }
    assert_eq!(fx.store.view("seat:").await.expect("view").len(), 50);
    assert_eq!(fx.store.view("node:").await.expect("view"), []);
}

async fn view_judges_liveness_from_expires_at<B: Backend>(fx: Fx<B>) {
    let l = won(&fx.store, req("seat:alice", A)).await;
    assert_eq!(fx.store.view("seat:").await.expect("view").len(), 1);
    fx.lapse(&l).await;
    // No event arrives for an expiry on 2.9; the view judges by expires_at.
    assert_eq!(fx.store.view("seat:").await.expect("view"), []);
}

async fn view_stops_after_it_goes_unused<B: Backend>(fx: Fx<B>) {
    assert!(!fx.store.view_running(), "the view starts on demand");
    // Its last use is inside the read below: the idle period may begin any
    // time before the read returns, never before it was asked.
    let started = tokio::time::Instant::now();
    fx.store.protocol_floor(4).await.expect("floor");
    assert!(fx.store.view_running());
    let s = fx.store.clone();
    eventually_within(fx.view_idle + DEADLINE, "the unused view to stop", || {
        let s = s.clone();
        async move { !s.view_running() }
    })
    .await;
    assert!(
        started.elapsed() >= fx.view_idle,
        "not before it has been unused for its idle period"
    );
    won(&fx.peer().await, req("node:old", B).with_protocol(3)).await;
    assert_eq!(
        fx.store.protocol_floor(4).await.expect("floor"),
        Some(3),
        "and starts again on the next question"
    );
}

async fn protocol_floor_counts_presence_and_seat_leases_never_duties<B: Backend>(fx: Fx<B>) {
    let old = fx.peer().await;
    let s = &fx.store;
    assert_eq!(s.protocol_floor(4).await.expect("floor"), None);
    won(
        &old,
        req("worker:learning", B)
            .with_protocol(2)
            .with_ttl(Duration::from_secs(60)),
    )
    .await;
    assert_eq!(
        s.protocol_floor(4).await.expect("floor"),
        None,
        "a duty never counts"
    );
    let presence = won(&old, req("node:node-b", B).with_protocol(3)).await;
    assert_eq!(s.protocol_floor(4).await.expect("floor"), Some(3));
    let seat = won(&old, req("seat:alice", B).with_protocol(2)).await;
    assert_eq!(s.protocol_floor(4).await.expect("floor"), Some(2));
    // A draining node gives its presence up first and keeps its seats: they still count.
    old.release(&presence, B).await.expect("release");
    assert_eq!(s.protocol_floor(4).await.expect("floor"), Some(2));
    old.release(&seat, B).await.expect("release");
    assert_eq!(s.protocol_floor(4).await.expect("floor"), None);
    assert_eq!(
        s.protocol_floor(2).await.expect("floor"),
        None,
        "the gate only looks down"
    );
}

async fn protocol_floor_ignores_lapsed_leases<B: Backend>(fx: Fx<B>) {
    let l = won(&fx.peer().await, req("node:node-b", B).with_protocol(3)).await;
    assert_eq!(fx.store.protocol_floor(4).await.expect("floor"), Some(3));
    fx.lapse(&l).await;
    assert_eq!(fx.store.protocol_floor(4).await.expect("floor"), None);
}

async fn a_gated_claim_judges_the_protocol_gate_only_once_its_seat_reads_free<B: Backend>(
    fx: Fx<B>,
) {
    let peer = fx.peer().await;
    won(&peer, req("seat:alice", B)).await;
    let old = won(&peer, req("node:old", B).with_protocol(3)).await;
    let s = &fx.store;
    // A claim on a seat a peer holds judges no gate: the peer's hold is the
    // rule that refuses it, and no view of the fleet's leases is kept.
    let holder = held_by(s, req("seat:alice", A).with_protocol(4).gated()).await;
    assert_eq!(holder.owner, B, "the refusal names the peer's hold");
    assert!(
        !s.view_running(),
        "a claim on a held seat reads no protocol floor"
    );
    // A free seat: the gate is judged, refuses at the lower lease's
    // protocol, and nothing is left held.
    match s.claim(req("seat:bob", A).with_protocol(4).gated()).await {
        Ok(Claim::Gated { floor }) => assert_eq!(floor, 3, "the refusal names the floor"),
        other => panic!("expected the protocol gate to refuse, got {other:?}"),
    }
    assert!(s.view_running(), "the gate was judged from the live view");
    assert_eq!(
        s.lease("seat:bob").await.expect("read"),
        None,
        "a refused claim leaves the seat free"
    );
    // An ungated claim (a duty, a presence) never asks.
    won(s, req("worker:scheduler", A).with_protocol(4)).await;
    // The lower lease gone, the same claim wins.
    peer.release(&old, B).await.expect("release");
    let bob = won(s, req("seat:bob", A).with_protocol(4).gated()).await;
    assert_eq!(bob.owner, A);
}

async fn duty_leases_have_their_own_ttl_and_bucket<B: Backend>(fx: Fx<B>) {
    let duty_ttl = TTL * 2;
    let d = won(&fx.store, req("worker:scheduler", A).with_ttl(duty_ttl)).await;
    let seat = won(&fx.store, req("seat:alice", A)).await;
    assert_eq!(d.expires_at, d.acquired_at.plus(duty_ttl));
    assert_eq!(
        fx.store.list("seat:").await.expect("list").len(),
        1,
        "duties are not in the seat bucket"
    );
    fx.lapse(&seat).await;
    assert!(
        fx.store
            .lease("worker:scheduler")
            .await
            .expect("read")
            .is_some(),
        "the seat TTL does not bound a duty"
    );
    let d2 = renewed(&fx.store, &d, A).await;
    assert_eq!(d2.ttl, duty_ttl);
    assert!(d2.expires_at > d.expires_at);
    fx.lapse(&d2).await;
    assert_eq!(
        fx.store.lease("worker:scheduler").await.expect("read"),
        None
    );
    // The duties bucket keeps no age: the lapsed record is taken over.
    let next = won(
        &fx.peer().await,
        req("worker:scheduler", B).with_ttl(duty_ttl),
    )
    .await;
    assert_eq!(next.epoch, 2);
}

async fn lease_ttl_in_force_is_exposed<B: Backend>(fx: Fx<B>) {
    assert_eq!(fx.store.lease_ttl(), TTL);
    assert_eq!(fx.store.connection(), ConnectionState::Connected);
    assert_eq!(
        *fx.store.connection_changes().borrow(),
        ConnectionState::Connected
    );
}

async fn state_buckets_are_compare_and_set<B: Backend>(fx: Fx<B>) {
    let s = &fx.store;
    for b in [
        StateBucket::Ledger,
        StateBucket::Mailboxes,
        StateBucket::Pauses,
        StateBucket::Config,
    ] {
        let k = "seat:alice";
        let r1 = s
            .create(b, k, Bytes::from_static(b"1"))
            .await
            .expect("create");
        assert_eq!(
            s.create(b, k, Bytes::from_static(b"x")).await,
            Err(KvError::AlreadyExists)
        );
        assert_eq!(
            s.update(b, k, Bytes::from_static(b"x"), r1 + 100).await,
            Err(KvError::WrongRevision)
        );
        let r2 = s
            .update(b, k, Bytes::from_static(b"2"), r1)
            .await
            .expect("update");
        let e = s.get(b, k).await.expect("get").expect("present");
        assert_eq!((e.value.as_ref(), e.revision), (b"2".as_ref(), r2));
        assert_eq!(s.delete(b, k, r1).await, Err(KvError::WrongRevision));
        s.delete(b, k, r2).await.expect("delete");
        assert_eq!(s.get(b, k).await.expect("get"), None);
    }
}

/// 10,000 seats: the spec's scale and the company file's role limit.
fn large_company() -> Vec<crewlet::config::RoleConfig> {
    (0..crewlet::config::MAX_ROLES)
        .map(|i| crate::support::turnfleet::echo_role(&format!("seat-{i:05}")))
        .collect()
}

/// A company's revision is one value while it fits; a 10,000-seat one
/// (about 2 MB, past NATS's default 1 MiB `max_payload`, which the NATS
/// fixture's server keeps) is kept in parts and read back whole by a peer.
async fn a_company_too_large_for_one_message_is_applied_in_parts_and_a_peer_reads_it_whole<
    B: Backend,
>(
    fx: Fx<B>,
) {
    let roles = large_company();
    let n = crewlet::company::apply(&fx.store, "Large", &roles)
        .await
        .expect("a 10,000-seat company applies");
    let manifest = fx
        .store
        .get(StateBucket::Config, &crewlet::company::revision_key(n))
        .await
        .expect("get")
        .expect("the revision is there");
    assert!(
        manifest.value.len() < crewlet::company::PART_BYTES,
        "the revision key holds the manifest, {} bytes",
        manifest.value.len()
    );
    let parts = fx
        .store
        .entries(StateBucket::Config, "revision-part:")
        .await
        .expect("entries");
    let written: usize = parts.iter().map(|e| e.value.len()).sum();
    assert!(
        written > 1024 * 1024 && parts.len() >= 4,
        "{} parts, {written} bytes",
        parts.len()
    );
    assert!(
        parts
            .iter()
            .all(|e| e.value.len() <= crewlet::company::PART_BYTES)
    );
    let peer = (fx.make)(options(fx.view_idle)).await;
    let read = crewlet::company::active(&peer)
        .await
        .expect("a peer reads the revision")
        .expect("active");
    assert_eq!(read.revision, n);
    assert_eq!(read.name, "Large");
    assert_eq!(read.roles, roles);
    // A small company after it is one value again, and the pointer moves.
    let small = &roles[..3];
    let m = crewlet::company::apply(&fx.store, "Small", small)
        .await
        .expect("apply");
    assert_eq!(m, n + 1);
    let read = crewlet::company::active(&peer).await.unwrap().unwrap();
    assert_eq!((read.revision, read.roles.as_slice()), (m, small));
}

/// Apply the large company (kept in parts): its revision and its parts.
async fn large_company_in_parts<B: Backend>(fx: &Fx<B>) -> (u64, Vec<crewlet::coord::Entry>) {
    let n = crewlet::company::apply(&fx.store, "Large", &large_company())
        .await
        .expect("apply");
    let parts = fx
        .store
        .entries(StateBucket::Config, "revision-part:")
        .await
        .expect("entries");
    (n, parts)
}

/// A revision in parts is read whole or not at all: with a part gone the
/// read fails naming the part, and no node follows a company cut short.
async fn a_company_revision_missing_a_part_is_unreadable_not_half_read<B: Backend>(fx: Fx<B>) {
    let (n, parts) = large_company_in_parts(&fx).await;
    let id = parts[0].key.split(':').nth(1).expect("an id").to_string();
    let second = crewlet::company::part_key(&id, 1);
    let gone = parts.iter().find(|e| e.key == second).expect("part 2");
    fx.store
        .delete(StateBucket::Config, &gone.key, gone.revision)
        .await
        .expect("delete");
    let err = crewlet::company::active(&fx.store)
        .await
        .expect_err("a revision missing a part is not read");
    let said = err.to_string();
    assert!(
        said.contains(&format!("revision {n}")) && said.contains("part 2 of"),
        "{said}"
    );
}

/// A part rewritten in the store (the same length, other bytes: a
/// corrupted or tampered write) fails the manifest's SHA-256, and the
/// revision is not read: no node follows a company nobody applied.
async fn a_company_revision_with_an_altered_part_is_unreadable<B: Backend>(fx: Fx<B>) {
    let (n, parts) = large_company_in_parts(&fx).await;
    let first = &parts[0];
    let mut altered = first.value.to_vec();
    let at = altered.len() / 2;
    altered[at] = if altered[at] == b'a' { b'b' } else { b'a' };
    fx.store
        .update(
            StateBucket::Config,
            &first.key,
            Bytes::from(altered),
            first.revision,
        )
        .await
        .expect("update");
    let said = match crewlet::company::active(&fx.store).await {
        Err(e) => e.to_string(),
        Ok(read) => panic!(
            "a revision with an altered part was read ({} roles)",
            read.map_or(0, |c| c.roles.len())
        ),
    };
    assert!(
        said.contains(&format!("revision {n}")) && said.contains("do not match the manifest"),
        "{said}"
    );
}

async fn state_entries_and_watch_by_prefix<B: Backend>(fx: Fx<B>) {
    let s = &fx.store;
    let b = StateBucket::Ledger;
    s.create(b, "evt:1", Bytes::from_static(b"a"))
        .await
        .expect("create");
    s.create(b, "evt:2", Bytes::from_static(b"b"))
        .await
        .expect("create");
    s.create(b, "other:1", Bytes::from_static(b"c"))
        .await
        .expect("create");
    let keys: Vec<String> = s
        .entries(b, "evt:")
        .await
        .expect("entries")
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, ["evt:1", "evt:2"]);
    let mut w = s.watch(b, "evt:").await.expect("watch");
    let mut next = async || {
        tokio::time::timeout(DEADLINE, w.next())
            .await
            .expect("an event")
            .expect("open")
            .expect("ok")
    };
    let first = [next().await, next().await];
    assert!(
        first.iter().all(|e| matches!(e, Event::Put(_))),
        "current values first"
    );
    let r3 = s
        .create(b, "evt:3", Bytes::from_static(b"d"))
        .await
        .expect("create");
    s.create(b, "other:2", Bytes::from_static(b"e"))
        .await
        .expect("create");
    match next().await {
        Event::Put(e) => assert_eq!((e.key.as_str(), e.revision), ("evt:3", r3)),
        other => panic!("{other:?}"),
    }
    s.delete(b, "evt:3", r3).await.expect("delete");
    assert!(matches!(next().await, Event::Delete { key, .. } if key == "evt:3"));
}

async fn kv_trap_create_after_delete_has_exactly_one_winner<B: Backend>(fx: Fx<B>) {
    let peer = fx.peer().await;
    let b = StateBucket::Mailboxes;
    for i in 0..20 {
        let k = format!("seat:s{i}");
        let r = fx
            .store
            .create(b, &k, Bytes::from_static(b"0"))
            .await
            .expect("create");
        fx.store.delete(b, &k, r).await.expect("delete");
        let (x, y) = tokio::join!(
            fx.store.create(b, &k, Bytes::from_static(b"x")),
            peer.create(b, &k, Bytes::from_static(b"y"))
        );
        let wins = [&x, &y].iter().filter(|r| r.is_ok()).count();
        assert_eq!(
            wins, 1,
            "create after delete: exactly one winner ({x:?}, {y:?})"
        );
        let loser = if x.is_ok() { &y } else { &x };
        assert_eq!(loser, &Err(KvError::AlreadyExists));
    }
}

async fn kv_trap_wrong_last_sequence_after_delete<B: Backend>(fx: Fx<B>) {
    let b = StateBucket::Pauses;
    let r = fx
        .store
        .create(b, "seat:alice", Bytes::from_static(b"1"))
        .await
        .expect("create");
    fx.store.delete(b, "seat:alice", r).await.expect("delete");
    assert_eq!(
        fx.store
            .update(b, "seat:alice", Bytes::from_static(b"2"), r)
            .await,
        Err(KvError::WrongRevision)
    );
    assert_eq!(
        fx.store.delete(b, "seat:alice", r).await,
        Err(KvError::WrongRevision)
    );
    fx.store
        .create(b, "seat:alice", Bytes::from_static(b"3"))
        .await
        .expect("create after delete");
}

async fn kv_trap_create_after_expiry<B: Backend>(fx: Fx<B>) {
    let l = won(&fx.store, req("seat:alice", A)).await;
    fx.lapse(&l).await;
    let s = fx.store.clone();
    eventually("the key to age out", || {
        let s = s.clone();
        async move {
            s.backend()
                .get(BucketId::Leases, "seat:alice")
                .await
                .is_ok_and(|e| e.is_none())
        }
    })
    .await;
    // A stale revision from before the expiry refuses; a create works.
    assert_eq!(fx.store.renew(&l, A, None).await, Renewal::Lost);
    let again = won(&fx.peer().await, req("seat:alice", B)).await;
    assert_eq!(again.epoch, 2);
}

async fn concurrent_updates_at_one_revision_have_exactly_one_winner<B: Backend>(fx: Fx<B>) {
    // Two sweeps marking one mailbox record: exactly one wins the mark.
    let peer = fx.peer().await;
    let b = StateBucket::Mailboxes;
    fx.store
        .create(b, "seat:alice", Bytes::from_static(b"{}"))
        .await
        .expect("create");
    for _ in 0..10 {
        let cur = fx
            .store
            .get(b, "seat:alice")
            .await
            .expect("get")
            .expect("present")
            .revision;
        let (x, y) = tokio::join!(
            fx.store
                .update(b, "seat:alice", Bytes::from_static(b"x"), cur),
            peer.update(b, "seat:alice", Bytes::from_static(b"y"), cur)
        );
        assert_eq!(
            [&x, &y].iter().filter(|r| r.is_ok()).count(),
            1,
            "{x:?} {y:?}"
        );
        assert!([&x, &y].contains(&&Err(KvError::WrongRevision)));
    }
}

async fn ledger_record_written_by_one_node_is_found_by_a_peer<B: Backend>(fx: Fx<B>) {
    // A redelivery that lands on a peer has to find the completion.
    let b = StateBucket::Ledger;
    fx.store
        .create(b, "agent:alice:evt-1", Bytes::from_static(b"done"))
        .await
        .expect("record");
    let peer = fx.peer().await;
    let e = peer
        .get(b, "agent:alice:evt-1")
        .await
        .expect("get")
        .expect("found on the peer");
    assert_eq!(e.value.as_ref(), b"done");
    assert_eq!(
        peer.create(b, "agent:alice:evt-1", Bytes::from_static(b"again"))
            .await,
        Err(KvError::AlreadyExists)
    );
}

async fn removal_markers_are_listed_and_purged_through_their_own_revision<B: Backend>(fx: Fx<B>) {
    let s = &fx.store;
    let b = StateBucket::Mailboxes;
    let ra = s
        .create(b, "seat:a", Bytes::from_static(b"1"))
        .await
        .expect("create");
    s.delete(b, "seat:a", ra).await.expect("delete");
    let rb = s
        .create(b, "seat:b", Bytes::from_static(b"1"))
        .await
        .expect("create");
    s.delete(b, "seat:b", rb).await.expect("delete");
    let markers = s.markers(b, "seat:").await.expect("markers");
    assert_eq!(
        markers.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(),
        ["seat:a", "seat:b"]
    );
    let now = s.now().await.expect("now");
    assert!(
        markers.iter().all(|m| m.written_at <= now),
        "stamped on the store's clock"
    );
    let mb = markers[1].revision;
    // seat:b is written again after its marker was listed.
    let rb2 = s
        .create(b, "seat:b", Bytes::from_static(b"2"))
        .await
        .expect("create again");
    for m in &markers {
        s.purge_marker(b, &m.key, m.revision).await.expect("purge");
    }
    assert_eq!(s.markers(b, "seat:").await.expect("markers"), []);
    let kept = s
        .get(b, "seat:b")
        .await
        .expect("get")
        .expect("a key written again since is untouched");
    assert_eq!((kept.value.as_ref(), kept.revision), (b"2".as_ref(), rb2));
    assert!(rb2 > mb);
    s.create(b, "seat:a", Bytes::from_static(b"3"))
        .await
        .expect("create after purge");
}

async fn keys_outside_the_grammar_are_refused_with_a_typed_error<B: Backend>(fx: Fx<B>) {
    for bad in ["mailbox:alice", "seat:", "seat", ""] {
        let r = fx.store.claim(req(bad, A)).await;
        assert!(
            matches!(r, Err(StoreError::InvalidKey { .. })),
            "{bad:?}: {r:?}"
        );
    }
    assert!(matches!(
        fx.store.get(StateBucket::Ledger, "").await,
        Err(StoreError::InvalidKey { .. })
    ));
    assert!(matches!(
        fx.store
            .create(StateBucket::Ledger, "a::b", Bytes::new())
            .await,
        Err(KvError::Store(StoreError::InvalidKey { .. }))
    ));
    // Any other key round-trips, whatever its characters.
    let k = "evt:Ünï code.1=2 /x";
    fx.store
        .create(StateBucket::Ledger, k, Bytes::from_static(b"1"))
        .await
        .expect("create");
    assert_eq!(
        fx.store
            .entries(StateBucket::Ledger, "evt:")
            .await
            .expect("entries")[0]
            .key,
        k
    );
}

// ---- NATS only -------------------------------------------------------------

/// The reads `client` sent since the last look: everything it sent before
/// a mark it publishes now reaches the observer before the mark.
async fn reads_before_mark(
    client: &async_nats::Client,
    marks: &mut async_nats::Subscriber,
    reads: &mut (impl futures::Stream<Item = async_nats::Message> + Unpin),
    mark: &'static str,
) -> Vec<String> {
    use futures::StreamExt;
    client
        .publish("crewlet.test.mark", mark.into())
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), marks.next())
        .await
        .expect("the mark comes back")
        .expect("subscribed");
    assert_eq!(&seen.payload[..], mark.as_bytes());
    let mut out = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::ZERO, reads.next()).await {
        out.push(m.subject.to_string());
    }
    out
}

/// A renewal costs the broker its write alone: the store's clock keeps an
/// upper bound, calibrated by the node's own writes, so a renewal that
/// surely landed in time is counted from when it was sent instead of being
/// read back — neither by its sequence nor by a read pipelined behind it
/// (one a node every minute recalibrates the clock). The holder's expiry
/// is never later than the store's.
#[tokio::test]
async fn a_renewal_is_one_request_its_write_not_a_write_and_a_read() {
    use futures::StreamExt;
    let fx = nats().await;
    let url = fx._server.as_ref().expect("a server").url();
    let observer = async_nats::connect(url).await.unwrap();
    // Every JetStream API request; the reads are the `GET`s among them.
    let mut reads = observer
        .subscribe("$JS.API.>")
        .await
        .unwrap()
        .filter(|m| std::future::ready(m.subject.contains(".GET.")));
    let mut marks = observer.subscribe("crewlet.test.mark").await.unwrap();
    observer.flush().await.unwrap();
    let mut l = won(&fx.store, req("seat:alice", A)).await;
    let before = fx.store.backend().stamp_reads();
    let client = fx.store.backend().client().clone();
    let before_renewals = reads_before_mark(&client, &mut marks, &mut reads, "claimed").await;
    for _ in 0..20 {
        l = renewed(&fx.store, &l, A).await;
    }
    let during = reads_before_mark(&client, &mut marks, &mut reads, "renewed").await;
    assert!(
        !before_renewals.is_empty(),
        "the claim read its stamp (the observer sees reads)"
    );
    assert_eq!(during, Vec::<String>::new(), "no renewal read anything");
    assert_eq!(
        fx.store.backend().stamp_reads(),
        before,
        "no renewal read its own write back"
    );
    let read = fx
        .store
        .lease("seat:alice")
        .await
        .expect("read")
        .expect("held");
    assert_eq!((read.revision, read.epoch), (l.revision, l.epoch));
    assert!(
        l.expires_at <= read.expires_at,
        "the holder never believes its tenure outlasts the store's: {:?} > {:?}",
        l.expires_at,
        read.expires_at
    );
}

#[tokio::test]
async fn user_and_password_reach_an_authenticated_server() {
    let server = NatsServer::start_with(
        "authorization {\n  user: crewlet\n  password: s3cret\n}\n",
        Some(("crewlet", "s3cret")),
    )
    .await;
    let mut o = nats_options(vec![server.url()]);
    o.user = Some("crewlet".into());
    o.password = Some("s3cret".into());
    let store = Coordinator::new(
        NatsBackend::connect(&o).await.expect("connect"),
        options(Duration::from_secs(60)),
    );
    won(&store, req("seat:alice", A)).await;
    o.password = Some("wrong".into());
    let refused = NatsBackend::connect(&o).await;
    assert!(
        matches!(refused, Err(StoreError::Unavailable(_))),
        "a refused login is a typed error"
    );
}

/// A private authority and a server certificate for 127.0.0.1, made with
/// the openssl command: (ca, cert, key).
fn tls_material(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("the openssl command (apt-get install -y openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=crewlet test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

#[tokio::test]
async fn a_tls_url_is_verified_against_the_configured_authority() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = tls_material(dir.path());
    let server = NatsServer::start_tls(&cert, &key, &ca).await;
    let mut o = nats_options(vec![server.tls_url()]);
    o.tls_ca_file = Some(ca);
    let store = Coordinator::new(
        NatsBackend::connect(&o).await.expect("connect over TLS"),
        options(Duration::from_secs(60)),
    );
    let l = won(&store, req("seat:alice", A)).await;
    renewed(&store, &l, A).await;
    // Without the authority the server's certificate proves nothing: the
    // connection is refused with a typed error, never made in plain text.
    o.tls_ca_file = None;
    assert!(
        matches!(
            NatsBackend::connect(&o).await,
            Err(StoreError::Unavailable(_))
        ),
        "an unverifiable server is refused"
    );
    // And a plain URL to a server that requires TLS does not get in either.
    let mut plain = nats_options(vec![server.url()]);
    plain.store_timeout = Duration::from_secs(2);
    assert!(NatsBackend::connect(&plain).await.is_err());
}

/// One JWT signed by `issuer` (the NATS claims encoding: a base64url
/// header and body, an ed25519 signature by the issuer's nkey).
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "jti": format!("{subject}-{now}"),
        "iat": now,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let body = b64.encode(claims.to_string());
    let signed = format!("{header}.{body}");
    let sig = issuer.sign(signed.as_bytes()).expect("sign");
    format!("{signed}.{}", b64.encode(sig))
}

/// An operator, an account with JetStream and a user: the server's config
/// lines and the user's creds file.
fn operator_setup(dir: &std::path::Path) -> (String, std::path::PathBuf) {
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let system = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let op_jwt = jwt(
        &operator,
        &operator.public_key(),
        "crewlet-test",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
    });
    let acc_jwt = jwt(
        &operator,
        &account.public_key(),
        "crewlet",
        serde_json::json!({"limits": unlimited, "type": "account", "version": 2}),
    );
    let sys_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({"type": "account", "version": 2}),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "node",
        serde_json::json!({
            "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
            "type": "user", "version": 2,
        }),
    );
    let creds = dir.join("node.creds");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().expect("seed")
        ),
    )
    .unwrap();
    let config = format!(
        "operator: {op_jwt}\nsystem_account: {sys}\nresolver: MEMORY\nresolver_preload: {{\n  {acc}: {acc_jwt}\n  {sys}: {sys_jwt}\n}}\n",
        acc = account.public_key(),
        sys = system.public_key(),
    );
    (config, creds)
}

#[tokio::test]
async fn a_creds_file_signs_in_to_an_operator_mode_server() {
    let dir = tempfile::tempdir().unwrap();
    let (config, creds) = operator_setup(dir.path());
    let server = NatsServer::start_operator(&config, &creds).await;
    let mut o = nats_options(vec![server.url()]);
    o.creds_file = Some(creds);
    let store = Coordinator::new(
        NatsBackend::connect(&o)
            .await
            .expect("connect with the creds file"),
        options(Duration::from_secs(60)),
    );
    let l = won(&store, req("seat:alice", A)).await;
    renewed(&store, &l, A).await;
    // Without credentials the server lets nobody in: a typed error.
    o.creds_file = None;
    assert!(matches!(
        NatsBackend::connect(&o).await,
        Err(StoreError::Unavailable(_))
    ));
    // A creds file that is not there is named in the error.
    o.creds_file = Some(dir.path().join("missing.creds"));
    match NatsBackend::connect(&o).await {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("missing.creds"), "{m}"),
        Err(other) => panic!("expected an unavailable store naming the file, got {other:?}"),
        Ok(_) => panic!("expected an unavailable store naming the file, got a connection"),
    }
}

#[tokio::test]
async fn several_urls_reach_whichever_server_answers() {
    let server = NatsServer::start().await;
    // The first URL has nobody listening.
    let dead = format!("nats://127.0.0.1:{}", support::free_port());
    let store = nats_store(vec![dead, server.url()], options(Duration::from_secs(60))).await;
    won(&store, req("seat:alice", A)).await;
}

#[tokio::test]
async fn buckets_are_made_as_designed() {
    let server = NatsServer::start().await;
    let store = nats_store(vec![server.url()], options(Duration::from_secs(60))).await;
    let js = store.backend().jetstream();
    for (name, age) in [
        ("crewlet_leases", TTL),
        ("crewlet_epochs", Duration::ZERO),
        ("crewlet_duties", Duration::ZERO),
        ("crewlet_ledger", Duration::from_secs(7 * 24 * 3600)),
        ("crewlet_mailboxes", Duration::ZERO),
        ("crewlet_pauses", Duration::ZERO),
        ("crewlet_config", Duration::ZERO),
        ("crewlet_runs", Duration::ZERO),
        ("crewlet_handoffs", Duration::from_secs(3600)),
    ] {
        let mut st = js.get_stream(format!("KV_{name}")).await.expect("stream");
        let c = st.info().await.expect("info").config.clone();
        assert_eq!(c.max_age, age, "{name}");
        assert!(
            !c.allow_direct,
            "{name}: decisions read from the leader, never a follower"
        );
        assert_eq!(c.max_messages_per_subject, 1, "{name}");
        assert_eq!(c.subjects, [format!("$KV.{name}.>")], "{name}");
        assert!(c.allow_rollup && c.deny_delete, "{name}");
    }
}

#[tokio::test]
async fn peer_created_bucket_ttl_is_adopted() {
    let server = NatsServer::start().await;
    let first = NatsBackend::connect(&nats_options(vec![server.url()]))
        .await
        .expect("connect");
    assert_eq!(first.lease_ttl(), TTL);
    let mut o = nats_options(vec![server.url()]);
    o.lease_ttl = Duration::from_secs(45);
    let second = Coordinator::new(
        NatsBackend::connect(&o).await.expect("connect"),
        options(Duration::from_secs(60)),
    );
    assert_eq!(
        second.lease_ttl(),
        TTL,
        "the bucket's age limit is the TTL in force"
    );
    let l = won(&second, req("seat:alice", B)).await;
    assert_eq!(l.expires_at, l.acquired_at.plus(TTL));
}

#[tokio::test]
async fn unreachable_store_answers_every_call_with_a_typed_error() {
    let mut server = NatsServer::start().await;
    // A TTL long enough that the lease is still live when the renewal is tried.
    let mut o = nats_options(vec![server.url()]);
    o.lease_ttl = Duration::from_secs(60);
    let store = Coordinator::new(
        NatsBackend::connect(&o).await.expect("connect"),
        options(Duration::from_secs(60)),
    );
    let l = won(&store, req("seat:alice", A)).await;
    let mut changes = store.connection_changes();
    assert_eq!(*changes.borrow_and_update(), ConnectionState::Connected);
    server.kill();
    // The drop is reported as it happens.
    tokio::time::timeout(
        DEADLINE,
        changes.wait_for(|s| *s == ConnectionState::Disconnected),
    )
    .await
    .expect("the drop reported")
    .expect("the connection's watch is open");
    assert_ne!(store.connection(), ConnectionState::Connected);
    // Each call returns a typed error; the guard only proves nothing hangs.
    let guard = store.store_timeout() * 5;
    let claim = tokio::time::timeout(guard, store.claim(req("seat:bob", A)))
        .await
        .expect("claim returned");
    assert!(
        matches!(
            claim,
            Err(StoreError::Timeout(_) | StoreError::Unavailable(_))
        ),
        "{claim:?}"
    );
    let renew = tokio::time::timeout(guard, store.renew(&l, A, None))
        .await
        .expect("renew returned");
    assert!(
        matches!(renew, Renewal::Unknown(_)),
        "an unreachable store says nothing about ownership: {renew:?}"
    );
    let rel = tokio::time::timeout(guard, store.release(&l, A))
        .await
        .expect("release returned");
    assert!(rel.is_err());
    let list = tokio::time::timeout(guard, store.list("seat:"))
        .await
        .expect("list returned");
    assert!(list.is_err());
    let get = tokio::time::timeout(guard, store.get(StateBucket::Ledger, "k"))
        .await
        .expect("get returned");
    assert!(get.is_err());
    let floor = tokio::time::timeout(guard, store.protocol_floor(4))
        .await
        .expect("floor returned");
    assert!(floor.is_err());

    server.restart().await;
    tokio::time::timeout(
        DEADLINE,
        changes.wait_for(|s| *s == ConnectionState::Connected),
    )
    .await
    .expect("the reconnect reported")
    .expect("the connection's watch is open");
    let s = store.clone();
    eventually("claims to work again", || {
        let s = s.clone();
        async move { matches!(s.claim(req("seat:bob", A)).await, Ok(Claim::Won(_))) }
    })
    .await;
}

/// A tenure as the cluster test saw it: who, which epoch, from when to the
/// last expiry a renewal granted.
#[derive(Debug, Clone)]
struct Tenure {
    owner: String,
    epoch: u64,
    from: StoreTime,
    until: StoreTime,
}

fn record(history: &mut BTreeMap<String, Vec<Tenure>>, l: &Lease) {
    let ts = history.entry(l.resource.clone()).or_default();
    match ts.iter_mut().find(|t| t.epoch == l.epoch) {
        Some(t) => {
            assert_eq!(t.owner, l.owner, "one epoch, one owner");
            t.until = t.until.max(l.expires_at);
        }
        None => ts.push(Tenure {
            owner: l.owner.clone(),
            epoch: l.epoch,
            from: l.acquired_at,
            until: l.expires_at,
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_leader_kill_claims_and_renews_recover_and_no_lease_is_held_twice() {
    let mut cluster = NatsCluster::start(3).await;
    let mut o = NatsOptions::new(cluster.urls());
    o.lease_ttl = Duration::from_secs(10);
    o.store_timeout = Duration::from_secs(2);
    o.replicas = 3;
    let a = Coordinator::new(
        NatsBackend::connect(&o).await.expect("connect a"),
        options(Duration::from_secs(60)),
    );
    let b = Coordinator::new(
        NatsBackend::connect(&o).await.expect("connect b"),
        options(Duration::from_secs(60)),
    );
    let seats: Vec<String> = (0..6).map(|i| format!("seat:s{i}")).collect();
    let mut history: BTreeMap<String, Vec<Tenure>> = BTreeMap::new();
    let mut held: BTreeMap<(usize, String), Lease> = BTreeMap::new();
    let stores = [(&a, A), (&b, B)];

    // Both nodes compete for every seat, then renew what they won.
    async fn one_round(
        stores: &[(&NatsCoordinator, &str); 2],
        seats: &[String],
        held: &mut BTreeMap<(usize, String), Lease>,
        history: &mut BTreeMap<String, Vec<Tenure>>,
    ) -> (usize, usize) {
        let (mut claims, mut renews) = (0, 0);
        for (i, (s, owner)) in stores.iter().enumerate() {
            for seat in seats {
                let key = (i, seat.clone());
                if let Some(l) = held.get(&key).cloned() {
                    match s.renew(&l, owner, None).await {
                        Renewal::Renewed(r) => {
                            record(history, &r);
                            held.insert(key, r);
                            renews += 1;
                        }
                        Renewal::Lost => {
                            held.remove(&key);
                        }
                        Renewal::Unknown(_) => {}
                    }
                } else if let Ok(Claim::Won(l)) = s.claim(req(seat, owner)).await {
                    record(history, &l);
                    held.insert(key, l);
                    claims += 1;
                }
            }
        }
        (claims, renews)
    }

    let (claims, _) = one_round(&stores, &seats, &mut held, &mut history).await;
    assert_eq!(claims, seats.len(), "every seat taken once before the kill");
    one_round(&stores, &seats, &mut held, &mut history).await;

    let leader = cluster
        .leader_of(a.backend().jetstream(), "KV_crewlet_leases")
        .await
        .expect("the leases stream has a leader");
    cluster.servers[leader].kill();

    // Keep going until both a claim and a renewal have succeeded after the kill.
    // Keep going (a fresh seat each round) until both a claim and a
    // renewal have succeeded after the kill.
    let until = tokio::time::Instant::now() + Duration::from_secs(90);
    let (mut claimed_after, mut renewed_after) = (0, 0);
    let mut round = 0;
    while claimed_after == 0 || renewed_after == 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "claims ({claimed_after}) and renewals ({renewed_after}) did not recover"
        );
        let mut batch = seats.clone();
        batch.push(format!("seat:after{round}"));
        round += 1;
        let (c, r) = one_round(&stores, &batch, &mut held, &mut history).await;
        claimed_after += c;
        renewed_after += r;
    }
    // And a few more rounds with the cluster at two members.
    for _ in 0..3 {
        one_round(&stores, &seats, &mut held, &mut history).await;
    }

    // The live view, brought level from the new leader, answers as a full
    // read does. Starting it (a consumer on the new leader) may take longer
    // than one call's bound: a timeout is a typed answer, so ask again.
    let key = |l: &Lease| (l.resource.clone(), l.owner.clone(), l.epoch);
    let until = tokio::time::Instant::now() + DEADLINE;
    let viewed: Vec<_> = loop {
        match a.view("seat:").await {
            Ok(v) => break v.iter().map(key).collect(),
            Err(StoreError::Timeout(_)) if tokio::time::Instant::now() < until => {}
            Err(e) => panic!("view: {e}"),
        }
    };
    // A full read opens a consumer, and with a member gone the server may
    // place it on that member and never answer: the call then answers with
    // a typed timeout within its bound, and asking again gets through.
    let listed: Vec<_> = loop {
        match a.list("seat:").await {
            Ok(l) => break l.iter().map(key).collect(),
            Err(StoreError::Timeout(_)) if tokio::time::Instant::now() < until => {}
            Err(e) => panic!("list: {e}"),
        }
    };
    assert_eq!(viewed, listed);
    // Reads keep answering within their bound: the same leases, or a
    // typed timeout — never a hang.
    let mut answered = 0;
    for _ in 0..8 {
        let bound = a.store_timeout() * 2;
        match tokio::time::timeout(bound, a.list("seat:")).await {
            Ok(Ok(l)) => {
                assert_eq!(l.len(), listed.len());
                answered += 1;
            }
            Ok(Err(StoreError::Timeout(_))) => {}
            Ok(Err(e)) => panic!("list after the election: {e}"),
            Err(_) => panic!("a full read did not answer within {bound:?}"),
        }
    }
    assert!(answered > 0, "no full read got through after the election");

    // No lease held twice: per seat, tenures are disjoint on the store's clock.
    for (seat, tenures) in &history {
        let mut ts = tenures.clone();
        ts.sort_by_key(|t| t.epoch);
        for w in ts.windows(2) {
            assert!(w[0].epoch < w[1].epoch);
            assert!(
                w[0].until <= w[1].from,
                "{seat}: tenure {:?} overlaps the next one {:?}",
                w[0],
                w[1]
            );
        }
    }
}
