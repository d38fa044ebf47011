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

/// One call on its way: recorded when answered, and told at debug level
/// when its caller gives it up unanswered (a store call is dropped at the
/// store's bound) — which primitive on which key went unanswered is what a
/// store outage's recording has to say.
struct InFlight<'a> {
    op: &'static str,
    bucket: BucketId,
    key: &'a str,
    began: Instant,
    answered: bool,
}

impl<'a> InFlight<'a> {
    fn new(op: &'static str, bucket: BucketId, key: &'a str) -> InFlight<'a> {
        InFlight {
            op,
            bucket,
            key,
            began: Instant::now(),
            answered: false,
        }
    }

    /// Record the answer, and whether it failed.
    fn observed<T, E: Failed>(mut self, r: Result<T, E>) -> Result<T, E> {
        self.answered = true;
        observed(self.op, self.began, r)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered {
            tracing::debug!(
                op = self.op,
                bucket = self.bucket.name(),
                key = self.key,
                waited_ms = self.began.elapsed().as_millis() as u64,
                "a store call was given up unanswered"
            );
        }
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
        let t = InFlight::new("get", b, key);
        t.observed(self.inner.get(b, key).await)
    }

    async fn get_marked(
        &self,
        b: BucketId,
        key: &str,
    ) -> Result<(Revision, Option<RawEntry>), StoreError> {
        let t = InFlight::new("get", b, key);
        t.observed(self.inner.get_marked(b, key).await)
    }

    fn atomic_claims(&self) -> bool {
        self.inner.atomic_claims()
    }

    fn epoch_keys(&self) -> bool {
        self.inner.epoch_keys()
    }

    async fn batch(&self, b: BucketId, writes: Vec<BatchWrite>) -> Result<Written, WriteError> {
        let t = InFlight::new("batch", b, "");
        t.observed(self.inner.batch(b, writes).await)
    }

    async fn create(&self, b: BucketId, key: &str, value: Bytes) -> Result<Written, WriteError> {
        let t = InFlight::new("create", b, key);
        t.observed(self.inner.create(b, key, value).await)
    }

    async fn update(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        let t = InFlight::new("update", b, key);
        t.observed(self.inner.update(b, key, value, expected).await)
    }

    async fn update_stamped(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        let t = InFlight::new("update", b, key);
        t.observed(self.inner.update_stamped(b, key, value, expected).await)
    }

    async fn update_renewal(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        let t = InFlight::new("update", b, key);
        t.observed(self.inner.update_renewal(b, key, value, expected).await)
    }

    async fn delete(&self, b: BucketId, key: &str, expected: Revision) -> Result<(), WriteError> {
        let t = InFlight::new("delete", b, key);
        t.observed(self.inner.delete(b, key, expected).await)
    }

    async fn written_at(
        &self,
        b: BucketId,
        key: &str,
        revision: Revision,
    ) -> Result<Option<StoreTime>, StoreError> {
        let t = InFlight::new("written_at", b, key);
        t.observed(self.inner.written_at(b, key, revision).await)
    }

    async fn last_revision(
        &self,
        b: BucketId,
        scope: &str,
    ) -> Result<Option<Revision>, StoreError> {
        let t = InFlight::new("last_revision", b, scope);
        t.observed(self.inner.last_revision(b, scope).await)
    }

    async fn revision_exists(&self, b: BucketId, revision: Revision) -> Result<bool, StoreError> {
        let t = InFlight::new("revision_exists", b, "");
        t.observed(self.inner.revision_exists(b, revision).await)
    }

    async fn purge(&self, b: BucketId, key: &str, through: Revision) -> Result<(), StoreError> {
        let t = InFlight::new("purge", b, key);
        t.observed(self.inner.purge(b, key, through).await)
    }

    async fn watch(&self, b: BucketId, prefix: &str) -> Result<RawEventStream, StoreError> {
        let t = InFlight::new("watch", b, prefix);
        t.observed(self.inner.watch(b, prefix).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::logging::logged;

    #[test]
    fn a_call_given_up_unanswered_is_told_with_its_primitive_bucket_and_key_and_an_answered_one_is_not()
     {
        let told = logged(|| drop(InFlight::new("update", BucketId::Epochs, "seat:s1")));
        assert!(
            told.contains("a store call was given up unanswered"),
            "{told}"
        );
        assert!(told.contains("op=\"update\""), "{told}");
        assert!(told.contains("bucket=\"crewlet_epochs\""), "{told}");
        assert!(told.contains("key=\"seat:s1\""), "{told}");
        let answered = logged(|| {
            let r: Result<(), StoreError> =
                InFlight::new("get", BucketId::Leases, "seat:s1").observed(Ok(()));
            assert!(r.is_ok());
        });
        assert!(!answered.contains("unanswered"), "{answered}");
    }

    #[test]
    fn a_lost_compare_and_set_is_an_answer_and_no_answer_is_a_store_error() {
        assert!(!WriteError::Conflict.failed());
        let timeout = StoreError::Timeout(Duration::from_secs(1));
        assert!(WriteError::Unknown(timeout.clone()).failed());
        assert!(timeout.failed());
    }
}
