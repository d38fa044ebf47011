//! A claim: the epoch minted, the lease written (three writes, or one
//! atomic batch where the backend offers it), the protocol gate judged once
//! the seat reads free, and a claim dropped after its first write giving
//! back exactly its own record ([`ClaimGuard`]).

use std::sync::Arc;
use std::time::Duration;

use crate::coord::kv::{self, Backend, BatchWrite, BucketId, RawEntry, WriteError, Written};
use crate::coord::lease::{
    self, AtomicClaim, EpochRecord, Found, Lease, LeaseRecord, LeaseState, ResourceKind,
};
use crate::coord::{Claim, ClaimRequest, Revision, StoreError};

use super::{ClaimStep, Coordinator, MAX_ATTEMPTS, bucket_of};

impl<B: Backend> Coordinator<B> {
    /// Mint the next epoch for `key` (compare-and-set on the counter).
    /// `read` is the counter as read beside the claim's first write, if
    /// that read answered.
    pub(super) async fn mint_epoch(
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

    pub(super) async fn claim_inner(
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
                            return held_by(current, key);
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

        self.gate_and_commit(
            req,
            guard,
            (b, key),
            &first,
            r1,
            (counter.ok(), key_counter),
        )
        .await
    }

    /// Write 2 on: the record found the key free (or lapsed) and now reads
    /// claiming at `r1`: only now is the protocol gate judged, then the
    /// epoch is minted and the record written held. A refusal or a failure
    /// gives back the claiming record (a peer reads it held only until
    /// then); an unanswered give-back is retried in the background by the
    /// guard.
    async fn gate_and_commit(
        &self,
        req: &ClaimRequest,
        guard: &mut ClaimGuard<B>,
        (b, key): (BucketId, &str),
        first: &LeaseRecord,
        r1: Revision,
        counters: (Option<Option<RawEntry>>, Option<Option<RawEntry>>),
    ) -> Result<Claim, StoreError> {
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

        match self.commit(b, key, first, r1, &guard.claim, counters).await {
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
    pub(super) async fn claim_atomic(
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
    pub(super) async fn gate_floor(&self, req: &ClaimRequest) -> Result<Option<u32>, StoreError> {
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
    pub(super) async fn commit(
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
}

/// The claim in flight: if its future is dropped (a caller that gave up, or
/// the store timeout) after its first write, its own record is given back
/// in the background.
pub(super) struct ClaimGuard<B: Backend> {
    pub(super) coord: Coordinator<B>,
    pub(super) bucket: BucketId,
    pub(super) key: String,
    pub(super) claim: String,
    pub(super) ttl: Duration,
    pub(super) armed: bool,
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

/// The answer to a claim that found the key held (pure): by whom, or a
/// failure when no record names a holder.
fn held_by(current: Option<Lease>, key: &str) -> Result<Claim, StoreError> {
    match current {
        Some(l) => Ok(Claim::HeldBy(l)),
        None => Err(StoreError::ClaimFailed {
            key: key.into(),
            reason: "held by nobody".into(),
        }),
    }
}
