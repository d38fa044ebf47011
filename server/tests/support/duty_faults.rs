//! A coordination store that fails (or never answers) the reads and
//! writes a test names, in front of a fleet's real store, and a turn-fleet
//! node built over it. The duty suites use it for the store errors and
//! timeouts the sweep and the registration must survive (spec § The
//! removed seat: unknown is never absent; a registration that fails still
//! creates the mailbox).
//!
//! Included by path (`#[path = "support/duty_faults.rs"]`) from the suites
//! that use it, next to `mod support;`.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use crewlet::config::RoleConfig;
use crewlet::coord::{
    Claim, ClaimRequest, ConnectionState, Entry, EventStream, KvError, Lease, Marker, Metadata,
    Release, Renewal, Revision, StateBucket, Store, StoreError, StoreTime,
};
use crewlet::queue::{
    Attachment, DeadLetter, Handler, Queue, QueueError, SubscriptionInfo, SubscriptionSpec,
};
use tokio::sync::watch;

use crate::support::turnfleet::{Fleet, Node};

/// One read or write the store fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `get` of this key in this bucket errors.
    Get(StateBucket, String),
    /// `entries` of this bucket errors.
    Entries(StateBucket),
    /// `lease` of this resource times out.
    Lease(String),
    /// `create` of this key in this bucket errors.
    Create(StateBucket, String),
    /// `entries` of this bucket never answers while the fault stands.
    HangEntries(StateBucket),
    /// A claim of this resource errors.
    Claim(String),
    /// A renewal of this resource cannot say (`Renewal::Unknown`).
    Renew(String),
    /// A claim of this resource waits while the fault stands, then goes
    /// through (a claim in flight).
    HoldClaim(String),
}

/// The fleet's store with [`Fault`]s in front of it. A fault stands until
/// [`FaultyStore::heal`]; every call it touched is counted in
/// [`FaultyStore::hits`], so a test can prove the fault was reached.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    faults: watch::Sender<Vec<Fault>>,
    hits: Mutex<Vec<Fault>>,
    /// Every `get` asked of the store, faulted or not.
    gets: Mutex<Vec<(StateBucket, String)>>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>, faults: &[Fault]) -> Arc<FaultyStore> {
        Arc::new(FaultyStore {
            inner,
            faults: watch::Sender::new(faults.to_vec()),
            hits: Mutex::new(Vec::new()),
            gets: Mutex::new(Vec::new()),
        })
    }

    /// Every fault stops standing (a hung call answers).
    pub fn heal(&self) {
        self.faults.send_replace(Vec::new());
    }

    /// `faults` stand from now on, instead of the ones that did.
    pub fn set(&self, faults: &[Fault]) {
        self.faults.send_replace(faults.to_vec());
    }

    /// How often `f` failed (or hung) a call.
    pub fn hits(&self, f: &Fault) -> usize {
        self.hits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|h| *h == f)
            .count()
    }

    /// How often `key` of `bucket` was read (`get`) through this store.
    pub fn gets(&self, bucket: StateBucket, key: &str) -> usize {
        self.gets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(b, k)| *b == bucket && k == key)
            .count()
    }

    fn stands(&self, f: &Fault) -> bool {
        let on = self.faults.borrow().contains(f);
        if on {
            self.hits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(f.clone());
        }
        on
    }

    fn injected(f: &Fault) -> StoreError {
        StoreError::Unavailable(format!("injected: {f:?}"))
    }
}

#[async_trait]
impl Store for FaultyStore {
    fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl()
    }
    fn connection(&self) -> ConnectionState {
        self.inner.connection()
    }
    fn connection_changes(&self) -> watch::Receiver<ConnectionState> {
        self.inner.connection_changes()
    }
    async fn now(&self) -> Result<StoreTime, StoreError> {
        self.inner.now().await
    }
    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        let f = Fault::Claim(req.resource.clone());
        if self.stands(&f) {
            return Err(Self::injected(&f));
        }
        let hold = Fault::HoldClaim(req.resource.clone());
        if self.stands(&hold) {
            let mut rx = self.faults.subscribe();
            let _ = rx.wait_for(|fs| !fs.contains(&hold)).await;
        }
        self.inner.claim(req).await
    }
    async fn renew(&self, lease: &Lease, owner: &str, metadata: Option<Metadata>) -> Renewal {
        let f = Fault::Renew(lease.resource.clone());
        if self.stands(&f) {
            return Renewal::Unknown(StoreError::Timeout(Duration::from_millis(2000)));
        }
        self.inner.renew(lease, owner, metadata).await
    }
    async fn release(&self, lease: &Lease, owner: &str) -> Result<Release, StoreError> {
        self.inner.release(lease, owner).await
    }
    async fn offer(
        &self,
        lease: &Lease,
        owner: &str,
        offer: Option<crewlet::coord::Offer>,
    ) -> Renewal {
        self.inner.offer(lease, owner, offer).await
    }
    async fn take(
        &self,
        resource: &str,
        offer_id: &str,
        owner: &str,
        preferred: &str,
        protocol: u32,
    ) -> Result<Claim, StoreError> {
        self.inner
            .take(resource, offer_id, owner, preferred, protocol)
            .await
    }
    async fn lease(&self, resource: &str) -> Result<Option<Lease>, StoreError> {
        if self.stands(&Fault::Lease(resource.to_string())) {
            return Err(StoreError::Timeout(Duration::from_millis(2000)));
        }
        self.inner.lease(resource).await
    }
    async fn epoch(&self, resource: &str) -> Result<u64, StoreError> {
        self.inner.epoch(resource).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        self.inner.list(prefix).await
    }
    async fn holders(
        &self,
        prefix: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, StoreError> {
        self.inner.holders(prefix).await
    }
    async fn view(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        self.inner.view(prefix).await
    }
    async fn protocol_floor(&self, mine: u32) -> Result<Option<u32>, StoreError> {
        self.inner.protocol_floor(mine).await
    }
    fn view_running(&self) -> bool {
        self.inner.view_running()
    }
    async fn get(&self, bucket: StateBucket, key: &str) -> Result<Option<Entry>, StoreError> {
        self.gets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((bucket, key.to_string()));
        let f = Fault::Get(bucket, key.to_string());
        if self.stands(&f) {
            return Err(Self::injected(&f));
        }
        self.inner.get(bucket, key).await
    }
    async fn create(
        &self,
        bucket: StateBucket,
        key: &str,
        value: Bytes,
    ) -> Result<Revision, KvError> {
        let f = Fault::Create(bucket, key.to_string());
        if self.stands(&f) {
            return Err(KvError::Store(Self::injected(&f)));
        }
        self.inner.create(bucket, key, value).await
    }
    async fn update(
        &self,
        bucket: StateBucket,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Revision, KvError> {
        self.inner.update(bucket, key, value, expected).await
    }
    async fn delete(
        &self,
        bucket: StateBucket,
        key: &str,
        expected: Revision,
    ) -> Result<(), KvError> {
        self.inner.delete(bucket, key, expected).await
    }
    async fn entries(&self, bucket: StateBucket, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        let f = Fault::Entries(bucket);
        if self.stands(&f) {
            return Err(Self::injected(&f));
        }
        let hang = Fault::HangEntries(bucket);
        if self.stands(&hang) {
            let mut rx = self.faults.subscribe();
            let _ = rx.wait_for(|fs| !fs.contains(&hang)).await;
        }
        self.inner.entries(bucket, prefix).await
    }
    async fn markers(&self, bucket: StateBucket, prefix: &str) -> Result<Vec<Marker>, StoreError> {
        self.inner.markers(bucket, prefix).await
    }
    async fn purge_marker(
        &self,
        bucket: StateBucket,
        key: &str,
        revision: Revision,
    ) -> Result<(), StoreError> {
        self.inner.purge_marker(bucket, key, revision).await
    }
    async fn watch(&self, bucket: StateBucket, prefix: &str) -> Result<EventStream, StoreError> {
        self.inner.watch(bucket, prefix).await
    }
}

/// Start node `id` (as [`Fleet::node`] does) over its fleet store wrapped
/// in `faults`; the first node writes `roles` as the company. The node's
/// `store` is the faulty one.
pub async fn node_over_faults(
    f: &Fleet,
    id: &str,
    roles: &[RoleConfig],
    faults: &[Fault],
) -> (Node, Arc<FaultyStore>) {
    let mut faulty = None;
    let node = f
        .node_over_store(
            id,
            roles,
            |real| {
                let w = FaultyStore::new(real, faults);
                faulty = Some(w.clone());
                w
            },
            |turns| turns,
        )
        .await;
    (node, faulty.expect("the store was wrapped"))
}

/// The fleet's queue, with the delete of one subscription held: the delete
/// waits (before it reaches the broker) until [`PausingQueue::go`], and
/// [`PausingQueue::entered`] says it is waiting. What a retirement looks
/// like to a node adding the seat back in the middle of it.
pub struct PausingQueue {
    inner: Arc<dyn Queue>,
    name: String,
    entered: watch::Sender<bool>,
    go: watch::Sender<bool>,
}

impl PausingQueue {
    pub fn new(inner: Arc<dyn Queue>, name: &str) -> Arc<PausingQueue> {
        Arc::new(PausingQueue {
            inner,
            name: name.to_string(),
            entered: watch::Sender::new(false),
            go: watch::Sender::new(false),
        })
    }

    /// Whether the held delete has begun waiting.
    pub fn entered(&self) -> bool {
        *self.entered.borrow()
    }

    /// Let the held delete (and every later one) through.
    pub fn go(&self) {
        self.go.send_replace(true);
    }
}

#[async_trait]
impl Queue for PausingQueue {
    async fn ensure_subscription(&self, spec: &SubscriptionSpec) -> Result<(), QueueError> {
        self.inner.ensure_subscription(spec).await
    }
    async fn delete_subscription(&self, name: &str) -> Result<bool, QueueError> {
        if name == self.name {
            self.entered.send_replace(true);
            let mut go = self.go.subscribe();
            let _ = go.wait_for(|g| *g).await;
        }
        self.inner.delete_subscription(name).await
    }
    async fn list_subscriptions(&self) -> Result<Vec<SubscriptionInfo>, QueueError> {
        self.inner.list_subscriptions().await
    }
    async fn publish(
        &self,
        subject: &str,
        msg_id: Option<&str>,
        payload: Bytes,
    ) -> Result<bool, QueueError> {
        self.inner.publish(subject, msg_id, payload).await
    }
    async fn attach(
        &self,
        name: &str,
        holds: &[&str],
        handler: Arc<dyn Handler>,
    ) -> Result<Attachment, QueueError> {
        self.inner.attach(name, holds, handler).await
    }
    async fn pending(&self, name: &str) -> Result<u64, QueueError> {
        self.inner.pending(name).await
    }
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        self.inner.dead_letters(limit).await
    }
}
