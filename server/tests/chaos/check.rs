//! The invariant checker: pure functions over a run's recording.
//!
//! The recording is what the harness saw from outside the nodes — what it
//! published, the outbox and dead-letter streams, every node's own log of
//! its events (one log per process, timestamps in microseconds), the
//! processes' lives (started, stopped, cut off, ended and how) and the
//! company's removals. Times are microseconds since the Unix epoch on the
//! one machine every process runs on.
//!
//! The rules (docs/testing.md § Chaos testing):
//! - epochs: a seat's attachments come in strictly increasing epochs;
//! - overlap: two processes are attached to one seat at once (not counting
//!   time the older one spent stopped) for at most TTL + heartbeat + store
//!   timeout — how long a holder that lost the store takes to learn it;
//! - admission: no turn starts at an epoch once a newer epoch of the seat
//!   was claimed (beyond the store timeout a turn's ledger read may take);
//! - lost: every acknowledged publish has an outbox effect naming it, or is
//!   dead-lettered; one with neither is *lost* when its inbox no longer
//!   stores it at the end, and *unanswered* when it still does (never run:
//!   a recovery that did not finish in the run, nothing lost; still a
//!   violation);
//! - duplicates: no trigger has effects from two turns, unless one of the
//!   turns' nodes stopped extending its delivery for a whole ack window
//!   (the documented bound: it held the delivery past the window), which
//!   is named;
//! - late effects: an effect stored after a newer epoch of its seat was
//!   claimed came from a call that passed the fence before that claim
//!   (the trace's `fence_passed`, less any time its process was stopped
//!   after the claim), and was stored within the outbox's retry bound of
//!   that check (not counting time its process was stopped or cut off);
//!   the bound verified is reported;
//! - stops: a process stopped past the TTL exits 75 or resumes fenced;
//! - exits: a SIGTERM exits 0; a process ending on its own exits 75 after a
//!   stall (stopped, or cut off from NATS), never otherwise;
//! - panics: none in any node's stderr.
//!
//! For every lost or duplicated message the checker tells its whole story
//! ([`story`]): the nodes' delivery trace (docs/config.md § `[logging]`) and events
//! that name it, its turns, effects and dead letter, and its seat's claims.
//!
//! Dark time (a seat nobody serves) is measured, not judged: a seat is
//! served from its attachment until its detachment, its holder's end, or
//! the holder being stopped or cut off, whichever comes first.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Microseconds since the Unix epoch.
pub type Ts = i64;

pub const SECOND: i64 = 1_000_000;

/// One process of a node: the node's id and its spawn number.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcId {
    pub node: String,
    pub spawn: u32,
}

impl std::fmt::Display for ProcId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.node, self.spawn)
    }
}

#[derive(Clone, Debug)]
pub struct Published {
    pub id: String,
    pub seat: String,
    pub at: Ts,
    /// The stream acknowledged it (a publish never acknowledged may or may
    /// not be stored, and is not counted as lost).
    pub acked: bool,
    /// The stream sequence its acknowledgement named.
    pub seq: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct EffectRec {
    /// The stream's timestamp.
    pub at: Ts,
    pub seat: String,
    pub node: String,
    pub epoch: u64,
    pub turn_id: String,
    pub trigger_ids: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct DeadRec {
    pub id: String,
}

#[derive(Clone, Debug)]
pub struct NodeEvent {
    pub at: Ts,
    pub proc: ProcId,
    pub name: String,
    pub v: serde_json::Value,
}

impl NodeEvent {
    fn str(&self, k: &str) -> &str {
        self.v.get(k).and_then(|v| v.as_str()).unwrap_or("")
    }
    fn u64(&self, k: &str) -> u64 {
        self.v.get(k).and_then(|v| v.as_u64()).unwrap_or(0)
    }
}

/// Why a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndCause {
    /// kill -9 by the harness.
    Killed,
    /// SIGTERM by the harness: a drain, which must exit 0.
    Terminated,
    /// Nobody asked it to.
    OnItsOwn,
}

#[derive(Clone, Debug)]
pub struct Proc {
    pub id: ProcId,
    pub ended: Option<Ts>,
    pub cause: Option<EndCause>,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// SIGSTOP → SIGCONT.
    pub stops: Vec<(Ts, Ts)>,
    /// Cut off from NATS (blackholed) → forwarded again.
    pub cutoffs: Vec<(Ts, Ts)>,
}

impl Proc {
    /// Time spent stopped within [a, b).
    fn frozen_within(&self, a: Ts, b: Ts) -> i64 {
        self.stops
            .iter()
            .map(|(s, e)| (e.min(&b) - s.max(&a)).max(0))
            .sum()
    }

    /// Time spent stopped or cut off from NATS within [a, b) (overlaps
    /// counted once).
    fn stalled_within(&self, a: Ts, b: Ts) -> i64 {
        let mut spans: Vec<(Ts, Ts)> = self
            .stops
            .iter()
            .chain(self.cutoffs.iter())
            .map(|(s, e)| (*s.max(&a), *e.min(&b)))
            .filter(|(s, e)| e > s)
            .collect();
        spans.sort();
        let (mut total, mut reach) = (0, Ts::MIN);
        for (s, e) in spans {
            let s = s.max(reach);
            if e > s {
                total += e - s;
                reach = e;
            }
        }
        total
    }
}

#[derive(Clone, Debug)]
pub struct Removal {
    pub seat: String,
    pub from: Ts,
    pub to: Ts,
}

#[derive(Clone, Copy, Debug)]
pub struct Timings {
    pub ttl: i64,
    pub heartbeat: i64,
    pub store_timeout: i64,
    pub ack_wait: i64,
}

/// One answer of `GET /query/fleet`: seat → (holder node, epoch).
#[derive(Clone, Debug)]
pub struct Poll {
    pub at: Ts,
    pub by: String,
    pub seats: BTreeMap<String, (String, u64)>,
}

/// Everything a run recorded.
#[derive(Clone, Debug)]
pub struct History {
    pub timings: Timings,
    /// From the fleet's first convergence to the end of the final settle:
    /// where dark time is measured.
    pub window: (Ts, Ts),
    pub seats: Vec<String>,
    pub published: Vec<Published>,
    pub effects: Vec<EffectRec>,
    pub dead: Vec<DeadRec>,
    pub events: Vec<NodeEvent>,
    pub procs: Vec<Proc>,
    pub removals: Vec<Removal>,
    /// When a NATS server was down (killed → started again and serving):
    /// the store may not have answered anyone.
    pub outages: Vec<(Ts, Ts)>,
    pub polls: Vec<Poll>,
    /// Panic lines found in the nodes' stderr.
    pub panics: Vec<(ProcId, String)>,
    /// What the harness itself saw go wrong (a node's /health not
    /// answering at the end, an apply refused, a fleet that did not
    /// recover).
    pub harness: Vec<String>,
    /// The ids of the messages the inbox stream still stored after every
    /// node stopped (`None`: it could not be read, and every message with
    /// no effect and no dead letter counts as lost).
    pub stored_at_end: Option<BTreeSet<String>>,
}

/// A seat's tenure on one process.
#[derive(Clone, Debug)]
pub struct Tenure {
    pub proc: ProcId,
    pub seat: String,
    pub epoch: u64,
    pub attached: Ts,
    pub ended: Ts,
    /// The detach reason, or `process_end`.
    pub reason: String,
}

#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub messages: usize,
    pub unconfirmed: usize,
    pub effects: usize,
    /// Triggers with effects from two or more turns, violations and named
    /// bounded cases together.
    pub duplicates: usize,
    pub bounded_duplicates: usize,
    pub lost: usize,
    /// Acknowledged, no effect, no dead letter, and still stored in its
    /// inbox at the end: never run, not lost.
    pub unanswered: usize,
    pub dead_lettered: usize,
    /// Effects posted at an epoch after a newer epoch of the seat was
    /// claimed (a zombie's last call: bounded by the in-turn fence).
    pub zombie_effects: usize,
    /// Of those, the longest time from the call's fence check to the
    /// effect being stored, outside stops and cut-offs (judged against
    /// [`late_effect_bound`]).
    pub late_max_delay_us: i64,
    /// Of those, the most from one turn.
    pub late_most_per_turn: usize,
    /// The bound [`late_max_delay_us`] was judged against.
    ///
    /// [`late_max_delay_us`]: Stats::late_max_delay_us
    pub late_bound_us: i64,
    pub max_dark_us: i64,
    pub p99_dark_us: i64,
    pub dark_stretches: usize,
    pub max_overlap_us: i64,
    pub stops_exit75: usize,
    pub stops_fenced: usize,
    /// Publish → first effect.
    pub max_latency_us: i64,
}

#[derive(Clone, Debug, Default)]
pub struct Findings {
    pub violations: Vec<String>,
    /// Documented, bounded exceptions that happened, named.
    pub bounded: Vec<String>,
    pub stats: Stats,
    /// The whole story ([`story`]) of each lost message and each message
    /// that ran twice (a few of each).
    pub stories: Vec<String>,
}

/// The first ten of `messages` with their seats, "…" when there are more.
fn sample_of(messages: &[&Published]) -> String {
    let sample: Vec<String> = messages
        .iter()
        .take(10)
        .map(|p| format!("{} (seat {})", p.id, p.seat))
        .collect();
    let more = if messages.len() > 10 { ", …" } else { "" };
    format!("{}{more}", sample.join(", "))
}

/// How many stories of each kind (lost, ran twice) a run tells.
const STORIES: usize = 5;

/// How long an effect may take from its call's fence check to the stream,
/// outside stops and cut-offs: the outbox tries a post again for ten store
/// timeouts (`RETRY_TIMEOUTS` in engine/outbox.rs), the last try may take
/// one more, and a second for the scheduler.
pub fn late_effect_bound(t: &Timings) -> i64 {
    11 * t.store_timeout + SECOND
}

fn secs(us: i64) -> String {
    format!("{:.2}s", us as f64 / SECOND as f64)
}

/// Every tenure in the recording, from the nodes' attach and detach events.
pub fn tenures(h: &History) -> Vec<Tenure> {
    let end_of: HashMap<&ProcId, Ts> = h
        .procs
        .iter()
        .map(|p| (&p.id, p.ended.unwrap_or(h.window.1)))
        .collect();
    let mut open: BTreeMap<(ProcId, String), (u64, Ts)> = BTreeMap::new();
    let mut out = Vec::new();
    let mut events: Vec<&NodeEvent> = h.events.iter().collect();
    events.sort_by_key(|e| e.at);
    for e in events {
        match e.name.as_str() {
            "seat_attached" => {
                open.insert(
                    (e.proc.clone(), e.str("seat").to_string()),
                    (e.u64("epoch"), e.at),
                );
            }
            "seat_detached" => {
                let key = (e.proc.clone(), e.str("seat").to_string());
                if let Some((epoch, at)) = open.remove(&key) {
                    out.push(Tenure {
                        proc: key.0,
                        seat: key.1,
                        epoch,
                        attached: at,
                        ended: e.at,
                        reason: e.str("reason").to_string(),
                    });
                }
            }
            _ => {}
        }
    }
    for ((proc, seat), (epoch, at)) in open {
        let ended = end_of.get(&proc).copied().unwrap_or(h.window.1);
        out.push(Tenure {
            proc,
            seat,
            epoch,
            attached: at,
            ended,
            reason: "process_end".into(),
        });
    }
    out.sort_by_key(|t| (t.seat.clone(), t.attached));
    out
}

/// The detach reasons of a voluntary release (spec § Establishing a seat,
/// and giving it back).
const VOLUNTARY: [&str; 5] = [
    "drain",
    "rebalance",
    "role_gone",
    "placement_moved",
    "unserviceable",
];

/// Graceful handoffs: each tenure given back voluntarily whose release was
/// proven, paired with the seat's next tenure on another node. Proven: no
/// `seat_release_unproven` for that tenure, or a `seat_release_recovered`
/// after it. A voluntary release whose teardown (its last memory flush
/// among it) never succeeded left the seat undead, and an undead seat's
/// lease that lapses is lost like a crashed holder's: its memory is
/// bounded by one flush cycle (spec § A seat's memory follows it: "a crash
/// loses at most one cycle"), not carried whole. Those are counted in
/// `lapsed_unproven`.
pub fn graceful_handoffs(h: &History, tenures: &[Tenure]) -> Handoffs {
    // (Also not graceful: a release whose lease had lapsed before it, so
    // the next holder claimed the seat before the giver let it go — see
    // [`lapsed_before_release`]; counted in `lapsed_before_release`.)
    let said = |name: &str, t: &Tenure| {
        h.events.iter().any(|e| {
            e.name == name
                && e.proc == t.proc
                && e.str("seat") == t.seat
                && e.u64("epoch") == t.epoch
        })
    };
    let mut out = Handoffs::default();
    for (k, t) in tenures.iter().enumerate() {
        if !VOLUNTARY.contains(&t.reason.as_str()) {
            continue;
        }
        let Some(next) = tenures[k + 1..]
            .iter()
            .find(|n| n.seat == t.seat && n.attached >= t.ended)
        else {
            continue;
        };
        if next.proc.node == t.proc.node {
            continue;
        }
        if said("seat_release_unproven", t) && !said("seat_release_recovered", t) {
            out.lapsed_unproven += 1;
            continue;
        }
        if lapsed_before_release(h, t, next) {
            out.lapsed_before_release += 1;
            continue;
        }
        out.graceful.push((t.clone(), next.clone()));
    }
    out
}

/// Whether the seat's next tenure began with a plain claim (not the take
/// of an offer) made before the giver detached: the giver's lease had
/// lapsed (a store outage longer than the TTL, say) while it was still
/// letting the seat go, so the release that followed found nothing to give
/// back and its last flush came after the next holder had read the seat's
/// memory. A lapsed lease is a lost tenure (spec § A seat's memory follows
/// it: "a crash loses at most one cycle"), whatever the detach's reason.
pub fn lapsed_before_release(h: &History, t: &Tenure, next: &Tenure) -> bool {
    let by_next = |name: &'static str| {
        h.events.iter().filter(move |e| {
            e.name == name
                && e.proc == next.proc
                && e.str("seat") == next.seat
                && e.u64("epoch") == next.epoch
        })
    };
    by_next("seat_offer_taken").next().is_none() && by_next("seat_claimed").any(|e| e.at < t.ended)
}

/// A tenure that ended without a proven handoff — its lease lost or
/// lapsed, its process killed or ended, or a voluntary release whose
/// teardown never succeeded — paired with the seat's next tenure on
/// another node, and the time by which work the giver completed must have
/// reached the taker: the spec's crash bound (spec § A seat's memory follows
/// it: "a crash loses at most one cycle") is one `memory.flush_seconds`
/// cycle, plus `slack` for the flush's own trip to the store, before the
/// giver last reached the store: its tenure's end, or its first stop or
/// cut-off in it, or the start of a NATS outage that reached into the
/// tenure's last cycle (rows due to flush in an outage cannot be, and a
/// lease lost to it goes with them).
pub fn crash_handoffs(
    h: &History,
    tenures: &[Tenure],
    flush: i64,
    slack: i64,
) -> Vec<(Tenure, Tenure, Ts)> {
    let unproven = |t: &Tenure| {
        let said = |name: &str| {
            h.events.iter().any(|e| {
                e.name == name
                    && e.proc == t.proc
                    && e.str("seat") == t.seat
                    && e.u64("epoch") == t.epoch
            })
        };
        said("seat_release_unproven") && !said("seat_release_recovered")
    };
    let procs: HashMap<&ProcId, &Proc> = h.procs.iter().map(|p| (&p.id, p)).collect();
    let mut out = Vec::new();
    for (k, t) in tenures.iter().enumerate() {
        let Some(next) = tenures[k + 1..]
            .iter()
            .find(|n| n.seat == t.seat && n.epoch > t.epoch)
        else {
            continue;
        };
        let crashed = matches!(t.reason.as_str(), "lost" | "grace_expired" | "process_end")
            || (VOLUNTARY.contains(&t.reason.as_str())
                && (unproven(t) || lapsed_before_release(h, t, next)));
        if !crashed {
            continue;
        }
        if next.proc.node == t.proc.node {
            continue;
        }
        let last_cycle = t.ended - flush - slack;
        let outages = h
            .outages
            .iter()
            .filter(|(s, e)| *e > last_cycle && *s < t.ended)
            .map(|(s, _)| *s);
        let acted_until = procs
            .get(&t.proc)
            .into_iter()
            .flat_map(|p| p.stops.iter().chain(p.cutoffs.iter()))
            .map(|(s, _)| *s)
            .filter(|s| *s >= t.attached && *s < t.ended)
            .chain(outages)
            .fold(t.ended, Ts::min);
        out.push((t.clone(), next.clone(), acted_until - flush - slack));
    }
    out
}

/// Whether tenure `x` was offered before `stop` and its offer taken: a
/// two-phase handoff whose giver was frozen between its offer and its
/// successor's take. An offered seat admits nothing (its last turn was
/// fenced at the offer's flush), so the giver detaching on resume — phase
/// 2, under the handoff's reason — held nothing a peer ran (soak seed
/// 12311: a giver stopped 5.4 s just after offering, detached 0.17 s after
/// it resumed).
pub fn handed_over_before(h: &History, x: &Tenure, stop: Ts) -> bool {
    let offered = h.events.iter().any(|e| {
        e.name == "seat_offered"
            && e.proc == x.proc
            && e.str("seat") == x.seat
            && e.u64("epoch") == x.epoch
            && e.at < stop
    });
    offered
        && h.events.iter().any(|e| {
            e.name == "seat_offer_taken"
                && e.str("seat") == x.seat
                && e.u64("from_epoch") == x.epoch
        })
}

/// When a graceful tenure's last memory flush was: a hand-off flushes in
/// its quiesce, just before it offers the seat (`seat_offered`) — a turn
/// still in flight past the hand-off's wait is fenced at that flush and
/// deferred to the taker, so no finished work of the giver's lies after it
/// but a turn that passed its last fence check just before; a release
/// flushes after it detaches, at the tenure's end.
pub fn flushed_by(h: &History, t: &Tenure) -> Ts {
    h.events
        .iter()
        .filter(|e| {
            e.name == "seat_offered"
                && e.proc == t.proc
                && e.str("seat") == t.seat
                && e.u64("epoch") == t.epoch
                && e.at <= t.ended
        })
        .map(|e| e.at)
        .max()
        .unwrap_or(t.ended)
}

/// What [`graceful_handoffs`] found.
#[derive(Clone, Debug, Default)]
pub struct Handoffs {
    /// (the tenure given back, the seat's next tenure elsewhere).
    pub graceful: Vec<(Tenure, Tenure)>,
    /// Voluntary releases whose teardown never succeeded before the lease
    /// went: not graceful.
    pub lapsed_unproven: usize,
    /// Voluntary releases whose lease had lapsed before them (the next
    /// holder claimed first): not graceful.
    pub lapsed_before_release: usize,
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Subtract `cut` from the intervals in `spans` (both half-open).
fn minus(spans: Vec<(Ts, Ts)>, cut: (Ts, Ts)) -> Vec<(Ts, Ts)> {
    let mut out = Vec::new();
    for (a, b) in spans {
        if cut.1 <= a || cut.0 >= b {
            out.push((a, b));
            continue;
        }
        if cut.0 > a {
            out.push((a, cut.0));
        }
        if cut.1 < b {
            out.push((cut.1, b));
        }
    }
    out
}

/// The stretches of each seat's window no tenure served, longest first.
pub fn dark_stretches(h: &History, tenures: &[Tenure]) -> Vec<(String, Ts, i64)> {
    let procs: HashMap<&ProcId, &Proc> = h.procs.iter().map(|p| (&p.id, p)).collect();
    let mut out = Vec::new();
    for seat in &h.seats {
        // When it is served: attached, not stopped, not cut off.
        let mut served: Vec<(Ts, Ts)> = Vec::new();
        for t in tenures.iter().filter(|t| &t.seat == seat) {
            let mut end = t.ended;
            if let Some(p) = procs.get(&t.proc) {
                for (s, _) in p.stops.iter().chain(p.cutoffs.iter()) {
                    if *s >= t.attached && *s < end {
                        end = *s;
                    }
                }
            }
            if end > t.attached {
                served.push((t.attached, end));
            }
        }
        served.sort();
        let mut expected = vec![h.window];
        for r in h.removals.iter().filter(|r| &r.seat == seat) {
            // A removed seat is not expected to be served; a re-added one
            // gets a sweep to be claimed again, like any new seat.
            expected = minus(expected, (r.from, r.to));
        }
        for s in served {
            expected = minus(expected, s);
        }
        for (a, b) in expected {
            if b > a {
                out.push((seat.clone(), a, b - a));
            }
        }
    }
    out.sort_by_key(|x| std::cmp::Reverse(x.2));
    out
}

/// The late-effects rule: every effect stored after a newer epoch of its
/// seat was claimed is judged by the last fence its turn passed before it
/// (the trace's `fence_passed`). It is bounded when that check came
/// before the claim — not counting time the process was stopped after the
/// claim, since a stop between the check and its log line delays only the
/// line — and the effect was stored within [`late_effect_bound`] of the
/// check, outside stops and cut-offs. Anything else is a violation.
fn late_effects(
    h: &History,
    procs: &HashMap<&ProcId, &Proc>,
    newer_claim: &dyn Fn(&str, u64) -> Option<Ts>,
    f: &mut Findings,
) {
    let bound = late_effect_bound(&h.timings);
    f.stats.late_bound_us = bound;
    let mut passes: HashMap<&str, Vec<&NodeEvent>> = HashMap::new();
    for e in h.events.iter().filter(|e| e.name == "trace.fence_passed") {
        passes.entry(e.str("turn_id")).or_default().push(e);
    }
    let mut per_turn: HashMap<&str, usize> = HashMap::new();
    for e in &h.effects {
        let Some(c) = newer_claim(&e.seat, e.epoch).filter(|c| e.at > *c) else {
            continue;
        };
        f.stats.zombie_effects += 1;
        *per_turn.entry(e.turn_id.as_str()).or_default() += 1;
        let what = format!(
            "effect of turn {} on seat {} (epoch {}, {}) stored {} after epoch {} was claimed",
            e.turn_id,
            e.seat,
            e.epoch,
            e.node,
            secs(e.at - c),
            e.epoch + 1
        );
        let Some(pass) = passes
            .get(e.turn_id.as_str())
            .and_then(|ps| ps.iter().filter(|p| p.at <= e.at).max_by_key(|p| p.at))
        else {
            f.violations.push(format!(
                "late effect: {what}, and the trace shows no fence its call passed"
            ));
            continue;
        };
        let proc = procs.get(&pass.proc);
        let frozen_after_claim = proc.map_or(0, |p| p.frozen_within(c, pass.at));
        if pass.at - frozen_after_claim > c {
            f.violations.push(format!(
                "late effect: {what}; its call passed the fence on {} {} after the claim",
                pass.proc,
                secs(pass.at - frozen_after_claim - c)
            ));
            continue;
        }
        let delay = e.at - pass.at - proc.map_or(0, |p| p.stalled_within(pass.at, e.at));
        f.stats.late_max_delay_us = f.stats.late_max_delay_us.max(delay);
        if delay > bound {
            f.violations.push(format!(
                "late effect: {what}; stored {} after its call passed the fence (outside stops and cut-offs; bound {})",
                secs(delay),
                secs(bound)
            ));
        }
    }
    f.stats.late_most_per_turn = per_turn.values().copied().max().unwrap_or(0);
}

/// One message's whole story, in time order, for a person hunting a loss
/// or a duplicate: its publish; every step of its deliveries on every
/// process (the trace: fetched, handed back, settled and how); the turns
/// that carried it (started, each fence passed, completed); its effects
/// with their epochs; its dead letter; and its seat's claims,
/// attachments, detachments and undead alarms from a little before the
/// publish on. Times are seconds from the publish.
pub fn story(h: &History, id: &str) -> String {
    let Some(p) = h.published.iter().find(|p| p.id == id) else {
        return format!("  {id} was never published");
    };
    let t0 = p.at;
    let mut lines: Vec<(Ts, String)> = vec![(
        p.at,
        format!(
            "published to seat {} ({})",
            p.seat,
            match (p.acked, p.seq) {
                (true, Some(seq)) => format!("acknowledged at stream sequence {seq}"),
                (true, None) => "acknowledged".into(),
                (false, _) => "never acknowledged".into(),
            }
        ),
    )];
    let turns: BTreeSet<&str> = h
        .events
        .iter()
        .filter(|e| {
            e.name == "turn_started"
                && e.v["trigger_ids"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == id))
        })
        .map(|e| e.str("turn_id"))
        .collect();
    const SEAT_EVENTS: [&str; 6] = [
        "seat_claimed",
        "seat_attached",
        "seat_detached",
        "seat_undead",
        "seat_undead_lost",
        "seat_release_unproven",
    ];
    let line = |e: &NodeEvent| (e.at, format!("{} {} {}", e.proc, e.name, e.v));
    for e in &h.events {
        let mine = if e.name.starts_with("trace.") {
            e.str("msg_id") == id || turns.contains(e.str("turn_id"))
        } else {
            e.name.starts_with("turn_") && turns.contains(e.str("turn_id"))
        };
        if mine {
            lines.push(line(e));
        }
    }
    for e in h
        .effects
        .iter()
        .filter(|e| e.trigger_ids.iter().any(|x| x == id))
    {
        lines.push((
            e.at,
            format!(
                "effect stored: turn {} on {} at epoch {}",
                e.turn_id, e.node, e.epoch
            ),
        ));
    }
    // The seat's life around it: from a little before the publish to a
    // while after the message's last step (a minute, when it has none).
    let last = lines.iter().map(|l| l.0).max().unwrap_or(t0);
    let until = if last > t0 {
        last + 10 * SECOND
    } else {
        t0 + 60 * SECOND
    };
    lines.extend(
        h.events
            .iter()
            .filter(|e| {
                SEAT_EVENTS.contains(&e.name.as_str())
                    && e.str("seat") == p.seat
                    && (t0 - 5 * SECOND..=until).contains(&e.at)
            })
            .map(line),
    );
    lines.sort_by_key(|l| l.0);
    let mut out: Vec<String> = lines
        .iter()
        .map(|(at, l)| format!("  {:+9.3}s {l}", (at - t0) as f64 / SECOND as f64))
        .collect();
    if h.dead.iter().any(|d| d.id == id) {
        out.push("  (dead-lettered)".into());
    }
    if !h.events.iter().any(|e| e.name.starts_with("trace.")) {
        out.push("  (the recording holds no delivery trace: the nodes logged no crewlet::delivery lines)".into());
    }
    out.join("\n")
}

/// Check every rule over `h`.
pub fn check(h: &History) -> Findings {
    let mut f = Findings::default();
    let t = h.timings;
    let tenures = tenures(h);
    let procs: HashMap<&ProcId, &Proc> = h.procs.iter().map(|p| (&p.id, p)).collect();

    // Epochs: strictly increasing attachments per seat.
    let mut by_seat: BTreeMap<&str, Vec<&Tenure>> = BTreeMap::new();
    for t in &tenures {
        by_seat.entry(t.seat.as_str()).or_default().push(t);
    }
    for (seat, ts) in &by_seat {
        for w in ts.windows(2) {
            if w[1].epoch <= w[0].epoch {
                f.violations.push(format!(
                    "epochs: seat {seat} attached at epoch {} on {} after epoch {} on {}",
                    w[1].epoch, w[1].proc, w[0].epoch, w[0].proc
                ));
            }
        }
    }

    // Overlap: two processes attached to one seat at once.
    let bound = t.ttl + t.heartbeat + t.store_timeout;
    for (seat, ts) in &by_seat {
        for (i, a) in ts.iter().enumerate() {
            for b in ts.iter().skip(i + 1) {
                if a.proc == b.proc {
                    continue;
                }
                let (s, e) = (a.attached.max(b.attached), a.ended.min(b.ended));
                if e <= s {
                    continue;
                }
                // The older tenure's time stopped is not time it acted.
                let older = if a.epoch < b.epoch { a } else { b };
                let frozen = procs
                    .get(&older.proc)
                    .map(|p| p.frozen_within(s, e))
                    .unwrap_or(0);
                let overlap = e - s - frozen;
                f.stats.max_overlap_us = f.stats.max_overlap_us.max(overlap);
                if overlap > bound {
                    f.violations.push(format!(
                        "overlap: seat {seat} attached on {} (epoch {}) and {} (epoch {}) at once for {} (bound {})",
                        a.proc,
                        a.epoch,
                        b.proc,
                        b.epoch,
                        secs(overlap),
                        secs(bound)
                    ));
                }
            }
        }
    }

    // Claims per seat, for admission and zombie effects.
    let mut claims: BTreeMap<&str, Vec<(u64, Ts)>> = BTreeMap::new();
    for e in h.events.iter().filter(|e| e.name == "seat_claimed") {
        claims
            .entry(e.str("seat"))
            .or_default()
            .push((e.u64("epoch"), e.at));
    }
    let newer_claim = |seat: &str, epoch: u64| -> Option<Ts> {
        claims
            .get(seat)?
            .iter()
            .filter(|(e, _)| *e > epoch)
            .map(|(_, at)| *at)
            .min()
    };

    // Admission.
    // When each turn ended (its record and acknowledgement are behind it).
    let ended_at: HashMap<&str, Ts> = h
        .events
        .iter()
        .filter(|e| e.name == "turn_completed")
        .map(|e| (e.str("turn_id"), e.at))
        .collect();
    let mut started: HashMap<&str, &NodeEvent> = HashMap::new();
    for e in h.events.iter().filter(|e| e.name == "turn_started") {
        started.insert(e.str("turn_id"), e);
        let (seat, epoch) = (e.str("seat"), e.u64("epoch"));
        if let Some(c) = newer_claim(seat, epoch)
            && e.at > c
        {
            let frozen = procs
                .get(&e.proc)
                .map(|p| p.frozen_within(c, e.at))
                .unwrap_or(0);
            let running = e.at - c - frozen;
            if running > t.store_timeout + SECOND / 2 {
                f.violations.push(format!(
                    "admission: {} started turn {} on seat {seat} at epoch {epoch} {} after a newer epoch was claimed",
                    e.proc,
                    e.str("turn_id"),
                    secs(running)
                ));
            }
        }
    }

    // Every effect's turn has its start in the nodes' logs: without it
    // the admission and duplicate rules cannot judge that turn (they went
    // blind once when turn events moved to DEBUG lines).
    let unstarted: BTreeSet<String> = h
        .effects
        .iter()
        .filter(|e| !started.contains_key(e.turn_id.as_str()))
        .map(|e| format!("{} on {} (epoch {})", e.turn_id, e.node, e.epoch))
        .collect();
    if !unstarted.is_empty() {
        f.violations.push(format!(
            "recording: {} turns posted effects with no turn_started in the nodes' logs, so the admission and duplicate rules cannot judge them: {}{}",
            unstarted.len(),
            unstarted.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
            if unstarted.len() > 5 { ", …" } else { "" }
        ));
    }

    // Effects per trigger.
    f.stats.effects = h.effects.len();
    let mut by_id: HashMap<&str, Vec<&EffectRec>> = HashMap::new();
    for e in &h.effects {
        for id in &e.trigger_ids {
            by_id.entry(id.as_str()).or_default().push(e);
        }
    }
    late_effects(h, &procs, &newer_claim, &mut f);
    let dead: BTreeSet<&str> = h.dead.iter().map(|d| d.id.as_str()).collect();
    f.stats.dead_lettered = h.dead.len();
    f.stats.messages = h.published.len();
    let mut lost = Vec::new();
    let mut twice: Vec<&str> = Vec::new();
    for p in &h.published {
        if !p.acked {
            f.stats.unconfirmed += 1;
        }
        let effects = by_id.get(p.id.as_str());
        match effects {
            Some(es) => {
                let first = es.iter().map(|e| e.at).min().unwrap_or(p.at);
                f.stats.max_latency_us = f.stats.max_latency_us.max(first - p.at);
                let turns: BTreeSet<&str> = es.iter().map(|e| e.turn_id.as_str()).collect();
                if turns.len() > 1 {
                    f.stats.duplicates += 1;
                    // The documented bound: a turn whose node stopped
                    // extending its delivery (stopped, cut off, fenced),
                    // so it came back to another holder a window later:
                    // such a turn held its delivery past the window.
                    // The window runs from the delivery, which the turn
                    // held for `waited_ms` before it began, to the turn's
                    // end (its record and acknowledgement come after its
                    // effects), or to its effect when it never ended.
                    let outlived: Vec<String> = es
                        .iter()
                        .filter_map(|e| {
                            let s = started.get(e.turn_id.as_str())?;
                            let waited = s.u64("waited_ms") as i64 * 1000;
                            let end = ended_at
                                .get(e.turn_id.as_str())
                                .map_or(e.at, |&t| t.max(e.at));
                            let held = end - (s.at - waited);
                            (held > t.ack_wait).then(|| {
                                format!(
                                    "turn {} on {} (epoch {}) held its delivery {} ({} before it began)",
                                    e.turn_id,
                                    s.proc,
                                    e.epoch,
                                    secs(held),
                                    secs(waited)
                                )
                            })
                        })
                        .collect();
                    // The spec's other window: the effect shipped and its
                    // process died (killed, or the watchdog's exit) before
                    // the turn's completion was recorded — a record written
                    // after the effects cannot un-ship them.
                    let died: Vec<String> = es
                        .iter()
                        .filter_map(|e| {
                            let s = started.get(e.turn_id.as_str())?;
                            if ended_at.contains_key(e.turn_id.as_str()) {
                                return None;
                            }
                            let p = procs.get(&s.proc)?;
                            let died = match p.cause {
                                Some(EndCause::Killed) => true,
                                Some(EndCause::OnItsOwn) => p.code == Some(75),
                                _ => false,
                            };
                            died.then(|| {
                                format!(
                                    "turn {} on {} (epoch {}) posted its effect and its process ended before the turn completed",
                                    e.turn_id, s.proc, e.epoch
                                )
                            })
                        })
                        .collect();
                    let which: Vec<String> = es
                        .iter()
                        .map(|e| format!("{}@{}:epoch {}", e.turn_id, e.node, e.epoch))
                        .collect();
                    // The violations' stories are told first.
                    if !died.is_empty() || !outlived.is_empty() {
                        twice.push(p.id.as_str());
                    } else {
                        twice.insert(0, p.id.as_str());
                    }
                    if !died.is_empty() && outlived.is_empty() {
                        f.stats.bounded_duplicates += 1;
                        f.bounded.push(format!(
                            "a holder died between an effect and its completion record: trigger {} of seat {} ran twice — {}",
                            p.id,
                            p.seat,
                            died.join("; ")
                        ));
                    } else if outlived.is_empty() {
                        f.violations.push(format!(
                            "duplicate: trigger {} of seat {} has effects from {} turns: {}",
                            p.id,
                            p.seat,
                            turns.len(),
                            which.join(", ")
                        ));
                    } else {
                        f.stats.bounded_duplicates += 1;
                        f.bounded.push(format!(
                            "a turn's node stopped extending its delivery for the ack window ({}): trigger {} of seat {} ran twice — {}",
                            secs(t.ack_wait),
                            p.id,
                            p.seat,
                            outlived.join("; ")
                        ));
                    }
                }
            }
            None if dead.contains(p.id.as_str()) => {}
            None if p.acked => lost.push(p),
            None => {}
        }
    }
    let (unanswered, lost): (Vec<&Published>, Vec<&Published>) = lost
        .into_iter()
        .partition(|p| h.stored_at_end.as_ref().is_some_and(|s| s.contains(&p.id)));
    f.stats.lost = lost.len();
    f.stats.unanswered = unanswered.len();
    for p in lost.iter().take(STORIES) {
        f.stories
            .push(format!("lost {}:\n{}", p.id, story(h, &p.id)));
    }
    for p in unanswered.iter().take(STORIES) {
        f.stories.push(format!(
            "unanswered {} (still stored in its inbox):\n{}",
            p.id,
            story(h, &p.id)
        ));
    }
    for id in twice.iter().take(STORIES) {
        f.stories.push(format!("ran twice {id}:\n{}", story(h, id)));
    }
    if !lost.is_empty() {
        f.violations.push(format!(
            "lost: {} acknowledged messages have no effect, were not dead-lettered and are gone from their inbox: {}",
            lost.len(),
            sample_of(&lost)
        ));
    }
    if !unanswered.is_empty() {
        f.violations.push(format!(
            "unanswered: {} acknowledged messages have no effect and are still stored in their inbox at the end (never run; nothing lost): {}",
            unanswered.len(),
            sample_of(&unanswered)
        ));
    }

    // Stops and exits.
    for p in &h.procs {
        for (i, (s, r)) in p.stops.iter().enumerate() {
            if r - s <= t.ttl {
                continue;
            }
            let exited_75 = p.code == Some(75)
                && p.cause == Some(EndCause::OnItsOwn)
                && p.ended
                    .is_some_and(|e| e >= *r && e <= r + t.ttl + 5 * SECOND)
                && i + 1 == p.stops.len();
            if exited_75 {
                f.stats.stops_exit75 += 1;
                continue;
            }
            // Resumed: every seat it held when stopped was lost or fenced
            // after it resumed, and it started no turn at those epochs.
            let held: Vec<&Tenure> = tenures
                .iter()
                .filter(|x| x.proc == p.id && x.attached < *s && x.ended > *s)
                .collect();
            let mut fenced = true;
            for x in &held {
                let taken = newer_claim(&x.seat, x.epoch).is_some_and(|c| c < x.ended);
                if !taken {
                    continue;
                }
                if !(x.reason == "lost"
                    || x.reason == "grace_expired"
                    || x.ended <= *r
                    || handed_over_before(h, x, *s))
                {
                    fenced = false;
                    f.violations.push(format!(
                        "stop: {} resumed after {} stopped and held seat {} (epoch {}) until {} ({}) after a peer claimed it",
                        p.id,
                        secs(r - s),
                        x.seat,
                        x.epoch,
                        secs(x.ended - r),
                        x.reason
                    ));
                }
            }
            if p.ended.is_some_and(|e| e < *r + t.ttl + 5 * SECOND)
                && p.cause == Some(EndCause::OnItsOwn)
                && p.code != Some(75)
            {
                fenced = false;
                f.violations.push(format!(
                    "stop: {} ended with code {:?} (signal {:?}) after it was resumed",
                    p.id, p.code, p.signal
                ));
            }
            if fenced {
                f.stats.stops_fenced += 1;
            }
        }
        match (p.cause, p.code) {
            (Some(EndCause::Terminated), c) if c != Some(0) => f.violations.push(format!(
                "exit: {} was sent SIGTERM and exited with {:?} (signal {:?}), not 0",
                p.id, c, p.signal
            )),
            (Some(EndCause::OnItsOwn), Some(75)) => {
                let end = p.ended.unwrap_or(h.window.1);
                let stalled = p
                    .stops
                    .iter()
                    .chain(p.cutoffs.iter())
                    .any(|(s, _)| *s <= end && end <= s + 60 * SECOND);
                if !stalled {
                    f.violations.push(format!(
                        "exit: {} exited 75 (its watchdog) without being stopped or cut off",
                        p.id
                    ));
                }
            }
            (Some(EndCause::OnItsOwn), c) => f.violations.push(format!(
                "exit: {} ended on its own with {:?} (signal {:?})",
                p.id, c, p.signal
            )),
            _ => {}
        }
    }

    for (p, line) in &h.panics {
        f.violations.push(format!("panic: {p}: {line}"));
    }

    // The lease view never goes back.
    let mut seen: BTreeMap<&str, (u64, Ts, &str)> = BTreeMap::new();
    let mut polls: Vec<&Poll> = h.polls.iter().collect();
    polls.sort_by_key(|p| p.at);
    for p in polls {
        // Epoch 0 is a claim still being written (its record, then the
        // counter, then the token): not a tenure.
        for (seat, (_, epoch)) in p.seats.iter().filter(|(_, (_, e))| *e > 0) {
            if let Some((e, at, by)) = seen.get(seat.as_str())
                && epoch < e
            {
                f.violations.push(format!(
                    "fleet view: seat {seat} at epoch {epoch} (asked {}) after epoch {e} (asked {by}, {} earlier)",
                    p.by,
                    secs(p.at - at)
                ));
            }
            let best = seen.get(seat.as_str()).map(|x| x.0).unwrap_or(0);
            if *epoch >= best {
                seen.insert(seat, (*epoch, p.at, &p.by));
            }
        }
    }

    let dark = dark_stretches(h, &tenures);
    let mut d: Vec<i64> = dark.iter().map(|x| x.2).collect();
    d.sort();
    f.stats.dark_stretches = d.len();
    f.stats.max_dark_us = d.last().copied().unwrap_or(0);
    f.stats.p99_dark_us = percentile(&d, 0.99);

    f.violations.extend(h.harness.iter().cloned());
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn proc(node: &str, spawn: u32) -> ProcId {
        ProcId {
            node: node.into(),
            spawn,
        }
    }

    fn ev(at: i64, p: &ProcId, name: &str, v: serde_json::Value) -> NodeEvent {
        NodeEvent {
            at: at * SECOND,
            proc: p.clone(),
            name: name.into(),
            v,
        }
    }

    fn running(p: &ProcId) -> Proc {
        Proc {
            id: p.clone(),
            ended: None,
            cause: None,
            code: None,
            signal: None,
            stops: vec![],
            cutoffs: vec![],
        }
    }

    fn base() -> History {
        History {
            timings: Timings {
                ttl: 3 * SECOND,
                heartbeat: SECOND,
                store_timeout: 2 * SECOND,
                ack_wait: 10 * SECOND,
            },
            window: (0, 100 * SECOND),
            seats: vec!["s".into()],
            published: vec![],
            effects: vec![],
            dead: vec![],
            events: vec![],
            procs: vec![],
            removals: vec![],
            outages: vec![],
            polls: vec![],
            panics: vec![],
            harness: vec![],
            stored_at_end: Some(BTreeSet::new()),
        }
    }

    fn effect(at: i64, turn: &str, node: &str, epoch: u64, ids: &[&str]) -> EffectRec {
        EffectRec {
            at: at * SECOND,
            seat: "s".into(),
            node: node.into(),
            epoch,
            turn_id: turn.into(),
            trigger_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn published(id: &str) -> Published {
        Published {
            id: id.into(),
            seat: "s".into(),
            at: 0,
            acked: true,
            seq: None,
        }
    }

    #[test]
    fn a_clean_handoff_is_clean_and_its_gap_is_dark_time() {
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        h.procs = vec![running(&a), running(&b)];
        h.events = vec![
            ev(0, &a, "seat_claimed", json!({"seat": "s", "epoch": 1})),
            ev(0, &a, "seat_attached", json!({"seat": "s", "epoch": 1})),
            ev(
                40,
                &a,
                "seat_detached",
                json!({"seat": "s", "epoch": 1, "reason": "drain"}),
            ),
            ev(41, &b, "seat_claimed", json!({"seat": "s", "epoch": 2})),
            ev(42, &b, "seat_attached", json!({"seat": "s", "epoch": 2})),
            ev(
                4,
                &a,
                "turn_started",
                json!({"seat": "s", "turn_id": "t1", "epoch": 1}),
            ),
        ];
        h.published = vec![published("m1")];
        h.effects = vec![effect(5, "t1", "a", 1, &["m1"])];
        let f = check(&h);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.stats.max_dark_us, 2 * SECOND);
        assert_eq!(f.stats.lost, 0);
    }

    #[test]
    fn a_voluntary_release_whose_teardown_never_succeeded_is_not_a_graceful_handoff() {
        // Three rebalances from a to b: proven at once, proven on an undead
        // retry, and never proven (the lease lapsed undead).
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        h.procs = vec![running(&a), running(&b)];
        let mut tenure = |epoch: u64, at: i64, after: &[&str]| {
            let s = json!({"seat": "s", "epoch": epoch});
            h.events.push(ev(at, &a, "seat_attached", s.clone()));
            h.events.push(ev(
                at + 1,
                &a,
                "seat_detached",
                json!({"seat": "s", "epoch": epoch, "reason": "rebalance"}),
            ));
            for (i, name) in after.iter().enumerate() {
                h.events.push(ev(at + 2 + i as i64, &a, name, s.clone()));
            }
            h.events.push(ev(
                at + 5,
                &b,
                "seat_attached",
                json!({"seat": "s", "epoch": epoch + 1}),
            ));
            h.events.push(ev(
                at + 6,
                &b,
                "seat_detached",
                json!({"seat": "s", "epoch": epoch + 1, "reason": "lost"}),
            ));
        };
        tenure(1, 0, &[]);
        tenure(3, 10, &["seat_release_unproven", "seat_release_recovered"]);
        tenure(5, 20, &["seat_release_unproven"]);
        let found = graceful_handoffs(&h, &tenures(&h));
        let given: Vec<u64> = found.graceful.iter().map(|(t, _)| t.epoch).collect();
        assert_eq!(given, vec![1, 3]);
        assert!(found.graceful.iter().all(|(_, n)| n.proc == b));
        assert_eq!(found.lapsed_unproven, 1);
    }

    #[test]
    fn a_release_whose_lease_lapsed_before_it_is_judged_by_the_crash_bound_not_as_graceful() {
        // a rebalances s twice. Epoch 1: released, then b claims it (a
        // graceful handoff). Epoch 3: a's lease lapses in a store outage
        // while it is letting the seat go; b claims it (epoch 4) before a
        // detaches. Epoch 5: handed over in two phases — b takes it while
        // a still holds it, before a detaches (graceful).
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        h.procs = vec![running(&a), running(&b)];
        let s = |epoch: u64| json!({"seat": "s", "epoch": epoch});
        let gone = |epoch: u64| json!({"seat": "s", "epoch": epoch, "reason": "rebalance"});
        h.events = vec![
            ev(0, &a, "seat_attached", s(1)),
            ev(5, &a, "seat_detached", gone(1)),
            ev(6, &b, "seat_claimed", s(2)),
            ev(6, &b, "seat_attached", s(2)),
            ev(
                7,
                &b,
                "seat_detached",
                json!({"seat": "s", "epoch": 2, "reason": "lost"}),
            ),
            ev(10, &a, "seat_attached", s(3)),
            ev(14, &b, "seat_claimed", s(4)),
            ev(15, &a, "seat_detached", gone(3)),
            ev(16, &b, "seat_attached", s(4)),
            ev(
                17,
                &b,
                "seat_detached",
                json!({"seat": "s", "epoch": 4, "reason": "lost"}),
            ),
            ev(20, &a, "seat_attached", s(5)),
            ev(24, &b, "seat_claimed", s(6)),
            ev(24, &b, "seat_offer_taken", s(6)),
            ev(25, &a, "seat_detached", gone(5)),
            ev(26, &b, "seat_attached", s(6)),
        ];
        let all = tenures(&h);
        let found = graceful_handoffs(&h, &all);
        let given: Vec<u64> = found.graceful.iter().map(|(t, _)| t.epoch).collect();
        assert_eq!(given, vec![1, 5]);
        assert_eq!(found.lapsed_before_release, 1);
        let crashed: Vec<(u64, u64)> = crash_handoffs(&h, &all, 0, 0)
            .iter()
            .filter(|(t, _, _)| t.proc == a)
            .map(|(t, n, _)| (t.epoch, n.epoch))
            .collect();
        assert_eq!(crashed, vec![(3, 4)]);
    }

    #[test]
    fn an_effect_whose_turn_start_is_not_in_the_logs_is_a_violation() {
        let a = proc("a", 0);
        let mut h = base();
        h.procs = vec![running(&a)];
        h.published = vec![published("m1")];
        h.effects = vec![effect(5, "t1", "a", 1, &["m1"])];
        let f = check(&h);
        assert!(
            f.violations
                .iter()
                .any(|v| v.starts_with("recording") && v.contains("t1 on a (epoch 1)")),
            "{:?}",
            f.violations
        );
        h.events = vec![ev(
            4,
            &a,
            "turn_started",
            json!({"seat": "s", "turn_id": "t1", "epoch": 1}),
        )];
        assert!(check(&h).violations.is_empty());
    }

    #[test]
    fn a_message_with_no_effect_and_no_dead_letter_is_lost() {
        let mut h = base();
        h.published = vec![published("m1"), published("m2"), published("m3")];
        h.events = vec![ev(
            4,
            &proc("a", 0),
            "turn_started",
            json!({"seat": "s", "turn_id": "t1", "epoch": 1}),
        )];
        h.effects = vec![effect(5, "t1", "a", 1, &["m1"])];
        h.dead = vec![DeadRec { id: "m2".into() }];
        let f = check(&h);
        assert_eq!(f.stats.lost, 1);
        assert!(f.violations[0].contains("m3"), "{:?}", f.violations);
    }

    #[test]
    fn a_message_with_no_effect_still_stored_in_its_inbox_is_unanswered_not_lost() {
        let mut h = base();
        h.published = vec![published("m1"), published("m2")];
        h.stored_at_end = Some(BTreeSet::from(["m2".to_string()]));
        let f = check(&h);
        assert_eq!((f.stats.lost, f.stats.unanswered), (1, 1));
        assert!(
            f.violations
                .iter()
                .any(|v| v.starts_with("lost: 1") && v.contains("m1")),
            "{:?}",
            f.violations
        );
        assert!(
            f.violations
                .iter()
                .any(|v| v.starts_with("unanswered: 1") && v.contains("m2")),
            "{:?}",
            f.violations
        );
        // An inbox that could not be read at the end proves nothing stored.
        h.stored_at_end = None;
        assert_eq!(check(&h).stats.lost, 2);
    }

    /// Trigger m1 run by two turns of seat s: t1 on a (epoch 1) started
    /// at `t1_at` s, having held its delivery `waited_ms` before, its
    /// effect at `t1_effect` s; t2 on b (epoch 2) started at `t2_at` s,
    /// its effect at `t2_effect` s.
    fn one_trigger_two_turns(
        (t1_at, waited_ms, t1_effect): (i64, u64, i64),
        (t2_at, t2_effect): (i64, i64),
    ) -> History {
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        h.procs = vec![running(&a), running(&b)];
        h.published = vec![published("m1")];
        h.events = vec![
            ev(
                t1_at,
                &a,
                "turn_started",
                json!({"seat": "s", "turn_id": "t1", "epoch": 1, "waited_ms": waited_ms}),
            ),
            ev(
                t2_at,
                &b,
                "turn_started",
                json!({"seat": "s", "turn_id": "t2", "epoch": 2}),
            ),
        ];
        h.effects = vec![
            effect(t1_effect, "t1", "a", 1, &["m1"]),
            effect(t2_effect, "t2", "b", 2, &["m1"]),
        ];
        h
    }

    #[test]
    fn two_effects_for_one_trigger_are_a_violation_unless_a_turn_outlived_the_ack_window() {
        let mut h = one_trigger_two_turns((10, 0, 11), (12, 13));
        let f = check(&h);
        assert_eq!(f.stats.duplicates, 1);
        assert!(f.violations.iter().any(|v| v.starts_with("duplicate")));
        // The same, with the first turn running 12 s (stopped mid-turn).
        h.effects[0].at = 22 * SECOND;
        let f = check(&h);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.stats.bounded_duplicates, 1);
        assert!(f.bounded[0].contains("stopped extending its delivery"));
    }

    #[test]
    fn a_message_that_ran_twice_is_told_with_both_turns_their_effects_and_the_claim_between() {
        let mut h = one_trigger_two_turns((10, 0, 11), (13, 14));
        let (a, b) = (proc("a", 0), proc("b", 0));
        let fetched = |delivered: u64| json!({"step": "fetched", "msg_id": "m1", "seq": 3, "delivered": delivered, "what": "fetch"});
        h.events.extend([
            ev(9, &a, "trace.fetched", fetched(1)),
            ev(11, &b, "seat_claimed", json!({"seat": "s", "epoch": 2})),
            ev(12, &b, "trace.fetched", fetched(2)),
        ]);
        for e in &mut h.events {
            if e.name == "turn_started" {
                e.v["trigger_ids"] = json!(["m1"]);
            }
        }
        h.events.sort_by_key(|e| e.at);
        let f = check(&h);
        assert_eq!(f.stats.duplicates, 1);
        let told = f
            .stories
            .iter()
            .find(|s| s.starts_with("ran twice m1"))
            .expect("m1's story is told");
        let steps: Vec<&str> = told.lines().skip(1).collect();
        let at = |needle: &str| {
            steps
                .iter()
                .position(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no step with {needle:?} in:\n{told}"))
        };
        let order = [
            at("published to seat s"),
            at("a#0 trace.fetched"),
            at("a#0 turn_started"),
            at("effect stored: turn t1 on a at epoch 1"),
            at("b#0 seat_claimed"),
            at("b#0 trace.fetched"),
            at("b#0 turn_started"),
            at("effect stored: turn t2 on b at epoch 2"),
        ];
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "out of order: {order:?}\n{told}"
        );
    }

    #[test]
    fn the_ack_window_runs_from_the_delivery_not_from_the_turn_start() {
        // The first turn began 3 s after its delivery reached it (a ledger
        // read that timed out) and its effect landed 8 s after it began:
        // 11 s after the delivery, past the 10 s window, which had handed
        // the trigger to the next holder.
        let h = one_trigger_two_turns((10, 3000, 18), (17, 17));
        let f = check(&h);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.stats.bounded_duplicates, 1);
        assert!(
            f.bounded[0].contains("held its delivery 11.00s"),
            "{:?}",
            f.bounded
        );
        // Had it waited 1 s, the delivery was 9 s old at the effect: a
        // violation.
        let mut h = one_trigger_two_turns((10, 1000, 18), (17, 17));
        let f = check(&h);
        assert!(
            f.violations.iter().any(|v| v.starts_with("duplicate")),
            "{:?}",
            f.violations
        );
        // The same turn whose record and acknowledgement came at 21 s:
        // its delivery (from 9 s) was held past the window all the same.
        h.events.push(ev(
            21,
            &proc("a", 0),
            "turn_completed",
            json!({"seat": "s", "turn_id": "t1", "epoch": 1}),
        ));
        let f = check(&h);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert!(
            f.bounded[0].contains("held its delivery 12.00s"),
            "{:?}",
            f.bounded
        );
    }

    /// Two processes: a, killed at 14 s, and b, running.
    fn a_killed_at_14_s_beside_b() -> (ProcId, ProcId, History) {
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        let mut dead = running(&a);
        dead.ended = Some(14 * SECOND);
        dead.cause = Some(EndCause::Killed);
        h.procs = vec![dead, running(&b)];
        (a, b, h)
    }

    #[test]
    fn the_story_of_a_duplicate_that_is_a_violation_is_told_before_the_bounded_ones() {
        let (a, b, mut h) = a_killed_at_14_s_beside_b();
        // m1 ran twice within the bound (its first holder was killed
        // between the effect and the record); m2, published after it, ran
        // twice on a live holder: a violation.
        h.published = vec![published("m1"), published("m2")];
        let started = |at, p: &ProcId, t: &str, e: u64| {
            ev(
                at,
                p,
                "turn_started",
                json!({"seat": "s", "turn_id": t, "epoch": e}),
            )
        };
        let completed = |at, p: &ProcId, t: &str, e: u64| {
            ev(
                at,
                p,
                "turn_completed",
                json!({"seat": "s", "turn_id": t, "epoch": e}),
            )
        };
        h.events = vec![
            started(10, &a, "t1", 1),
            started(20, &b, "t2", 2),
            completed(21, &b, "t2", 2),
            started(22, &b, "t3", 2),
            completed(23, &b, "t3", 2),
        ];
        h.effects = vec![
            effect(11, "t1", "a", 1, &["m1"]),
            effect(21, "t2", "b", 2, &["m1", "m2"]),
            effect(23, "t3", "b", 2, &["m2"]),
        ];
        let f = check(&h);
        assert_eq!(f.stats.bounded_duplicates, 1, "{:?}", f.bounded);
        assert!(
            f.violations.iter().any(|v| v.contains("trigger m2")),
            "{:?}",
            f.violations
        );
        assert!(
            f.stories[0].starts_with("ran twice m2"),
            "{:?}",
            f.stories
                .iter()
                .map(|s| s.lines().next())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_holder_killed_between_its_effect_and_its_completion_record_is_the_named_bound() {
        let (a, b, mut h) = a_killed_at_14_s_beside_b();
        h.published = vec![published("m1")];
        h.events = vec![
            ev(
                10,
                &a,
                "turn_started",
                json!({"seat": "s", "turn_id": "t1", "epoch": 1}),
            ),
            ev(
                20,
                &b,
                "turn_started",
                json!({"seat": "s", "turn_id": "t2", "epoch": 2}),
            ),
            ev(
                21,
                &b,
                "turn_completed",
                json!({"seat": "s", "turn_id": "t2", "epoch": 2}),
            ),
        ];
        h.effects = vec![
            effect(11, "t1", "a", 1, &["m1"]),
            effect(21, "t2", "b", 2, &["m1"]),
        ];
        let f = check(&h);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.stats.bounded_duplicates, 1);
        assert!(f.bounded[0].contains("died between an effect and its completion record"));
        // Had the first turn completed (its record written), the second run
        // is a violation whatever happened to its process after.
        h.events.push(ev(
            12,
            &a,
            "turn_completed",
            json!({"seat": "s", "turn_id": "t1", "epoch": 1}),
        ));
        let f = check(&h);
        assert!(
            f.violations.iter().any(|v| v.starts_with("duplicate")),
            "{:?}",
            f.violations
        );
    }

    #[test]
    fn attachments_overlapping_past_the_bound_are_a_violation_but_stopped_time_is_not() {
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        h.procs = vec![running(&a), running(&b)];
        h.events = vec![
            ev(0, &a, "seat_attached", json!({"seat": "s", "epoch": 1})),
            ev(10, &b, "seat_attached", json!({"seat": "s", "epoch": 2})),
            ev(
                30,
                &a,
                "seat_detached",
                json!({"seat": "s", "epoch": 1, "reason": "lost"}),
            ),
        ];
        let f = check(&h);
        assert!(
            f.violations.iter().any(|v| v.starts_with("overlap")),
            "{:?}",
            f.violations
        );
        // a was stopped from 5 s to 29 s: it held nothing it could act on.
        h.procs[0].stops = vec![(5 * SECOND, 29 * SECOND)];
        let f = check(&h);
        assert!(
            !f.violations.iter().any(|v| v.starts_with("overlap")),
            "{:?}",
            f.violations
        );
        assert_eq!(f.stats.stops_fenced, 1);
    }

    /// Seat s claimed by b at epoch 2 at 10 s; a's turn t1 (epoch 1)
    /// passed its call's fence at `passed` and its effect was stored at
    /// `stored` (seconds).
    fn late(passed: i64, stored: i64) -> History {
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        h.procs = vec![running(&a), running(&b)];
        h.published = vec![published("m1")];
        h.events = vec![
            ev(1, &a, "seat_claimed", json!({"seat": "s", "epoch": 1})),
            ev(
                2,
                &a,
                "turn_started",
                json!({"seat": "s", "turn_id": "t1", "epoch": 1}),
            ),
            ev(
                passed,
                &a,
                "trace.fence_passed",
                json!({"seat": "s", "turn_id": "t1", "epoch": 1, "call": "post_outbox"}),
            ),
            ev(10, &b, "seat_claimed", json!({"seat": "s", "epoch": 2})),
        ];
        h.effects = vec![effect(stored, "t1", "a", 1, &["m1"])];
        h
    }

    #[test]
    fn a_late_effect_whose_call_passed_the_fence_before_the_claim_is_bounded_and_reported() {
        let f = check(&late(9, 12));
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.stats.zombie_effects, 1);
        assert_eq!(f.stats.late_max_delay_us, 3 * SECOND);
        assert_eq!(f.stats.late_most_per_turn, 1);
        assert_eq!(f.stats.late_bound_us, 23 * SECOND);
    }

    #[test]
    fn a_late_effect_whose_call_passed_the_fence_after_the_claim_is_a_violation() {
        let f = check(&late(11, 12));
        assert!(
            f.violations
                .iter()
                .any(|v| v.starts_with("late effect") && v.contains("after the claim")),
            "{:?}",
            f.violations
        );
        // Unless the process was stopped from before the claim until the
        // line was written: the check came before the stop.
        let mut h = late(11, 12);
        h.procs[0].stops = vec![(9 * SECOND + SECOND / 2, 11 * SECOND)];
        let f = check(&h);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
    }

    #[test]
    fn a_late_effect_with_no_fence_pass_in_the_trace_is_a_violation() {
        let mut h = late(9, 12);
        h.events.retain(|e| e.name != "trace.fence_passed");
        assert!(
            check(&h)
                .violations
                .iter()
                .any(|v| v.contains("no fence its call passed"))
        );
    }

    #[test]
    fn a_late_effect_stored_past_the_retry_bound_is_a_violation_unless_its_process_was_stalled() {
        // 31 s after the check: past the bound of 23 s.
        let f = check(&late(9, 40));
        assert!(
            f.violations
                .iter()
                .any(|v| v.starts_with("late effect") && v.contains("bound 23.00s")),
            "{:?}",
            f.violations
        );
        // Cut off for 20 s and stopped for 5 s (overlapping 2 s) of it:
        // 8 s of running time.
        let mut h = late(9, 40);
        h.procs[0].cutoffs = vec![(12 * SECOND, 32 * SECOND)];
        h.procs[0].stops = vec![(30 * SECOND, 35 * SECOND)];
        let f = check(&h);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.stats.late_max_delay_us, 8 * SECOND);
    }

    #[test]
    fn a_lost_message_is_told_with_every_step_of_its_deliveries_on_every_node() {
        let (a, b) = (proc("a", 0), proc("b", 1));
        let mut h = base();
        h.procs = vec![running(&a), running(&b)];
        h.published = vec![published("m1"), published("m2")];
        let trace = |step: &str, what: &str, delivered: u64| json!({"step": step, "msg_id": "m1", "seq": 7, "delivered": delivered, "what": what});
        h.events = vec![
            ev(1, &a, "trace.fetched", trace("fetched", "fetch", 1)),
            ev(
                2,
                &a,
                "trace.settled",
                trace("settled", "defer: seat \"s\" is not owned here", 1),
            ),
            ev(3, &b, "seat_claimed", json!({"seat": "s", "epoch": 2})),
            ev(4, &b, "trace.fetched", trace("fetched", "stranded", 2)),
            ev(5, &b, "trace.settled", trace("settled", "ack", 2)),
            ev(
                6,
                &b,
                "trace.fetched",
                json!({"step": "fetched", "msg_id": "m2", "seq": 8, "delivered": 1, "what": "fetch"}),
            ),
        ];
        let f = check(&h);
        assert_eq!(f.stats.lost, 2);
        let told = f
            .stories
            .iter()
            .find(|s| s.starts_with("lost m1"))
            .expect("m1's story");
        let lines: Vec<&str> = told.lines().collect();
        assert!(lines[1].contains("published to seat s"), "{told}");
        assert!(lines[2].contains("a#0 trace.fetched"), "{told}");
        assert!(lines[3].contains("defer: seat"), "{told}");
        assert!(lines[4].contains("b#1 seat_claimed"), "{told}");
        assert!(lines[5].contains("stranded"), "{told}");
        assert!(lines[6].contains("\"ack\""), "{told}");
        assert!(!told.contains("m2"), "another message's steps: {told}");
    }

    #[test]
    fn a_handed_off_tenures_memory_is_judged_up_to_its_offer_and_a_released_ones_to_its_end() {
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        h.events = vec![
            ev(0, &a, "seat_attached", json!({"seat": "s", "epoch": 1})),
            ev(
                8,
                &a,
                "seat_offered",
                json!({"seat": "s", "epoch": 1, "to": "b"}),
            ),
            ev(
                10,
                &a,
                "seat_detached",
                json!({"seat": "s", "epoch": 1, "reason": "rebalance"}),
            ),
            ev(9, &b, "seat_attached", json!({"seat": "s", "epoch": 2})),
            ev(
                20,
                &b,
                "seat_detached",
                json!({"seat": "s", "epoch": 2, "reason": "drain"}),
            ),
        ];
        let ts = tenures(&h);
        let given = ts.iter().find(|t| t.proc == a).unwrap();
        let released = ts.iter().find(|t| t.proc == b).unwrap();
        assert_eq!(flushed_by(&h, given), 8 * SECOND);
        assert_eq!(flushed_by(&h, released), 20 * SECOND);
    }

    #[test]
    fn a_killed_holders_memory_is_judged_one_flush_cycle_before_it_last_acted() {
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        let mut pa = running(&a);
        pa.stops = vec![(50 * SECOND, 60 * SECOND)];
        h.procs = vec![pa, running(&b)];
        h.events = vec![
            ev(0, &a, "seat_attached", json!({"seat": "s", "epoch": 1})),
            ev(
                70,
                &a,
                "seat_detached",
                json!({"seat": "s", "epoch": 1, "reason": "lost"}),
            ),
            ev(56, &b, "seat_attached", json!({"seat": "s", "epoch": 2})),
            ev(
                80,
                &b,
                "seat_detached",
                json!({"seat": "s", "epoch": 2, "reason": "drain"}),
            ),
            ev(81, &a, "seat_attached", json!({"seat": "s", "epoch": 3})),
        ];
        let ts = tenures(&h);
        let found = crash_handoffs(&h, &ts, 30 * SECOND, 5 * SECOND);
        // The lost tenure (it last acted at its stop, 50 s) is judged at
        // 50 − 30 − 5 s, against b's; the drain is not a crash.
        assert_eq!(found.len(), 1, "{found:?}");
        let (gave, took, by) = &found[0];
        assert_eq!((gave.epoch, took.epoch), (1, 2));
        assert_eq!(*by, 15 * SECOND);
        // A NATS outage from 40 s reaching into its last cycle: judged
        // from the outage's start. One that ended long before: not.
        h.outages = vec![(5 * SECOND, 8 * SECOND), (40 * SECOND, 44 * SECOND)];
        let found = crash_handoffs(&h, &ts, 30 * SECOND, 5 * SECOND);
        assert_eq!(found[0].2, 5 * SECOND);
    }

    #[test]
    fn a_turn_started_long_after_a_newer_claim_breaks_admission() {
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        h.procs = vec![running(&a), running(&b)];
        h.events = vec![
            ev(10, &b, "seat_claimed", json!({"seat": "s", "epoch": 2})),
            ev(
                15,
                &a,
                "turn_started",
                json!({"seat": "s", "turn_id": "t1", "epoch": 1}),
            ),
        ];
        let f = check(&h);
        assert!(
            f.violations.iter().any(|v| v.starts_with("admission")),
            "{:?}",
            f.violations
        );
    }

    #[test]
    fn a_stopped_node_exiting_75_is_fine_and_exiting_otherwise_is_not() {
        let a = proc("a", 0);
        let mut h = base();
        let mut p = running(&a);
        p.stops = vec![(10 * SECOND, 16 * SECOND)];
        p.ended = Some(16 * SECOND + SECOND / 2);
        p.cause = Some(EndCause::OnItsOwn);
        p.code = Some(75);
        h.procs = vec![p.clone()];
        let f = check(&h);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.stats.stops_exit75, 1);
        p.code = Some(1);
        h.procs = vec![p.clone()];
        assert!(!check(&h).violations.is_empty());
        // A watchdog exit with no stall behind it.
        p.code = Some(75);
        p.stops.clear();
        h.procs = vec![p];
        assert!(check(&h).violations.iter().any(|v| v.contains("watchdog")));
    }

    #[test]
    fn a_giver_stopped_between_its_offer_and_the_take_detaches_on_resume_without_a_violation() {
        let (a, b) = (proc("a", 0), proc("b", 0));
        let mut h = base();
        let mut pa = running(&a);
        pa.stops = vec![(10 * SECOND, 16 * SECOND)];
        h.procs = vec![pa, running(&b)];
        let taken = vec![
            ev(0, &a, "seat_attached", json!({"seat": "s", "epoch": 1})),
            ev(11, &b, "seat_claimed", json!({"seat": "s", "epoch": 2})),
            ev(11, &b, "seat_attached", json!({"seat": "s", "epoch": 2})),
            ev(
                11,
                &b,
                "seat_offer_taken",
                json!({"seat": "s", "epoch": 2, "from_epoch": 1, "from": "a"}),
            ),
            ev(
                17,
                &a,
                "seat_detached",
                json!({"seat": "s", "epoch": 1, "reason": "rebalance"}),
            ),
        ];
        let stop_violations = |h: &History| {
            check(h)
                .violations
                .into_iter()
                .filter(|v| v.starts_with("stop:"))
                .collect::<Vec<_>>()
        };
        // Offered before the stop: the take is the handoff.
        let mut offered = taken.clone();
        offered.insert(
            1,
            ev(
                9,
                &a,
                "seat_offered",
                json!({"seat": "s", "epoch": 1, "to": "b", "reason": "rebalance"}),
            ),
        );
        h.events = offered;
        assert!(stop_violations(&h).is_empty(), "{:?}", stop_violations(&h));
        // Never offered: a peer claimed a seat the stopped node held on.
        h.events = taken;
        assert_eq!(stop_violations(&h).len(), 1, "{:?}", check(&h).violations);
    }

    #[test]
    fn a_removed_seat_is_not_dark_while_it_is_out_of_the_company() {
        let a = proc("a", 0);
        let mut h = base();
        h.procs = vec![running(&a)];
        h.events = vec![
            ev(0, &a, "seat_attached", json!({"seat": "s", "epoch": 1})),
            ev(
                20,
                &a,
                "seat_detached",
                json!({"seat": "s", "epoch": 1, "reason": "role_gone"}),
            ),
            ev(51, &a, "seat_attached", json!({"seat": "s", "epoch": 2})),
        ];
        h.removals = vec![Removal {
            seat: "s".into(),
            from: 19 * SECOND,
            to: 50 * SECOND,
        }];
        let f = check(&h);
        assert_eq!(f.stats.max_dark_us, SECOND);
    }
}
