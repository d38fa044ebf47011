//! The lease protocol, written once over the [`Backend`] primitives: claim
//! (three writes, or one atomic batch where the backend offers it), renew
//! (three-valued), release (compare-and-set), list, the live view, and the
//! generic compare-and-set state.
//!
//! It owns the sequencing and the failure handling: a write whose answer was
//! lost is re-read before anything is retried; a claim that fails after its
//! first write gives back exactly the record it wrote (compare-and-delete on
//! that record's own revision, or, for a caller that gave up, on a re-read
//! that finds this call's own claiming record), never a sibling claim's and
//! never a committed tenure. Every call is bounded by the store timeout.
//! The decisions themselves are the pure rules in [`super::lease`].
//!
//! It must never decide on the local wall clock and never retry a write
//! blindly. Fault hooks ([`Fault`]) exist so the contract suite can break a
//! claim between its writes on either backend; nothing in the product
//! injects one.
//!
//! One file a part: `claim`, `tenure` (renew, offer and take, release,
//! give back), `reads` (scans and watches), `store` (the [`Store`] calls).
//! This file holds the coordinator, its options and fault hooks, and the
//! helpers every part shares.

mod claim;
mod reads;
mod store;
mod tenure;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Notify;

use super::kv::{self, Backend, BucketId, RawEntry, WriteError, Written};
use super::lease::{Lease, LeaseRecord, ResourceKind, StoreTime};
use super::view::LeaseView;
use super::{KvError, StoreError};
use crate::tasks::Tasks;

/// How many times one call goes round a compare-and-set loop.
const MAX_ATTEMPTS: usize = 8;
/// How often a scan re-checks that the write it waits for still exists.
const RECHECK: Duration = Duration::from_millis(100);
/// How often a background give-back looks again.
const GIVE_BACK_RETRY: Duration = Duration::from_millis(500);

/// The three writes of a claim, and the one batch of an atomic claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimStep {
    /// The record, in claiming state.
    Record,
    /// The epoch counter.
    Counter,
    /// The minted epoch into the record.
    Token,
    /// An atomic claim's one batch: the epoch key and the held record.
    Batch,
}

/// A failure the contract suite injects into the next claim.
#[derive(Clone, Debug)]
pub enum Fault {
    /// The claim fails right after this write landed.
    FailAfter(ClaimStep),
    /// This write lands, and its answer is lost.
    LoseAnswer(ClaimStep),
    /// The claim waits after this write until notified, then fails; drop the
    /// claim's future meanwhile to play a caller that gave up.
    HoldAfter(ClaimStep, Arc<Notify>),
    /// The store refuses the next give-back.
    RefuseGiveBack,
    /// The next call to reach `at` notifies `read`, then waits for `go`
    /// before it goes on.
    Hold {
        at: HoldPoint,
        read: Arc<Notify>,
        go: Arc<Notify>,
    },
}

/// Where [`Fault::Hold`] pauses a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldPoint {
    /// A scan (a list), after reading the last revision under its scope
    /// and before opening its watch: a write made meanwhile lands past
    /// that revision.
    Scan,
    /// A take, once it has read the offered record live and minted its
    /// epoch, before its write: the offered tenure may lapse meanwhile.
    Take,
}

/// How a coordinator is run.
#[derive(Clone)]
pub struct CoordinatorOptions {
    /// The bound on every call (`coordination.store_timeout_ms`).
    pub store_timeout: Duration,
    /// The live view stops this long after it was last used.
    pub view_idle: Duration,
    /// The owner of the view task and of give-backs that outlive their call.
    pub tasks: Tasks,
}

impl Default for CoordinatorOptions {
    fn default() -> Self {
        CoordinatorOptions {
            store_timeout: Duration::from_millis(2000),
            view_idle: super::view::DEFAULT_IDLE,
            tasks: Tasks::new(),
        }
    }
}

struct Inner<B> {
    backend: Arc<B>,
    timeout: Duration,
    faults: Mutex<Vec<Fault>>,
    view: Arc<LeaseView>,
    tasks: Tasks,
}

/// The coordination store: the lease protocol over a backend.
pub struct Coordinator<B: Backend> {
    inner: Arc<Inner<B>>,
}

impl<B: Backend> Clone for Coordinator<B> {
    fn clone(&self) -> Self {
        Coordinator {
            inner: Arc::clone(&self.inner),
        }
    }
}

fn claim_id() -> String {
    let r: u64 = rand::thread_rng().r#gen();
    format!("{r:016x}")
}

/// Which bucket a resource's lease lives in.
fn bucket_of(resource: &str) -> Result<(BucketId, ResourceKind), StoreError> {
    kv::validate_key(resource)?;
    match ResourceKind::of(resource) {
        Some(ResourceKind::Worker) => Ok((BucketId::Duties, ResourceKind::Worker)),
        Some(k) => Ok((BucketId::Leases, k)),
        None => Err(StoreError::InvalidKey {
            key: resource.into(),
            reason: "a lease is on seat:, node: or worker:",
        }),
    }
}

/// The part of `prefix` a backend can filter on: up to its last `:`.
fn scope_of(prefix: &str) -> &str {
    match prefix.rfind(':') {
        Some(i) => &prefix[..=i],
        None => "",
    }
}

impl<B: Backend> Coordinator<B> {
    pub fn new(backend: B, options: CoordinatorOptions) -> Coordinator<B> {
        Coordinator {
            inner: Arc::new(Inner {
                backend: Arc::new(backend),
                timeout: options.store_timeout,
                faults: Mutex::new(Vec::new()),
                view: LeaseView::new(options.view_idle),
                tasks: options.tasks,
            }),
        }
    }

    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    pub fn store_timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Arm a failure for the next claim that reaches it (tests only).
    pub fn inject(&self, fault: Fault) {
        self.faults().push(fault);
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        self.inner.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take_fault(&self, want: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let mut faults = self.faults();
        let i = faults.iter().position(want)?;
        Some(faults.remove(i))
    }

    /// Pause here if a test armed a hold at `point`.
    async fn hold_point(&self, point: HoldPoint) {
        if let Some(Fault::Hold { read, go, .. }) =
            self.take_fault(|f| matches!(f, Fault::Hold { at, .. } if *at == point))
        {
            read.notify_one();
            go.notified().await;
        }
    }

    fn be(&self) -> &B {
        &self.inner.backend
    }

    fn bucket_ttl(&self, b: BucketId) -> Option<Duration> {
        match b {
            BucketId::Leases => Some(self.be().lease_ttl()),
            _ => None,
        }
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.inner.timeout)),
        }
    }

    /// A lost answer, injected: the write landed, the caller hears nothing.
    fn after_write(
        &self,
        step: ClaimStep,
        res: Result<Written, WriteError>,
    ) -> Result<Written, WriteError> {
        if res.is_ok()
            && self
                .take_fault(|f| matches!(f, Fault::LoseAnswer(s) if *s == step))
                .is_some()
        {
            return Err(WriteError::Unknown(StoreError::Timeout(self.inner.timeout)));
        }
        res
    }

    async fn fault_point(&self, step: ClaimStep) -> Result<(), StoreError> {
        match self
            .take_fault(|f| matches!(f, Fault::FailAfter(s) | Fault::HoldAfter(s, _) if *s == step))
        {
            Some(Fault::HoldAfter(_, resume)) => {
                resume.notified().await;
                Err(StoreError::Injected(step))
            }
            Some(_) => Err(StoreError::Injected(step)),
            None => Ok(()),
        }
    }

    fn resolve(&self, b: BucketId, e: RawEntry) -> Result<Lease, StoreError> {
        let rec = LeaseRecord::decode(&e.key, &e.value)?;
        let mut l = Lease::resolve(rec, e.revision, e.written_at, self.bucket_ttl(b));
        l.resource = e.key;
        Ok(l)
    }

    /// The record at `key`, live or not, from the leader.
    async fn read_lease(&self, b: BucketId, key: &str) -> Result<Option<Lease>, StoreError> {
        match self.be().get(b, key).await? {
            Some(e) => self.resolve(b, e).map(Some),
            None => Ok(None),
        }
    }

    /// The store timestamp of a write that landed.
    async fn stamp(&self, b: BucketId, key: &str, w: Written) -> Result<StoreTime, StoreError> {
        if let Some(at) = w.written_at {
            return Ok(at);
        }
        self.be()
            .written_at(b, key, w.revision)
            .await?
            .ok_or_else(|| StoreError::ClaimFailed {
                key: key.into(),
                reason: "the write was replaced before its timestamp could be read".into(),
            })
    }

    /// The lease a committing write made (a claim's token, an atomic
    /// claim's batch, a take): `acquired_at` is that write's own stamp.
    async fn committed(
        &self,
        b: BucketId,
        key: &str,
        rec: LeaseRecord,
        w: Written,
    ) -> Result<Lease, StoreError> {
        let at = self.stamp(b, key, w).await?;
        let mut lease = Lease::resolve(rec, w.revision, at, self.bucket_ttl(b));
        lease.resource = key.into();
        Ok(lease)
    }
}

fn kv_error(e: WriteError, conflict: KvError) -> KvError {
    match e {
        WriteError::Conflict => conflict,
        WriteError::Unknown(e) => KvError::Store(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::{Claim, ClaimRequest};

    #[test]
    fn resources_map_to_their_buckets() {
        assert_eq!(
            bucket_of("seat:a").ok(),
            Some((BucketId::Leases, ResourceKind::Seat))
        );
        assert_eq!(
            bucket_of("node:n").ok(),
            Some((BucketId::Leases, ResourceKind::Node))
        );
        assert_eq!(
            bucket_of("worker:w").ok(),
            Some((BucketId::Duties, ResourceKind::Worker))
        );
        assert!(bucket_of("mailbox:a").is_err());
        assert!(bucket_of("seat:").is_err());
    }

    #[test]
    fn a_scope_is_the_prefix_up_to_its_last_colon() {
        assert_eq!(scope_of(""), "");
        assert_eq!(scope_of("se"), "");
        assert_eq!(scope_of("seat:"), "seat:");
        assert_eq!(scope_of("seat:al"), "seat:");
        assert_eq!(scope_of("agent:alice:evt"), "agent:alice:");
    }

    #[tokio::test(start_paused = true)]
    async fn local_coordination_opens_the_twin() {
        let mut config = crate::config::Config::default();
        config.coordination.lease_ttl_seconds = 7;
        let (store, client) = super::super::open(&config, &Tasks::new())
            .await
            .expect("open");
        assert!(client.is_none(), "no NATS connection on local coordination");
        assert_eq!(store.lease_ttl(), Duration::from_secs(7));
        let won = store
            .claim(ClaimRequest::new("seat:a", "n:1", "n"))
            .await
            .expect("claim");
        assert!(matches!(won, Claim::Won(l) if l.epoch == 1));
    }
}
