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

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use rand::Rng;
use tokio::sync::Notify;

use super::kv::{
    self, Backend, BatchWrite, BucketId, RawEntry, RawEvent, RawEventStream, WriteError, Written,
};
use super::lease::{
    self, AtomicClaim, EpochRecord, Found, Lease, LeaseRecord, LeaseState, Offer, ResourceKind,
    StoreTime,
};
use super::view::LeaseView;
use super::{
    Claim, ClaimRequest, ConnectionState, Entry, Event, EventStream, KvError, Marker, Metadata,
    Release, Renewal, Revision, StateBucket, Store, StoreError,
};
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

    /// Give back the record at `revision` (this claim's own), if still
    /// there. `false` when the store did not answer (the give-back may be
    /// worth trying again); `true` when it applied, or definitely cannot.
    async fn give_back(&self, b: BucketId, key: &str, revision: Revision) -> bool {
        if self
            .take_fault(|f| matches!(f, Fault::RefuseGiveBack))
            .is_some()
        {
            tracing::warn!(key, "claim give-back refused; the record lapses on its TTL");
            return true;
        }
        match tokio::time::timeout(self.inner.timeout, self.be().delete(b, key, revision)).await {
            Ok(Ok(())) => {
                tracing::debug!(key, revision, "claim gave its record back");
                true
            }
            Ok(Err(WriteError::Conflict)) => {
                tracing::debug!(
                    key,
                    revision,
                    "claim give-back found the record moved on; left alone"
                );
                true
            }
            Ok(Err(WriteError::Unknown(_))) | Err(_) => false,
        }
    }

    /// Give back this claim's own claiming record, found by re-reading: the
    /// background half of a claim whose caller gave up or timed out. A write
    /// whose answer was lost may still land (a client buffers publishes
    /// while disconnected), so it keeps looking until two reads a moment
    /// apart find no record of this claim, or until the record would have
    /// lapsed anyway. A committed tenure is never taken.
    async fn give_back_by_claim(&self, b: BucketId, key: &str, claim: &str, ttl: Duration) {
        let until = tokio::time::Instant::now() + ttl;
        let mut clear_reads = 0;
        while tokio::time::Instant::now() < until {
            match self.bounded(self.read_lease(b, key)).await {
                Ok(Some(l)) if l.claim == claim => {
                    if l.state != LeaseState::Claiming {
                        return;
                    }
                    clear_reads = 0;
                    if self.give_back(b, key, l.revision).await {
                        continue;
                    }
                }
                Ok(_) => {
                    clear_reads += 1;
                    if clear_reads >= 2 {
                        return;
                    }
                }
                Err(_) => clear_reads = 0,
            }
            tokio::time::sleep(GIVE_BACK_RETRY).await;
        }
    }

    /// Mint the next epoch for `key` (compare-and-set on the counter).
    /// `read` is the counter as read beside the claim's first write, if
    /// that read answered.
    async fn mint_epoch(
        &self,
        key: &str,
        claim: &str,
        holder: &str,
        mut read: Option<Option<RawEntry>>,
        key_read: Option<Option<RawEntry>>,
    ) -> Result<u64, StoreError> {
        // Where atomic claims may run, the epoch key beside the lease is a
        // floor too (an atomic claim minted there last).
        let floor = if self.be().epoch_keys() {
            let found = match key_read {
                Some(f) => f,
                None => self.be().get(BucketId::Leases, &kv::epoch_key(key)).await?,
            };
            match found {
                Some(e) => EpochRecord::decode(&e.key, &e.value)?.epoch,
                None => 0,
            }
        } else {
            0
        };
        let mut last_err = None;
        for _ in 0..MAX_ATTEMPTS {
            let current = match read.take() {
                Some(c) => c,
                None => self.be().get(BucketId::Epochs, key).await?,
            };
            let (next, res) = match &current {
                None => {
                    let rec = EpochRecord {
                        epoch: lease::next_epoch(floor),
                        claim: claim.into(),
                        holder: holder.into(),
                    };
                    (
                        rec.epoch,
                        self.be().create(BucketId::Epochs, key, rec.encode()).await,
                    )
                }
                Some(e) => {
                    let cur = EpochRecord::decode(key, &e.value)?;
                    if cur.claim == claim {
                        // Our own write, whose answer was lost, landed.
                        return Ok(cur.epoch);
                    }
                    let rec = EpochRecord {
                        epoch: lease::next_epoch(cur.epoch.max(floor)),
                        claim: claim.into(),
                        holder: holder.into(),
                    };
                    (
                        rec.epoch,
                        self.be()
                            .update(BucketId::Epochs, key, rec.encode(), e.revision)
                            .await,
                    )
                }
            };
            match self.after_write(ClaimStep::Counter, res) {
                Ok(_) => return Ok(next),
                Err(WriteError::Conflict) => {}
                Err(WriteError::Unknown(e)) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| StoreError::ClaimFailed {
            key: key.into(),
            reason: "the epoch counter stayed contended".into(),
        }))
    }

    async fn claim_inner(
        &self,
        req: &ClaimRequest,
        guard: &mut ClaimGuard<B>,
    ) -> Result<Claim, StoreError> {
        let (b, kind) = bucket_of(&req.resource)?;
        let ttl = match kind {
            ResourceKind::Worker => req.ttl.unwrap_or(self.be().lease_ttl()),
            _ => self.be().lease_ttl(),
        };
        let key = req.resource.as_str();
        if b == BucketId::Leases && self.be().atomic_claims() {
            return self.claim_atomic(req, &guard.claim, ttl).await;
        }
        let first = LeaseRecord::claiming(req, &guard.claim, ttl);
        let body = first.encode();
        guard.bucket = b;
        guard.ttl = ttl;

        // From here a write may land: a caller that gives up leaves the
        // guard to give back whatever this claim wrote.
        guard.armed = true;

        // Write 1: the record, claiming. The first attempt assumes the key
        // is free, and reads the epoch counter beside it (the counter's
        // compare-and-set keeps that read honest); every later attempt
        // re-reads the record first.
        let epoch_key = kv::epoch_key(key);
        let (first_attempt, counter, key_counter) = tokio::join!(
            self.be().create(b, key, body.clone()),
            self.be().get(BucketId::Epochs, key),
            async {
                if b == BucketId::Leases && self.be().epoch_keys() {
                    self.be().get(BucketId::Leases, &epoch_key).await.ok()
                } else {
                    None
                }
            }
        );
        let mut pending = Some(first_attempt);
        let mut r1 = None;
        let mut last_err = None;
        // The epoch key read beside the first write is a floor only if that
        // write won: a later attempt may follow an atomic claim made since.
        let mut key_counter = key_counter;
        for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                key_counter = None;
            }
            let res = match pending.take() {
                Some(res) => res,
                None => {
                    let current = self.read_lease(b, key).await?;
                    match lease::judge_found(current.as_ref(), &guard.claim, self.be().now()) {
                        Found::Mine(rev) => {
                            r1 = Some(rev);
                            break;
                        }
                        Found::Held => {
                            guard.armed = false;
                            return match current {
                                Some(l) => Ok(Claim::HeldBy(l)),
                                None => Err(StoreError::ClaimFailed {
                                    key: key.into(),
                                    reason: "held by nobody".into(),
                                }),
                            };
                        }
                        Found::Free => self.be().create(b, key, body.clone()).await,
                        Found::Lapsed(rev) => self.be().update(b, key, body.clone(), rev).await,
                    }
                }
            };
            match self.after_write(ClaimStep::Record, res) {
                Ok(w) => {
                    r1 = Some(w.revision);
                    break;
                }
                Err(WriteError::Conflict) => {}
                Err(WriteError::Unknown(e)) => last_err = Some(e),
            }
        }
        let Some(r1) = r1 else {
            // A write with no answer may still land: leave the guard armed.
            guard.armed = last_err.is_some();
            return Err(last_err.unwrap_or_else(|| StoreError::ClaimFailed {
                key: key.into(),
                reason: "the key stayed contended".into(),
            }));
        };

        // The record found the key free (or lapsed) and now reads claiming:
        // only now is the protocol gate judged. A refusal gives back the
        // claiming record (a peer reads it held only until then).
        match self.gate_floor(req).await {
            Ok(None) => {}
            Ok(Some(floor)) => {
                guard.armed = !self.give_back(b, key, r1).await;
                return Ok(Claim::Gated { floor });
            }
            Err(e) => {
                guard.armed = !self.give_back(b, key, r1).await;
                return Err(e);
            }
        }

        match self
            .commit(
                b,
                key,
                &first,
                r1,
                &guard.claim,
                (counter.ok(), key_counter),
            )
            .await
        {
            Ok(lease) => {
                guard.armed = false;
                Ok(Claim::Won(lease))
            }
            Err(e) => {
                // Unanswered, it is retried in the background by the guard.
                guard.armed = !self.give_back(b, key, r1).await;
                Err(e)
            }
        }
    }

    /// A claim in one atomic batch (a backend with [`Backend::batch`]): read
    /// the record, the epoch key beside it and the epochs bucket's counter
    /// together, then write the epoch key and the held record in one batch,
    /// both by compare-and-set. Nothing is half done: a stale read stores
    /// nothing and is read again; a lost answer is read again, and the
    /// record says whether the batch landed.
    async fn claim_atomic(
        &self,
        req: &ClaimRequest,
        claim: &str,
        ttl: Duration,
    ) -> Result<Claim, StoreError> {
        let b = BucketId::Leases;
        let key = req.resource.as_str();
        let epoch_key = kv::epoch_key(key);
        let claiming = LeaseRecord::claiming(req, claim, ttl);
        let mut last_err = None;
        for _ in 0..MAX_ATTEMPTS {
            let (record, counter, legacy) = tokio::join!(
                self.be().get_marked(b, key),
                self.be().get(b, &epoch_key),
                self.be().get(BucketId::Epochs, key)
            );
            let (last, record) = record?;
            let found = record.map(|e| self.resolve(b, e)).transpose()?;
            let counter = counter?
                .map(|e| EpochRecord::decode(&e.key, &e.value).map(|r| (e.revision, r)))
                .transpose()?;
            let legacy = legacy?
                .map(|e| EpochRecord::decode(&e.key, &e.value))
                .transpose()?;
            let plan = lease::judge_atomic_claim(
                found.as_ref(),
                last,
                counter.as_ref().map(|(rev, r)| (*rev, r)),
                legacy.as_ref(),
                claim,
                self.be().now(),
            );
            let (lease_expected, epoch, epoch_expected) = match plan {
                AtomicClaim::Mine => {
                    return found
                        .map(Claim::Won)
                        .ok_or_else(|| StoreError::ClaimFailed {
                            key: key.into(),
                            reason: "held by nobody".into(),
                        });
                }
                AtomicClaim::Held => {
                    return found
                        .map(Claim::HeldBy)
                        .ok_or_else(|| StoreError::ClaimFailed {
                            key: key.into(),
                            reason: "held by nobody".into(),
                        });
                }
                AtomicClaim::Write {
                    lease_expected,
                    epoch,
                    epoch_expected,
                } => (lease_expected, epoch, epoch_expected),
            };
            // Free (or lapsed): only now is the protocol gate judged.
            if let Some(floor) = self.gate_floor(req).await? {
                return Ok(Claim::Gated { floor });
            }
            let rec = claiming.committed(epoch);
            let counter = EpochRecord {
                epoch,
                claim: claim.into(),
                holder: req.preferred.clone(),
            };
            let res = self
                .be()
                .batch(
                    b,
                    vec![
                        BatchWrite {
                            key: epoch_key.clone(),
                            value: counter.encode(),
                            expected: epoch_expected,
                            keep: true,
                        },
                        BatchWrite {
                            key: key.to_string(),
                            value: rec.encode(),
                            expected: lease_expected,
                            keep: false,
                        },
                    ],
                )
                .await;
            match self.after_write(ClaimStep::Batch, res) {
                Ok(w) => return self.committed(b, key, rec, w).await.map(Claim::Won),
                // A peer wrote first (or the read was stale): nothing was
                // stored; read again.
                Err(WriteError::Conflict) => {}
                // Read again: the record says whether the batch landed.
                Err(WriteError::Unknown(e)) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| StoreError::ClaimFailed {
            key: key.into(),
            reason: "the key stayed contended".into(),
        }))
    }

    /// A gated claim's protocol gate, judged from the live view: the floor
    /// a lower-protocol presence or seat lease imposes, if any. An ungated
    /// claim judges nothing.
    async fn gate_floor(&self, req: &ClaimRequest) -> Result<Option<u32>, StoreError> {
        if !req.gated {
            return Ok(None);
        }
        let be = Arc::clone(&self.inner.backend);
        let mine = req.protocol;
        self.inner
            .view
            .read(&self.inner.backend, &self.inner.tasks, move |m| {
                m.protocol_floor(be.now(), mine)
            })
            .await
    }

    /// Writes 2 and 3: mint the epoch, put it into the record.
    async fn commit(
        &self,
        b: BucketId,
        key: &str,
        first: &LeaseRecord,
        r1: Revision,
        claim: &str,
        (counter, key_counter): (Option<Option<RawEntry>>, Option<Option<RawEntry>>),
    ) -> Result<Lease, StoreError> {
        self.fault_point(ClaimStep::Record).await?;
        let epoch = self
            .mint_epoch(key, claim, &first.preferred, counter, key_counter)
            .await?;
        self.fault_point(ClaimStep::Counter).await?;

        let rec = first.committed(epoch);
        let body = rec.encode();
        let mut expected = r1;
        let mut written = None;
        for _ in 0..MAX_ATTEMPTS {
            let res = self
                .be()
                .update_stamped(b, key, body.clone(), expected)
                .await;
            match self.after_write(ClaimStep::Token, res) {
                Ok(w) => {
                    written = Some(w);
                    break;
                }
                Err(_) => match self.read_lease(b, key).await? {
                    Some(l)
                        if l.claim == claim && l.state == LeaseState::Held && l.epoch == epoch =>
                    {
                        written = Some(Written {
                            revision: l.revision,
                            ..Default::default()
                        });
                        break;
                    }
                    Some(l) if l.claim == claim && l.state == LeaseState::Claiming => {
                        expected = l.revision
                    }
                    _ => {
                        return Err(StoreError::ClaimFailed {
                            key: key.into(),
                            reason: "the claiming record was gone before the epoch reached it"
                                .into(),
                        });
                    }
                },
            }
        }
        let w = written.ok_or_else(|| StoreError::ClaimFailed {
            key: key.into(),
            reason: "the token write never landed".into(),
        })?;
        self.fault_point(ClaimStep::Token).await?;
        self.committed(b, key, rec, w).await
    }

    /// Writes the next epoch into an offered record, by compare-and-set on
    /// the record as read: a renewal by the giver in between is read again,
    /// a withdrawal or a new offer ends the take.
    async fn take_inner(
        &self,
        resource: &str,
        offer_id: &str,
        owner: &str,
        preferred: &str,
        protocol: u32,
    ) -> Result<Claim, StoreError> {
        let (b, kind) = bucket_of(resource)?;
        if kind != ResourceKind::Seat {
            return Err(StoreError::InvalidKey {
                key: resource.into(),
                reason: "only a seat lease is offered and taken",
            });
        }
        let key = resource;
        let claim = claim_id();
        let mut minted: Option<u64> = None;
        let mut last_err = None;
        for _ in 0..MAX_ATTEMPTS {
            let now = self.be().now();
            let Some(cur) = self.read_lease(b, key).await?.filter(|l| l.is_live(now)) else {
                return Err(StoreError::ClaimFailed {
                    key: key.into(),
                    reason: "the offered lease is gone (lapsed or released)".into(),
                });
            };
            if cur.claim == claim {
                // Our write, whose answer was lost, landed.
                return Ok(Claim::Won(cur));
            }
            let standing = cur.state == LeaseState::Held
                && cur
                    .offer
                    .as_ref()
                    .is_some_and(|o| o.id == offer_id && o.to == preferred);
            if !standing {
                return Ok(Claim::HeldBy(cur));
            }
            let epoch = match minted {
                Some(e) => e,
                None => {
                    let e = self.mint_epoch(key, &claim, preferred, None, None).await?;
                    minted = Some(e);
                    e
                }
            };
            self.hold_point(HoldPoint::Take).await;
            let rec = LeaseRecord::taken(&cur, owner, preferred, protocol, &claim, epoch);
            match self
                .be()
                .update_stamped(b, key, rec.encode(), cur.revision)
                .await
            {
                Ok(w) => {
                    let lease = self.committed(b, key, rec, w).await?;
                    if !lease::landed_in_time(cur.expires_at, lease.acquired_at) {
                        // Stamped after the offered tenure lapsed (this
                        // node's clock read it live a moment too long): a
                        // lapsed lease is never taken, only claimed. The
                        // late write is taken back; its epoch is a gap.
                        let _ = self.be().delete(b, key, w.revision).await;
                        return Err(StoreError::ClaimFailed {
                            key: key.into(),
                            reason: "the offered lease is gone (it lapsed before the take landed)"
                                .into(),
                        });
                    }
                    return Ok(Claim::Won(lease));
                }
                // The giver renewed in between: read again.
                Err(WriteError::Conflict) => {}
                // Read again: the record says whether it landed.
                Err(WriteError::Unknown(e)) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| StoreError::ClaimFailed {
            key: key.into(),
            reason: "the offered record kept changing under the take".into(),
        }))
    }

    async fn renew_inner(
        &self,
        lease: &Lease,
        owner: &str,
        metadata: Option<Metadata>,
    ) -> Result<Renewal, StoreError> {
        self.renew_offering(lease, owner, metadata, None).await
    }

    /// A renewal that may also set or clear the handoff offer (`offer`:
    /// `None` keeps the lease's own).
    async fn renew_offering(
        &self,
        lease: &Lease,
        owner: &str,
        metadata: Option<Metadata>,
        offer: Option<Option<Offer>>,
    ) -> Result<Renewal, StoreError> {
        if lease.owner != owner {
            return Ok(Renewal::Lost);
        }
        let (b, _) = bucket_of(&lease.resource)?;
        let key = lease.resource.as_str();
        if !lease.is_live(self.be().now()) {
            // A lapsed lease cannot be renewed, only re-acquired.
            return Ok(Renewal::Lost);
        }
        let mut rec = LeaseRecord::renewal(lease, &lease.claim, metadata);
        if let Some(offer) = offer {
            rec.offer = offer;
        }
        let body = rec.encode();
        let mut expected = lease.revision;
        let mut expires = lease.expires_at;
        for _ in 0..MAX_ATTEMPTS {
            match self
                .be()
                .update_stamped(b, key, body.clone(), expected)
                .await
            {
                Ok(w) => {
                    // Counted from the backend's lower bound when its
                    // upper bound shows the write landed in time: no
                    // second round trip to read the stamp back.
                    let at = match lease::renewal_stamp(w.written_at, w.within, expires) {
                        Some(at) => at,
                        None => self.stamp(b, key, w).await?,
                    };
                    if !lease::landed_in_time(expires, at) {
                        // Landed after the tenure lapsed: it renewed nothing.
                        // Take the late write back so the resource is free.
                        let _ = self.be().delete(b, key, w.revision).await;
                        return Ok(Renewal::Lost);
                    }
                    let mut renewed = Lease::resolve(rec, w.revision, at, self.bucket_ttl(b));
                    renewed.resource = key.into();
                    return Ok(Renewal::Renewed(renewed));
                }
                Err(WriteError::Conflict) => match self.read_lease(b, key).await? {
                    // Our own earlier renewal, whose answer was lost, landed.
                    Some(cur)
                        if lease::same_tenure(&cur, lease)
                            && cur.revision != expected
                            && cur.is_live(self.be().now()) =>
                    {
                        expected = cur.revision;
                        expires = expires.max(cur.expires_at);
                    }
                    _ => return Ok(Renewal::Lost),
                },
                // Re-read on the next renewal (a Conflict then finds our write).
                Err(WriteError::Unknown(e)) => return Ok(Renewal::Unknown(e)),
            }
        }
        Ok(Renewal::Unknown(StoreError::Backend(
            "the lease kept changing under its renewal".into(),
        )))
    }

    async fn release_inner(&self, lease: &Lease, owner: &str) -> Result<Release, StoreError> {
        if lease.owner != owner {
            return Ok(Release::NotHeld);
        }
        let (b, _) = bucket_of(&lease.resource)?;
        let key = lease.resource.as_str();
        let mut expected = lease.revision;
        let mut unknown = false;
        for _ in 0..MAX_ATTEMPTS {
            match self.be().delete(b, key, expected).await {
                Ok(()) => return Ok(Release::Released),
                Err(e) => {
                    unknown |= matches!(e, WriteError::Unknown(_));
                    match self.read_lease(b, key).await? {
                        Some(cur) if lease::same_tenure(&cur, lease) => expected = cur.revision,
                        // Gone after a delete whose answer was lost: ours landed.
                        None if unknown => return Ok(Release::Released),
                        _ => return Ok(Release::NotHeld),
                    }
                }
            }
        }
        Err(StoreError::Backend(
            "the lease kept changing under its release".into(),
        ))
    }

    /// Every key's current state (a value or a removal marker) under
    /// `prefix`, read level with the bucket's last write under its scope.
    ///
    /// The watch delivers each key's last message in revision order, then
    /// what is written after. A key written again after the last revision
    /// was read (or while the watch delivers) is delivered only at its new
    /// revision, past that last one: so on reaching the last revision read
    /// the scan reads it once more and reads on to that. Stopping at the
    /// first instead once missed a live node's presence renewed a moment
    /// after this node's own release.
    async fn scan_events(&self, b: BucketId, prefix: &str) -> Result<Vec<RawEvent>, StoreError> {
        let scope = scope_of(prefix);
        let Some(mut last) = self.be().last_revision(b, scope).await? else {
            return Ok(Vec::new());
        };
        self.hold_point(HoldPoint::Scan).await;
        let mut stream = self.open_watch(b, scope).await?;
        let mut seen = std::collections::BTreeMap::new();
        let mut reached = 0;
        // Read the last revision again once, on reaching the first: a key
        // written again before that re-read lies at or below its answer.
        // Once only: an answer past what the scope's watch ever delivers
        // must not keep the scan chasing.
        let mut reread = false;
        loop {
            match tokio::time::timeout(RECHECK, stream.next()).await {
                Ok(Some(Ok(ev))) => {
                    reached = reached.max(ev.revision());
                    let key = match &ev {
                        RawEvent::Put(e) => e.key.clone(),
                        RawEvent::Delete { key, .. } => key.clone(),
                    };
                    seen.insert(key, ev);
                    if reached < last {
                        continue;
                    }
                }
                Ok(Some(Err(e))) => return Err(e),
                Ok(None) => break,
                Err(_) => {
                    // Nothing came: the last revision read may be gone (its
                    // key removed), and then it is never delivered. After
                    // the re-read, what it covers has had its time.
                    if !reread && reached < last && self.be().revision_exists(b, last).await? {
                        continue;
                    }
                }
            }
            if reread {
                break;
            }
            reread = true;
            match self.be().last_revision(b, scope).await? {
                Some(now) if now > reached => last = now,
                _ => break,
            }
        }
        Ok(seen
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, ev)| ev)
            .collect())
    }

    /// Open a watch, trying again when an attempt goes unanswered: on a
    /// cluster that has just lost a member, the server may place the
    /// watch's consumer on the member that is gone, and that request is
    /// never answered (server 2.9). The caller's bound still applies.
    async fn open_watch(&self, b: BucketId, scope: &str) -> Result<RawEventStream, StoreError> {
        let attempt = (self.inner.timeout / 4).max(Duration::from_millis(200));
        loop {
            match tokio::time::timeout(attempt, self.be().watch(b, scope)).await {
                Ok(r) => return r,
                Err(_) => {
                    tracing::debug!(bucket = b.name(), "watch not opened in time; trying again")
                }
            }
        }
    }

    /// Every current value under `prefix`.
    async fn scan(&self, b: BucketId, prefix: &str) -> Result<Vec<RawEntry>, StoreError> {
        Ok(self
            .scan_events(b, prefix)
            .await?
            .into_iter()
            .filter_map(|ev| match ev {
                RawEvent::Put(e) => Some(e),
                RawEvent::Delete { .. } => None,
            })
            .collect())
    }

    async fn list_inner(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        let mut out = Vec::new();
        let mut buckets = Vec::new();
        if !prefix.starts_with("worker") {
            buckets.push(BucketId::Leases);
        }
        if prefix.starts_with("worker:") || "worker:".starts_with(prefix) {
            buckets.push(BucketId::Duties);
        }
        for b in buckets {
            for e in self.scan(b, prefix).await? {
                if e.key.starts_with(kv::EPOCH_KEY_PREFIX) {
                    // An atomic claim's epoch key is no lease.
                    continue;
                }
                match self.resolve(b, e) {
                    Ok(l) => out.push(l),
                    Err(err) => tracing::warn!(error = %err, "unreadable lease record skipped"),
                }
            }
        }
        let now = self.be().now();
        out.retain(|l| l.is_live(now));
        out.sort_by(|a, b| a.resource.cmp(&b.resource));
        Ok(out)
    }

    fn entry(e: RawEntry) -> Entry {
        Entry {
            key: e.key,
            value: e.value,
            revision: e.revision,
            written_at: e.written_at,
        }
    }
}

/// The claim in flight: if its future is dropped (a caller that gave up, or
/// the store timeout) after its first write, its own record is given back
/// in the background.
struct ClaimGuard<B: Backend> {
    coord: Coordinator<B>,
    bucket: BucketId,
    key: String,
    claim: String,
    ttl: Duration,
    armed: bool,
}

impl<B: Backend> Drop for ClaimGuard<B> {
    fn drop(&mut self) {
        if !self.armed || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let coord = self.coord.clone();
        let (b, ttl) = (self.bucket, self.ttl);
        let (key, claim) = (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.claim),
        );
        self.coord
            .inner
            .tasks
            .spawn("coord_claim_give_back", async move {
                coord.give_back_by_claim(b, &key, &claim, ttl).await;
            });
    }
}

fn kv_error(e: WriteError, conflict: KvError) -> KvError {
    match e {
        WriteError::Conflict => conflict,
        WriteError::Unknown(e) => KvError::Store(e),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
