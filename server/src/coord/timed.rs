//! A backend whose every primitive is timed: `crewlet_store_call_duration_seconds{op}`
//! (and `crewlet_store_errors_total{op}` for a call that failed). The node's
//! store is always one of these over the twin or NATS KV.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;

use super::kv::{Backend, BatchWrite, BucketId, RawEntry, RawEventStream, WriteError, Written};
use super::{ConnectionState, Revision, StoreError, StoreTime};
use crate::metrics::{self as m, Update};

/// `B`, timed.
pub struct Timed<B> {
    inner: B,
}

impl<B> Timed<B> {
    pub fn new(inner: B) -> Timed<B> {
        Timed { inner }
    }
}

/// Whether an answer is the store failing (a lost compare-and-set is an
/// answer, not a failure).
trait Failed {
    fn failed(&self) -> bool;
}

impl Failed for StoreError {
    fn failed(&self) -> bool {
        true
    }
}

impl Failed for WriteError {
    fn failed(&self) -> bool {
        !matches!(self, WriteError::Conflict)
    }
}

/// Record one call of `op` that took since `began`, and whether it failed.
fn observed<T, E: Failed>(op: &'static str, began: Instant, r: Result<T, E>) -> Result<T, E> {
    let took = began.elapsed().as_secs_f64();
    m::apply(&Update::Observe {
        name: m::STORE_DURATION,
        labels: vec![("op", op.to_string())],
        value: took,
    });
    m::note_store_latency(took);
    if r.as_ref().is_err_and(Failed::failed) {
        m::apply(&Update::count(m::STORE_ERRORS, "op", op));
    }
    r
}

#[async_trait]
impl<B: Backend> Backend for Timed<B> {
    fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl()
    }

    fn now(&self) -> StoreTime {
        self.inner.now()
    }

    fn connection(&self) -> ConnectionState {
        self.inner.connection()
    }

    fn connection_changes(&self) -> tokio::sync::watch::Receiver<ConnectionState> {
        self.inner.connection_changes()
    }

    async fn get(&self, b: BucketId, key: &str) -> Result<Option<RawEntry>, StoreError> {
        let t = Instant::now();
        observed("get", t, self.inner.get(b, key).await)
    }

    async fn get_marked(
        &self,
        b: BucketId,
        key: &str,
    ) -> Result<(Revision, Option<RawEntry>), StoreError> {
        let t = Instant::now();
        observed("get", t, self.inner.get_marked(b, key).await)
    }

    fn atomic_claims(&self) -> bool {
        self.inner.atomic_claims()
    }

    fn epoch_keys(&self) -> bool {
        self.inner.epoch_keys()
    }

    async fn batch(&self, b: BucketId, writes: Vec<BatchWrite>) -> Result<Written, WriteError> {
        let t = Instant::now();
        observed("batch", t, self.inner.batch(b, writes).await)
    }

    async fn create(&self, b: BucketId, key: &str, value: Bytes) -> Result<Written, WriteError> {
        let t = Instant::now();
        observed("create", t, self.inner.create(b, key, value).await)
    }

    async fn update(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        let t = Instant::now();
        observed(
            "update",
            t,
            self.inner.update(b, key, value, expected).await,
        )
    }

    async fn update_stamped(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        let t = Instant::now();
        observed(
            "update",
            t,
            self.inner.update_stamped(b, key, value, expected).await,
        )
    }

    async fn delete(&self, b: BucketId, key: &str, expected: Revision) -> Result<(), WriteError> {
        let t = Instant::now();
        observed("delete", t, self.inner.delete(b, key, expected).await)
    }

    async fn written_at(
        &self,
        b: BucketId,
        key: &str,
        revision: Revision,
    ) -> Result<Option<StoreTime>, StoreError> {
        let t = Instant::now();
        observed(
            "written_at",
            t,
            self.inner.written_at(b, key, revision).await,
        )
    }

    async fn last_revision(
        &self,
        b: BucketId,
        scope: &str,
    ) -> Result<Option<Revision>, StoreError> {
        let t = Instant::now();
        observed("last_revision", t, self.inner.last_revision(b, scope).await)
    }

    async fn revision_exists(&self, b: BucketId, revision: Revision) -> Result<bool, StoreError> {
        let t = Instant::now();
        observed(
            "revision_exists",
            t,
            self.inner.revision_exists(b, revision).await,
        )
    }

    async fn purge(&self, b: BucketId, key: &str, through: Revision) -> Result<(), StoreError> {
        let t = Instant::now();
        observed("purge", t, self.inner.purge(b, key, through).await)
    }

    async fn watch(&self, b: BucketId, prefix: &str) -> Result<RawEventStream, StoreError> {
        let t = Instant::now();
        observed("watch", t, self.inner.watch(b, prefix).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_compare_and_set_is_an_answer_and_no_answer_is_a_store_error() {
        assert!(!WriteError::Conflict.failed());
        let timeout = StoreError::Timeout(Duration::from_secs(1));
        assert!(WriteError::Unknown(timeout.clone()).failed());
        assert!(timeout.failed());
    }
}
