//! A coordination store whose run records cannot be read (listing
//! `crewlet_runs` fails) while a test says so, in front of a fleet's real
//! store, and a turn-fleet node built over it. The run suite uses it for a
//! seat whose interrupted runs cannot be recovered in the acquire hook
//! (spec § Establishing a seat: handed back voluntarily, `unprepared`).
//!
//! Included by path (`#[path = "support/run_faults.rs"]`) from the suites
//! that use it, next to `mod support;`.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use crewlet::config::RoleConfig;
use crewlet::coord::{
    Claim, ClaimRequest, ConnectionState, Entry, EventStream, KvError, Lease, Marker, Metadata,
    Offer, Release, Renewal, Revision, StateBucket, Store, StoreError, StoreTime,
};
use tokio::sync::watch;

use crate::support::turnfleet::{Fleet, Node};

/// The fleet's store, whose run records cannot be listed while
/// [`RunsUnreadable::unreadable`] says so. It counts the listings it failed
/// and notes every lease this node gave back (released, not left to lapse).
pub struct RunsUnreadable {
    inner: Arc<dyn Store>,
    unreadable: AtomicBool,
    failed: AtomicUsize,
    released: Mutex<Vec<(String, u64)>>,
}

impl RunsUnreadable {
    pub fn new(inner: Arc<dyn Store>, unreadable: bool) -> Arc<RunsUnreadable> {
        Arc::new(RunsUnreadable {
            inner,
            unreadable: AtomicBool::new(unreadable),
            failed: AtomicUsize::new(0),
            released: Mutex::new(Vec::new()),
        })
    }

    /// The run records can be read again.
    pub fn heal(&self) {
        self.unreadable.store(false, Ordering::SeqCst);
    }

    /// How many listings of the run records failed.
    pub fn failed(&self) -> usize {
        self.failed.load(Ordering::SeqCst)
    }

    /// The leases (resource, epoch) this store released on request.
    pub fn released(&self) -> Vec<(String, u64)> {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[async_trait]
impl Store for RunsUnreadable {
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
        self.inner.claim(req).await
    }
    async fn renew(&self, lease: &Lease, owner: &str, metadata: Option<Metadata>) -> Renewal {
        self.inner.renew(lease, owner, metadata).await
    }
    async fn release(&self, lease: &Lease, owner: &str) -> Result<Release, StoreError> {
        let r = self.inner.release(lease, owner).await;
        if matches!(r, Ok(Release::Released)) {
            self.released
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((lease.resource.clone(), lease.epoch));
        }
        r
    }
    async fn offer(&self, lease: &Lease, owner: &str, offer: Option<Offer>) -> Renewal {
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
        self.inner.get(bucket, key).await
    }
    async fn create(
        &self,
        bucket: StateBucket,
        key: &str,
        value: Bytes,
    ) -> Result<Revision, KvError> {
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
        if bucket == StateBucket::Runs && self.unreadable.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable(
                "injected: the run records cannot be read".into(),
            ));
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
/// in [`RunsUnreadable`] (unreadable from the start when `unreadable`); the
/// first node writes `roles` as the company. The node's `store` is the
/// wrapped one.
pub async fn node_over(
    f: &Fleet,
    id: &str,
    roles: &[RoleConfig],
    unreadable: bool,
) -> (Node, Arc<RunsUnreadable>) {
    let mut wrapped = None;
    let node = f
        .node_over_store(
            id,
            roles,
            |real| {
                let w = RunsUnreadable::new(real, unreadable);
                wrapped = Some(w.clone());
                w
            },
            |turns| turns,
        )
        .await;
    (node, wrapped.expect("the store was wrapped"))
}
