//! The primitives a coordination backend provides: compare-and-set writes
//! on named buckets, reads from the leader, a watch, and the store's clock.
//!
//! This is the whole surface the lease protocol ([`super::protocol`]) is
//! written against, so that it runs unchanged on the twin and on NATS. A
//! backend must never retry a write itself (a write whose answer was lost
//! is reported as [`WriteError::Unknown`], and the protocol re-reads before
//! anything is retried), and must never read from a follower.
//!
//! Also here: the pure mapping between contract keys (`seat:alice`, ledger
//! event ids) and NATS KV keys, which allow only `[-/_=.a-zA-Z0-9]`.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

use super::{ConnectionState, Revision, StoreError, StoreTime};

/// The buckets of the coordination store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BucketId {
    /// Seat and presence leases; age limit = the lease TTL.
    Leases,
    /// The epoch counters; no age limit.
    Epochs,
    /// Duty leases, each its own TTL (judged from the record).
    Duties,
    Ledger,
    Mailboxes,
    Pauses,
    Config,
    /// Detached runs' records.
    Runs,
    /// Handoff notices and move requests (an hour's age).
    Handoffs,
    /// The seats' windowed token counters (forty days' age: past the
    /// longest window, a month).
    Budgets,
}

/// The completion ledger's age: seven days.
pub const LEDGER_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Handoff notices and move requests age out after an hour.
pub const HANDOFFS_MAX_AGE: Duration = Duration::from_secs(3600);
/// A token counter ages out forty days after its last charge.
pub const BUDGETS_MAX_AGE: Duration = Duration::from_secs(40 * 24 * 3600);

impl BucketId {
    pub const ALL: [BucketId; 10] = [
        BucketId::Leases,
        BucketId::Epochs,
        BucketId::Duties,
        BucketId::Ledger,
        BucketId::Mailboxes,
        BucketId::Pauses,
        BucketId::Config,
        BucketId::Runs,
        BucketId::Handoffs,
        BucketId::Budgets,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BucketId::Leases => "crewlet_leases",
            BucketId::Epochs => "crewlet_epochs",
            BucketId::Duties => "crewlet_duties",
            BucketId::Ledger => "crewlet_ledger",
            BucketId::Mailboxes => "crewlet_mailboxes",
            BucketId::Pauses => "crewlet_pauses",
            BucketId::Config => "crewlet_config",
            BucketId::Runs => "crewlet_runs",
            BucketId::Handoffs => "crewlet_handoffs",
            BucketId::Budgets => "crewlet_budgets",
        }
    }

    /// The bucket's age limit, given the lease TTL in force.
    pub fn max_age(self, lease_ttl: Duration) -> Option<Duration> {
        match self {
            BucketId::Leases => Some(lease_ttl),
            BucketId::Ledger => Some(LEDGER_MAX_AGE),
            BucketId::Handoffs => Some(HANDOFFS_MAX_AGE),
            BucketId::Budgets => Some(BUDGETS_MAX_AGE),
            _ => None,
        }
    }
}

/// A key's current value as a backend reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawEntry {
    pub key: String,
    pub value: Bytes,
    pub revision: Revision,
    pub written_at: StoreTime,
}

/// A change as a backend's watch reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawEvent {
    Put(RawEntry),
    /// A removal marker (a delete's tombstone), stamped when it was written.
    Delete {
        key: String,
        revision: Revision,
        written_at: StoreTime,
    },
}

impl RawEvent {
    pub fn revision(&self) -> Revision {
        match self {
            RawEvent::Put(e) => e.revision,
            RawEvent::Delete { revision, .. } => *revision,
        }
    }
}

/// A write that landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Written {
    pub revision: Revision,
    /// The write's store timestamp when the backend knows it without a read.
    pub written_at: Option<StoreTime>,
    /// When the exact timestamp is not known: bounds the backend can vouch
    /// for without a read — the write was stamped no earlier than the first
    /// and no later than the second (the store's clock when the write was
    /// sent, and an upper bound on it when its answer came back).
    pub within: Option<(StoreTime, StoreTime)>,
}

/// The epoch counter's key in the leases bucket, beside the lease it counts
/// for (an atomic claim writes both in one batch): `epoch:{resource}`.
/// Never a lease: `epoch` is no resource kind.
pub fn epoch_key(resource: &str) -> String {
    format!("{EPOCH_KEY_PREFIX}{resource}")
}

/// The prefix of every epoch key kept in the leases bucket.
pub const EPOCH_KEY_PREFIX: &str = "epoch:";

/// One compare-and-set write of an atomic batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchWrite {
    pub key: String,
    pub value: Bytes,
    /// The key's last write must be this revision; 0: the key must be absent.
    pub expected: Revision,
    /// Kept whatever the bucket's age limit (a counter that must outlive it).
    pub keep: bool,
}

/// A write that did not (certainly) land.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteError {
    /// The compare-and-set precondition failed: nothing was written.
    Conflict,
    /// No answer: the write may or may not have landed. Re-read first.
    Unknown(StoreError),
}

pub type RawEventStream = BoxStream<'static, Result<RawEvent, StoreError>>;

/// The primitives. Keys are contract keys; a backend maps them itself.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The lease TTL in force (the leases bucket's age limit).
    fn lease_ttl(&self) -> Duration;
    /// Now on the store's clock; never ahead of the store.
    fn now(&self) -> StoreTime;
    fn connection(&self) -> ConnectionState;
    /// Every change of the connection's state, as it happens.
    fn connection_changes(&self) -> tokio::sync::watch::Receiver<ConnectionState>;
    /// The key's current value, from the leader; `None` when absent or deleted.
    async fn get(&self, b: BucketId, key: &str) -> Result<Option<RawEntry>, StoreError>;
    /// The key's last write's revision, a removal marker included (0:
    /// none), and its value unless it is a marker; from the leader.
    async fn get_marked(
        &self,
        b: BucketId,
        key: &str,
    ) -> Result<(Revision, Option<RawEntry>), StoreError>;
    /// Write only if the key is absent (or deleted).
    async fn create(&self, b: BucketId, key: &str, value: Bytes) -> Result<Written, WriteError>;
    /// Write only if the key's last write is `expected`.
    async fn update(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError>;
    /// `update`, with the write's store timestamp when the backend can learn
    /// it without another round trip (`None` leaves the caller to read it).
    async fn update_stamped(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        self.update(b, key, value, expected).await
    }
    /// A renewal's `update`: answered with the write's timestamp, or with
    /// bounds on it, whichever the backend has without another request;
    /// [`Backend::update_stamped`] where it has neither.
    async fn update_renewal(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        self.update_stamped(b, key, value, expected).await
    }
    /// Delete only if the key's last write is `expected`.
    async fn delete(&self, b: BucketId, key: &str, expected: Revision) -> Result<(), WriteError>;
    /// Whether [`Backend::batch`] is available: every write of a batch to one
    /// bucket stored together or none (JetStream atomic batch publish, API
    /// level 2, with `coordination.atomic_claim` on).
    fn atomic_claims(&self) -> bool {
        false
    }
    /// Whether epoch keys ([`epoch_key`]) can exist in the leases bucket
    /// (an atomic claim ran on this store, or may): every mint then reads
    /// them beside the epochs bucket.
    fn epoch_keys(&self) -> bool {
        false
    }
    /// Several compare-and-set writes to bucket `b`, stored together or
    /// not at all: `Conflict` when any precondition fails (nothing stored).
    /// The answer is the batch's last write.
    async fn batch(&self, b: BucketId, writes: Vec<BatchWrite>) -> Result<Written, WriteError> {
        let _ = (b, writes);
        Err(WriteError::Unknown(StoreError::Backend(
            "this store has no atomic batch write".into(),
        )))
    }
    /// The store timestamp of `key`'s write `revision`, if it still exists.
    async fn written_at(
        &self,
        b: BucketId,
        key: &str,
        revision: Revision,
    ) -> Result<Option<StoreTime>, StoreError>;
    /// The revision of the bucket's last write to a key under `scope` (a
    /// prefix ending in `:`, or empty for the whole bucket), from the leader.
    async fn last_revision(&self, b: BucketId, scope: &str)
    -> Result<Option<Revision>, StoreError>;
    /// Whether the bucket still holds the write `revision`.
    async fn revision_exists(&self, b: BucketId, revision: Revision) -> Result<bool, StoreError>;
    /// Remove `key`'s writes up to and including `through` (a removal
    /// marker, normally): a write made since is untouched.
    async fn purge(&self, b: BucketId, key: &str, through: Revision) -> Result<(), StoreError>;
    /// Current values under `prefix` (deletes included while they last),
    /// then every change. Ages out silently, as 2.9 does.
    async fn watch(&self, b: BucketId, prefix: &str) -> Result<RawEventStream, StoreError>;
}

/// Check a contract key: non-empty, and every `:`-separated part non-empty.
pub fn validate_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(StoreError::InvalidKey {
            key: key.into(),
            reason: "empty",
        });
    }
    if key.split(':').any(str::is_empty) {
        return Err(StoreError::InvalidKey {
            key: key.into(),
            reason: "an empty part around ':'",
        });
    }
    Ok(())
}

fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '/'
}

/// Contract key → NATS KV key: `:` becomes the subject separator `.`, so
/// `seat:alice` is `seat.alice` and a `seat:` prefix is a subject filter;
/// everything outside `[-_/a-zA-Z0-9]` (including `.` and `=`) is `=XX`.
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c == ':' {
            out.push('.');
        } else if plain(c) {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("={b:02X}"));
            }
        }
    }
    out
}

/// NATS KV key → contract key; `None` for a key this mapping never makes.
pub fn decode_key(key: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(key.len());
    let mut it = key.bytes();
    while let Some(b) = it.next() {
        match b {
            b'.' => bytes.push(b':'),
            b'=' => {
                let hi = it.next()?;
                let lo = it.next()?;
                let s = [hi, lo];
                let v = u8::from_str_radix(std::str::from_utf8(&s).ok()?, 16).ok()?;
                bytes.push(v);
            }
            _ => bytes.push(b),
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_map_kinds_to_subject_tokens() {
        for k in [
            "seat:alice",
            "node:node-0",
            "worker:sandbox-waiter",
            "evt.1=2:x y",
            "ünï:códe",
            "a/b_c-d",
        ] {
            assert_eq!(decode_key(&encode_key(k)).as_deref(), Some(k), "{k}");
        }
        assert_eq!(encode_key("seat:alice"), "seat.alice");
        assert_eq!(encode_key("a.b"), "a=2Eb");
        assert_eq!(decode_key("=Z"), None);
    }

    #[test]
    fn empty_parts_are_refused() {
        assert!(validate_key("seat:a").is_ok());
        assert!(validate_key("").is_err());
        assert!(validate_key("seat:").is_err());
        assert!(validate_key(":a").is_err());
        assert!(validate_key("a::b").is_err());
    }
}
