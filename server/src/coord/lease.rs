//! The lease record and the pure rules about it: liveness, epochs, which
//! claim may proceed, whether a renewal landed in time, the protocol floor.
//!
//! Everything here is a pure function of its arguments. Time enters as a
//! value on the store's clock ([`StoreTime`]); nothing here reads a clock,
//! talks to a store or spawns anything.
//!
//! On the wire (JSON) the record is additive-only: unknown fields are
//! ignored and every field added later must have a default. The record does
//! not carry its own write time (a store stamps that on the message), so
//! `expires_at` is the write's store timestamp plus the TTL, and
//! `acquired_at` is absent on the write that commits a tenure (the tenure
//! began at that write's own timestamp) and carried unchanged by every
//! renewal after it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Metadata;

/// A moment on the store's clock: nanoseconds since the Unix epoch.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct StoreTime(i64);

impl StoreTime {
    pub const fn from_unix_nanos(n: i64) -> StoreTime {
        StoreTime(n)
    }

    pub const fn unix_nanos(self) -> i64 {
        self.0
    }

    pub fn from_offset(t: time::OffsetDateTime) -> StoreTime {
        let n = t.unix_timestamp_nanos();
        StoreTime(n.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
    }

    pub fn to_offset(self) -> Option<time::OffsetDateTime> {
        time::OffsetDateTime::from_unix_timestamp_nanos(self.0 as i128).ok()
    }

    pub fn plus(self, d: Duration) -> StoreTime {
        let add = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        StoreTime(self.0.saturating_add(add))
    }

    /// How long after `earlier` this is (zero when it is not after).
    pub fn since(self, earlier: StoreTime) -> Duration {
        Duration::from_nanos(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

impl std::fmt::Display for StoreTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_offset().and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        }) {
            Some(s) => f.write_str(&s),
            None => write!(f, "{}ns", self.0),
        }
    }
}

/// What kind of thing a resource key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceKind {
    Seat,
    Node,
    Worker,
}

impl ResourceKind {
    /// `seat:{handle}` → Seat, and so on; `None` for anything else.
    pub fn of(resource: &str) -> Option<ResourceKind> {
        let (kind, rest) = resource.split_once(':')?;
        if rest.is_empty() {
            return None;
        }
        match kind {
            "seat" => Some(ResourceKind::Seat),
            "node" => Some(ResourceKind::Node),
            "worker" => Some(ResourceKind::Worker),
            _ => None,
        }
    }

    /// Presence and seat leases count for the protocol gate; a duty never
    /// does (it outlives its holder by its own TTL, up to hours).
    pub fn counts_for_protocol_gate(self) -> bool {
        matches!(self, ResourceKind::Seat | ResourceKind::Node)
    }
}

/// Where a tenure is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// The first of a claim's three writes: the record exists, the epoch is
    /// not minted yet. Read as held by everyone (a sibling claim about to
    /// commit).
    Claiming,
    /// A committed tenure: the record carries its epoch.
    Held,
}

/// Phase 1 of a two-phase handoff, carried on a held seat lease: its
/// holder quiesced the seat and offers the lease to the node `to`, which
/// may take it (a compare-and-set that mints the next epoch) while the
/// holder still holds and renews it. Older nodes ignore the field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    /// The successor's stable node id.
    pub to: String,
    /// Names this offer: a take names the offer it takes, so an offer
    /// withdrawn and made again is never taken by a stale notice.
    pub id: String,
    /// When the holder stopped admitting turns, on the store's clock.
    pub quiesced_at: StoreTime,
}

/// The record as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeaseRecord {
    #[serde(default)]
    pub resource: String,
    pub owner: String,
    #[serde(default)]
    pub epoch: u64,
    /// Absent on the write that commits a tenure (that write's own
    /// timestamp is the tenure's start), carried by every renewal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<StoreTime>,
    /// The TTL the writer meant (a duty's own; the leases bucket's age
    /// limit for seats and presence).
    #[serde(default)]
    pub ttl_ms: u64,
    #[serde(default)]
    pub preferred: String,
    #[serde(default)]
    pub protocol: u32,
    pub state: LeaseState,
    /// The id of the claim call that wrote the tenure's first record: how a
    /// claim recognises its own write after an answer was lost, and the
    /// only record its give-back may take.
    #[serde(default)]
    pub claim: String,
    #[serde(default)]
    pub metadata: Metadata,
    /// A standing handoff offer (seats only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offer: Option<Offer>,
}

impl LeaseRecord {
    pub fn encode(&self) -> bytes::Bytes {
        // Serialising a struct of strings, integers and JSON values cannot fail.
        bytes::Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    pub fn decode(key: &str, raw: &[u8]) -> Result<LeaseRecord, super::StoreError> {
        serde_json::from_slice(raw).map_err(|e| super::StoreError::Corrupt {
            key: key.to_string(),
            reason: e.to_string(),
        })
    }

    /// The first write of a claim.
    pub fn claiming(req: &super::ClaimRequest, claim: &str, ttl: Duration) -> LeaseRecord {
        LeaseRecord {
            resource: req.resource.clone(),
            owner: req.owner.clone(),
            epoch: 0,
            acquired_at: None,
            ttl_ms: ttl.as_millis() as u64,
            preferred: req.preferred.clone(),
            protocol: req.protocol,
            state: LeaseState::Claiming,
            claim: claim.to_string(),
            metadata: req.metadata.clone(),
            offer: None,
        }
    }

    /// The third write of a claim: the minted epoch into the record.
    pub fn committed(&self, epoch: u64) -> LeaseRecord {
        LeaseRecord {
            epoch,
            state: LeaseState::Held,
            acquired_at: None,
            ..self.clone()
        }
    }

    /// A renewal of `lease`: same tenure, same `acquired_at`.
    pub fn renewal(lease: &Lease, claim: &str, metadata: Option<Metadata>) -> LeaseRecord {
        LeaseRecord {
            resource: lease.resource.clone(),
            owner: lease.owner.clone(),
            epoch: lease.epoch,
            acquired_at: Some(lease.acquired_at),
            ttl_ms: lease.ttl.as_millis() as u64,
            preferred: lease.preferred.clone(),
            protocol: lease.protocol,
            state: LeaseState::Held,
            claim: claim.to_string(),
            metadata: metadata.unwrap_or_else(|| lease.metadata.clone()),
            offer: lease.offer.clone(),
        }
    }

    /// The write that takes an offered lease: a new tenure for `owner`
    /// (node `preferred`) at `epoch`, begun at this write's own timestamp.
    pub fn taken(
        lease: &Lease,
        owner: &str,
        preferred: &str,
        protocol: u32,
        claim: &str,
        epoch: u64,
    ) -> LeaseRecord {
        LeaseRecord {
            resource: lease.resource.clone(),
            owner: owner.to_string(),
            epoch,
            acquired_at: None,
            ttl_ms: lease.ttl.as_millis() as u64,
            preferred: preferred.to_string(),
            protocol,
            state: LeaseState::Held,
            claim: claim.to_string(),
            metadata: Metadata::new(),
            offer: None,
        }
    }
}

/// A lease as the contract hands it out: the record, resolved against the
/// write that stored it.
#[derive(Clone, Debug, PartialEq)]
pub struct Lease {
    pub resource: String,
    pub owner: String,
    pub epoch: u64,
    pub acquired_at: StoreTime,
    pub expires_at: StoreTime,
    pub preferred: String,
    pub protocol: u32,
    pub state: LeaseState,
    pub metadata: Metadata,
    /// The revision of the write this was read from (renew and release
    /// compare-and-set against it).
    pub revision: u64,
    pub ttl: Duration,
    /// The claim call that began the tenure.
    pub claim: String,
    /// A standing handoff offer.
    pub offer: Option<Offer>,
}

impl Lease {
    /// Resolve `record`, stored at `revision` by a write stamped
    /// `written_at`. `bucket_ttl` is the bucket's age limit when it has one
    /// (the leases bucket): the key disappears then whatever the record says.
    pub fn resolve(
        record: LeaseRecord,
        revision: u64,
        written_at: StoreTime,
        bucket_ttl: Option<Duration>,
    ) -> Lease {
        let ttl = bucket_ttl.unwrap_or(Duration::from_millis(record.ttl_ms));
        Lease {
            acquired_at: record.acquired_at.unwrap_or(written_at),
            expires_at: written_at.plus(ttl),
            resource: record.resource,
            owner: record.owner,
            epoch: record.epoch,
            preferred: record.preferred,
            protocol: record.protocol,
            state: record.state,
            metadata: record.metadata,
            revision,
            ttl,
            claim: record.claim,
            offer: record.offer,
        }
    }

    pub fn is_live(&self, now: StoreTime) -> bool {
        is_live(self.expires_at, now)
    }

    pub fn kind(&self) -> Option<ResourceKind> {
        ResourceKind::of(&self.resource)
    }

    /// The node this lease stands for: the id of a presence lease
    /// (`node:{id}`), else its owner's node (`node-1` of `node-1:0a1b2c3d`).
    pub fn node(&self) -> &str {
        match self.resource.strip_prefix("node:") {
            Some(id) => id,
            None => self
                .owner
                .rsplit_once(':')
                .map_or(self.owner.as_str(), |(node, _)| node),
        }
    }
}

/// A lease is live strictly before its expiry.
pub fn is_live(expires_at: StoreTime, now: StoreTime) -> bool {
    now < expires_at
}

/// What a claim does about the record it found.
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    /// Nothing there: create.
    Free,
    /// This call's own record (a write whose answer was lost landed).
    Mine(u64),
    /// A live record, claiming or held, by anyone (this owner included: a
    /// live lease is renewed, not claimed again).
    Held,
    /// A lapsed record the store has not removed yet: take it over with a
    /// compare-and-set on its revision.
    Lapsed(u64),
}

/// Judge the record a claim found at its key.
pub fn judge_found(found: Option<&Lease>, claim: &str, now: StoreTime) -> Found {
    match found {
        None => Found::Free,
        Some(l) if l.claim == claim && l.state == LeaseState::Claiming => Found::Mine(l.revision),
        Some(l) if l.is_live(now) => Found::Held,
        Some(l) => Found::Lapsed(l.revision),
    }
}

/// What an atomic claim (one batch: the epoch key and the lease, both by
/// compare-and-set) does, given what it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AtomicClaim {
    /// A live lease of someone else's (or of this owner's earlier tenure).
    Held,
    /// This claim's own batch, whose answer was lost, landed.
    Mine,
    /// Write the batch: the lease over its last write `lease_expected` (0:
    /// none), the epoch key holding `epoch` over `epoch_expected` (0: none).
    Write {
        lease_expected: u64,
        epoch: u64,
        epoch_expected: u64,
    },
}

/// Pure: judge an atomic claim. `found` is the lease record (none when
/// absent or a removal marker), `last` the key's last write, a marker
/// included (0: none); `counter` the epoch key in the leases bucket (its
/// revision and record), `legacy` the epochs bucket's counter. The epoch
/// minted is past every counter and past the record's own, so epochs stay
/// monotonic whichever claim path wrote last.
pub fn judge_atomic_claim(
    found: Option<&Lease>,
    last: u64,
    counter: Option<(u64, &EpochRecord)>,
    legacy: Option<&EpochRecord>,
    claim: &str,
    now: StoreTime,
) -> AtomicClaim {
    if let Some(l) = found {
        if l.claim == claim && l.state == LeaseState::Held {
            return AtomicClaim::Mine;
        }
        if l.is_live(now) {
            return AtomicClaim::Held;
        }
    }
    let current = [
        counter.map(|(_, r)| r.epoch),
        legacy.map(|r| r.epoch),
        found.map(|l| l.epoch),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(0);
    AtomicClaim::Write {
        lease_expected: last,
        epoch: next_epoch(current),
        epoch_expected: counter.map_or(0, |(rev, _)| rev),
    }
}

/// The next epoch after the counter's current value (0 = never minted).
pub fn next_epoch(current: u64) -> u64 {
    current.saturating_add(1)
}

/// A renewal extends a tenure only if it landed before the tenure lapsed:
/// one stamped at or after `expires_at` renewed nothing (the lease had
/// lapsed and may only be re-acquired, with a new epoch).
pub fn landed_in_time(expires_at: StoreTime, written_at: StoreTime) -> bool {
    written_at < expires_at
}

/// Pure: the timestamp a renewal's new tenure is counted from, without
/// reading the write back. The exact stamp when the store gave it; else,
/// when the backend's bounds show the write landed in time (its upper
/// bound before `expires_at`), the lower bound: the holder then believes
/// its tenure ends no later than the store does, never later. `None`: the
/// bounds cannot tell (or there are none); read the write's stamp.
pub fn renewal_stamp(
    exact: Option<StoreTime>,
    within: Option<(StoreTime, StoreTime)>,
    expires_at: StoreTime,
) -> Option<StoreTime> {
    match (exact, within) {
        (Some(at), _) => Some(at),
        (None, Some((lo, hi))) if lo <= hi && landed_in_time(expires_at, hi) => Some(lo),
        _ => None,
    }
}

/// Whether `current` is still `lease`'s tenure: same owner, same epoch, held.
pub fn same_tenure(current: &Lease, lease: &Lease) -> bool {
    current.owner == lease.owner
        && current.epoch == lease.epoch
        && current.state == LeaseState::Held
}

/// The leases the protocol gate looks at that sit below `mine`: live
/// presence and seat leases (claiming or held) at a lower protocol. Duty
/// leases never count.
fn below<'a>(
    leases: impl IntoIterator<Item = &'a Lease>,
    now: StoreTime,
    mine: u32,
) -> impl Iterator<Item = &'a Lease> {
    leases.into_iter().filter(move |l| {
        l.kind().is_some_and(ResourceKind::counts_for_protocol_gate)
            && l.is_live(now)
            && l.protocol < mine
    })
}

/// The protocol floor: the lowest protocol below `mine` among live presence
/// and seat leases (claiming or held). Duty leases never count.
pub fn protocol_floor<'a>(
    leases: impl IntoIterator<Item = &'a Lease>,
    now: StoreTime,
    mine: u32,
) -> Option<u32> {
    below(leases, now, mine).map(|l| l.protocol).min()
}

/// The nodes holding a live presence or seat lease below `mine` (the ones a
/// protocol-gate refusal waits for), each named once, in order.
pub fn nodes_below<'a>(
    leases: impl IntoIterator<Item = &'a Lease>,
    now: StoreTime,
    mine: u32,
) -> Vec<String> {
    below(leases, now, mine)
        .map(|l| l.node().to_string())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The epoch counter's record in `crewlet_epochs`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    pub epoch: u64,
    /// The claim call that minted it (how a lost answer is recognised).
    #[serde(default)]
    pub claim: String,
    /// The stable node id of the claim that minted it: the resource's
    /// last holder, kept here because this bucket has no age limit, so the
    /// `preferred` hint outlives a lapsed lease (what stickiness reads).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub holder: String,
}

impl EpochRecord {
    pub fn encode(&self) -> bytes::Bytes {
        bytes::Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    pub fn decode(key: &str, raw: &[u8]) -> Result<EpochRecord, super::StoreError> {
        serde_json::from_slice(raw).map_err(|e| super::StoreError::Corrupt {
            key: key.to_string(),
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> StoreTime {
        StoreTime::from_unix_nanos(s * 1_000_000_000)
    }

    fn epoch_rec(epoch: u64, claim: &str) -> EpochRecord {
        EpochRecord {
            epoch,
            claim: claim.into(),
            holder: "node-a".into(),
        }
    }

    #[test]
    fn an_atomic_claim_mints_past_every_counter_and_the_record() {
        let mut l = lease("seat:a", 4, 10);
        l.epoch = 4;
        l.revision = 9;
        // Lapsed at t=20: the epoch key says 3, the epochs bucket 6 (a
        // three-write claim minted there last), the record 4.
        let plan = judge_atomic_claim(
            Some(&l),
            9,
            Some((5, &epoch_rec(3, "x"))),
            Some(&epoch_rec(6, "y")),
            "mine",
            t(20),
        );
        assert_eq!(
            plan,
            AtomicClaim::Write {
                lease_expected: 9,
                epoch: 7,
                epoch_expected: 5
            }
        );
        // Nothing anywhere: epoch 1, both keys created.
        assert_eq!(
            judge_atomic_claim(None, 0, None, None, "mine", t(0)),
            AtomicClaim::Write {
                lease_expected: 0,
                epoch: 1,
                epoch_expected: 0
            }
        );
        // A removal marker: the lease is written over the marker's revision.
        assert_eq!(
            judge_atomic_claim(None, 12, Some((11, &epoch_rec(2, "x"))), None, "m", t(0)),
            AtomicClaim::Write {
                lease_expected: 12,
                epoch: 3,
                epoch_expected: 11
            }
        );
    }

    #[test]
    fn a_renewal_counts_from_its_lower_bound_only_when_it_surely_landed_in_time() {
        // Exact: used as is.
        assert_eq!(renewal_stamp(Some(t(5)), None, t(10)), Some(t(5)));
        // Bounds wholly before the expiry: the lower bound (never later
        // than the store's stamp, so the holder's expiry is never later).
        assert_eq!(renewal_stamp(None, Some((t(4), t(6))), t(10)), Some(t(4)));
        // The upper bound at or past the expiry: it may have landed late.
        assert_eq!(renewal_stamp(None, Some((t(8), t(10))), t(10)), None);
        // No bounds, or nonsense bounds: read it.
        assert_eq!(renewal_stamp(None, None, t(10)), None);
        assert_eq!(renewal_stamp(None, Some((t(7), t(6))), t(10)), None);
    }

    #[test]
    fn an_atomic_claim_never_writes_over_a_live_lease_and_knows_its_own() {
        let mut l = lease("seat:a", 4, 10);
        l.claim = "theirs".into();
        assert_eq!(
            judge_atomic_claim(Some(&l), l.revision, None, None, "mine", t(5)),
            AtomicClaim::Held
        );
        l.claim = "mine".into();
        assert_eq!(
            judge_atomic_claim(Some(&l), l.revision, None, None, "mine", t(5)),
            AtomicClaim::Mine
        );
    }

    fn lease(resource: &str, protocol: u32, expires: i64) -> Lease {
        Lease {
            resource: resource.into(),
            owner: "n:1".into(),
            epoch: 1,
            acquired_at: t(0),
            expires_at: t(expires),
            preferred: "n".into(),
            protocol,
            state: LeaseState::Held,
            metadata: Metadata::new(),
            revision: 1,
            ttl: Duration::from_secs(45),
            claim: "c".into(),
            offer: None,
        }
    }

    #[test]
    fn record_ignores_unknown_fields_and_defaults_missing_ones() {
        let raw = br#"{"owner":"a:1","state":"held","epoch":3,"from_the_future":{"x":1}}"#;
        let r = LeaseRecord::decode("seat.x", raw).expect("decodes");
        assert_eq!(r.owner, "a:1");
        assert_eq!(r.epoch, 3);
        assert_eq!(r.state, LeaseState::Held);
        assert!(r.metadata.is_empty());
    }

    #[test]
    fn committing_write_dates_the_tenure_and_renewals_carry_it() {
        let mut rec = LeaseRecord::decode(
            "k",
            br#"{"owner":"a:1","state":"held","epoch":1,"ttl_ms":1000}"#,
        )
        .expect("decodes");
        let first = Lease::resolve(rec.clone(), 5, t(10), None);
        assert_eq!(first.acquired_at, t(10));
        assert_eq!(first.expires_at, t(11));
        rec = LeaseRecord::renewal(&first, "c", None);
        let renewed = Lease::resolve(rec, 6, t(20), Some(Duration::from_secs(3)));
        assert_eq!(
            renewed.acquired_at,
            t(10),
            "a renewal never restamps acquired_at"
        );
        assert_eq!(
            renewed.expires_at,
            t(23),
            "the bucket's age limit wins for the leases bucket"
        );
    }

    #[test]
    fn liveness_is_strictly_before_expiry() {
        assert!(is_live(t(10), t(9)));
        assert!(!is_live(t(10), t(10)));
        assert!(landed_in_time(t(10), t(9)));
        assert!(!landed_in_time(t(10), t(10)));
    }

    #[test]
    fn judge_found_covers_every_case() {
        let mut l = lease("seat:a", 4, 10);
        assert_eq!(judge_found(None, "c", t(0)), Found::Free);
        assert_eq!(judge_found(Some(&l), "other", t(5)), Found::Held);
        assert_eq!(judge_found(Some(&l), "other", t(10)), Found::Lapsed(1));
        l.state = LeaseState::Claiming;
        assert_eq!(judge_found(Some(&l), "c", t(5)), Found::Mine(1));
        assert_eq!(
            judge_found(Some(&l), "other", t(5)),
            Found::Held,
            "a sibling claim reads as held"
        );
    }

    #[test]
    fn protocol_floor_counts_live_presence_and_seats_never_duties() {
        let ls = [
            lease("seat:a", 4, 10),
            lease("node:n", 3, 10),
            lease("worker:learning", 2, 1000),
            lease("seat:b", 1, 5),
        ];
        assert_eq!(protocol_floor(&ls, t(1), 4), Some(1));
        assert_eq!(
            protocol_floor(&ls, t(6), 4),
            Some(3),
            "a lapsed lower lease no longer counts"
        );
        assert_eq!(protocol_floor(&ls, t(11), 4), None, "a duty never counts");
        assert_eq!(
            protocol_floor(&ls, t(1), 1),
            None,
            "the gate only looks down"
        );
    }

    #[test]
    fn a_refusal_names_each_node_holding_a_live_lease_below_the_protocol_once() {
        let mut seat_of_old = lease("seat:a", 3, 10);
        seat_of_old.owner = "old-1:0a1b2c3d".into();
        let mut seat_of_old_again = lease("seat:b", 3, 10);
        seat_of_old_again.owner = "old-1:0a1b2c3d".into();
        let mut lapsed = lease("seat:c", 3, 5);
        lapsed.owner = "old-3:00000003".into();
        let ls = [
            seat_of_old,
            seat_of_old_again,
            lease("node:old-2", 2, 10),
            lapsed,
            lease("worker:learning", 1, 1000),
            lease("node:new", 4, 10),
        ];
        assert_eq!(
            nodes_below(&ls, t(6), 4),
            vec!["old-1".to_string(), "old-2".to_string()],
            "a presence by its id, a seat by its owner's node; lapsed leases, duties \
             and leases at the protocol are not named"
        );
        assert!(nodes_below(&ls, t(6), 2).is_empty(), "only lower protocols");
    }

    #[test]
    fn resource_kinds() {
        assert_eq!(ResourceKind::of("seat:a"), Some(ResourceKind::Seat));
        assert_eq!(ResourceKind::of("node:a"), Some(ResourceKind::Node));
        assert_eq!(ResourceKind::of("worker:a"), Some(ResourceKind::Worker));
        assert_eq!(ResourceKind::of("seat:"), None);
        assert_eq!(ResourceKind::of("mailbox:a"), None);
        assert_eq!(next_epoch(0), 1);
    }
}
