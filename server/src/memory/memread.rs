//! Reads of a seat's memory, answered by the seat's holder (seed § A seat's
//! memory follows it: "A read is answered by the holder").
//!
//! Every node that ever held a seat keeps a copy of its memory, and only
//! the holder keeps it current. So a read is never answered from whichever
//! node was asked: [`MemRead::read`] reads the seat's lease once and
//!
//! - no lease → [`SeatAnswer::Unheld`]: empty, naming no holder (a copy of
//!   unknown age is not the seat's memory);
//! - the lease is this process's and the seat is attached here → the
//!   local store answers ([`SeatAnswer::Held`], `answered_by.local`);
//! - the lease is this process's but the seat is still being established
//!   (hydrating) or given back → [`SeatAnswer::Unavailable`];
//! - a peer's → that incarnation is asked within the scatter budget
//!   (`memory.scatter_budget_ms`, two seconds by default). Silence, nobody
//!   listening, or "not held here" is [`SeatAnswer::Unavailable`] naming
//!   the holder and why — never an empty answer.
//!
//! [`MemRead::overview`] follows the same rule in one round: the seat leases
//! are listed once, this node's own seats are counted from its store, and
//! ONE request goes to each other holder naming all of that holder's seats.
//! Its [`Coverage`] names the holders that answered and those that did not
//! (whose seats read unavailable, not empty); seats of the company nobody
//! holds are listed as unheld.
//!
//! # The subject
//!
//! Every node answers for the seats it holds — whether or not it serves
//! HTTP — on `crewlet.memread.{incarnation}` (NATS core request/reply,
//! no stream), where the incarnation is the lease owner
//! `{node_id}:{random}`. Single-node (twin) nodes use [`TwinScatter`], an
//! in-process registry of the same requests and answers.
//!
//! A request (JSON):
//!
//! ```json
//! {"seats": ["alice", "bob"], "want": {"memory": {"limit": 100}}}
//! {"seats": ["alice", "bob"], "want": "counts"}
//! ```
//!
//! Its answer (JSON), one entry per seat named, each carrying the epoch of
//! the tenure it was answered under (null when not held here):
//!
//! ```json
//! {"node_id": "n1", "incarnation": "n1:0a1b2c3d", "error": null,
//!  "seats": [
//!    {"handle": "alice", "epoch": 4, "answer": {"memory": {"diary": [...], ...}}},
//!    {"handle": "bob", "epoch": 2, "answer": {"counts": {"diary": 3, ...}}},
//!    {"handle": "carol", "epoch": null, "answer": {"unavailable": {"kind": "not_held_here"}}}
//!  ]}
//! ```
//!
//! # The answer shapes (what a screen gets)
//!
//! A seat ([`SeatRead`] for a read, [`SeatCounts`] per seat of an
//! overview), tagged by `state`:
//!
//! ```json
//! {"state": "held", "handle": "alice",
//!  "holder": {"node_id": "n1", "incarnation": "n1:0a1b2c3d", "epoch": 4},
//!  "answered_by": {"node_id": "n1", "incarnation": "n1:0a1b2c3d", "epoch": 4, "local": false},
//!  "memory": {...}}
//! {"state": "unheld", "handle": "ghost",
//!  "answered_by": {"node_id": "n2", "incarnation": "n2:…", "epoch": null, "local": true},
//!  "memory": {...empty...}}
//! {"state": "unavailable", "handle": "alice", "holder": {...},
//!  "answered_by": {"node_id": "n2", ..., "local": true},
//!  "reason": {"kind": "silent", "budget_ms": 2000},
//!  "why": "the holder n1 did not answer within 2000 ms"}
//! ```
//!
//! For a read `memory` is the seat's rows ([`SeatMemory`]); for an overview
//! it is the rows per table ([`MemoryCounts`]). An [`Overview`] is
//! `{"node_id", "incarnation", "seats": [...], "coverage": {"answered":
//! [...], "unanswered": [...]}}`, each coverage entry naming a holder, its
//! seats, whether it is this node, and (unanswered) why.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::StreamExt;
use serde::{Deserialize, Serialize};

use super::store::{MemoryStore, SeatMemory, Table};
use crate::coord::{Lease, Store, StoreError};
use crate::tasks::Tasks;

/// The subject prefix every holder answers under.
pub const SUBJECT_PREFIX: &str = "crewlet.memread";

/// Rows per table a read returns unless asked otherwise.
pub const READ_LIMIT: u32 = 100;

/// The most rows per table a holder returns for one seat, whatever it is
/// asked for.
pub const MAX_LIMIT: u32 = 1000;

/// Seats a responder reads from its store at once.
const CONCURRENT_REQUESTS: usize = 8;

/// The subject the process incarnation `incarnation` answers memory reads
/// on: `crewlet.memread.{incarnation}`.
pub fn subject(incarnation: &str) -> String {
    format!("{SUBJECT_PREFIX}.{incarnation}")
}

// ---------------------------------------------------------------------------
// The answers.

/// The seat's lease holder: its node, its process incarnation, the epoch of
/// its tenure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub node_id: String,
    pub incarnation: String,
    pub epoch: u64,
}

impl Holder {
    fn of(lease: &Lease) -> Holder {
        Holder {
            node_id: lease.preferred.clone(),
            incarnation: lease.owner.clone(),
            epoch: lease.epoch,
        }
    }
}

/// Who gave an answer: its node and incarnation, the epoch of the tenure it
/// answered under (none when it does not hold the seat), and whether it was
/// the node that was asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answerer {
    pub node_id: String,
    pub incarnation: String,
    pub epoch: Option<u64>,
    pub local: bool,
}

/// Why a held seat's memory cannot be had right now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Unavailable {
    /// The holder is still establishing the seat: its acquire hook, which
    /// replays the seat's memory from the changelog, has not returned.
    Hydrating,
    /// The holder is giving the seat back, or could not prove its teardown.
    Releasing,
    /// The holder says it does not hold the seat: the lease moved.
    NotHeldHere,
    /// The holder did not answer within the budget.
    Silent { budget_ms: u64 },
    /// Nothing answers for the holder's incarnation: its process is gone.
    NoResponder,
    /// The holder answered, but could not read the seat's memory.
    HolderFailed { message: String },
    /// The request could not be made, or its answer could not be read.
    AskFailed { message: String },
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Hydrating => f.write_str("is still hydrating the seat's memory"),
            Unavailable::Releasing => f.write_str("is giving the seat back"),
            Unavailable::NotHeldHere => {
                f.write_str("answered that it does not hold the seat (the lease moved)")
            }
            Unavailable::Silent { budget_ms } => {
                write!(f, "did not answer within {budget_ms} ms")
            }
            Unavailable::NoResponder => {
                f.write_str("has nothing answering for it (its process is gone)")
            }
            Unavailable::HolderFailed { message } => {
                write!(f, "cannot read the seat's memory: {message}")
            }
            Unavailable::AskFailed { message } => write!(f, "could not be asked: {message}"),
        }
    }
}

/// A seat's rows per table, in the order [`SeatMemory::counts`] lists them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryCounts {
    pub diary: u64,
    pub episodes: u64,
    pub counterparty_profiles: u64,
    pub skills: u64,
    pub skill_versions: u64,
    pub onboarding_markers: u64,
    pub conversations: u64,
}

impl MemoryCounts {
    /// The counts in [`SeatMemory::counts`] order.
    pub fn as_array(&self) -> [u64; 7] {
        [
            self.diary,
            self.episodes,
            self.counterparty_profiles,
            self.skills,
            self.skill_versions,
            self.onboarding_markers,
            self.conversations,
        ]
    }

    fn from_array(a: [u64; 7]) -> MemoryCounts {
        MemoryCounts {
            diary: a[0],
            episodes: a[1],
            counterparty_profiles: a[2],
            skills: a[3],
            skill_versions: a[4],
            onboarding_markers: a[5],
            conversations: a[6],
        }
    }

    pub fn total(&self) -> u64 {
        self.as_array().iter().sum()
    }
}

/// One seat's answer. `memory` is the seat's rows for a read
/// ([`SeatRead`]) and its rows per table for an overview ([`SeatCounts`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SeatAnswer<T> {
    /// The holder's own copy, answered by the holder.
    Held {
        handle: String,
        holder: Holder,
        answered_by: Answerer,
        memory: T,
    },
    /// No node holds the seat: empty, naming no holder.
    Unheld {
        handle: String,
        answered_by: Answerer,
        memory: T,
    },
    /// The seat is held, but its holder's copy cannot be had: never empty.
    Unavailable {
        handle: String,
        holder: Holder,
        answered_by: Answerer,
        reason: Unavailable,
        /// The reason in words, naming the holder's node.
        why: String,
    },
}

/// A read of one seat's memory.
pub type SeatRead = SeatAnswer<SeatMemory>;
/// One seat of an overview.
pub type SeatCounts = SeatAnswer<MemoryCounts>;

impl<T> SeatAnswer<T> {
    pub fn handle(&self) -> &str {
        match self {
            SeatAnswer::Held { handle, .. }
            | SeatAnswer::Unheld { handle, .. }
            | SeatAnswer::Unavailable { handle, .. } => handle,
        }
    }

    pub fn answered_by(&self) -> &Answerer {
        match self {
            SeatAnswer::Held { answered_by, .. }
            | SeatAnswer::Unheld { answered_by, .. }
            | SeatAnswer::Unavailable { answered_by, .. } => answered_by,
        }
    }

    /// The lease holder (none when nobody holds the seat).
    pub fn holder(&self) -> Option<&Holder> {
        match self {
            SeatAnswer::Held { holder, .. } | SeatAnswer::Unavailable { holder, .. } => {
                Some(holder)
            }
            SeatAnswer::Unheld { .. } => None,
        }
    }

    /// The memory (none when unavailable).
    pub fn memory(&self) -> Option<&T> {
        match self {
            SeatAnswer::Held { memory, .. } | SeatAnswer::Unheld { memory, .. } => Some(memory),
            SeatAnswer::Unavailable { .. } => None,
        }
    }

    /// Why the memory cannot be had (unavailable only).
    pub fn unavailable(&self) -> Option<&Unavailable> {
        match self {
            SeatAnswer::Unavailable { reason, .. } => Some(reason),
            _ => None,
        }
    }

    fn unavailable_from(
        handle: &str,
        holder: Holder,
        answered_by: Answerer,
        reason: Unavailable,
    ) -> SeatAnswer<T> {
        SeatAnswer::Unavailable {
            why: format!("the holder {} {reason}", holder.node_id),
            handle: handle.to_string(),
            holder,
            answered_by,
            reason,
        }
    }
}

/// One holder in an overview's coverage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HolderCoverage {
    pub node_id: String,
    pub incarnation: String,
    /// The node that was asked (its seats were read from its own store).
    pub local: bool,
    /// The seats it holds, by handle.
    pub seats: Vec<String>,
    /// Why it did not answer (unanswered only).
    pub reason: Option<Unavailable>,
    pub why: Option<String>,
}

/// Which holders answered an overview and which did not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Coverage {
    pub answered: Vec<HolderCoverage>,
    pub unanswered: Vec<HolderCoverage>,
}

/// Every seat's memory in one round: per-seat rows per table, who answered
/// each, and which holders answered.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Overview {
    /// The node that was asked.
    pub node_id: String,
    pub incarnation: String,
    /// Every seat held or in the company, by handle.
    pub seats: Vec<SeatCounts>,
    pub coverage: Coverage,
}

impl Overview {
    pub fn seat(&self, handle: &str) -> Option<&SeatCounts> {
        self.seats.iter().find(|s| s.handle() == handle)
    }

    /// The seats no node holds.
    pub fn unheld(&self) -> Vec<&str> {
        self.seats
            .iter()
            .filter(|s| matches!(s, SeatAnswer::Unheld { .. }))
            .map(|s| s.handle())
            .collect()
    }
}

/// A read this node could not make at all.
#[derive(Debug, thiserror::Error)]
pub enum MemReadError {
    #[error("cannot read the seat leases: {0}")]
    Leases(#[from] StoreError),
    #[error("this node's memory store cannot be read: {0}")]
    Store(#[from] sqlx::Error),
    #[error("cannot answer memory reads on {subject}: {source}")]
    Listen {
        subject: String,
        #[source]
        source: ScatterError,
    },
}

// ---------------------------------------------------------------------------
// The transport.

pub use crate::scatter::{Inbound, Incoming, NatsScatter, Scatter, ScatterError, TwinScatter};

// ---------------------------------------------------------------------------
// The wire.

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Want {
    Memory { limit: u32 },
    Counts,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct WireRequest {
    seats: Vec<String>,
    want: Want,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum WireAnswer {
    Memory(SeatMemory),
    Counts(MemoryCounts),
    Unavailable(Unavailable),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct WireSeat {
    handle: String,
    epoch: Option<u64>,
    answer: WireAnswer,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct WireReply {
    node_id: String,
    incarnation: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    seats: Vec<WireSeat>,
}

// ---------------------------------------------------------------------------
// Reads.

/// Where a seat stands on this node.
enum Here {
    /// Attached under this epoch: the store answers.
    Attached(u64),
    /// Held here but not answerable.
    Not(Option<u64>, Unavailable),
}

/// Where a seat stands on this node, as the seat host knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldHere {
    /// Attached at this epoch: its memory is current here.
    Attached(u64),
    /// Claimed at this epoch, its memory still being hydrated.
    Establishing(u64),
    /// Its teardown could not be proven; its lease is kept at this epoch.
    Releasing(u64),
}

/// What a memory read asks of the node it runs on: who it is, where each
/// seat stands here, the coordination store and the company's seats. The
/// seat engine answers it, so reads never reach into the seat layer.
pub trait Holdings: Send + Sync {
    fn node_id(&self) -> &str;
    fn incarnation(&self) -> &str;
    /// `None` when this node does not have the seat at all.
    fn held_here(&self, handle: &str) -> Option<HeldHere>;
    fn store(&self) -> &Arc<dyn Store>;
    fn company_handles(&self) -> Vec<String>;
}

/// Memory reads answered by the seat's holder, and this node's answers for
/// the seats it holds. One per node.
pub struct MemRead {
    engine: Arc<dyn Holdings>,
    memory: MemoryStore,
    scatter: Arc<dyn Scatter>,
    budget: Duration,
    limit: u32,
}

impl MemRead {
    /// Reads for the node running `engine`, whose memory store is `memory`,
    /// asking peers over `scatter` and waiting `budget` for each.
    pub fn new(
        engine: Arc<dyn Holdings>,
        memory: MemoryStore,
        scatter: Arc<dyn Scatter>,
        budget: Duration,
    ) -> MemRead {
        MemRead {
            engine,
            memory,
            scatter,
            budget,
            limit: READ_LIMIT,
        }
    }

    /// Rows per table a read returns (at most [`MAX_LIMIT`]).
    pub fn with_limit(mut self, limit: u32) -> MemRead {
        self.limit = limit.clamp(1, MAX_LIMIT);
        self
    }

    pub fn budget(&self) -> Duration {
        self.budget
    }

    fn node_id(&self) -> &str {
        self.engine.node_id()
    }

    fn incarnation(&self) -> &str {
        self.engine.incarnation()
    }

    fn me(&self, epoch: Option<u64>) -> Answerer {
        Answerer {
            node_id: self.node_id().to_string(),
            incarnation: self.incarnation().to_string(),
            epoch,
            local: true,
        }
    }

    /// Answer for the seats this node holds on
    /// `crewlet.memread.{incarnation}` until `tasks` stops. Returns once
    /// the node is listening.
    pub async fn serve(self: &Arc<Self>, tasks: &Tasks) -> Result<(), MemReadError> {
        let inbound = self
            .scatter
            .listen(&subject(self.incarnation()))
            .await
            .map_err(|e| MemReadError::Listen {
                subject: subject(self.incarnation()),
                source: e,
            })?;
        let me = self.clone();
        tasks.spawn("memread-responder", async move {
            inbound
                .for_each_concurrent(CONCURRENT_REQUESTS, |req| {
                    let me = me.clone();
                    async move { me.respond(req).await }
                })
                .await;
        });
        Ok(())
    }

    /// Where `handle` stands here, by the seat host.
    fn here(&self, handle: &str) -> Here {
        match self.engine.held_here(handle) {
            Some(HeldHere::Attached(e)) => Here::Attached(e),
            Some(HeldHere::Establishing(e)) => Here::Not(Some(e), Unavailable::Hydrating),
            Some(HeldHere::Releasing(e)) => Here::Not(Some(e), Unavailable::Releasing),
            None => Here::Not(None, Unavailable::NotHeldHere),
        }
    }

    /// Read one seat's memory from whichever node holds it.
    pub async fn read(&self, handle: &str) -> Result<SeatRead, MemReadError> {
        let lease = self.engine.store().lease(&format!("seat:{handle}")).await?;
        let Some(lease) = lease else {
            return Ok(SeatAnswer::Unheld {
                handle: handle.to_string(),
                answered_by: self.me(None),
                memory: SeatMemory::default(),
            });
        };
        let holder = Holder::of(&lease);
        if lease.owner == self.incarnation() {
            return Ok(match self.here(handle) {
                Here::Attached(epoch) => SeatAnswer::Held {
                    handle: handle.to_string(),
                    holder,
                    answered_by: self.me(Some(epoch)),
                    memory: self.memory.seat_memory(handle, self.limit).await?,
                },
                Here::Not(epoch, reason) => {
                    SeatAnswer::unavailable_from(handle, holder, self.me(epoch), reason)
                }
            });
        }
        let request = WireRequest {
            seats: vec![handle.to_string()],
            want: Want::Memory { limit: self.limit },
        };
        let mut answers = match self.ask(&holder, &request).await {
            Ok(reply) => reply,
            Err(reason) => {
                return Ok(SeatAnswer::unavailable_from(
                    handle,
                    holder,
                    self.me(None),
                    reason,
                ));
            }
        };
        Ok(take_seat(&mut answers, handle, holder, |a| match a {
            WireAnswer::Memory(m) => Some(m),
            _ => None,
        }))
    }

    /// Every seat's memory, as rows per table, in one round: the seat
    /// leases listed once, this node's seats from its store, one request
    /// per other holder.
    pub async fn overview(&self) -> Result<Overview, MemReadError> {
        let leases = self.engine.store().list("seat:").await?;
        let mut by_owner: BTreeMap<String, Vec<(String, Holder)>> = BTreeMap::new();
        for l in &leases {
            if let Some(handle) = l.resource.strip_prefix("seat:") {
                by_owner
                    .entry(l.owner.clone())
                    .or_default()
                    .push((handle.to_string(), Holder::of(l)));
            }
        }
        let mut seats: BTreeMap<String, SeatCounts> = BTreeMap::new();
        let mut coverage = Coverage::default();

        // This node's own seats, from its own store.
        if let Some(mine) = by_owner.remove(self.incarnation()) {
            let mut attached = Vec::new();
            for (handle, holder) in &mine {
                match self.here(handle) {
                    Here::Attached(epoch) => attached.push((handle.clone(), holder.clone(), epoch)),
                    Here::Not(epoch, reason) => {
                        seats.insert(
                            handle.clone(),
                            SeatAnswer::unavailable_from(
                                handle,
                                holder.clone(),
                                self.me(epoch),
                                reason,
                            ),
                        );
                    }
                }
            }
            let handles: Vec<String> = attached.iter().map(|(h, _, _)| h.clone()).collect();
            let mut counts = count_rows(&self.memory, &handles).await?;
            for (handle, holder, epoch) in attached {
                let memory = counts.remove(&handle).unwrap_or_default();
                seats.insert(
                    handle.clone(),
                    SeatAnswer::Held {
                        handle,
                        holder,
                        answered_by: self.me(Some(epoch)),
                        memory,
                    },
                );
            }
            coverage.answered.push(HolderCoverage {
                node_id: self.node_id().to_string(),
                incarnation: self.incarnation().to_string(),
                local: true,
                seats: mine.into_iter().map(|(h, _)| h).collect(),
                reason: None,
                why: None,
            });
        }

        // One request per other holder, all at once.
        let asks = by_owner.into_iter().map(|(owner, held)| async move {
            let request = WireRequest {
                seats: held.iter().map(|(h, _)| h.clone()).collect(),
                want: Want::Counts,
            };
            // Every lease of one owner names the same node.
            let holder = held[0].1.clone();
            let answer = self.ask(&holder, &request).await;
            (owner, held, answer)
        });
        for (owner, held, answer) in futures::future::join_all(asks).await {
            let node_id = held[0].1.node_id.clone();
            let handles: Vec<String> = held.iter().map(|(h, _)| h.clone()).collect();
            match answer {
                Ok(mut reply) => {
                    for (handle, holder) in held {
                        let seat = take_seat(&mut reply, &handle, holder, |a| match a {
                            WireAnswer::Counts(c) => Some(c),
                            _ => None,
                        });
                        seats.insert(handle, seat);
                    }
                    coverage.answered.push(HolderCoverage {
                        node_id,
                        incarnation: owner,
                        local: false,
                        seats: handles,
                        reason: None,
                        why: None,
                    });
                }
                Err(reason) => {
                    let why = format!("the holder {node_id} {reason}");
                    for (handle, holder) in held {
                        seats.insert(
                            handle.clone(),
                            SeatAnswer::unavailable_from(
                                &handle,
                                holder,
                                self.me(None),
                                reason.clone(),
                            ),
                        );
                    }
                    coverage.unanswered.push(HolderCoverage {
                        node_id,
                        incarnation: owner,
                        local: false,
                        seats: handles,
                        reason: Some(reason),
                        why: Some(why),
                    });
                }
            }
        }

        // The company's seats nobody holds.
        for handle in self.engine.company_handles() {
            if !seats.contains_key(&handle) {
                seats.insert(
                    handle.to_string(),
                    SeatAnswer::Unheld {
                        handle: handle.to_string(),
                        answered_by: self.me(None),
                        memory: MemoryCounts::default(),
                    },
                );
            }
        }
        Ok(Overview {
            node_id: self.node_id().to_string(),
            incarnation: self.incarnation().to_string(),
            seats: seats.into_values().collect(),
            coverage,
        })
    }

    /// Put one request to `holder`'s incarnation; its answer by seat, or
    /// why there is none.
    async fn ask(&self, holder: &Holder, request: &WireRequest) -> Result<AnsweredBy, Unavailable> {
        let body = serde_json::to_vec(request).map_err(|e| Unavailable::AskFailed {
            message: e.to_string(),
        })?;
        let raw = self
            .scatter
            .ask(
                &subject(&holder.incarnation),
                Bytes::from(body),
                self.budget,
            )
            .await
            .map_err(|e| match e {
                ScatterError::TimedOut(_) => Unavailable::Silent {
                    budget_ms: self.budget.as_millis() as u64,
                },
                ScatterError::NoResponders(_) => Unavailable::NoResponder,
                ScatterError::Failed(message) => Unavailable::AskFailed { message },
            })?;
        let reply: WireReply =
            serde_json::from_slice(&raw).map_err(|e| Unavailable::AskFailed {
                message: format!("the answer does not decode: {e}"),
            })?;
        if let Some(message) = reply.error {
            return Err(Unavailable::HolderFailed { message });
        }
        Ok(AnsweredBy {
            node_id: reply.node_id,
            incarnation: reply.incarnation,
            seats: reply
                .seats
                .into_iter()
                .map(|s| (s.handle.clone(), s))
                .collect(),
        })
    }

    /// Answer one request for the seats held here.
    async fn respond(&self, mut req: Incoming) {
        let reply = match serde_json::from_slice::<WireRequest>(&req.payload) {
            Ok(r) => self.answer_here(&r).await,
            Err(e) => self.refusal(format!("not a memory read request: {e}")),
        };
        let body = serde_json::to_vec(&reply).unwrap_or_default();
        if let Err(e) = req.answer(Bytes::from(body)).await {
            // Most likely too large for the broker: say so, in few bytes.
            tracing::warn!(error = %e, "cannot send a memory read answer");
            let refusal = self.refusal(format!("the answer could not be sent: {e}"));
            let body = serde_json::to_vec(&refusal).unwrap_or_default();
            if let Err(e) = req.answer(Bytes::from(body)).await {
                tracing::debug!(error = %e, "cannot send a memory read refusal");
            }
        }
    }

    fn refusal(&self, error: String) -> WireReply {
        WireReply {
            node_id: self.node_id().to_string(),
            incarnation: self.incarnation().to_string(),
            error: Some(error),
            seats: Vec::new(),
        }
    }

    async fn answer_here(&self, req: &WireRequest) -> WireReply {
        let mut seats = Vec::with_capacity(req.seats.len());
        let mut attached = Vec::new();
        for handle in &req.seats {
            match self.here(handle) {
                Here::Attached(epoch) => attached.push((handle.clone(), epoch)),
                Here::Not(epoch, reason) => seats.push(WireSeat {
                    handle: handle.clone(),
                    epoch,
                    answer: WireAnswer::Unavailable(reason),
                }),
            }
        }
        match &req.want {
            Want::Memory { limit } => {
                let limit = (*limit).clamp(1, MAX_LIMIT);
                for (handle, epoch) in attached {
                    let answer = match self.memory.seat_memory(&handle, limit).await {
                        Ok(m) => WireAnswer::Memory(m),
                        Err(e) => WireAnswer::Unavailable(Unavailable::HolderFailed {
                            message: e.to_string(),
                        }),
                    };
                    seats.push(WireSeat {
                        handle,
                        epoch: Some(epoch),
                        answer,
                    });
                }
            }
            Want::Counts => {
                let handles: Vec<String> = attached.iter().map(|(h, _)| h.clone()).collect();
                match count_rows(&self.memory, &handles).await {
                    Ok(mut counts) => {
                        for (handle, epoch) in attached {
                            let c = counts.remove(&handle).unwrap_or_default();
                            seats.push(WireSeat {
                                handle,
                                epoch: Some(epoch),
                                answer: WireAnswer::Counts(c),
                            });
                        }
                    }
                    Err(e) => {
                        for (handle, epoch) in attached {
                            seats.push(WireSeat {
                                handle,
                                epoch: Some(epoch),
                                answer: WireAnswer::Unavailable(Unavailable::HolderFailed {
                                    message: e.to_string(),
                                }),
                            });
                        }
                    }
                }
            }
        }
        WireReply {
            node_id: self.node_id().to_string(),
            incarnation: self.incarnation().to_string(),
            error: None,
            seats,
        }
    }
}

/// A holder's answer, by seat.
struct AnsweredBy {
    node_id: String,
    incarnation: String,
    seats: HashMap<String, WireSeat>,
}

/// The answer for `handle` out of a holder's reply.
fn take_seat<T>(
    reply: &mut AnsweredBy,
    handle: &str,
    holder: Holder,
    want: impl FnOnce(WireAnswer) -> Option<T>,
) -> SeatAnswer<T> {
    let Some(seat) = reply.seats.remove(handle) else {
        let by = Answerer {
            node_id: reply.node_id.clone(),
            incarnation: reply.incarnation.clone(),
            epoch: None,
            local: false,
        };
        return SeatAnswer::unavailable_from(
            handle,
            holder,
            by,
            Unavailable::HolderFailed {
                message: "its answer left the seat out".into(),
            },
        );
    };
    let answered_by = Answerer {
        node_id: reply.node_id.clone(),
        incarnation: reply.incarnation.clone(),
        epoch: seat.epoch,
        local: false,
    };
    match seat.answer {
        WireAnswer::Unavailable(reason) => {
            SeatAnswer::unavailable_from(handle, holder, answered_by, reason)
        }
        other => match want(other) {
            Some(memory) => SeatAnswer::Held {
                handle: handle.to_string(),
                holder,
                answered_by,
                memory,
            },
            None => SeatAnswer::unavailable_from(
                handle,
                holder,
                answered_by,
                Unavailable::AskFailed {
                    message: "the answer is not what was asked for".into(),
                },
            ),
        },
    }
}

/// Rows per table of each of `handles` in this node's store, in one query
/// per table per few hundred seats.
async fn count_rows(
    memory: &MemoryStore,
    handles: &[String],
) -> Result<HashMap<String, MemoryCounts>, sqlx::Error> {
    let mut counts: HashMap<String, [u64; 7]> = HashMap::new();
    for chunk in handles.chunks(500) {
        let marks = vec!["?"; chunk.len()].join(", ");
        for (i, table) in Table::ALL.into_iter().enumerate() {
            let sql = format!(
                "SELECT agent_handle, COUNT(*) FROM {} WHERE agent_handle IN ({marks}) GROUP BY agent_handle",
                table.name()
            );
            let mut q = sqlx::query_as::<_, (String, i64)>(&sql);
            for h in chunk {
                q = q.bind(h);
            }
            for (handle, n) in q.fetch_all(memory.pool()).await? {
                counts.entry(handle).or_default()[i] = n.max(0) as u64;
            }
        }
    }
    Ok(counts
        .into_iter()
        .map(|(h, a)| (h, MemoryCounts::from_array(a)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subject_names_the_incarnation() {
        assert_eq!(subject("n1:0a1b2c3d"), "crewlet.memread.n1:0a1b2c3d");
    }

    #[test]
    fn counts_are_listed_in_the_order_of_seat_memory() {
        // Table::ALL is the order count_rows fills and SeatMemory::counts
        // lists.
        let names: Vec<&str> = Table::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(
            names,
            [
                "agent_diary",
                "episodes",
                "counterparty_profiles",
                "skills",
                "skill_versions",
                "agent_onboarding_markers",
                "conversations"
            ]
        );
        let c = MemoryCounts::from_array([1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(c.diary, 1);
        assert_eq!(c.conversations, 7);
        assert_eq!(c.as_array(), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(c.total(), 28);
    }

    #[test]
    fn an_unavailable_answer_names_the_holder_and_why_and_carries_no_memory() {
        let a: SeatRead = SeatAnswer::unavailable_from(
            "s0",
            Holder {
                node_id: "n1".into(),
                incarnation: "n1:1".into(),
                epoch: 3,
            },
            Answerer {
                node_id: "n2".into(),
                incarnation: "n2:1".into(),
                epoch: None,
                local: true,
            },
            Unavailable::Silent { budget_ms: 2000 },
        );
        assert!(a.memory().is_none());
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["state"], "unavailable");
        assert_eq!(v["holder"]["node_id"], "n1");
        assert_eq!(v["reason"]["kind"], "silent");
        assert_eq!(v["why"], "the holder n1 did not answer within 2000 ms");
        assert!(v.get("memory").is_none());
    }

    #[test]
    fn the_wire_round_trips() {
        let r = WireRequest {
            seats: vec!["a".into()],
            want: Want::Counts,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v, serde_json::json!({"seats": ["a"], "want": "counts"}));
        let r = WireRequest {
            seats: vec!["a".into()],
            want: Want::Memory { limit: 5 },
        };
        let back: WireRequest = serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back.want, Want::Memory { limit: 5 });
        let s = WireSeat {
            handle: "a".into(),
            epoch: None,
            answer: WireAnswer::Unavailable(Unavailable::NotHeldHere),
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["answer"]["unavailable"]["kind"], "not_held_here");
    }
}
