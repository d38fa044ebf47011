//! A tenure after its claim: renewed (three-valued), offered and taken
//! (the two-phase hand-over), released by compare-and-set, and a failed
//! claim's record given back.

use std::time::Duration;

use crate::coord::kv::{Backend, BucketId, WriteError};
use crate::coord::lease::{self, Lease, LeaseRecord, LeaseState, Offer, ResourceKind};
use crate::coord::{Claim, Metadata, Release, Renewal, Revision, StoreError};

use super::{Coordinator, Fault, GIVE_BACK_RETRY, HoldPoint, MAX_ATTEMPTS, bucket_of, claim_id};

impl<B: Backend> Coordinator<B> {
    /// Writes the next epoch into an offered record, by compare-and-set on
    /// the record as read: a renewal by the giver in between is read again,
    /// a withdrawal or a new offer ends the take.
    pub(super) async fn take_inner(
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

    pub(super) async fn renew_inner(
        &self,
        lease: &Lease,
        owner: &str,
        metadata: Option<Metadata>,
    ) -> Result<Renewal, StoreError> {
        self.renew_offering(lease, owner, metadata, None).await
    }

    /// A renewal that may also set or clear the handoff offer (`offer`:
    /// `None` keeps the lease's own).
    pub(super) async fn renew_offering(
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
                .update_renewal(b, key, body.clone(), expected)
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

    pub(super) async fn release_inner(
        &self,
        lease: &Lease,
        owner: &str,
    ) -> Result<Release, StoreError> {
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

    /// Give back the record at `revision` (this claim's own), if still
    /// there. `false` when the store did not answer (the give-back may be
    /// worth trying again); `true` when it applied, or definitely cannot.
    pub(super) async fn give_back(&self, b: BucketId, key: &str, revision: Revision) -> bool {
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
    pub(super) async fn give_back_by_claim(
        &self,
        b: BucketId,
        key: &str,
        claim: &str,
        ttl: Duration,
    ) {
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
}
