//! Reads of a seat's memory, answered by the seat's holder (spec § A seat's
//! memory follows it: "A read is answered by the holder").
//!
//! Every node that ever held a seat keeps a copy of its memory, and only
//! the holder keeps it current. So a read is never answered from whichever
//! node was asked: [`MemRead::read`] reads the seat's lease once and
//!
//! - no lease → [`MemoryAnswer::Unheld`]: empty, naming no holder (a copy of
//!   unknown age is not the seat's memory);
//! - the lease is this process's and the seat is attached here → the
//!   local store answers ([`MemoryAnswer::Held`], `answered_by.local`);
//! - the lease is this process's but the seat is still being established
//!   (hydrating) or given back → [`MemoryAnswer::Unavailable`];
//! - a peer's → that incarnation is asked within the scatter budget
//!   (`memory.scatter_budget_ms`, two seconds by default). Silence, nobody
//!   listening, or "not held here" is [`MemoryAnswer::Unavailable`] naming
//!   the holder and why — never an empty answer.
//!
//! [`MemRead::overview`] follows the same rule in one round: the seat leases
//! are listed once, this node's own seats are counted from its store, and
//! ONE request goes to each other holder naming all of that holder's seats.
//! Its [`MemoryCoverage`] names the holders that answered and those that
//! did not (whose seats read unavailable, not empty); seats of the company
//! nobody holds are listed as unheld.
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
//! A seat ([`SeatRead`] for a read, [`SeatMemoryCounts`] per seat of an
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
//! it is the rows per table ([`MemoryCounts`]). A [`MemoryOverview`] is
//! `{"node_id", "incarnation", "seats": [...], "coverage": {"answered":
//! [...], "unanswered": [...]}}`, each coverage entry naming a holder, its
//! seats, whether it is this node, and (unanswered) why.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use app::api::{
    MemoryAnswer, MemoryAnswerer, MemoryCounts, MemoryHolder, MemoryUnavailable, SeatMemoryCounts,
};
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
// The answers. Their types are the dashboard's (`app::api`): the browser,
// the JSON API and a holder's reply to another node all carry one shape.

/// A read of one seat's memory: the seat's rows as its store keeps them
/// (the web layer types them per table).
pub type SeatRead = MemoryAnswer<SeatMemory>;

/// Pure: a memory read's answer as `crewlet_memory_reads_total{answer}`
/// counts it: `held`, `unheld` or `unavailable`.
pub fn answer_label<T>(a: &MemoryAnswer<T>) -> &'static str {
    match a {
        MemoryAnswer::Held { .. } => "held",
        MemoryAnswer::Unheld { .. } => "unheld",
        MemoryAnswer::Unavailable { .. } => "unavailable",
    }
}

/// The seat's lease holder: its node, its process incarnation, the epoch of
/// its tenure.
fn holder_of(lease: &Lease) -> MemoryHolder {
    MemoryHolder {
        node_id: lease.preferred.clone(),
        incarnation: lease.owner.clone(),
        epoch: lease.epoch,
    }
}

/// What the holder did, as the end of a sentence naming it: "did not
/// answer within 2000 ms".
fn unavailable_words(reason: &MemoryUnavailable) -> String {
    match reason {
        MemoryUnavailable::Hydrating => "is still hydrating the seat's memory".into(),
        MemoryUnavailable::Releasing => "is giving the seat back".into(),
        MemoryUnavailable::NotHeldHere => {
            "answered that it does not hold the seat (the lease moved)".into()
        }
        MemoryUnavailable::Silent { budget_ms } => {
            format!("did not answer within {budget_ms} ms")
        }
        MemoryUnavailable::NoResponder => {
            "has nothing answering for it (its process is gone)".into()
        }
        MemoryUnavailable::HolderFailed { message } => {
            format!("cannot read the seat's memory: {message}")
        }
        MemoryUnavailable::AskFailed { message } => format!("could not be asked: {message}"),
    }
}

/// Why the holder on `node_id` gave no memory, in words.
fn why(node_id: &str, reason: &MemoryUnavailable) -> String {
    format!("the holder {node_id} {}", unavailable_words(reason))
}

/// A held seat whose holder's copy cannot be had: it names the holder and
/// why, and carries no memory.
fn unavailable<T>(
    handle: &str,
    holder: MemoryHolder,
    answered_by: MemoryAnswerer,
    reason: MemoryUnavailable,
) -> MemoryAnswer<T> {
    MemoryAnswer::Unavailable {
        why: why(&holder.node_id, &reason),
        handle: handle.to_string(),
        holder,
        answered_by,
        reason,
    }
}

/// A seat's rows per table, given in [`Table::ALL`] order (the order
/// [`SeatMemory::counts`] lists them).
fn counts_from(a: [u64; 7]) -> MemoryCounts {
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

mod overview;

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
    Unavailable(MemoryUnavailable),
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
    Not(Option<u64>, MemoryUnavailable),
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
    holdings: Arc<dyn Holdings>,
    memory: MemoryStore,
    scatter: Arc<dyn Scatter>,
    budget: Duration,
    limit: u32,
}

impl MemRead {
    /// Reads for the node whose seats `holdings` tells, whose memory store is `memory`,
    /// asking peers over `scatter` and waiting `budget` for each.
    pub fn new(
        holdings: Arc<dyn Holdings>,
        memory: MemoryStore,
        scatter: Arc<dyn Scatter>,
        budget: Duration,
    ) -> MemRead {
        MemRead {
            holdings,
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
        self.holdings.node_id()
    }

    fn incarnation(&self) -> &str {
        self.holdings.incarnation()
    }

    fn me(&self, epoch: Option<u64>) -> MemoryAnswerer {
        MemoryAnswerer {
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
        match self.holdings.held_here(handle) {
            Some(HeldHere::Attached(e)) => Here::Attached(e),
            Some(HeldHere::Establishing(e)) => Here::Not(Some(e), MemoryUnavailable::Hydrating),
            Some(HeldHere::Releasing(e)) => Here::Not(Some(e), MemoryUnavailable::Releasing),
            None => Here::Not(None, MemoryUnavailable::NotHeldHere),
        }
    }

    /// Read one seat's memory from whichever node holds it (counted by
    /// answer in `crewlet_memory_reads_total`).
    pub async fn read(&self, handle: &str) -> Result<SeatRead, MemReadError> {
        let read = self.read_seat(handle).await;
        if let Ok(a) = &read {
            crate::metrics::apply(&crate::metrics::Update::count(
                crate::metrics::MEMORY_READS,
                "answer",
                answer_label(a),
            ));
        }
        read
    }

    async fn read_seat(&self, handle: &str) -> Result<SeatRead, MemReadError> {
        let lease = self
            .holdings
            .store()
            .lease(&format!("seat:{handle}"))
            .await?;
        let Some(lease) = lease else {
            return Ok(MemoryAnswer::Unheld {
                handle: handle.to_string(),
                answered_by: self.me(None),
                memory: SeatMemory::default(),
            });
        };
        let holder = holder_of(&lease);
        if lease.owner == self.incarnation() {
            return Ok(match self.here(handle) {
                Here::Attached(epoch) => MemoryAnswer::Held {
                    handle: handle.to_string(),
                    holder,
                    answered_by: self.me(Some(epoch)),
                    memory: self.memory.seat_memory(handle, self.limit).await?,
                },
                Here::Not(epoch, reason) => unavailable(handle, holder, self.me(epoch), reason),
            });
        }
        let request = WireRequest {
            seats: vec![handle.to_string()],
            want: Want::Memory { limit: self.limit },
        };
        let mut answers = match self.ask(&holder, &request).await {
            Ok(reply) => reply,
            Err(reason) => {
                return Ok(unavailable(handle, holder, self.me(None), reason));
            }
        };
        Ok(take_seat(&mut answers, handle, holder, |a| match a {
            WireAnswer::Memory(m) => Some(m),
            _ => None,
        }))
    }

    /// Put one request to `holder`'s incarnation; its answer by seat, or
    /// why there is none.
    async fn ask(
        &self,
        holder: &MemoryHolder,
        request: &WireRequest,
    ) -> Result<AnsweredBy, MemoryUnavailable> {
        let body = serde_json::to_vec(request).map_err(|e| MemoryUnavailable::AskFailed {
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
                ScatterError::TimedOut(_) => MemoryUnavailable::Silent {
                    budget_ms: self.budget.as_millis() as u64,
                },
                ScatterError::NoResponders(_) => MemoryUnavailable::NoResponder,
                ScatterError::Failed(message) => MemoryUnavailable::AskFailed { message },
            })?;
        let reply: WireReply =
            serde_json::from_slice(&raw).map_err(|e| MemoryUnavailable::AskFailed {
                message: format!("the answer does not decode: {e}"),
            })?;
        if let Some(message) = reply.error {
            return Err(MemoryUnavailable::HolderFailed { message });
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
                        Err(e) => WireAnswer::Unavailable(MemoryUnavailable::HolderFailed {
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
                                answer: WireAnswer::Unavailable(MemoryUnavailable::HolderFailed {
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
    holder: MemoryHolder,
    want: impl FnOnce(WireAnswer) -> Option<T>,
) -> MemoryAnswer<T> {
    let Some(seat) = reply.seats.remove(handle) else {
        let by = MemoryAnswerer {
            node_id: reply.node_id.clone(),
            incarnation: reply.incarnation.clone(),
            epoch: None,
            local: false,
        };
        return unavailable(
            handle,
            holder,
            by,
            MemoryUnavailable::HolderFailed {
                message: "its answer left the seat out".into(),
            },
        );
    };
    let answered_by = MemoryAnswerer {
        node_id: reply.node_id.clone(),
        incarnation: reply.incarnation.clone(),
        epoch: seat.epoch,
        local: false,
    };
    match seat.answer {
        WireAnswer::Unavailable(reason) => unavailable(handle, holder, answered_by, reason),
        other => match want(other) {
            Some(memory) => MemoryAnswer::Held {
                handle: handle.to_string(),
                holder,
                answered_by,
                memory,
            },
            None => unavailable(
                handle,
                holder,
                answered_by,
                MemoryUnavailable::AskFailed {
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
        .map(|(h, a)| (h, counts_from(a)))
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
        let c = counts_from([1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(c.diary, 1);
        assert_eq!(c.conversations, 7);
        // The pages list the tables in the same order.
        assert_eq!(c.named().map(|(_, n)| n), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(c.total(), 28);
    }

    #[test]
    fn a_memory_read_counts_by_its_answer() {
        let me = MemoryAnswerer {
            node_id: "n1".into(),
            incarnation: "n1:x".into(),
            epoch: None,
            local: true,
        };
        let unheld: MemoryAnswer<SeatMemory> = MemoryAnswer::Unheld {
            handle: "a".into(),
            answered_by: me.clone(),
            memory: SeatMemory::default(),
        };
        assert_eq!(answer_label(&unheld), "unheld");
        let holder = MemoryHolder {
            node_id: "n2".into(),
            incarnation: "n2:y".into(),
            epoch: 3,
        };
        let held: MemoryAnswer<SeatMemory> = MemoryAnswer::Held {
            handle: "a".into(),
            holder: holder.clone(),
            answered_by: me.clone(),
            memory: SeatMemory::default(),
        };
        assert_eq!(answer_label(&held), "held");
        let away: MemoryAnswer<SeatMemory> =
            unavailable("a", holder, me, MemoryUnavailable::NoResponder);
        assert_eq!(answer_label(&away), "unavailable");
    }

    #[test]
    fn an_unavailable_answer_names_the_holder_and_why_and_carries_no_memory() {
        let a: SeatRead = unavailable(
            "s0",
            MemoryHolder {
                node_id: "n1".into(),
                incarnation: "n1:1".into(),
                epoch: 3,
            },
            MemoryAnswerer {
                node_id: "n2".into(),
                incarnation: "n2:1".into(),
                epoch: None,
                local: true,
            },
            MemoryUnavailable::Silent { budget_ms: 2000 },
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
            answer: WireAnswer::Unavailable(MemoryUnavailable::NotHeldHere),
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["answer"]["unavailable"]["kind"], "not_held_here");
    }

    #[test]
    fn a_holders_reply_keeps_its_shape() {
        let reply = serde_json::json!({
            "node_id": "n1", "incarnation": "n1:0a1b2c3d", "error": null,
            "seats": [
                {"handle": "bob", "epoch": 2, "answer": {"counts": {
                    "diary": 3, "episodes": 0, "counterparty_profiles": 1, "skills": 0,
                    "skill_versions": 0, "onboarding_markers": 2, "conversations": 5}}},
                {"handle": "carol", "epoch": null,
                 "answer": {"unavailable": {"kind": "silent", "budget_ms": 2000}}},
                {"handle": "dan", "epoch": 1,
                 "answer": {"unavailable": {"kind": "holder_failed", "message": "disk"}}}
            ]
        });
        let back: WireReply = serde_json::from_value(reply.clone()).unwrap();
        assert!(matches!(
            &back.seats[0].answer,
            WireAnswer::Counts(c) if c.diary == 3 && c.conversations == 5
        ));
        assert_eq!(serde_json::to_value(&back).unwrap(), reply);
    }

    #[test]
    fn why_names_the_holder_and_what_it_did() {
        for (reason, words) in [
            (
                MemoryUnavailable::Hydrating,
                "is still hydrating the seat's memory",
            ),
            (MemoryUnavailable::Releasing, "is giving the seat back"),
            (
                MemoryUnavailable::NotHeldHere,
                "answered that it does not hold the seat (the lease moved)",
            ),
            (
                MemoryUnavailable::NoResponder,
                "has nothing answering for it (its process is gone)",
            ),
            (
                MemoryUnavailable::HolderFailed {
                    message: "disk".into(),
                },
                "cannot read the seat's memory: disk",
            ),
            (
                MemoryUnavailable::AskFailed {
                    message: "no route".into(),
                },
                "could not be asked: no route",
            ),
        ] {
            assert_eq!(why("n1", &reason), format!("the holder n1 {words}"));
        }
    }
}
