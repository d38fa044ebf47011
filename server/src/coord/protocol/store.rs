//! [`Store`] as the node sees it: each call bounded by the store timeout
//! and answered by the protocol's parts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use crate::coord::kv::{self, Backend, BucketId, RawEvent};
use crate::coord::lease::{EpochRecord, Lease, Offer, StoreTime};
use crate::coord::{
    Claim, ClaimRequest, ConnectionState, Entry, Event, EventStream, KvError, Marker, Metadata,
    Release, Renewal, Revision, StateBucket, Store, StoreError,
};

use super::claim::ClaimGuard;
use super::{Coordinator, bucket_of, claim_id, kv_error, scope_of};

#[async_trait]
impl<B: Backend> Store for Coordinator<B> {
    fn lease_ttl(&self) -> Duration {
        self.be().lease_ttl()
    }

    fn connection(&self) -> ConnectionState {
        self.be().connection()
    }

    fn connection_changes(&self) -> tokio::sync::watch::Receiver<ConnectionState> {
        self.be().connection_changes()
    }

    async fn now(&self) -> Result<StoreTime, StoreError> {
        Ok(self.be().now())
    }

    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        let mut guard = ClaimGuard {
            coord: self.clone(),
            bucket: BucketId::Leases,
            key: req.resource.clone(),
            claim: claim_id(),
            ttl: self.be().lease_ttl(),
            armed: false,
        };
        self.bounded(self.claim_inner(&req, &mut guard)).await
    }

    async fn renew(&self, lease: &Lease, owner: &str, metadata: Option<Metadata>) -> Renewal {
        match self.bounded(self.renew_inner(lease, owner, metadata)).await {
            Ok(r) => r,
            Err(e) => Renewal::Unknown(e),
        }
    }

    async fn release(&self, lease: &Lease, owner: &str) -> Result<Release, StoreError> {
        self.bounded(self.release_inner(lease, owner)).await
    }

    async fn offer(&self, lease: &Lease, owner: &str, offer: Option<Offer>) -> Renewal {
        match self
            .bounded(self.renew_offering(lease, owner, None, Some(offer)))
            .await
        {
            Ok(r) => r,
            Err(e) => Renewal::Unknown(e),
        }
    }

    async fn take(
        &self,
        resource: &str,
        offer_id: &str,
        owner: &str,
        preferred: &str,
        protocol: u32,
    ) -> Result<Claim, StoreError> {
        self.bounded(self.take_inner(resource, offer_id, owner, preferred, protocol))
            .await
    }

    async fn lease(&self, resource: &str) -> Result<Option<Lease>, StoreError> {
        let (b, _) = bucket_of(resource)?;
        let found = self.bounded(self.read_lease(b, resource)).await?;
        let now = self.be().now();
        Ok(found.filter(|l| l.is_live(now)))
    }

    async fn epoch(&self, resource: &str) -> Result<u64, StoreError> {
        let (b, _) = bucket_of(resource)?;
        // The highest of the epochs bucket's counter and, where atomic
        // claims may run, the epoch key beside the lease.
        let keyed = b == BucketId::Leases && self.be().epoch_keys();
        let epoch_key = kv::epoch_key(resource);
        let (legacy, key) = self
            .bounded(async {
                Ok(tokio::join!(
                    self.be().get(BucketId::Epochs, resource),
                    async {
                        if keyed {
                            self.be().get(BucketId::Leases, &epoch_key).await
                        } else {
                            Ok(None)
                        }
                    }
                ))
            })
            .await?;
        let mut epoch = 0;
        for e in [legacy?, key?].into_iter().flatten() {
            epoch = epoch.max(EpochRecord::decode(resource, &e.value)?.epoch);
        }
        Ok(epoch)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        self.bounded(self.list_inner(prefix)).await
    }

    async fn holders(&self, prefix: &str) -> Result<BTreeMap<String, String>, StoreError> {
        self.bounded(async {
            // The last holder is the one that minted the highest epoch: in
            // the epochs bucket, or in the epoch key an atomic claim wrote.
            let mut found: BTreeMap<String, (u64, String)> = BTreeMap::new();
            let mut read = |key: String, raw: &[u8]| match EpochRecord::decode(&key, raw) {
                Ok(r) if !r.holder.is_empty() => {
                    let newer = found.get(&key).is_none_or(|(e, _)| r.epoch > *e);
                    if newer {
                        found.insert(key, (r.epoch, r.holder));
                    }
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(error = %err, "unreadable epoch record skipped"),
            };
            for e in self.scan(BucketId::Epochs, prefix).await? {
                read(e.key, &e.value);
            }
            if self.be().epoch_keys() {
                let keyed = kv::epoch_key(prefix);
                for e in self.scan(BucketId::Leases, &keyed).await? {
                    if let Some(resource) = e.key.strip_prefix(kv::EPOCH_KEY_PREFIX) {
                        read(resource.to_string(), &e.value);
                    }
                }
            }
            Ok(found.into_iter().map(|(k, (_, h))| (k, h)).collect())
        })
        .await
    }

    async fn view(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        let leases = self
            .bounded(
                self.inner
                    .view
                    .read(&self.inner.backend, &self.inner.tasks, |m| {
                        m.with_prefix(prefix).cloned().collect::<Vec<_>>()
                    }),
            )
            .await?;
        let now = self.be().now();
        Ok(leases.into_iter().filter(|l| l.is_live(now)).collect())
    }

    async fn protocol_floor(&self, mine: u32) -> Result<Option<u32>, StoreError> {
        let be = Arc::clone(&self.inner.backend);
        self.bounded(
            self.inner
                .view
                .read(&self.inner.backend, &self.inner.tasks, move |m| {
                    m.protocol_floor(be.now(), mine)
                }),
        )
        .await
    }

    fn view_running(&self) -> bool {
        self.inner.view.running()
    }

    async fn get(&self, bucket: StateBucket, key: &str) -> Result<Option<Entry>, StoreError> {
        kv::validate_key(key)?;
        Ok(self
            .bounded(self.be().get(bucket.bucket(), key))
            .await?
            .map(Self::entry))
    }

    async fn create(
        &self,
        bucket: StateBucket,
        key: &str,
        value: Bytes,
    ) -> Result<Revision, KvError> {
        kv::validate_key(key)?;
        match tokio::time::timeout(
            self.inner.timeout,
            self.be().create(bucket.bucket(), key, value),
        )
        .await
        {
            Ok(Ok(w)) => Ok(w.revision),
            Ok(Err(e)) => Err(kv_error(e, KvError::AlreadyExists)),
            Err(_) => Err(KvError::Store(StoreError::Timeout(self.inner.timeout))),
        }
    }

    async fn update(
        &self,
        bucket: StateBucket,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Revision, KvError> {
        kv::validate_key(key)?;
        match tokio::time::timeout(
            self.inner.timeout,
            self.be().update(bucket.bucket(), key, value, expected),
        )
        .await
        {
            Ok(Ok(w)) => Ok(w.revision),
            Ok(Err(e)) => Err(kv_error(e, KvError::WrongRevision)),
            Err(_) => Err(KvError::Store(StoreError::Timeout(self.inner.timeout))),
        }
    }

    async fn delete(
        &self,
        bucket: StateBucket,
        key: &str,
        expected: Revision,
    ) -> Result<(), KvError> {
        kv::validate_key(key)?;
        match tokio::time::timeout(
            self.inner.timeout,
            self.be().delete(bucket.bucket(), key, expected),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(kv_error(e, KvError::WrongRevision)),
            Err(_) => Err(KvError::Store(StoreError::Timeout(self.inner.timeout))),
        }
    }

    async fn entries(&self, bucket: StateBucket, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        Ok(self
            .bounded(self.scan(bucket.bucket(), prefix))
            .await?
            .into_iter()
            .map(Self::entry)
            .collect())
    }

    async fn markers(&self, bucket: StateBucket, prefix: &str) -> Result<Vec<Marker>, StoreError> {
        let events = self
            .bounded(self.scan_events(bucket.bucket(), prefix))
            .await?;
        Ok(events
            .into_iter()
            .filter_map(|ev| match ev {
                RawEvent::Delete {
                    key,
                    revision,
                    written_at,
                } => Some(Marker {
                    key,
                    revision,
                    written_at,
                }),
                RawEvent::Put(_) => None,
            })
            .collect())
    }

    async fn purge_marker(
        &self,
        bucket: StateBucket,
        key: &str,
        revision: Revision,
    ) -> Result<(), StoreError> {
        kv::validate_key(key)?;
        self.bounded(self.be().purge(bucket.bucket(), key, revision))
            .await
    }

    async fn watch(&self, bucket: StateBucket, prefix: &str) -> Result<EventStream, StoreError> {
        let stream = self
            .bounded(self.be().watch(bucket.bucket(), scope_of(prefix)))
            .await?;
        let prefix = prefix.to_string();
        Ok(stream
            .filter_map(move |ev| {
                let out = match ev {
                    Ok(RawEvent::Put(e)) if e.key.starts_with(&prefix) => {
                        Some(Ok(Event::Put(Self::entry(e))))
                    }
                    Ok(RawEvent::Delete { key, revision, .. }) if key.starts_with(&prefix) => {
                        Some(Ok(Event::Delete { key, revision }))
                    }
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                };
                futures::future::ready(out)
            })
            .boxed())
    }
}
