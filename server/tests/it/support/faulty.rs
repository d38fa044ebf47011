//! One fault-injecting coordination store for every suite: [`Faulty`]
//! forwards each `Store` call to the real store behind it, first asking the
//! test's [`Faults`] whether the call fails, waits, or goes through, and
//! telling it of each release the store granted. The suites' fault sets
//! (`duty_faults.rs`, `run_faults.rs`) are `Faults` implementations; none
//! of them forwards a store method itself.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use crewlet::coord::{
    Claim, ClaimRequest, ConnectionState, Entry, EventStream, KvError, Lease, Marker, Metadata,
    Offer, Release, Renewal, Revision, StateBucket, Store, StoreError, StoreTime,
};
use tokio::sync::watch;

/// A call on its way to the store, as the faults see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call<'a> {
    Claim(&'a str),
    Renew(&'a str),
    Release(&'a str),
    Offer(&'a str),
    Take(&'a str),
    Lease(&'a str),
    Epoch(&'a str),
    List(&'a str),
    Holders(&'a str),
    View(&'a str),
    ProtocolFloor,
    Get(StateBucket, &'a str),
    Create(StateBucket, &'a str),
    Update(StateBucket, &'a str),
    Delete(StateBucket, &'a str),
    Entries(StateBucket, &'a str),
    Markers(StateBucket, &'a str),
    PurgeMarker(StateBucket, &'a str),
    Watch(StateBucket, &'a str),
}

/// What a test puts in front of the store.
#[async_trait]
pub trait Faults: Send + Sync + 'static {
    /// Before `call` reaches the store: `Err` fails it with that error (a
    /// renewal or an offer then answers `Renewal::Unknown`); waiting here
    /// holds the call in flight.
    async fn before(&self, call: Call<'_>) -> Result<(), StoreError>;

    /// After `call` was answered by the store, before its answer reaches
    /// the caller: waiting here plays an answer that comes late (offers
    /// only).
    async fn after(&self, _call: Call<'_>) {}

    /// The store released `lease` on request.
    fn released(&self, _lease: &Lease) {}
}

/// The real store behind a test's [`Faults`]. Derefs to the faults, so a
/// test heals or counts through the store it holds.
pub struct Faulty<F> {
    inner: Arc<dyn Store>,
    faults: F,
}

impl<F: Faults> Faulty<F> {
    pub fn wrap(inner: Arc<dyn Store>, faults: F) -> Arc<Faulty<F>> {
        Arc::new(Faulty { inner, faults })
    }
}

impl<F> Deref for Faulty<F> {
    type Target = F;
    fn deref(&self) -> &F {
        &self.faults
    }
}

fn kv(e: StoreError) -> KvError {
    KvError::Store(e)
}

#[async_trait]
impl<F: Faults> Store for Faulty<F> {
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
        self.faults.before(Call::Claim(&req.resource)).await?;
        self.inner.claim(req).await
    }
    async fn renew(&self, lease: &Lease, owner: &str, metadata: Option<Metadata>) -> Renewal {
        if let Err(e) = self.faults.before(Call::Renew(&lease.resource)).await {
            return Renewal::Unknown(e);
        }
        self.inner.renew(lease, owner, metadata).await
    }
    async fn release(&self, lease: &Lease, owner: &str) -> Result<Release, StoreError> {
        self.faults.before(Call::Release(&lease.resource)).await?;
        let r = self.inner.release(lease, owner).await;
        if matches!(r, Ok(Release::Released)) {
            self.faults.released(lease);
        }
        r
    }
    async fn offer(&self, lease: &Lease, owner: &str, offer: Option<Offer>) -> Renewal {
        if let Err(e) = self.faults.before(Call::Offer(&lease.resource)).await {
            return Renewal::Unknown(e);
        }
        let answer = self.inner.offer(lease, owner, offer).await;
        self.faults.after(Call::Offer(&lease.resource)).await;
        answer
    }
    async fn take(
        &self,
        resource: &str,
        offer_id: &str,
        owner: &str,
        preferred: &str,
        protocol: u32,
    ) -> Result<Claim, StoreError> {
        self.faults.before(Call::Take(resource)).await?;
        self.inner
            .take(resource, offer_id, owner, preferred, protocol)
            .await
    }
    async fn lease(&self, resource: &str) -> Result<Option<Lease>, StoreError> {
        self.faults.before(Call::Lease(resource)).await?;
        self.inner.lease(resource).await
    }
    async fn epoch(&self, resource: &str) -> Result<u64, StoreError> {
        self.faults.before(Call::Epoch(resource)).await?;
        self.inner.epoch(resource).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        self.faults.before(Call::List(prefix)).await?;
        self.inner.list(prefix).await
    }
    async fn holders(&self, prefix: &str) -> Result<BTreeMap<String, String>, StoreError> {
        self.faults.before(Call::Holders(prefix)).await?;
        self.inner.holders(prefix).await
    }
    async fn view(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        self.faults.before(Call::View(prefix)).await?;
        self.inner.view(prefix).await
    }
    async fn protocol_floor(&self, mine: u32) -> Result<Option<u32>, StoreError> {
        self.faults.before(Call::ProtocolFloor).await?;
        self.inner.protocol_floor(mine).await
    }
    fn view_running(&self) -> bool {
        self.inner.view_running()
    }
    async fn get(&self, bucket: StateBucket, key: &str) -> Result<Option<Entry>, StoreError> {
        self.faults.before(Call::Get(bucket, key)).await?;
        self.inner.get(bucket, key).await
    }
    async fn create(
        &self,
        bucket: StateBucket,
        key: &str,
        value: Bytes,
    ) -> Result<Revision, KvError> {
        self.faults
            .before(Call::Create(bucket, key))
            .await
            .map_err(kv)?;
        self.inner.create(bucket, key, value).await
    }
    async fn update(
        &self,
        bucket: StateBucket,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Revision, KvError> {
        self.faults
            .before(Call::Update(bucket, key))
            .await
            .map_err(kv)?;
        self.inner.update(bucket, key, value, expected).await
    }
    async fn delete(
        &self,
        bucket: StateBucket,
        key: &str,
        expected: Revision,
    ) -> Result<(), KvError> {
        self.faults
            .before(Call::Delete(bucket, key))
            .await
            .map_err(kv)?;
        self.inner.delete(bucket, key, expected).await
    }
    async fn entries(&self, bucket: StateBucket, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        self.faults.before(Call::Entries(bucket, prefix)).await?;
        self.inner.entries(bucket, prefix).await
    }
    async fn markers(&self, bucket: StateBucket, prefix: &str) -> Result<Vec<Marker>, StoreError> {
        self.faults.before(Call::Markers(bucket, prefix)).await?;
        self.inner.markers(bucket, prefix).await
    }
    async fn purge_marker(
        &self,
        bucket: StateBucket,
        key: &str,
        revision: Revision,
    ) -> Result<(), StoreError> {
        self.faults.before(Call::PurgeMarker(bucket, key)).await?;
        self.inner.purge_marker(bucket, key, revision).await
    }
    async fn watch(&self, bucket: StateBucket, prefix: &str) -> Result<EventStream, StoreError> {
        self.faults.before(Call::Watch(bucket, prefix)).await?;
        self.inner.watch(bucket, prefix).await
    }
}
