//! The coordination store contract: leases with a TTL and a fencing epoch,
//! and the small compare-and-set state the fleet shares.
//!
//! This module owns the contract every node programs against — the
//! [`Store`] trait, the records it hands out and its typed errors — and the
//! one implementation of the lease protocol ([`Coordinator`]), which runs
//! unchanged over either backend: [`twin`] (the in-process twin a single
//! node runs; `coordination.type = local`) or [`nats`] (JetStream KV shared by
//! a fleet; `embedded-kv`). A behaviour one backend has and the other lacks
//! is a bug, which is why the protocol is written once, over the narrow
//! [`Backend`] primitives, and both backends are tested by one suite.
//!
//! It must never decide ownership on the local wall clock (time is the
//! store's: [`StoreTime`]), never block beyond `store_timeout` (every call
//! returns a typed error instead), and never give back a record that the
//! calling claim did not write.
//!
//! Resource keys: `seat:{handle}` and `node:{id}` live in the leases bucket
//! (`crewlet_leases`, age limit = the lease TTL); `worker:{duty}` in the
//! duties bucket (`crewlet_duties`, each duty its own TTL). Epochs live in
//! `crewlet_epochs`, which has no age limit.

pub mod kv;
pub mod lease;
pub mod nats;
pub mod protocol;
pub mod timed;
pub mod twin;
pub mod view;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

pub use kv::{Backend, BucketId};
pub use lease::{Lease, LeaseRecord, LeaseState, Offer, ResourceKind, StoreTime};
pub use nats::{NatsBackend, NatsOptions};
pub use protocol::{ClaimStep, Coordinator, CoordinatorOptions, Fault, HoldPoint};
pub use twin::TwinBackend;

/// A bucket's revision: on NATS the stream sequence, shared by the whole bucket.
pub type Revision = u64;

/// The metadata map a lease carries (presence rows: labels, roles,
/// seats_held, seats_withdrawn, draining, behind).
pub type Metadata = BTreeMap<String, serde_json::Value>;

/// The in-process twin: the store a single node runs.
pub type TwinCoordinator = Coordinator<TwinBackend>;
/// The fleet store on NATS JetStream KV.
pub type NatsCoordinator = Coordinator<NatsBackend>;

/// Open the store `config` names: the in-process twin for
/// `coordination.type = local`, JetStream KV on `stream.urls` for
/// `embedded-kv` (buckets made or adopted, the TTL in force logged when it
/// is a peer's). Background work is owned by `tasks`. On a fleet the NATS
/// connection comes back too, for the queue and the event bus to share.
pub async fn open(
    config: &crate::config::Config,
    tasks: &crate::tasks::Tasks,
) -> Result<(std::sync::Arc<dyn Store>, Option<async_nats::Client>), StoreError> {
    let c = &config.coordination;
    let options = CoordinatorOptions {
        store_timeout: Duration::from_millis(c.store_timeout_ms),
        view_idle: view::DEFAULT_IDLE,
        tasks: tasks.clone(),
    };
    match c.kind {
        crate::config::CoordinationType::Local => Ok((
            std::sync::Arc::new(Coordinator::new(
                timed::Timed::new(
                    TwinBackend::new(Duration::from_secs(c.lease_ttl_seconds))
                        .with_atomic_claims(c.atomic_claim),
                ),
                options,
            )),
            None,
        )),
        crate::config::CoordinationType::EmbeddedKv => {
            let backend = NatsBackend::connect(&NatsOptions::from_config(
                &config.stream,
                c,
                &config.node.id,
            ))
            .await?;
            let client = backend.client().clone();
            Ok((
                std::sync::Arc::new(Coordinator::new(timed::Timed::new(backend), options)),
                Some(client),
            ))
        }
    }
}

/// Everything that can go wrong talking to the store. Cloneable so that a
/// renewal can carry it in [`Renewal::Unknown`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("the coordination store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the coordination store is unavailable: {0}")]
    Unavailable(String),
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("the record at {key} cannot be read: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("the claim on {key} did not complete: {reason}")]
    ClaimFailed { key: String, reason: String },
    #[error("injected failure after the {0:?} write")]
    Injected(ClaimStep),
    #[error("the coordination store refused the request: {0}")]
    Backend(String),
}

/// A compare-and-set write that was refused, or could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("the key already exists")]
    AlreadyExists,
    #[error("the key is not at the expected revision")]
    WrongRevision,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether the store's connection is up (a later issue turns a drop into
/// the "store blip" behaviour).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionState {
    Connected,
    Disconnected,
    /// Never connected yet.
    Pending,
}

/// What a claim asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimRequest {
    /// `seat:{handle}`, `node:{id}` or `worker:{duty}`.
    pub resource: String,
    /// The process incarnation, `{node_id}:{random}`.
    pub owner: String,
    /// The stable node id.
    pub preferred: String,
    pub protocol: u32,
    pub metadata: Metadata,
    /// A duty's own TTL (`worker:` only; a seat or presence lease always
    /// runs on the leases bucket's TTL, and this is ignored for it).
    pub ttl: Option<Duration>,
    /// Judge the protocol gate at `protocol` once the resource reads free
    /// (a seat claim): a claim on a resource a peer holds judges no gate,
    /// and a refusal comes back as [`Claim::Gated`].
    pub gated: bool,
}

impl ClaimRequest {
    pub fn new(
        resource: impl Into<String>,
        owner: impl Into<String>,
        preferred: impl Into<String>,
    ) -> ClaimRequest {
        ClaimRequest {
            resource: resource.into(),
            owner: owner.into(),
            preferred: preferred.into(),
            protocol: crate::config::protocol(),
            metadata: Metadata::new(),
            ttl: None,
            gated: false,
        }
    }

    /// The claim judges the protocol gate once it finds the resource free.
    pub fn gated(mut self) -> ClaimRequest {
        self.gated = true;
        self
    }

    pub fn with_ttl(mut self, ttl: Duration) -> ClaimRequest {
        self.ttl = Some(ttl);
        self
    }

    pub fn with_protocol(mut self, protocol: u32) -> ClaimRequest {
        self.protocol = protocol;
        self
    }

    pub fn with_metadata(mut self, metadata: Metadata) -> ClaimRequest {
        self.metadata = metadata;
        self
    }
}

/// The answer to a claim.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// A new tenure, with a freshly minted epoch.
    Won(Lease),
    /// Somebody (possibly a sibling claim still committing, or this very
    /// owner) holds it live.
    HeldBy(Lease),
    /// A gated claim found the resource free and the protocol gate shut: a
    /// live presence or seat lease is held at `floor`, below the claim's
    /// protocol. Nothing was written (or what was written is given back).
    Gated { floor: u32 },
}

/// Pure: what a seat claim's answer counts as in
/// `crewlet_claims_total{outcome}`: `won`, `held_by_peer`, `store_error`;
/// `None` for a gate refusal, which the pass it ends counts once
/// (`protocol_gate`, from `seat_claims_blocked_by_older_protocol`).
pub fn claim_outcome(answer: &Result<Claim, StoreError>) -> Option<&'static str> {
    match answer {
        Ok(Claim::Won(_)) => Some("won"),
        Ok(Claim::HeldBy(_)) => Some("held_by_peer"),
        Ok(Claim::Gated { .. }) => None,
        Err(_) => Some("store_error"),
    }
}

/// The answer to a renewal: three-valued, because an unreachable store says
/// nothing about ownership.
#[derive(Clone, Debug, PartialEq)]
pub enum Renewal {
    Renewed(Lease),
    /// The tenure is over: lapsed, taken, or never this owner's.
    Lost,
    /// The store could not say.
    Unknown(StoreError),
}

impl Renewal {
    /// What it counts as in `crewlet_renewals_total{outcome}`: `renewed`,
    /// `lost`, `store_unreachable`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Renewal::Renewed(_) => "renewed",
            Renewal::Lost => "lost",
            Renewal::Unknown(_) => "store_unreachable",
        }
    }
}

/// The answer to a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    Released,
    /// The record is not this tenure's (another owner, a later epoch, or gone).
    NotHeld,
}

/// The generic compare-and-set buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateBucket {
    /// The completion ledger, `crewlet_ledger` (seven-day age).
    Ledger,
    /// The mailbox registry, `crewlet_mailboxes`.
    Mailboxes,
    /// Pauses, `crewlet_pauses`.
    Pauses,
    /// Config revisions and the activation pointer, `crewlet_config`.
    Config,
    /// Detached runs' records, `crewlet_runs`.
    Runs,
    /// Handoff notices and move requests, `crewlet_handoffs` (an hour).
    Handoffs,
    /// The seats' windowed token counters, `crewlet_budgets` (forty days).
    Budgets,
}

impl StateBucket {
    /// Every generic bucket.
    pub const ALL: [StateBucket; 7] = [
        StateBucket::Ledger,
        StateBucket::Mailboxes,
        StateBucket::Pauses,
        StateBucket::Config,
        StateBucket::Runs,
        StateBucket::Handoffs,
        StateBucket::Budgets,
    ];

    pub fn bucket(self) -> BucketId {
        match self {
            StateBucket::Ledger => BucketId::Ledger,
            StateBucket::Mailboxes => BucketId::Mailboxes,
            StateBucket::Pauses => BucketId::Pauses,
            StateBucket::Config => BucketId::Config,
            StateBucket::Runs => BucketId::Runs,
            StateBucket::Handoffs => BucketId::Handoffs,
            StateBucket::Budgets => BucketId::Budgets,
        }
    }
}

/// One key's current value in a state bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: Bytes,
    pub revision: Revision,
    pub written_at: StoreTime,
}

/// A removal marker: what a delete leaves in a bucket with no age, until
/// the maintenance duty purges it (three hours on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    pub key: String,
    pub revision: Revision,
    pub written_at: StoreTime,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Put(Entry),
    Delete { key: String, revision: Revision },
}

pub type EventStream = BoxStream<'static, Result<Event, StoreError>>;

/// The coordination store contract.
#[async_trait]
pub trait Store: Send + Sync {
    /// The lease TTL in force: the leases bucket's age limit, which may be a
    /// peer's rather than this node's configured one (the watchdog uses it).
    fn lease_ttl(&self) -> Duration;

    /// The connection's state (always connected in process).
    fn connection(&self) -> ConnectionState;

    /// Every change of the connection's state (what a later issue turns
    /// into the "store blip" behaviour).
    fn connection_changes(&self) -> tokio::sync::watch::Receiver<ConnectionState>;

    /// Now, on the store's clock (a lower bound on NATS: never ahead of the
    /// server).
    async fn now(&self) -> Result<StoreTime, StoreError>;

    /// Take a free resource: a new tenure with a fresh epoch.
    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError>;

    /// Extend `owner`'s live tenure `lease`; `metadata` replaces the
    /// record's metadata when given.
    async fn renew(&self, lease: &Lease, owner: &str, metadata: Option<Metadata>) -> Renewal;

    /// Give back `owner`'s tenure `lease` (only that tenure: compare-and-set).
    async fn release(&self, lease: &Lease, owner: &str) -> Result<Release, StoreError>;

    /// Set (`Some`) or withdraw (`None`) a handoff offer on `owner`'s live
    /// seat tenure `lease`, renewing it: three-valued, like a renewal (a
    /// renewal keeps a standing offer).
    async fn offer(&self, lease: &Lease, owner: &str, offer: Option<Offer>) -> Renewal;
    /// Take the seat lease on `resource` offered to node `preferred` under
    /// `offer_id`: a new tenure for `owner` with the next epoch, begun at
    /// this write (`Won`), while the giver still holds it — or the record
    /// as found when that offer does not stand (`HeldBy`).
    async fn take(
        &self,
        resource: &str,
        offer_id: &str,
        owner: &str,
        preferred: &str,
        protocol: u32,
    ) -> Result<Claim, StoreError>;
    /// The live lease on `resource`, read from the leader.
    async fn lease(&self, resource: &str) -> Result<Option<Lease>, StoreError>;

    /// The current epoch counter of `resource` (0 when never claimed).
    async fn epoch(&self, resource: &str) -> Result<u64, StoreError>;

    /// Every live lease whose resource key starts with `prefix`.
    async fn list(&self, prefix: &str) -> Result<Vec<Lease>, StoreError>;

    /// Resource → the stable node id of its last claim, for every resource
    /// under `prefix` whose epoch counter names one: the `preferred` hint,
    /// kept when the lease itself lapses.
    async fn holders(
        &self,
        prefix: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, StoreError>;

    /// Every live seat or presence lease whose key starts with `prefix`,
    /// answered from the live view after bringing it level with the leases
    /// bucket's last write.
    async fn view(&self, prefix: &str) -> Result<Vec<Lease>, StoreError>;

    /// The protocol floor: the lowest protocol below `mine` at which a live
    /// presence or seat lease is held (duty leases never count), from the
    /// live view. `None`: nothing lower is held.
    async fn protocol_floor(&self, mine: u32) -> Result<Option<u32>, StoreError>;

    /// Whether the live view is running (it stops a while after last use).
    fn view_running(&self) -> bool;

    async fn get(&self, bucket: StateBucket, key: &str) -> Result<Option<Entry>, StoreError>;
    async fn create(
        &self,
        bucket: StateBucket,
        key: &str,
        value: Bytes,
    ) -> Result<Revision, KvError>;
    async fn update(
        &self,
        bucket: StateBucket,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Revision, KvError>;
    async fn delete(
        &self,
        bucket: StateBucket,
        key: &str,
        expected: Revision,
    ) -> Result<(), KvError>;
    async fn entries(&self, bucket: StateBucket, prefix: &str) -> Result<Vec<Entry>, StoreError>;
    /// The removal markers under `prefix`, with when each was written.
    async fn markers(&self, bucket: StateBucket, prefix: &str) -> Result<Vec<Marker>, StoreError>;
    /// Purge `key`'s marker `revision` (and anything older): a write made
    /// since is untouched.
    async fn purge_marker(
        &self,
        bucket: StateBucket,
        key: &str,
        revision: Revision,
    ) -> Result<(), StoreError>;
    /// Current values under `prefix`, then every change.
    async fn watch(&self, bucket: StateBucket, prefix: &str) -> Result<EventStream, StoreError>;
}
